"""This host's server processes (`serve --workers N`), each listening on a Unix socket of its
own in one directory, so that each stream's appends are committed by one of them, its owner
(`CommitPeers`, application/ports.py).

Without it, every process ran its own group commit for a stream: two processes appending to
one hot stream took turns on its row lock, each with half the group, so a second process made
the stream slower (docs/architecture.md, "Processes and replicas"). With it, a process
that receives an append for a stream another process owns sends the command there and relays
its outcome, so each stream has one group commit on the host however many processes take its
requests.

- **Who owns a stream**: rendezvous hashing of the stream's key over the processes whose sockets
  are in the directory (listed again at most once a second): every process computes the same
  owner, and a process that comes or goes moves only the streams it owns or will own.
- **The wire**: one connection per pair, requests and answers framed by their length, in
  MessagePack (msgspec): an append (native or Durable Streams) and its answer as typed structs,
  an error pickled (only processes of the same user can open the socket: the directory is
  created private by the supervisor). Pickling the command cost 35 µs of CPU a request; this
  costs about 3. What one loop turn sends on a connection goes in one write, so a group's
  answers leave together.
- **Deadline**: a request carries the moment its sender stops waiting. What the owner has not
  taken into a batch by then is dropped, never to commit (a stalled owner's queue, read after a
  pause, once committed appends the client had given up on after the ones it made next). One
  taken into a batch just before may still commit after its sender answered: that answer says
  the outcome is unknown, as it does for a COMMIT without an answer.
- **Failure**: ownership is only a matter of speed. Every decision is made under the stream's
  row lock, whichever process makes it, so a process that cannot reach the owner (no listener,
  a refused or failed connection) commits the append itself. Once a command is sent, a lost
  connection or an answer later than the request's budget is of unknown outcome (503, "may
  have been committed"), as a COMMIT without an answer is.
- **Silence**: an owner that answers nothing within a request's budget is left out until it
  answers a probe (a message its event loop answers at once, without a commit), so its streams
  are committed by the others meanwhile: a stopped process, or one whose loop is stuck, stays
  out for as long as it is silent, one that was only slow (its commits waiting on PostgreSQL)
  for the half second its probe takes. Before, every append to its streams waited for its
  budget and answered 503 for as long as the owner was silent (a hostile tester stopped one for
  25 s: not one append of its streams went through another process).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import math
import os
import pickle
import struct
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import msgspec

from application.access import Caller
from application.append_records import AppendCommand, ProduceCommand, Produced
from application.ports import (
    Command,
    Done,
    Failed,
    Idempotency,
    Outcome,
    PeerUnavailable,
    Replayed,
)
from application.tenant_limits import TenantRoom
from application.views import AppendAnswer
from application.waiting import Expired, Unanswered, expire
from domain.producers import ProducerClaim
from domain.records import NewRecord
from domain.stream import StreamKey

log = logging.getLogger("ductor_streams.peers")


# -- the wire ---------------------------------------------------------------------------------


class _Append(msgspec.Struct, array_like=True, tag=1):
    caller: Caller
    records: list[NewRecord]
    idempotency: Idempotency | None
    now: datetime
    room: TenantRoom | None = None  # the command's `tenant_room`, decided where it commits
    copies: int = 0  # the command's `copies`


class _Produce(msgspec.Struct, array_like=True, tag=2):
    caller: Caller
    records: list[NewRecord]
    now: datetime
    producer: ProducerClaim | None
    writer_seq: str | None
    close: bool
    content_conflict: str | None
    room: TenantRoom | None = None
    copies: int = 0


class _Request(msgspec.Struct, array_like=True):
    number: int
    key: tuple[str, str, str]
    command: _Append | _Produce | None  # None: a probe, answered at once (`_Reply(number)`)
    # When the sender stops waiting (`time.monotonic()`, one clock for the host's processes):
    # not taken up by then, the command never commits (`GroupCommit.enqueue_until`). (None
    # from a process of an earlier version, started before this one: no bound.)
    deadline: float | None = None


class _Reply(msgspec.Struct, array_like=True):
    """An outcome (`appended`, `produced` or `replayed`), or an error (`error`, pickled): the
    command's refusal (`failed`, a `Failed` outcome) or what its commit raised."""

    number: int
    appended: AppendAnswer | None = None
    produced: Produced | None = None
    replayed: bytes | None = None
    error: bytes | None = None
    failed: bool = False
    stored: int = 0  # what a `Done` added to its tenant's bytes (counted where it was received)


def _wire(command: Command) -> _Append | _Produce:
    if type(command) is AppendCommand:
        records = list(command.records)
        room = getattr(command, "tenant_room", None)
        return _Append(
            command.caller, records, command.idempotency, command.now, room, command.copies
        )
    if type(command) is ProduceCommand:
        return _Produce(
            command.caller,
            list(command.records),
            command.now,
            command.producer,
            command.writer_seq,
            command.close,
            command.content_conflict,
            getattr(command, "tenant_room", None),
            command.copies,
        )
    raise PeerUnavailable(f"a {type(command).__name__} is committed where it is received")


def _command(wire: _Append | _Produce) -> Command:
    command: AppendCommand | ProduceCommand
    if type(wire) is _Append:
        command = AppendCommand(wire.caller, wire.records, wire.idempotency, wire.now)
    else:
        assert type(wire) is _Produce
        command = ProduceCommand(
            wire.caller,
            wire.records,
            wire.now,
            producer=wire.producer,
            writer_seq=wire.writer_seq,
            close=wire.close,
            content_conflict=wire.content_conflict,
        )
    if wire.room is not None:
        command.tenant_room = wire.room  # type: ignore[union-attr]
    command.copies = wire.copies
    return command


def _outcome(reply: _Reply) -> Outcome:
    """What the owner answered (raises what its commit raised)."""
    if reply.error is not None:
        error = pickle.loads(reply.error)
        if reply.failed:
            return Failed(error)
        raise error
    if reply.replayed is not None:
        return Replayed(reply.replayed)
    answer = reply.appended if reply.appended is not None else reply.produced
    return Done([], answer, stored=reply.stored)


def _reply(number: int, done: asyncio.Future[Outcome]) -> _Reply:
    error = done.exception()
    if error is not None:
        return _Reply(number, error=_pickled(error))
    outcome = done.result()
    if type(outcome) is Failed:
        return _Reply(number, error=_pickled(outcome.error), failed=True)
    if type(outcome) is Replayed:
        return _Reply(number, replayed=outcome.answer_json)
    assert type(outcome) is Done
    answer = outcome.answer  # (its events stay here: the sender needs the answer alone)
    if type(answer) is AppendAnswer:
        return _Reply(number, appended=answer, stored=outcome.stored)
    return _Reply(number, produced=answer, stored=outcome.stored)


def _pickled(error: BaseException) -> bytes:
    """`error` pickled; one that would not come back as itself is sent as an outcome-unknown
    503, and logged here."""
    try:
        payload = pickle.dumps(error, pickle.HIGHEST_PROTOCOL)
        pickle.loads(payload)
        return payload
    except Exception:
        log.error("an error could not be sent to the process that asked: %r", error, exc_info=error)
        return pickle.dumps(Unanswered(_WHAT, 0, outcome_unknown=True), pickle.HIGHEST_PROTOCOL)


_encode = msgspec.msgpack.Encoder().encode
_requests = msgspec.msgpack.Decoder(_Request)
_replies = msgspec.msgpack.Decoder(_Reply)

# Queues a command another process sent for this one's next batch (GroupCommit.enqueue).
Enqueue = Callable[[StreamKey, Command, float], "asyncio.Future[Outcome]"]

_WHAT = "the process that commits this stream"
_HEADER = struct.Struct(">I")
_SUFFIX = ".sock"
# How often the directory is listed again (processes come and go), how long a process that
# could not be reached is left out, how long a connection attempt may take.
LIST_SECONDS = 1.0
DOWN_SECONDS = 1.0
CONNECT_SECONDS = 0.5
# How often a silent process is probed, and how long its answer to a probe may take.
PROBE_SECONDS = 0.5
# Owners computed, kept until the processes change (bounded: cleared when full).
MAX_OWNERS = 10_000


class _Lost(Exception):
    pass


def _score(member: str, key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(key, digest_size=8, salt=member.encode()[:16]).digest())


class _Channel(asyncio.Protocol):
    """One end of a connection between two processes: whole frames handed to `received`, and
    what is sent in one loop turn written at once."""

    def __init__(self, received: Callable[[_Channel, bytes], None]) -> None:
        self._received = received
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.on_lost: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is no subclass)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        at, end = 0, len(buffer)
        while end - at >= _HEADER.size:
            (size,) = _HEADER.unpack_from(buffer, at)
            if end - at - _HEADER.size < size:
                break
            at += _HEADER.size
            frame = bytes(buffer[at : at + size])
            at += size
            try:
                self._received(self, frame)
            except Exception:
                log.exception("a message from another server process could not be read")
                self.close()
                return
        del buffer[:at]

    def send(self, payload: bytes) -> None:
        if self.closed:
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out += (_HEADER.pack(len(payload)), payload)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and not self.closed:
            self.transport.write(b"".join(out))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.connection_lost(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        if self.on_lost is not None:
            self.on_lost()


class _Link:
    """This process's connection to another: requests numbered, answers matched by number."""

    def __init__(self) -> None:
        self.pending: dict[int, asyncio.Future[Outcome]] = {}
        self.sent = 0
        self.channel = _Channel(self._answered)
        self.channel.on_lost = self._lost

    def ask(self, payload: bytes) -> tuple[int, asyncio.Future[Outcome]]:
        """Sends `payload`, a request numbered `sent` (the next number), and answers its number
        and the future its answer settles (the caller takes it out of `pending` when done)."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        number = self.sent
        self.sent += 1
        self.pending[number] = future
        self.channel.send(payload)
        return number, future

    def _answered(self, _: _Channel, frame: bytes) -> None:
        reply = _replies.decode(frame)
        future = self.pending.pop(reply.number, None)
        if future is None or future.done():
            return
        try:
            future.set_result(_outcome(reply))
        except Exception as error:
            future.set_exception(error)

    def _lost(self) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(_Lost())
        self.pending.clear()


class UnixPeers:
    """`CommitPeers` over Unix sockets in `directory`: this process's is `{name}.sock` (its pid
    by default); `enqueue` queues what the others send for this process's group commit."""

    def __init__(self, directory: Path, enqueue: Enqueue, name: str | None = None) -> None:
        self.name = name or str(os.getpid())
        self._dir = directory
        self._path = directory / f"{self.name}{_SUFFIX}"
        self._enqueue = enqueue
        self._server: asyncio.AbstractServer | None = None
        self._members: tuple[str, ...] = (self.name,)
        self._listed = float("-inf")
        self._down: dict[str, float] = {}
        self._owners: dict[StreamKey, str | None] = {}
        self._links: dict[str, _Link] = {}
        self._connecting: dict[str, asyncio.Future[_Link]] = {}
        self._served: set[_Channel] = set()
        self._answering: set[asyncio.Future[Outcome]] = set()
        self._probing: dict[str, asyncio.Task[None]] = {}  # silent processes, each probed
        self._closed = False
        self.forwarded = 0  # commands sent to their owner
        self.received = 0  # commands committed here for another process

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()  # left by a process that had this name (a pid reused)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._accepted, path=str(self._path))

    async def close(self, drain_seconds: float = 5.0) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()  # the others stop sending here at their next listing
        if self._server is not None:
            self._server.close()
        self._closed = True  # (no probe starts from here on)
        probes = list(self._probing.values())
        for probe in probes:
            probe.cancel()
        if probes:
            await asyncio.wait(probes)
        for link in list(self._links.values()):
            link.channel.close()
        self._links.clear()
        if self._answering:  # what was received is answered, as a draining server would
            await asyncio.wait(self._answering, timeout=drain_seconds)
        for channel in list(self._served):
            channel.close()

    # -- CommitPeers ---------------------------------------------------------------------------

    def owner(self, key: StreamKey) -> str | None:
        now = time.monotonic()
        if now - self._listed >= LIST_SECONDS:
            self._list(now)
        try:
            return self._owners[key]
        except KeyError:
            pass
        owner: str | None = None
        if len(self._members) > 1:
            text = "\0".join(key).encode()
            best = max(self._members, key=lambda member: _score(member, text))
            owner = None if best == self.name else best
        if len(self._owners) >= MAX_OWNERS:
            self._owners.clear()
        self._owners[key] = owner
        return owner

    async def submit(self, owner: Any, key: StreamKey, command: Command, seconds: float) -> Outcome:
        wire = _wire(command)
        link = await self._link(owner)
        deadline = time.monotonic() + seconds
        request = _Request(link.sent, (key.tenant, key.run_id, key.stream_id), wire, deadline)
        payload = _encode(request)
        if link.channel.closed:
            raise PeerUnavailable(f"the connection to process {owner} was lost")
        number, future = link.ask(payload)
        self.forwarded += 1
        timer = asyncio.get_running_loop().call_later(seconds, expire, future)
        try:
            return await future
        except Expired:
            self._silent(owner)
            raise Unanswered(_WHAT, seconds, outcome_unknown=True) from None
        except _Lost:
            raise Unanswered(_WHAT, seconds, outcome_unknown=True) from None
        finally:
            timer.cancel()
            link.pending.pop(number, None)

    # -- silent processes ----------------------------------------------------------------------

    def _silent(self, owner: str) -> None:
        """`owner` answered nothing in time: left out (its streams go to the others) until it
        answers a probe. An owner that is only slow (its commits wait on PostgreSQL) answers
        the first at once, so it is left out for that long, and nothing is logged."""
        if self._closed or owner in self._probing:
            return
        self._down[owner] = math.inf
        self._listed = float("-inf")
        self._probing[owner] = asyncio.get_running_loop().create_task(
            self._probe(owner), context=contextvars.Context()
        )

    async def _probe(self, owner: str) -> None:
        said = False
        try:
            while True:
                try:
                    link = await self._link(owner)
                    async with asyncio.timeout(PROBE_SECONDS):
                        await self._ping(link)
                    break
                except _Lost:
                    # It read the probe and closed the connection: alive (a process of an
                    # earlier version, which knows no probe, does so), or gone, which the next
                    # connection attempt finds.
                    break
                except (PeerUnavailable, TimeoutError):
                    if not (self._dir / f"{owner}{_SUFFIX}").exists():
                        return  # gone (its socket removed): the listing leaves it out
                    if not said:
                        said = True
                        log.warning(
                            "server process %s answers nothing: its streams are committed by "
                            "the others until it does",
                            owner,
                        )
                    await asyncio.sleep(PROBE_SECONDS)
            if said:
                log.warning("server process %s answers again", owner)
        finally:
            self._down.pop(owner, None)
            self._listed = float("-inf")
            self._probing.pop(owner, None)

    async def _ping(self, link: _Link) -> None:
        number, future = link.ask(_encode(_Request(link.sent, ("", "", ""), None)))
        try:
            await future
        finally:
            link.pending.pop(number, None)

    # -- the others ----------------------------------------------------------------------------

    def _list(self, now: float) -> None:
        self._listed = now
        try:
            found = [e.name for e in os.scandir(self._dir)]
        except OSError as error:
            log.warning("the server processes' directory could not be listed: %s", error)
            found = []
        names = [n[: -len(_SUFFIX)] for n in found if n.endswith(_SUFFIX)]
        members = tuple(sorted({self.name, *(n for n in names if self._down.get(n, 0.0) <= now)}))
        if members != self._members:
            self._members = members
            self._owners.clear()

    def _left_out(self, member: str, stale: bool) -> None:
        """`member` could not be reached: left out for a while (its socket removed if nothing
        listens on it: a process that is gone)."""
        self._down[member] = max(self._down.get(member, 0.0), time.monotonic() + DOWN_SECONDS)
        self._listed = float("-inf")  # its streams go to the others from the next request on
        if stale:
            with contextlib.suppress(OSError):
                (self._dir / f"{member}{_SUFFIX}").unlink()

    async def _link(self, owner: str) -> _Link:
        link = self._links.get(owner)
        if link is not None and not link.channel.closed:
            return link
        connecting = self._connecting.get(owner)
        if connecting is None:
            # In a context of its own, not the request's: the connection's callbacks run in
            # the context it was made in, and would log as that request for good.
            connecting = asyncio.get_running_loop().create_task(
                self._connect(owner), context=contextvars.Context()
            )
            self._connecting[owner] = connecting
            connecting.add_done_callback(lambda _: self._connecting.pop(owner, None))
        return await asyncio.shield(connecting)

    async def _connect(self, owner: str) -> _Link:
        path = str(self._dir / f"{owner}{_SUFFIX}")
        link = _Link()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_SECONDS):
                await loop.create_unix_connection(lambda: link.channel, path)
        except (ConnectionRefusedError, FileNotFoundError) as error:
            self._left_out(owner, stale=True)
            raise PeerUnavailable(f"process {owner} is not listening: {error}") from None
        except (OSError, TimeoutError) as error:
            self._left_out(owner, stale=False)
            raise PeerUnavailable(f"process {owner} could not be reached: {error}") from None
        self._links[owner] = link
        return link

    def _accepted(self) -> _Channel:
        channel = _Channel(self._command)
        self._served.add(channel)
        channel.on_lost = lambda: self._served.discard(channel)
        return channel

    def _command(self, channel: _Channel, frame: bytes) -> None:
        request = _requests.decode(frame)
        if request.command is None:  # a probe: this process answers
            channel.send(_encode(_Reply(request.number)))
            return
        self.received += 1
        deadline = math.inf if request.deadline is None else request.deadline
        future = self._enqueue(StreamKey(*request.key), _command(request.command), deadline)
        self._answering.add(future)
        number = request.number
        future.add_done_callback(lambda done: self._answer(channel, number, done))

    def _answer(self, channel: _Channel, number: int, done: asyncio.Future[Outcome]) -> None:
        self._answering.discard(done)
        channel.send(_encode(_reply(number, done)))
