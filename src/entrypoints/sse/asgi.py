"""A lean ASGI response for an event stream.

An idle subscriber costs what it holds while it waits, so this response holds little: the
byte stream and one task that writes it. The request's own task waits on `receive()` for the
client to leave. That order matters more than it looks: measured under granian with 1,000 idle
connections, a request task parked on `receive()` costs about 10 KB per connection, while one
parked on anything else (with the disconnect watched from a second task, as general streaming
responses do) costs about 28 KB.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator

from litestar.types import Receive, Scope, Send

from application.waiting import acts_like
from entrypoints.edge.writing import pieces

log = logging.getLogger("ductor_streams.sse")

# Frames are handed to the server in pieces of at most WRITE_BYTES (entrypoints/edge/writing.py
# says why), as every large answer is.
# A piece the client has not taken within this long ends the response: a subscriber that
# stopped reading holds no slot, no server shutdown and no follower for longer. It resumes
# with Last-Event-ID when it reads again. (One that vanished without a word while its stream
# was idle is found only once what is written fills the connection's buffers, or TCP gives
# up on it.)
WRITE_STALL_SECONDS = 30.0
# And a chunk (one delivery's events) must be taken within WRITE_STALL_SECONDS plus its size at
# this rate: a client that reads a piece every 20 s would otherwise hold its delivery, and its
# encoding, for as long as it liked (about 1.6 MB each).
WRITE_MIN_BYTES_PER_SECOND = 16 * 1024
# The writers of this application's event streams, ended when the server stops (`stop_all`).
_WRITERS = "event_stream_writers"


class EventStreamResponse:
    """Sends `chunks` as one chunked `200` response. Ends when the chunks end, when the client
    disconnects (the chunks are closed at once, which ends the subscription behind them) or when
    writing fails. Never raises for a client that left."""

    __slots__ = ("_chunks", "_headers")

    def __init__(
        self, chunks: AsyncGenerator[bytes, None], headers: list[tuple[bytes, bytes]]
    ) -> None:
        self._chunks = chunks
        self._headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_task = asyncio.current_task()
        assert request_task is not None
        listening = False

        def written(_: asyncio.Task[None]) -> None:
            if listening:  # everything was written: stop waiting for the client to leave
                request_task.cancel()

        try:
            await send({"type": "http.response.start", "status": 200, "headers": self._headers})
        except OSError:
            await self._chunks.aclose()
            return
        writer = asyncio.get_running_loop().create_task(self._write(send))
        acts_like(writer)  # its reads are the subscriber's, charged to its tenant
        writer.add_done_callback(written)
        writers = _writers(scope)
        writers.add(writer)
        writer.add_done_callback(writers.discard)
        try:
            listening = True
            while (await receive())["type"] != "http.disconnect":
                pass
        except asyncio.CancelledError:
            if not writer.done():
                raise  # cancelled from outside (the server is stopping)
            request_task.uncancel()
        finally:
            listening = False
            writer.cancel()
            await asyncio.wait([writer])

    async def _write(self, send: Send) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for chunk in self._chunks:
                taken_by = (
                    loop.time() + WRITE_STALL_SECONDS + len(chunk) / WRITE_MIN_BYTES_PER_SECOND
                )
                for piece in pieces(chunk):
                    async with asyncio.timeout_at(min(loop.time() + WRITE_STALL_SECONDS, taken_by)):
                        await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:  # before OSError, whose subclass it is
            log.info(
                "event stream ended: its client took nothing for %.0f s, or read slower than "
                "%d bytes a second",
                WRITE_STALL_SECONDS,
                WRITE_MIN_BYTES_PER_SECOND,
            )
        except OSError:
            pass  # the client left while we were writing
        except Exception:
            # The status line is out: nothing better can be answered. The client sees the
            # stream end without `closed` and resumes with Last-Event-ID.
            log.exception("event stream ended by an error")
        finally:
            await self._chunks.aclose()


def _writers(scope: Scope) -> set[asyncio.Task[None]]:
    state = getattr(scope.get("app"), "state", None)
    if state is None:
        return set()
    writers: set[asyncio.Task[None]] | None = getattr(state, _WRITERS, None)
    if writers is None:
        writers = set()
        setattr(state, _WRITERS, writers)
    return writers


def stop_all(state: object, grace_seconds: float = 1.0) -> None:
    """The server is stopping: the event streams still writing `grace_seconds` from now (a
    client that does not read keeps its writer waiting in `send`) are ended. The others have
    ended by then: their subscriptions were ended first."""
    writers: set[asyncio.Task[None]] = getattr(state, _WRITERS, set())

    def end() -> None:
        for writer in list(writers):
            writer.cancel()

    asyncio.get_running_loop().call_later(grace_seconds, end)
