"""The figures /metrics reports from the database (outbox backlogs and lag, object intents by
state), read at most once per `every_seconds` however often it is scraped: a busy scraper costs
the database next to nothing, and between reads it is answered the last figures read.

While the database cannot be read the query answers None (and says so once in the log), so that
/metrics still answers with what the process itself knows: an outage is when its counters, the
live tails' among them, matter most."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from application.ports import FiguresSource, StoredFigures

READ_EVERY_SECONDS = 5.0

log = logging.getLogger("ductor_streams.metrics")


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
        self._read_at = float("-inf")
        self._failing = False

    async def __call__(self) -> StoredFigures | None:
        now = self._monotonic()
        if now - self._read_at < self._every:
            return self._last
        self._read_at = now
        try:
            self._last = await self._source.figures()
        except Exception as error:
            self._last = None
            if not self._failing:
                self._failing = True
                log.warning(
                    "/metrics cannot read its database figures (%s: %s); it answers without "
                    "them until they can be read",
                    type(error).__name__,
                    error,
                )
            return None
        if self._failing:
            self._failing = False
            log.warning("/metrics reads its database figures again")
        return self._last
