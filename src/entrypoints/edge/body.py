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

from application import waiting
from application.waiting import acting_for, stop_acting
from entrypoints.edge.head import RequestHead
from entrypoints.edge.paths import NATIVE_PREFIX
from entrypoints.edge.problems import BodyCutShort, BodyTimedOut, BodyTooLarge, TooManyBodies

DRAIN_LIMIT = 64 * 1024 * 1024
DRAIN_IDLE_SECONDS = 1.0
DRAIN_SECONDS = 30.0  # a rest that drips is not drained for longer
LINGER_LIMIT = 16 * 1024 * 1024
LINGER_SECONDS = 5.0
# A body is held to its minimum rate (`with_body_deadlines`) from this long after the handler
# first reads it (not from the request's arrival: a handler that reads late is no slow client),
# so a client's first bytes may come after a slow start.
RATE_GRACE_SECONDS = 5.0


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
        (the body stopped coming), or a 429 refused before it was read (`TenantBodies`)."""
        return status in (408, 413, 422, 429) and not self.done

    async def finish(self, status: int) -> None:
        """Read what is left of the body after the answer `status`, as the module says."""
        if self.done or self.head.closing or status in (408, 429):
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
        # What is drained after the answer is no tenant's: not admitted against its caps. One
        # already charged and refused past its bytes (TooManyBodies) just stops being drained.
        stop_acting()
        # A client that stops sending (it read the answer early) is not waited for long, nor
        # one that drips past its body's deadline (`with_body_deadlines`).
        with contextlib.suppress(TimeoutError, BodyTimedOut, TooManyBodies):
            async with asyncio.timeout(seconds):
                while not self.done and drained < limit:
                    async with asyncio.timeout(DRAIN_IDLE_SECONDS):
                        drained += len((await self.receive()).get("body", b""))


# The methods whose requests carry a body (no route reads the body of another).
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def body_coming(scope: Any) -> bool:
    """Whether the request's head announces a body (of a method whose body a route reads)."""
    return scope["method"] in BODY_METHODS and RequestHead(scope["headers"]).has_body


# The object upload route (the one body streamed to a store, not held whole): the idle bound
# only. Matched whole, since "body" is a valid stream or subscription ID too.
_UPLOAD = re.compile(re.escape(NATIVE_PREFIX) + r"/runs/[^/]+/streams/[^/]+/objects/[^/]+/body")


def streamed_body(scope: Any) -> bool:
    """Whether the request is an object upload (its body streamed to the store as it comes)."""
    return scope["method"] == "PUT" and _UPLOAD.fullmatch(scope["path"]) is not None


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


def _whole_at(headers: list[tuple[bytes, bytes]]) -> int | None:
    """How many bytes make the body whole: its one Content-Length, without Transfer-Encoding
    (as `Body.read` takes it: it stops reading there)."""
    length = None
    for name, value in headers:
        if name == b"content-length":
            if length is not None:
                return None
            length = value
        elif name == b"transfer-encoding":
            return None
    return int(length) if length is not None and length.isdigit() and len(length) < 19 else None


class TenantBodies:
    """Per tenant, on this process: its request bodies arriving, and the bytes of its bodies
    held (a body a handler reads whole is in memory until its request ends). Past either cap
    the tenant's next body is refused (TooManyBodies: 429) before it is read, so that one
    tenant's slow or large bodies cannot take the server's connections or memory from the
    others. Tenants with nothing arriving or held are not kept."""

    def __init__(self, max_arriving: int, max_bytes: int) -> None:
        self.max_arriving = max_arriving
        self.max_bytes = max_bytes
        self.arriving: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self.refused = 0

    def admit(self, tenant: str) -> None:
        if (
            self.arriving.get(tenant, 0) >= self.max_arriving
            or self.held.get(tenant, 0) >= self.max_bytes
        ):
            self.refused += 1
            raise TooManyBodies
        self.arriving[tenant] = self.arriving.get(tenant, 0) + 1

    def hold(self, tenant: str, size: int) -> None:
        held = self.held[tenant] = self.held.get(tenant, 0) + size
        if held > self.max_bytes:
            self.refused += 1
            raise TooManyBodies

    def arrived(self, tenant: str) -> None:
        if (left := self.arriving[tenant] - 1) > 0:
            self.arriving[tenant] = left
        else:
            del self.arriving[tenant]

    def release(self, tenant: str, size: int) -> None:
        if not size:
            return
        if (left := self.held[tenant] - size) > 0:
            self.held[tenant] = left
        else:
            del self.held[tenant]


def with_body_deadlines(
    app: Any,
    idle_seconds: float,
    total_seconds: float,
    min_rate: float = 0.0,
    bodies: TenantBodies | None = None,
) -> Any:
    """Each request's body must keep coming: a wait of more than `idle_seconds` for its next
    piece, or a body not complete `total_seconds` after the request arrived, ends the request
    (BodyTimedOut: 408, and the connection closed). A body a handler reads whole is held in
    memory while it arrives, so a client that stops sending, or drips, would hold it there for
    as long as it liked. An object upload, streamed to the store (`PUT …/body`), has the idle
    bound only: 32 MiB may take a slow link a while. Once the body is complete, `receive` is
    not bounded (an event stream waits on it for the client to leave).

    `min_rate`: from RATE_GRACE_SECONDS after its first read, a body (an upload's too) must have
    come at this many bytes a second on average since that read, or it ends the same way: a
    body dripping a byte every few seconds stays within the idle bound, and such requests held
    by the thousand would take every connection the server accepts (its in-flight cap) for two
    minutes each.

    `bodies`: a body is charged to the tenant its request authenticated as (`acting_for`,
    known by the time a handler reads it), counted while it arrives and its bytes while its
    request lasts (an upload's streamed bytes are not held); past the tenant's caps it is
    refused before it is read. Every route that reads a body authenticates first (a webhook
    callback or a pull-wake ack checks its wake token's signature, and acts for its tenant,
    before its body), so a request with no valid token holds none of its body."""
    watch = _Watch()

    async def bounded(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            # No route reads the body of another method: an event stream's GET waits on
            # `receive` for its client to leave, whatever its head declared.
            await app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        arrived_at = loop.time()
        deadline = math.inf
        upload = streamed_body(scope)
        if not upload:
            deadline = arrived_at + total_seconds
        paced_from = math.inf  # from the first read: a handler that reads late is no slow client
        complete = False
        whole_at = _whole_at(scope["headers"])
        received = 0
        tenant: str | None = None
        held = 0
        counted = False
        first = True
        stop_acting()  # not for a tenant an earlier request of this task named

        async def timed_receive() -> dict:
            nonlocal complete, received, tenant, held, counted, first, paced_from
            if complete:
                return await receive()
            if first:
                first = False
                paced_from = loop.time()
                if bodies is not None and (tenant := acting_for()) is not None:
                    bodies.admit(tenant)  # TooManyBodies: 429, nothing read
                    counted = True
            task = asyncio.current_task()
            assert task is not None
            now = loop.time()
            due = min(now + idle_seconds, deadline)
            if min_rate > 0:
                # The average since the first read, held to from RATE_GRACE_SECONDS on. (Counted
                # from the grace's end, a body at 96% of the rate was never refused.)
                paced = paced_from + max(RATE_GRACE_SECONDS, received / min_rate)
                due = min(due, max(now, paced))
            watch.waiting[task] = due
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
            size = len(message.get("body", b""))
            received += size
            # (A drain after the answer, `Body.finish`, stopped acting for the tenant: it holds
            # nothing, and the body's rest is nobody's to refuse.)
            if counted and not upload and size and acting_for() is not None:
                assert bodies is not None and tenant is not None
                held += size
                bodies.hold(tenant, size)  # TooManyBodies past the tenant's bytes
            if (
                message["type"] != "http.request"
                or not message.get("more_body", False)
                or received == whole_at  # granian's closing empty message is not waited for
            ):
                complete = True
                if counted:
                    assert bodies is not None and tenant is not None
                    bodies.arrived(tenant)
                    counted = False
                # Its body in, the request goes to work (its tenant's turn: not held while
                # the client sends, or a slow client would hold its tenant's turns). Not a
                # client gone mid-body, nor an upload (streamed to the store as it comes: it
                # is the client's pace, and a refusal at its end would waste the whole body).
                if message["type"] == "http.request" and not upload:
                    await waiting.body_arrived()
            return message

        try:
            await app(scope, timed_receive, send)
        finally:
            if bodies is not None and tenant is not None:
                if counted:
                    bodies.arrived(tenant)
                bodies.release(tenant, held)

    return bounded
