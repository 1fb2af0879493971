"""A client reading at a steady rate behind its connection's buffers, for the tests of what a
writer waits for (event streams, large answers)."""

from __future__ import annotations

import asyncio
from typing import Any


class Buffered:
    """Reads `rate` bytes a second behind buffers of `capacity` bytes, which take what is sent
    at once while they have room; a writer waiting on full buffers is woken only once half of
    what they hold has been read, as the kernel wakes a TCP writer. An ASGI `send`."""

    def __init__(self, rate: float, capacity: int) -> None:
        self.rate, self.capacity = rate, capacity
        self.sent = 0
        self.began: float | None = None
        self.ended = False

    def held(self) -> float:
        assert self.began is not None
        return self.sent - (asyncio.get_running_loop().time() - self.began) * self.rate

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] != "http.response.body":
            return
        if self.began is None:
            self.began = asyncio.get_running_loop().time()
        if self.held() + len(message["body"]) > self.capacity:
            full = self.held()
            while self.held() > full / 2:
                await asyncio.sleep(0.005)
        self.sent += len(message["body"])
        self.ended = not message.get("more_body", False)

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("never")
