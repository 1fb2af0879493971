"""A request's body under the route's limit, and what is left of it after the answer.

A body over the limit is refused 413 (or, past an object intent's size, 422) and the
connection closed; up to LINGER_LIMIT of the rest is still read first (for at most
LINGER_SECONDS), so that a client that writes a body a little over the limit before reading
gets its answer rather than a reset; a longer rest is not read at all. Any other body the
handler did not read (it failed before reading it all) is read to its end, bounded in bytes,
idle time and total time, for the same reason."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from typing import Any

from entrypoints.edge.head import RequestHead
from entrypoints.edge.paths import NATIVE_PREFIX
from entrypoints.edge.problems import BodyCutShort, BodyTimedOut, BodyTooLarge

DRAIN_LIMIT = 64 * 1024 * 1024
DRAIN_IDLE_SECONDS = 1.0
DRAIN_SECONDS = 30.0  # a rest that drips is not drained for longer
LINGER_LIMIT = 16 * 1024 * 1024
LINGER_SECONDS = 5.0


class Body:
    """The body of one request, as its messages arrive: how much came and whether it ended."""

    __slots__ = ("_receive", "done", "head", "received")

    def __init__(self, receive: Any, head: RequestHead) -> None:
        self._receive = receive
        self.head = head
        self.received = 0
        self.done = not head.has_body

    async def receive(self) -> dict:
        """The next message, counted (what a framework reading the body is handed)."""
        message = await self._receive()
        self.received += len(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.done = True
        return message

    async def read(self, limit: int) -> bytes:
        """The whole body, or BodyTooLarge past `limit` (declared or sent), or BodyCutShort if
        the client went away before its end."""
        head = self.head
        if head.declared is not None and head.declared > limit:
            raise BodyTooLarge
        chunks: list[bytes] = []
        while True:
            message = await self._receive()
            if message["type"] == "http.request":
                piece = message.get("body", b"")
                more = message.get("more_body", False)
                if piece:
                    self.received += len(piece)
                    if self.received > limit:
                        # Read to its end already (uvicorn hands over what it has): then the
                        # connection is kept.
                        self.done = not more
                        raise BodyTooLarge
                    chunks.append(piece)
                if not more or (self.received == head.declared and head.lengths == 1):
                    # All the one Content-Length said (and no Transfer-Encoding): the server's
                    # closing message (an empty one, from granian) is not waited for, a receive
                    # saved.
                    self.done = True
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            elif message["type"] == "http.disconnect":
                self.done = True
                raise BodyCutShort

    def closes(self, status: int) -> bool:
        """Whether the answer closes the connection: a 413 or 422 before the body's end (a body
        refused as it passed a size: its rest is not what the client meant to send), or a 408
        (the body stopped coming)."""
        return status in (408, 413, 422) and not self.done

    async def finish(self, status: int) -> None:
        """Read what is left of the body after the answer `status`, as the module says."""
        if self.done or self.head.closing or status == 408:
            return
        if status in (413, 422):
            declared = self.head.declared
            left = None if declared is None else declared - self.received
            if left is not None and left > LINGER_LIMIT:
                return
            limit, seconds = LINGER_LIMIT, LINGER_SECONDS
        else:
            limit, seconds = DRAIN_LIMIT, DRAIN_SECONDS
        drained = 0
        # A client that stops sending (it read the answer early) is not waited for long, nor
        # one that drips past its body's deadline (`with_body_deadlines`).
        with contextlib.suppress(TimeoutError, BodyTimedOut):
            async with asyncio.timeout(seconds):
                while not self.done and drained < limit:
                    async with asyncio.timeout(DRAIN_IDLE_SECONDS):
                        drained += len((await self.receive()).get("body", b""))


_WRITES = frozenset({"POST", "PUT", "PATCH"})
# The object upload route (the one body streamed to a store, not held whole): the idle bound
# only. Matched whole, since "body" is a valid stream or subscription ID too.
_UPLOAD = re.compile(re.escape(NATIVE_PREFIX) + r"/runs/[^/]+/streams/[^/]+/objects/[^/]+/body")


class _Watch:
    """The requests of this process waiting for a body's next piece, each with when it must
    come, checked twice a second by one timer (armed only while some wait): a timer per wait
    (`asyncio.timeout`) cost 4.8 µs per append, a wait registered here about a tenth of that. A
    wait found past its time has its task cancelled; the wait itself turns that into
    BodyTimedOut. A bound may so be passed by up to half a second."""

    TICK_SECONDS = 0.5

    def __init__(self) -> None:
        self.waiting: dict[asyncio.Task[Any], float] = {}
        self.expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is None:
            self._timer = loop.call_later(self.TICK_SECONDS, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        for task, deadline in list(self.waiting.items()):
            if deadline <= now and task not in self.expired:
                self.expired.add(task)
                task.cancel()
        if self.waiting:
            self.arm(loop)


def with_body_deadlines(app: Any, idle_seconds: float, total_seconds: float) -> Any:
    """Each request's body must keep coming: a wait of more than `idle_seconds` for its next
    piece, or a body not complete `total_seconds` after the request arrived, ends the request
    (BodyTimedOut: 408, and the connection closed). A body a handler reads whole is held in
    memory while it arrives, so a client that stops sending, or drips, would hold it there for
    as long as it liked. An object upload, streamed to the store (`PUT …/body`), has the idle
    bound only: 32 MiB may take a slow link a while. Once the body is complete, `receive` is
    not bounded (an event stream waits on it for the client to leave)."""
    watch = _Watch()

    async def bounded(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in _WRITES:
            # No route reads the body of another method: an event stream's GET waits on
            # `receive` for its client to leave, whatever its head declared.
            await app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = math.inf
        if not (scope["method"] == "PUT" and _UPLOAD.fullmatch(scope["path"])):
            deadline = loop.time() + total_seconds
        complete = False

        async def timed_receive() -> dict:
            nonlocal complete
            if complete:
                return await receive()
            task = asyncio.current_task()
            assert task is not None
            watch.waiting[task] = min(loop.time() + idle_seconds, deadline)
            watch.arm(loop)
            try:
                message = await receive()
            except asyncio.CancelledError:
                if task not in watch.expired:
                    raise
                watch.expired.discard(task)
                task.uncancel()
                raise BodyTimedOut from None
            finally:
                del watch.waiting[task]
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        await app(scope, timed_receive, send)

    return bounded
