"""Input streams: each record reaches the workflow wait service as one deterministic event.

The record and its delivery row commit together, so nothing acknowledged can miss delivery. The
dispatcher (a worker) claims, per stream, only the lowest undelivered record, with a lease: a
stream's N is published only after N-1 was accepted, a second dispatcher cannot overtake the
first, and a killed one's claim is taken over when its lease runs out. A publish whose answer was
lost is simply published again under the same event id, which the wait service deduplicates:
streams never become a second resume authority."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any, Protocol

import msgspec

from application import tracing
from application.log_context import about_stream
from application.ports import RecordReader, StreamRepository
from application.views import InputDeliveryStatus, record_view
from application.workers import Job, claim_renewed, ensure_claimed, retry_delay
from domain.errors import InvalidInput
from domain.records import ROW_BYTES, NewRecord, RecordKind
from domain.stream import StreamKey

log = logging.getLogger("ductor_streams.dispatcher")


class PublishFailed(Exception):
    """The wait service did not accept an event. `retry_in`, when set, overrides the backoff
    (a refusal that is not transient is retried slowly, never dropped)."""

    def __init__(self, detail: str, retry_in: float | None = None) -> None:
        super().__init__(detail)
        self.retry_in = retry_in


class WaitService(Protocol):
    async def publish(
        self, event_id: str, event: bytes, *, stream_created_at: datetime | None = None
    ) -> None:
        """Hand one event over; idempotent by `event_id`. Raises PublishFailed.
        `stream_created_at`: the incarnation of the stream whose record it is. A wait service
        in the service's own database hands nothing over once that stream is erased (or
        deleted while forks read it), nor for an incarnation created again under its ID, which
        would reuse the event's id: the erasure would not see it, and the new record of that
        sequence would find its id taken."""


class InputDeliveries(Protocol):
    async def advance(self, job: Job) -> Job | None:
        """Mark `job` delivered and claim the same stream's next record when it is free."""

    async def done(self, job: Job, next_in: float | None) -> None: ...

    async def failed(self, job: Job, error: str, retry_in: float) -> None: ...

    async def status(self, key: StreamKey) -> InputDeliveryStatus: ...

    async def delivered_through(self, key: StreamKey) -> int: ...


def event_id(key: StreamKey, sequence: int) -> str:
    """`wds:<tenant>:<runID>:<streamID>:<sequence>`, as the contract pins it: unambiguous
    because an input stream's tenant and stream ID hold no `:` (`check_input_ids`), so the id
    reads back from both ends, its run ID (which may hold `:`) what is left between."""
    return f"wds:{key.tenant}:{key.run_id}:{key.stream_id}:{sequence}"


def check_input_ids(key: StreamKey) -> None:
    """An input stream's tenant and stream ID hold no `:`, its events' ids' separator: run
    `a:b`'s stream `c` and run `a`'s stream `b:c` would share them (and tenant `t:a`'s run `b`
    with tenant `t`'s run `a:b`), and a wait service keeps one event per id: the other's
    records would never reach their workflow. A run ID may hold `:` (`wf:42`)."""
    for name, value in (("tenant", key.tenant), ("stream ID", key.stream_id)):
        if ":" in value:
            raise InvalidInput(
                f"an input stream's {name} cannot hold ':', the separator of its events' ids "
                f"(wds:<tenant>:<runID>:<streamID>:<sequence>); {value[:140]!r} does"
            )


class WaitEvent(msgspec.Struct, frozen=True):
    id: str
    tenant: str
    run_id: str
    stream_id: str
    sequence: int
    content_type: str
    record: Any


_encode = msgspec.json.Encoder().encode

# What a `WaitEvent`'s JSON holds besides its IDs, content type and record's data, at most: its
# keys, quotes and punctuation, its id's `wds:` and separators, its four numbers (the sequence
# in its id, its field and its record's, and the size) at 19 digits each, and the record's
# time: within 300 bytes (38-115 to spare, measured).
EVENT_FRAME_BYTES = 300


def event_bytes(key: StreamKey, record: NewRecord) -> int:
    """At most what the default wait service's event of `record` counts in its tenant's bytes
    (its JSON, as `Dispatch` encodes it, and its row): each ID twice (in its fields and in the
    event's id), the content type twice, and the record's data (an inline binary record's as
    base64)."""
    data = len(record.payload)
    if record.kind == RecordKind.BINARY:
        data = 4 * ((data + 2) // 3) + 2  # base64, in quotes
    names = len(key.tenant.encode()) + len(key.run_id.encode()) + len(key.stream_id.encode())
    content_type = len(_encode(record.content_type))  # as JSON: quoted, escaped
    return EVENT_FRAME_BYTES + 2 * (names + content_type) + data + ROW_BYTES


class Dispatch:
    """The dispatcher's job: publish one stream's next records, in order.

    A claimed stream is followed for up to `BATCH` records (claiming each next one as the
    previous is marked delivered), so a backlog costs one claim, not one per record."""

    BATCH = 200

    def __init__(
        self,
        streams: StreamRepository,
        reader: RecordReader,
        wait_service: WaitService,
        deliveries: InputDeliveries,
        retry_base_seconds: float = 1.0,
    ) -> None:
        self._streams = streams
        self._reader = reader
        self._wait_service = wait_service
        self._deliveries = deliveries
        self._retry_base = retry_base_seconds

    async def run_job(self, job: Job) -> float | None:
        key = job.key
        definition = await self._streams.definition(key)
        if definition is not None:
            about_stream(key, definition.placement.log_region)
        await self._publish(job)  # a failure here is the worker's to record and back off
        current: Job | None = job
        for _ in range(self.BATCH):
            assert current is not None
            sent = time.monotonic()
            current = await self._deliveries.advance(current)
            if current is None:
                return None
            claim_renewed(sent)  # the advance claimed the next record for a whole lease
            try:
                await self._publish(current)
            except Exception as error:
                retry_in = retry_delay(error, current.attempts, self._retry_base)
                await self._deliveries.failed(current, f"{type(error).__name__}: {error}", retry_in)
                return None
        assert current is not None
        await self._deliveries.done(current, None)  # delivered; the next claim takes it on
        return None

    async def _publish(self, job: Job) -> None:
        key, sequence = job.key, job.id
        assert sequence is not None
        found = await self._reader.page(key, sequence - 1, 1)
        if found is None or not found[1] or found[1][0].sequence != sequence:
            # Retention may not remove undelivered input (the pruner stops short of it); a
            # missing record here is a bug worth shouting about, not a reason to skip it.
            raise PublishFailed(f"record {sequence} is not readable", retry_in=60.0)
        record, created = found[1][0], found[0].created_at
        # Right before the effect: a partitioned dispatcher whose claim may be taken over
        # publishes nothing. A publish started in time is cancelled with its job when the claim
        # stops being trusted, a quarter of a lease before anyone else may claim the record.
        ensure_claimed()
        eid = event_id(key, sequence)
        event = WaitEvent(
            id=eid,
            tenant=key.tenant,
            run_id=key.run_id,
            stream_id=key.stream_id,
            sequence=sequence,
            content_type=record.content_type,
            record=record_view(record),
        )
        if not tracing.on():
            await self._wait_service.publish(eid, _encode(event), stream_created_at=created)
            return
        with tracing.span(
            "input dispatch",
            kind="producer",
            links=tracing.APPENDS.of(key, sequence, sequence),
            attributes={**tracing.stream_attributes(key), "ductor_streams.sequence": sequence},
        ):
            await self._wait_service.publish(eid, _encode(event), stream_created_at=created)
