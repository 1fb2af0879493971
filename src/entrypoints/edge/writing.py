"""Large answers written in pieces, within a bound, and charged to their tenant while written.

granian takes a response body handed to it in one `send` whole, and holds it until its client
has read it: a client that sends `GET …/records?limit=1000` on a stream of large records and
never reads kept each 4 MiB page in the server, for as long as it kept the connection open.
With 2,500 such connections the server held 9 GB, and its shutdown waited for them. So a body
larger than WRITE_BYTES is handed over in pieces of that size (granian holds back a response's
sends once a few wait for a client that does not read), and:

- a piece the client has not taken within WRITE_STALL_SECONDS, or a body not taken within that
  plus its size at WRITE_MIN_BYTES_PER_SECOND, ends the answer: its connection is closed, and
  what it held is freed (`AnswerTooSlow`, an OSError: the client is treated as gone);
- while it is written, its bytes count against its tenant (application/waiting.py,
  `answer_writing`): past DUCTOR_STREAMS_MAX_ANSWER_BYTES_PER_TENANT of them, the tenant's next
  requests are refused 429 at once, before any work is done for them;
- when the server stops, the answers still being written a second later are ended
  (`stop_all`), so that a client that does not read cannot hold the shutdown.

Event streams write their frames the same way (entrypoints/sse/asgi.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from application import waiting

log = logging.getLogger("ductor_streams.http")

# The most one `send` hands the server. granian stops a response's sends once a few messages
# wait for a client that does not read, whatever their size: a delivery of 130 records of 60 KB
# (one 7.8 MB message) held about 47 MB per stalled subscriber; in pieces of this size, a few
# hundred KB.
WRITE_BYTES = 64 * 1024
# A piece the client has not taken within this long ends the answer
# (DUCTOR_STREAMS_ANSWER_STALL_SECONDS: `configure`).
WRITE_STALL_SECONDS = 30.0
_stall = [WRITE_STALL_SECONDS]
# And a body must be taken within WRITE_STALL_SECONDS plus its size at this rate: a client that
# reads a piece every 20 s would otherwise hold it for as long as it liked.
WRITE_MIN_BYTES_PER_SECOND = 16 * 1024

# The tasks writing a large answer now: ended when the server stops (`stop_all`).
_writing: set[asyncio.Task[Any]] = set()

Send = Callable[[Any], Awaitable[None]]


def configure(stall_seconds: float) -> None:
    _stall[0] = stall_seconds


class AnswerTooSlow(ConnectionAbortedError):
    """The client did not take its answer in time (or the server is stopping): the answer ends,
    its connection closed. An OSError, as a client gone is: nothing else is answered."""


def cut_short(error: BaseException, _depth: int = 0) -> bool:
    """Whether `error` is an answer cut short (`AnswerTooSlow`), as raised or as the cause of
    what a framework made of it (Litestar: "Exception caught after response started"; a
    streamed answer, an object's body, is written from an anyio task group, which raises an
    ExceptionGroup). Only an explicit cause is followed, and a group only when every error in
    it was cut short: an error raised while one was being handled is an error of its own."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None or _depth > 8:
            return False
        if isinstance(seen, AnswerTooSlow):
            return True
        if isinstance(seen, BaseExceptionGroup):
            return all(cut_short(inner, _depth + 1) for inner in seen.exceptions)
        seen = seen.__cause__
    return False


def pieces(body: bytes) -> Iterator[bytes]:
    """`body` as pieces of at most WRITE_BYTES (itself, when it is no larger), each copied
    only when it is sent: a stalled client holds one piece, not a copy of the whole body."""
    if len(body) <= WRITE_BYTES:
        yield body
        return
    view = memoryview(body)
    for start in range(0, len(body), WRITE_BYTES):
        yield bytes(view[start : start + WRITE_BYTES])


async def in_pieces(send: Send, message: dict) -> None:
    """`message` (an `http.response.body` larger than WRITE_BYTES) sent as pieces, within its
    bounds, its bytes charged to the request's tenant while they are written."""
    body = message["body"]
    more = message.get("more_body", False)
    loop = asyncio.get_running_loop()
    stall = _stall[0]
    taken_by = loop.time() + stall + len(body) / WRITE_MIN_BYTES_PER_SECOND
    task = asyncio.current_task()
    assert task is not None
    try:
        charged = waiting.answer_writing(len(body))
    except waiting.AnswersNotTaken:
        # Its tenant's answers not taken are at their cap: this one is not written at all (its
        # status line is out; its connection is closed, and what it held freed at once).
        raise AnswerTooSlow("this tenant's answers not yet taken are at their cap") from None
    _writing.add(task)
    last = (len(body) - 1) // WRITE_BYTES  # (the last piece says whether more follows)
    try:
        for n, piece in enumerate(pieces(body)):
            going_on = more or n < last
            try:
                async with asyncio.timeout_at(min(loop.time() + stall, taken_by)):
                    await send({"type": "http.response.body", "body": piece, "more_body": going_on})
            except TimeoutError:
                log.info(
                    "answer ended: its client took nothing for %.0f s, or read slower than %d "
                    "bytes a second",
                    stall,
                    WRITE_MIN_BYTES_PER_SECOND,
                )
                raise AnswerTooSlow("the client did not take its answer in time") from None
            except asyncio.CancelledError:
                if task.cancelling() and task in _ended:
                    _ended.discard(task)
                    task.uncancel()
                    raise AnswerTooSlow("the server is stopping") from None
                raise
    finally:
        _writing.discard(task)
        _ended.discard(task)
        waiting.answer_written(charged)


_ended: set[asyncio.Task[Any]] = set()


def stop_all(grace_seconds: float = 1.0) -> None:
    """The server is stopping: the large answers still being written `grace_seconds` from now
    (a client that does not read keeps its request waiting in `send`) are ended."""

    def end() -> None:
        for task in list(_writing):
            _ended.add(task)
            task.cancel()

    asyncio.get_running_loop().call_later(grace_seconds, end)
