"""Wake signals: "stream K may have changed", and nothing more.

A notification never carries data anyone relies on; it is only a reason to reread from the
source of truth. Listeners register *before* they read (the seed's "subscribe, then backfill"),
and a listener's flag stays set until it is consumed, so a wake that lands between a read and the
next wait is never lost. Adapters feed `notify` (the PostgreSQL LISTEN bus, or the memory
adapter after its commit); `followed` tells a bus which streams to recheck.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

from domain.stream import StreamKey


class Listener:
    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def wake(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        """Wait until woken (True) or `timeout` seconds pass (False); consumes the wake."""
        if not self._event.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self._event.wait()
            except TimeoutError:
                return False
        self._event.clear()
        return True


class WakeRegistry:
    def __init__(self) -> None:
        self._listeners: defaultdict[StreamKey, set[Listener]] = defaultdict(set)

    @contextmanager
    def listen(self, key: StreamKey) -> Iterator[Listener]:
        listener = Listener()
        self._listeners[key].add(listener)
        try:
            yield listener
        finally:
            listeners = self._listeners.get(key)
            if listeners is not None:
                listeners.discard(listener)
                if not listeners:
                    del self._listeners[key]

    def notify(self, key: StreamKey) -> None:
        for listener in self._listeners.get(key, ()):
            listener.wake()

    def notify_all(self) -> None:
        for key in list(self._listeners):
            self.notify(key)

    def followed(self) -> list[StreamKey]:
        """Streams that someone in this process is waiting on."""
        return list(self._listeners)
