"""Journal compaction: the worker's use case that removes a stream's journal below its latest
snapshot (`StreamSnapshotted`, taken by `deciding.decide_all`), so that replay = that snapshot +
the events after it, and a stream's journal stays O(events since its last snapshot).

The rows it removes are immutable (nothing writes below the stream's version), so it runs
without the stream-row lock, in bounded batches, each batch refusing while the stream's legal
hold is on; the job then waits and looks again. Removing what is already gone removes nothing,
so a job taken over from a killed worker simply carries on."""

from __future__ import annotations

import logging
from typing import Protocol

from application.log_context import about_stream
from application.ports import StreamRepository
from application.workers import Job
from domain.errors import LegalHoldActive
from domain.stream import StreamKey

log = logging.getLogger("ductor_streams.compaction")

# Journal rows per delete statement: each is short, and none holds a lock a writer waits for.
COMPACTION_BATCH = 1000


class CompactionJob(Job, frozen=True):
    """Compact the journal of `key` below `through_version`, its latest snapshot."""

    through_version: int = 0


class JournalCompactor(Protocol):
    async def compact(self, key: StreamKey, through_version: int, batch: int) -> int:
        """Remove the stream's journal events with a version below `through_version` (a
        snapshot's), at most `batch` per statement; answer how many went. Raises
        LegalHoldActive, having removed nothing more, once it finds the legal hold on."""


class CompactJournal:
    def __init__(
        self,
        streams: StreamRepository,
        journal: JournalCompactor,
        hold_recheck_seconds: float = 30.0,
        batch: int = COMPACTION_BATCH,
    ) -> None:
        self._streams = streams
        self._journal = journal
        self._recheck = hold_recheck_seconds
        self._batch = batch

    async def run_job(self, job: Job) -> float | None:
        """None when done; else the seconds until a held stream is looked at again."""
        assert isinstance(job, CompactionJob)
        definition = await self._streams.definition(job.key)
        if definition is None:
            return None  # erased: its journal went with it
        about_stream(job.key, definition.placement.log_region)
        try:
            removed = await self._journal.compact(job.key, job.through_version, self._batch)
        except LegalHoldActive:
            return self._recheck
        if removed:
            log.info(
                "compacted the journal below version %d: %d events", job.through_version, removed
            )
        return None
