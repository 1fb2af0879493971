"""The figures /metrics reports from the database (outbox backlogs and lag, object intents by
state), read at most once per `every_seconds` however often it is scraped: a busy scraper costs
the database next to nothing, and between reads it is answered the last figures read."""

from __future__ import annotations

import time
from collections.abc import Callable

from application.ports import FiguresSource, StoredFigures

READ_EVERY_SECONDS = 5.0


class ReadFigures:
    def __init__(
        self,
        source: FiguresSource,
        every_seconds: float = READ_EVERY_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._every = every_seconds
        self._monotonic = monotonic
        self._last: StoredFigures | None = None
        self._read_at = 0.0

    async def __call__(self) -> StoredFigures:
        now = self._monotonic()
        if self._last is None or now - self._read_at >= self._every:
            self._read_at = now
            self._last = await self._source.figures()
        return self._last
