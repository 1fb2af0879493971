"""A stream's appends committed by one process of the host, its owner, whichever process took
them (adapters/peers.py over real Unix sockets, the group commit on memory adapters)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from adapters import peers as peers_module
from adapters.memory.streams import MemoryStreams
from adapters.peers import UnixPeers
from application.append_records import ProduceCommand, Produced
from application.group_commit import GroupCommit
from application.ports import Command, Done, Failed, Outcome, PeerUnavailable, Replayed
from application.tenant_limits import TenantRoom
from application.views import AppendAnswer, Credit
from application.waiting import Unanswered
from domain import errors
from domain.producers import ProducerClaim
from domain.stream import StreamKey
from tests.support.builders import NOW, WRITER, append, definition, new_key, record

Enqueue = Callable[[StreamKey, Command, float], "asyncio.Future[Outcome]"]


def answering(outcome: Outcome | BaseException | None) -> Enqueue:
    """An owner that answers every command so (None: never)."""

    def enqueue(key: StreamKey, command: Command, deadline: float) -> asyncio.Future[Outcome]:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        elif outcome is not None:
            future.set_result(outcome)
        return future

    return enqueue


@pytest.fixture
async def started() -> AsyncIterator[list[UnixPeers]]:
    """Peers started in the test, closed after it."""
    running: list[UnixPeers] = []
    yield running
    for peers in running:
        await peers.close(drain_seconds=0.1)  # (some owners here never answer)


async def pair(
    directory: Path, started: list[UnixPeers], enqueue: Enqueue
) -> tuple[UnixPeers, UnixPeers]:
    """`a` (which asks) and `b` (which answers with `enqueue`)."""
    a = UnixPeers(directory, answering(None), name="a")
    b = UnixPeers(directory, enqueue, name="b")
    for peers in (a, b):
        await peers.start()
        started.append(peers)
    return a, b


def owned_by(peers: UnixPeers, owner: str | None) -> StreamKey:
    return next(k for k in (new_key() for _ in range(1000)) if peers.owner(k) == owner)


async def test_every_process_names_the_same_owner_and_each_owns_some_streams(
    tmp_path: Path, started: list[UnixPeers]
) -> None:
    a, b = await pair(tmp_path, started, answering(None))
    keys = [new_key() for _ in range(200)]
    from_a = [a.owner(k) or "a" for k in keys]
    from_b = [b.owner(k) or "b" for k in keys]
    assert from_a == from_b
    assert 50 < from_a.count("a") < 150  # spread, not all on one


async def test_a_lone_process_commits_every_stream_itself(tmp_path: Path) -> None:
    alone = UnixPeers(tmp_path, answering(None), name="alone")
    await alone.start()
    try:
        assert all(alone.owner(new_key()) is None for _ in range(100))
    finally:
        await alone.close(drain_seconds=0.1)


async def test_an_append_and_a_durable_streams_write_come_back_with_their_answers(
    tmp_path: Path, started: list[UnixPeers]
) -> None:
    credit = Credit(unread_items=1, unread_bytes=2, max_unread_items=3, max_unread_bytes=4)
    appended = AppendAnswer(first_sequence=3, last_sequence=3, head=3, credit=credit)
    seen: list[Command] = []

    def enqueue(key: StreamKey, command: Command, deadline: float) -> asyncio.Future[Outcome]:
        seen.append(command)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        answer = appended if len(seen) == 1 else Produced(4, True, False, 1, 7)
        future.set_result(Done([], answer))
        return future

    a, _ = await pair(tmp_path, started, enqueue)
    key = owned_by(a, "b")
    sent = append([record(b'{"n":1}'), record(b'"two"')], key="idem-1")
    assert await a.submit("b", key, sent, 2.0) == Done([], appended)
    claim = ProducerClaim("p", 1, 7)
    produce = ProduceCommand(WRITER, [record()], NOW, producer=claim, writer_seq="s1", close=True)
    assert await a.submit("b", key, produce, 2.0) == Done([], Produced(4, True, False, 1, 7))
    got_append, got_produce = seen
    assert (got_append.caller, got_append.records, got_append.idempotency, got_append.now) == (
        sent.caller,
        sent.records,
        sent.idempotency,
        sent.now,
    )
    assert isinstance(got_produce, ProduceCommand)
    assert (got_produce.producer, got_produce.writer_seq, got_produce.close) == (claim, "s1", True)
    # Without a limit on the tenants' bytes, they carry no room.
    assert getattr(got_append, "tenant_room", None) is None


async def test_a_forwarded_write_carries_its_tenant_room_and_charge_to_its_decision(
    tmp_path: Path, started: list[UnixPeers]
) -> None:
    """The owner decides the tenant's limit with the room the receiving process saw: a write
    forwarded without it would pass the limit under `--workers N`."""
    seen: list[Command] = []
    credit = Credit(unread_items=1, unread_bytes=2, max_unread_items=3, max_unread_bytes=4)
    appended = AppendAnswer(first_sequence=1, last_sequence=1, head=1, credit=credit)

    def enqueue(key: StreamKey, command: Command, deadline: float) -> asyncio.Future[Outcome]:
        seen.append(command)
        answer = appended if len(seen) == 1 else Produced(2, False, False, None, None)
        return answering(Done([], answer, stored=131))(key, command, deadline)

    a, _ = await pair(tmp_path, started, enqueue)
    key = owned_by(a, "b")
    room = TenantRoom(held=90, limit=100)
    sent = append([record(b'"x"')])
    sent.tenant_room = room  # type: ignore[attr-defined]
    sent.copies = 700  # an input stream's: its wait events' charge
    produce = ProduceCommand(WRITER, [record()], NOW)
    produce.tenant_room = room  # type: ignore[attr-defined]
    produce.copies = 800
    outcomes = [await a.submit("b", key, command, 2.0) for command in (sent, produce)]
    assert [getattr(c, "tenant_room", None) for c in seen] == [room, room]
    assert [c.copies for c in seen] == [700, 800]
    # What it stored comes back, for the receiving process to count.
    assert [o.stored for o in outcomes if isinstance(o, Done)] == [131, 131]


async def test_a_refusal_and_a_replay_come_back_as_themselves(
    tmp_path: Path, started: list[UnixPeers]
) -> None:
    refusal = errors.Backpressure("full", retry_after=3, unread_items=5)
    a, _ = await pair(tmp_path, started, answering(Failed(refusal)))
    outcome = await a.submit("b", owned_by(a, "b"), append(), 2.0)
    assert isinstance(outcome, Failed) and isinstance(outcome.error, errors.Backpressure)
    assert (outcome.error.detail, outcome.error.retry_after) == ("full", 3)
    assert outcome.error.extra == {"unread_items": 5}
    b2 = UnixPeers(tmp_path, answering(Replayed(b'{"head":1}')), name="c")
    await b2.start()
    started.append(b2)
    assert await a.submit("c", new_key(), append(), 2.0) == Replayed(b'{"head":1}')


async def test_what_the_owners_commit_raised_is_raised_where_the_append_was_received(
    tmp_path: Path, started: list[UnixPeers]
) -> None:
    silent = Unanswered("the database", 5.0, outcome_unknown=True)
    a, _ = await pair(tmp_path, started, answering(silent))
    with pytest.raises(Unanswered) as raised:
        await a.submit("b", owned_by(a, "b"), append(), 2.0)
    assert raised.value.outcome_unknown and raised.value.what == "the database"


class Odd(Exception):
    """Pickles as Odd(message), which cannot be loaded."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a} {b}")


@pytest.mark.parametrize(
    ("answer", "seconds"),
    [(Odd(1, 2), 2.0), (None, 0.2)],
    ids=["an error that cannot cross", "no answer in time"],
)
async def test_an_answer_that_cannot_be_had_is_of_unknown_outcome(
    tmp_path: Path, started: list[UnixPeers], answer: Exception | None, seconds: float
) -> None:
    a, _ = await pair(tmp_path, started, answering(answer))
    with pytest.raises(Unanswered) as raised:
        await a.submit("b", owned_by(a, "b"), append(), seconds)
    assert raised.value.outcome_unknown


async def test_an_owner_gone_after_the_command_was_sent_is_of_unknown_outcome(
    tmp_path: Path, started: list[UnixPeers]
) -> None:
    a, b = await pair(tmp_path, started, answering(None))
    asking = asyncio.create_task(a.submit("b", owned_by(a, "b"), append(), 5.0))
    await asyncio.sleep(0.1)
    await b.close(drain_seconds=0.1)  # (nothing answered: its connection closes under it)
    with pytest.raises(Unanswered) as raised:
        await asyncio.wait_for(asking, 2.0)
    assert raised.value.outcome_unknown


async def test_a_silent_owner_is_left_out_until_it_answers_a_probe_again(
    tmp_path: Path, started: list[UnixPeers], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner that answers nothing within a request's budget (a process stopped, or its loop
    stuck) keeps its connection open: its streams go to the others from then on, not one
    request's budget at a time for as long as it is silent, and come back once it answers."""
    monkeypatch.setattr(peers_module, "PROBE_SECONDS", 0.05)
    credit = Credit(unread_items=1, unread_bytes=2, max_unread_items=3, max_unread_bytes=4)
    appended = AppendAnswer(first_sequence=1, last_sequence=1, head=1, credit=credit)
    a, b = await pair(tmp_path, started, answering(Done([], appended)))
    key = owned_by(a, "b")
    assert (await a.submit("b", key, append(), 2.0)).answer == appended  # (connected)
    for channel in b._served:  # b stops: it reads nothing more, and closes nothing
        assert channel.transport is not None
        channel.transport.pause_reading()
    with pytest.raises(Unanswered) as raised:
        await a.submit("b", key, append(), 0.2)
    assert raised.value.outcome_unknown
    assert a.owner(key) is None  # its streams are a's to commit meanwhile
    await asyncio.sleep(0.3)
    assert a.owner(key) is None  # (probed, and still silent)
    for channel in b._served:
        assert channel.transport is not None
        channel.transport.resume_reading()
    for _ in range(40):
        await asyncio.sleep(0.05)
        if a.owner(key) == "b":
            break
    assert a.owner(key) == "b"  # back, once it answered a probe
    assert (await a.submit("b", key, append(), 2.0)).answer == appended


async def test_an_owner_only_slow_to_commit_answers_its_probe_and_keeps_its_streams(
    tmp_path: Path,
    started: list[UnixPeers],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An owner whose commits wait (on PostgreSQL, say) but whose event loop runs answers the
    probe at once: its streams come back to it within the probe, and no process is said to be
    silent (a slow database would otherwise flood the log, blaming the peers)."""
    monkeypatch.setattr(peers_module, "PROBE_SECONDS", 0.05)
    a, _ = await pair(tmp_path, started, answering(None))  # (commits that never end)
    key = owned_by(a, "b")
    with pytest.raises(Unanswered):
        await a.submit("b", key, append(), 0.2)
    for _ in range(20):
        await asyncio.sleep(0.05)
        if a.owner(key) == "b":
            break
    assert a.owner(key) == "b"
    assert "answers nothing" not in caplog.text


async def test_a_process_that_is_gone_is_left_out_and_its_streams_go_to_the_others(
    tmp_path: Path, started: list[UnixPeers]
) -> None:
    a, _ = await pair(tmp_path, started, answering(None))
    # A process killed without closing leaves its socket file, with nothing listening on it.
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(tmp_path / "z.sock"))
    dead.close()
    a._listed = float("-inf")  # (as a second later)
    key = owned_by(a, "z")
    with pytest.raises(PeerUnavailable):
        await a.submit("z", key, append(), 2.0)
    assert not (tmp_path / "z.sock").exists()
    assert a.owner(key) in (None, "b")


async def test_a_command_that_is_not_an_append_is_committed_where_it_was_received(
    tmp_path: Path, started: list[UnixPeers]
) -> None:
    a, _ = await pair(tmp_path, started, answering(None))

    class Other:
        records = ()

    with pytest.raises(PeerUnavailable):
        await a.submit("b", owned_by(a, "b"), Other(), 2.0)  # type: ignore[arg-type]


async def test_appends_taken_by_two_processes_are_committed_by_each_streams_owner(
    tmp_path: Path, started: list[UnixPeers], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two group commits over one store, as two processes over one PostgreSQL: every append
    is committed by its stream's owner, in groups, and each stream's sequences are
    contiguous."""
    # A connection not made within 0.5 s leaves its owner out for a second (its appends are
    # committed where they were taken): a loaded machine made that happen here, once.
    monkeypatch.setattr(peers_module, "CONNECT_SECONDS", 30.0)
    streams = MemoryStreams()
    commits = {name: GroupCommit(streams) for name in ("a", "b")}
    for name, group in commits.items():
        peers = UnixPeers(tmp_path, group.enqueue_until, name=name)
        await peers.start()
        started.append(peers)
        group.forward_to(peers)
    keys = [new_key() for _ in range(8)]
    for key in keys:
        await streams.create(key, definition(), NOW)
    # Each stream's requests are taken by both processes, half by each.
    requests = [(commits["ab"[i // 8 % 2]], keys[i % 8]) for i in range(400)]
    outcomes = await asyncio.gather(*(group.submit(key, append()) for group, key in requests))
    assert all(type(o) is Done for o in outcomes)
    a_peers, b_peers = started
    # Those taken by the process that does not own their stream: 25 of each stream's 50.
    assert a_peers.forwarded + b_peers.forwarded == a_peers.received + b_peers.received == 200
    counted = {name: group.throughput.counts for name, group in commits.items()}
    owners = {key: a_peers.owner(key) or "a" for key in keys}
    for name in ("a", "b"):  # each commits exactly the appends of the streams it owns
        owned = sum(1 for _, key in requests if owners[key] == name)
        assert sum(count for count, _ in counted[name].values()) == owned
    for key in keys:
        sequences = sorted(
            o.answer.first_sequence
            for o, (_, k) in zip(outcomes, requests, strict=True)
            if k == key and type(o) is Done
        )
        assert sequences == list(range(1, len(sequences) + 1))


async def test_an_owner_out_of_reach_leaves_the_append_to_the_process_that_took_it(
    tmp_path: Path,
) -> None:
    streams = MemoryStreams()
    here = GroupCommit(streams)

    class Unreachable:
        def owner(self, key: StreamKey) -> str:
            return "elsewhere"

        async def submit(
            self, owner: object, key: StreamKey, command: Command, s: float
        ) -> Outcome:
            raise PeerUnavailable("not listening")

    here.forward_to(Unreachable())
    key = new_key()
    await streams.create(key, definition(), NOW)
    outcome = await here.submit(key, append())
    assert type(outcome) is Done and outcome.answer.first_sequence == 1
    assert sum(count for count, _ in here.throughput.counts.values()) == 1


async def test_a_command_its_sender_stopped_waiting_for_never_commits_at_its_owner(
    tmp_path: Path, started: list[UnixPeers]
) -> None:
    """An owner that takes a forwarded append up only after its sender's budget (a stalled
    process, its socket read after the pause) drops it: the sender answered 503, and the
    append must not land after what its client wrote next. One taken up in time commits."""
    streams = MemoryStreams()
    owner = GroupCommit(streams)
    stalled = asyncio.Event()
    received: list[asyncio.Future[Outcome]] = []

    def enqueue(key: StreamKey, command: Command, deadline: float) -> asyncio.Future[Outcome]:
        future = owner.enqueue_until(key, command, deadline)
        received.append(future)
        return future

    a, _ = await pair(tmp_path, started, enqueue)
    key = owned_by(a, "b")
    await streams.create(key, definition(), NOW)
    # The owner's leader is held up (a commit that does not end) while the sender waits 0.2 s.
    real_update = streams.update

    async def held(*args, **kwargs):  # type: ignore[no-untyped-def]
        await stalled.wait()
        return await real_update(*args, **kwargs)

    streams.update = held  # type: ignore[method-assign]
    first = asyncio.ensure_future(a.submit("b", key, append([record(b'"first"')]), 5.0))
    await asyncio.sleep(0.2)  # the leader took `first` and waits in its commit
    with pytest.raises(Unanswered) as late:
        await a.submit("b", key, append([record(b'"late"')]), 0.2)
    assert late.value.outcome_unknown  # to the sender, as any answer it did not get
    stalled.set()
    assert type(await first) is Done
    # `late` waited in the queue behind the held commit past its sender's deadline: dropped.
    with pytest.raises(Unanswered):
        await received[1]
    found = await streams.page(key, 0, 10)
    assert found is not None and [r.sequence for r in found[1]] == [1]  # `first` alone


async def test_a_command_late_on_arrival_or_when_its_leader_goes_on_never_commits() -> None:
    """Read from the socket after a stall, a command whose sender stopped waiting is never
    queued; one queued in time, whose deadline passes while its leader is held, is dropped as
    the leader goes on, even before its timer runs."""
    import time as clock

    streams = MemoryStreams()
    owner = GroupCommit(streams)
    key = new_key()
    await streams.create(key, definition(), NOW)
    past = clock.monotonic() - 5
    late = [owner.enqueue_until(key, append([record()]), past) for _ in range(2)]
    for future in late:
        with pytest.raises(Unanswered):
            await future
    # A leader held in its commit while the next command's deadline passes.
    held = asyncio.Event()
    real_update_many = streams.update_many

    async def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        await held.wait()
        return await real_update_many(*args, **kwargs)

    streams.update_many = slow  # type: ignore[method-assign]
    first = owner.enqueue_until(key, append([record()]), clock.monotonic() + 30)
    await asyncio.sleep(0.05)  # the leader took `first`, and waits
    owner._drop = lambda *_: None  # type: ignore[method-assign]  # its timer does nothing
    second = owner.enqueue_until(key, append([record()]), clock.monotonic() + 0.1)
    await asyncio.sleep(0.2)  # past `second`'s deadline; the leader still held
    held.set()
    assert type(await first) is Done
    with pytest.raises(Unanswered):
        await second
    found = await streams.page(key, 0, 10)
    assert found is not None and [r.sequence for r in found[1]] == [1]
