"""A request's body under the route's limit, and what is left of it after the answer.

A body over the limit is refused 413 and the connection closed; up to LINGER_LIMIT of the rest
is still read first (for at most LINGER_SECONDS), so that a client that writes a body a little
over the limit before reading gets its answer rather than a reset; a longer rest is not read at
all. Any other body the handler did not read (it failed before reading it all) is read to its
end, bounded in bytes and idle time, for the same reason."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from entrypoints.edge.head import RequestHead
from entrypoints.edge.problems import BodyCutShort, BodyTooLarge

DRAIN_LIMIT = 64 * 1024 * 1024
DRAIN_IDLE_SECONDS = 1.0
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
        """Whether the answer closes the connection: a 413 before the body's end."""
        return status == 413 and not self.done

    async def finish(self, status: int) -> None:
        """Read what is left of the body after the answer `status`, as the module says."""
        if self.done or self.head.closing:
            return
        if status == 413:
            declared = self.head.declared
            left = None if declared is None else declared - self.received
            if left is not None and left > LINGER_LIMIT:
                return
            limit, seconds = LINGER_LIMIT, LINGER_SECONDS
        else:
            limit, seconds = DRAIN_LIMIT, None
        drained = 0
        # A client that stops sending (it read the answer early) is not waited for long.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while not self.done and drained < limit:
                    async with asyncio.timeout(DRAIN_IDLE_SECONDS):
                        drained += len((await self.receive()).get("body", b""))
