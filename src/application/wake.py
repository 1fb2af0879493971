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
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from domain.stream import StreamKey


class Listener:
    __slots__ = ("_event", "deleted")

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.deleted = False  # the stream it listens to was deleted: it will not come back

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
        self._on_deleted: list[Callable[[StreamKey], None]] = []
        self._on_missed: list[Callable[[], None]] = []
        self._on_notified: list[Callable[[StreamKey], None]] = []

    def on_deleted(self, forget: Callable[[StreamKey], None]) -> None:
        """Call `forget(key)` whenever a stream is deleted (to drop what a cache keeps of it)."""
        self._on_deleted.append(forget)

    def on_missed(self, forget_all: Callable[[], None]) -> None:
        """Call `forget_all()` when deletions may have been missed (a lost listen connection)."""
        self._on_missed.append(forget_all)

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

    def on_notified(self, hear: Callable[[StreamKey], None]) -> None:
        """Call `hear(key)` whenever a stream is notified (the subscriptions' scheduler looks
        for pending work at once, instead of at its next poll)."""
        self._on_notified.append(hear)

    def notify(self, key: StreamKey) -> None:
        for hear in self._on_notified:
            hear(key)
        for listener in self._listeners.get(key, ()):
            listener.wake()

    def notify_deleted(self, key: StreamKey) -> None:
        """The stream was deleted: its listeners hear it (and stop), caches forget it. A stream
        created again under the same key later is another one, with listeners of its own."""
        self.forget(key)
        for listener in self._listeners.get(key, ()):
            listener.deleted = True
            listener.wake()

    def forget(self, key: StreamKey) -> None:
        """Caches drop what they keep of the stream (it was deleted, maybe created again)."""
        for forget in self._on_deleted:
            forget(key)

    def missed(self) -> None:
        for forget_all in self._on_missed:
            forget_all()

    def notify_all(self) -> None:
        for key in list(self._listeners):
            self.notify(key)

    def followed(self) -> list[StreamKey]:
        """Streams that someone in this process is waiting on."""
        return list(self._listeners)
