"""Retention: the pruner's use case. Records go from the front only, in bounded chunks, under
the stream-row lock, never while a legal hold is on, and never one that a fork of the stream
inherits (`Stream.prune`: the port reads the fork links under the same lock)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from application.group_commit import GroupCommit
from application.input_delivery import InputDeliveries
from application.log_context import about_stream
from application.ports import Clock, Done, Failed, Idempotency, RecordReader, StreamRepository
from application.workers import Job, LeaseLost, ensure_claimed
from domain import errors
from domain.definition import StreamDefinition
from domain.events import Event
from domain.stream import Stream, StreamKey

CHUNK = 10_000
log = logging.getLogger("ductor_streams.retention")


def has_retention(definition: StreamDefinition) -> bool:
    r = definition.retention
    return r.max_age_seconds is not None or r.max_records is not None


def expired_prefix(after: int, rows: Sequence[tuple[int, datetime]], cutoff: datetime) -> int:
    through = after
    for sequence, appended_at in rows:
        if appended_at >= cutoff or sequence != through + 1:
            break
        through = sequence
    return through


class PruneCommand:
    """Prune through `through`. With `fence_holder` (the worker whose claim of the stream's
    retention job this prune acts under), the port checks in the prune's own transaction that
    this worker still holds an unexpired claim, and locks the job's row until the commit so no
    other worker can take it over meanwhile; it sets `lease_held`, and a prune whose claim is
    gone decides nothing (LeaseLost). This is the fence: the claim clock of the worker loop
    (`ensure_claimed`) stops a partitioned worker early, and this check is what holds even when a
    statement sent in time arrives after the lease ran out."""

    frees = True  # its records' bytes (group_commit.py)

    idempotency: Idempotency | None = None
    records = ()
    producer = None

    def __init__(
        self, through: int, reason: str, now: datetime, fence_holder: str | None = None
    ) -> None:
        self.through = through
        self.reason = reason
        self.now = now
        self.offset_of = through
        self.fence_holder = fence_holder
        self.lease_held: bool | None = None  # set by the port, under the row lock

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        if self.fence_holder is not None and self.lease_held is not True:
            raise LeaseLost("another worker holds this stream's retention job now")
        if self.through < stream.state.earliest:
            return []
        assert offset is not None
        return stream.prune(self.through, offset, self.reason, self.now)

    def answer(self, stream: Stream, events: list[Event]) -> int:
        return stream.state.earliest


class PruneRetention:
    """Apply one stream's retention once; answer how long until it is worth looking again."""

    def __init__(
        self,
        streams: StreamRepository,
        reader: RecordReader,
        commits: GroupCommit,
        clock: Clock,
        deliveries: InputDeliveries,
        interval_seconds: float = 5.0,
    ) -> None:
        self._deliveries = deliveries
        self._streams = streams
        self._reader = reader
        self._commits = commits
        self._clock = clock
        self._interval = interval_seconds

    async def run_job(self, job: Job) -> float | None:
        return await self(job.key, fence_holder=job.claimed_by)

    async def __call__(self, key: StreamKey, fence_holder: str | None = None) -> float | None:
        """Seconds until the next run, or None when the stream no longer needs one. With
        `fence_holder`, the prune commits only while that worker holds the stream's job."""
        stream = await self._streams.load(key)
        if stream is None or not has_retention(stream.definition):
            return None
        about_stream(key, stream.definition.placement.log_region)
        state, retention = stream.state, stream.definition.retention
        if state.legal_hold.enabled:
            return self._interval
        now = self._clock()
        after = state.earliest - 1
        limit = min(CHUNK, state.head - after)
        through, reason = after, "retention"
        if retention.max_records is not None:
            through = max(through, min(state.head - retention.max_records, after + limit))
        if retention.max_age_seconds is not None and limit > 0:
            cutoff = now - timedelta(seconds=retention.max_age_seconds)
            through = max(through, await self._reader.expired_through(key, after, cutoff, limit))
        if stream.definition.direction == "input":
            # Never prune input the workflow has not been handed yet.
            through = min(through, await self._deliveries.delivered_through(key))
        if through <= after:
            return self._interval
        # Not under a claim this worker could not renew; the prune itself is decided again
        # under the row lock, and fenced there by the claim (PruneCommand).
        ensure_claimed()
        match await self._commits.submit(key, PruneCommand(through, reason, now, fence_holder)):
            case Failed(error=errors.LegalHoldActive()):
                return self._interval
            case Failed(error=error):
                raise error
            case Done(events=[]):
                # Nothing went: another pruner was first, or forks still read these records
                # (a fork pins the prefix it inherits; decided under the row lock).
                return self._interval
            case Done():
                log.info("retention pruned records %d to %d", after + 1, through)
        return 0.0 if through - after >= CHUNK else self._interval
