"""Streams in memory: a lock per stream plays the row lock, and values are stored encoded so
nothing outside the port can change state behind its back."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta

import msgspec

from application.deciding import SNAPSHOT_EVERY, Changes, Receipt, decide_all
from application.deletions import ERASED_STREAM, UPLOADING
from application.errors import NotFound
from application.fork_reads import (
    ForkLink,
    check_fork_source,
    kept_by_forks,
    link_of,
    segments,
    stitched,
)
from application.ports import (
    Backlog,
    Command,
    ConsumerPosition,
    Failed,
    Outcome,
    Position,
    RunPage,
    RunSummary,
    StoredFigures,
    StoredRecord,
    within_bytes,
)
from application.retention import expired_prefix
from application.wake import WakeRegistry
from domain.definition import StreamDefinition
from domain.events import (
    Event,
    ObjectAborted,
    ObjectCommitted,
    ObjectExpired,
    ObjectPrepared,
    ObjectUploaded,
    RecordsPruned,
    StreamDeleted,
    decode_event,
    encode_event,
)
from domain.objects import ObjectIntent, pledged_bytes
from domain.records import ROW_BYTES, held_bytes, receipt_bytes
from domain.stream import (
    Stream,
    StreamKey,
    decode_definition,
    decode_state,
    encode_definition,
    encode_state,
)


class _Row(msgspec.Struct):
    definition: bytes
    state: bytes
    journal: list[bytes] = msgspec.field(default_factory=list)
    records: dict[int, StoredRecord] = msgspec.field(default_factory=dict)
    offsets: dict[int, int] = msgspec.field(default_factory=dict)
    receipts: dict[str, Receipt] = msgspec.field(default_factory=dict)
    receipts_created: dict[str, datetime] = msgspec.field(default_factory=dict)
    snapshot_at: int = 0  # index in `journal` of the latest snapshot (0: nothing to compact)


class DeliveryRow(msgspec.Struct):
    delivered: bool = False
    delivered_at: datetime | None = None
    claimed_by: str | None = None
    attempts: int = 0
    not_before: float = 0.0
    last_error: str | None = None


class MemoryStreams:
    def __init__(
        self, wake: WakeRegistry | None = None, snapshot_every: int = SNAPSHOT_EVERY
    ) -> None:
        self._snapshot_every = snapshot_every
        self._rows: dict[StreamKey, _Row] = {}
        self._intents: dict[tuple[StreamKey, str], ObjectIntent] = {}
        self.deletions: list[tuple[StreamKey, str, str, str]] = []  # key, region, storage key, why
        self._uploads: dict[tuple[str, str], int] = {}  # region, storage key -> puts under way
        self.deliveries: dict[StreamKey, dict[int, DeliveryRow]] = {}
        self._locks: defaultdict[StreamKey, asyncio.Lock] = defaultdict(asyncio.Lock)
        # The fork links (what `stream_forks` holds in PostgreSQL): source -> each fork that
        # references it (live, or soft-deleted and kept) -> the last sequence it inherits.
        self._forks: dict[StreamKey, dict[StreamKey, int]] = {}
        self._wake = wake or WakeRegistry()
        self.transactions = 0

    def _stream(self, key: StreamKey, row: _Row) -> Stream:
        """The stream with the facts its forks' links give (read under its lock by `update`)."""
        links = self._forks.get(key, {})
        return Stream(
            key,
            decode_definition(row.definition),
            decode_state(row.state),
            forked=bool(links),
            pinned_through=max(links.values(), default=0),
        )

    async def create(
        self,
        key: StreamKey,
        definition: StreamDefinition,
        now: datetime,
        then: Sequence[Command] = (),
    ) -> tuple[Stream, bool]:
        async with self._locks[key]:
            row = self._rows.get(key)
            if row is not None:
                return self._stream(key, row), False
            stream, created = Stream.create(key, definition, now)
            row = _Row(
                definition=encode_definition(definition),
                state=encode_state(stream.state),
                journal=[encode_event(created)],
            )
            async with self._fork_source(key, definition):
                if then:
                    # Decided on the stream not stored yet: a failure leaves no stream at all
                    # (and, for a fork, no link to its source).
                    outcomes, changes = decide_all(stream, then, {}, {}, self._snapshot_every)
                    for outcome in outcomes:
                        if isinstance(outcome, Failed):
                            raise outcome.error
                    assert not changes.deleted
                    self._write(key, row, stream, changes)
                self._rows[key] = row
        if then or stream.state.head > 0:  # a fork starts with its source's records
            self._wake.notify(key)
        return self._stream(key, row), True

    @contextlib.asynccontextmanager
    async def _fork_source(
        self, key: StreamKey, definition: StreamDefinition
    ) -> AsyncIterator[None]:
        """For a fork, around its creation: its source's lock (taken after the fork's: child
        before parent, as erasure takes them), the re-check that it is the very source the fork
        was resolved against, not soft-deleted, and far enough; and, once the creation went
        through (not if it raised), the link that keeps the source from being erased while the
        fork reads it."""
        fork = definition.fork
        if fork is None:
            yield
            return
        source = StreamKey(key.tenant, fork.run_id, fork.stream_id)
        async with self._locks[source]:
            row = self._rows.get(source)
            check_fork_source(source, None if row is None else decode_state(row.state), fork)
            yield
            self._forks.setdefault(source, {})[key] = fork.through

    def forks_of(self, key: StreamKey) -> set[StreamKey]:
        """The live forks that reference `key` (for tests)."""
        return set(self._forks.get(key, ()))

    def stream_keys(self) -> list[StreamKey]:
        return list(self._rows)

    async def load(self, key: StreamKey) -> Stream | None:
        row = self._rows.get(key)
        return None if row is None else self._stream(key, row)

    async def list_run(
        self, tenant: str, run_id: str, after: str | None = None, limit: int | None = None
    ) -> list[Stream]:
        keys = sorted(
            (k for k in self._rows if k.tenant == tenant and k.run_id == run_id),
            key=lambda k: k.stream_id,
        )
        if after is not None:
            keys = keys[bisect.bisect_right([k.stream_id for k in keys], after) :]
        return [self._stream(k, self._rows[k]) for k in keys[:limit]]

    async def list_run_within(
        self, tenant: str, run_id: str, after: str | None, limit: int, max_bytes: int
    ) -> RunPage:
        keys = sorted(
            (k for k in self._rows if k.tenant == tenant and k.run_id == run_id),
            key=lambda k: k.stream_id,
        )
        if after is not None:
            keys = keys[bisect.bisect_right([k.stream_id for k in keys], after) :]
        taken: list[StreamKey] = []
        size = 0
        for key in keys[:limit]:
            row = self._rows[key]
            grows = len(row.definition) + len(row.state)
            if taken and size + grows > max_bytes:
                return RunPage([self._stream(k, self._rows[k]) for k in taken], size, True)
            taken.append(key)
            size += grows
        return RunPage([self._stream(k, self._rows[k]) for k in taken], size, False)

    async def consumers(
        self, key: StreamKey, after: str | None, limit: int
    ) -> list[ConsumerPosition]:
        row = self._rows.get(key)
        consumers = {} if row is None else decode_state(row.state).consumers
        return [
            ConsumerPosition(i, c.acked_sequence, c.holds_credit)
            for i, c in sorted(consumers.items())
            if after is None or i > after
        ][:limit]

    async def definition(self, key: StreamKey) -> StreamDefinition | None:
        row = self._rows.get(key)
        return None if row is None else decode_definition(row.definition)

    async def created_at(self, key: StreamKey) -> datetime | None:
        row = self._rows.get(key)
        return None if row is None else decode_state(row.state).created_at

    async def update_many(
        self, groups: Sequence[tuple[StreamKey, Sequence[Command]]]
    ) -> list[list[Outcome] | Exception]:
        """One `update` per stream, in order: memory commits cost nothing to share, and each
        stream's answer (or error) stays its own."""
        results: list[list[Outcome] | Exception] = []
        for key, commands in groups:
            try:
                results.append(await self.update(key, commands))
            except Exception as error:  # that stream's alone
                results.append(error)
        return results

    async def update(self, key: StreamKey, commands: Sequence[Command]) -> list[Outcome]:
        async with self._locks[key]:
            row = self._rows.get(key)
            if row is None:
                raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
            stream = self._stream(key, row)
            offsets = {
                c.offset_of: row.offsets[c.offset_of]
                for c in commands
                if c.offset_of is not None and c.offset_of in row.offsets
            }
            outcomes, changes = decide_all(
                stream, commands, dict(row.receipts), offsets, self._snapshot_every
            )
            self.transactions += 1
            released: list[StreamKey] = []
            if changes.deleted:
                [deleted] = [e for e in changes.events if isinstance(e, StreamDeleted)]
                released = await self._erase_with_sources(key, deleted.reason, deleted.at)
            elif changes.events:
                self._write(key, row, stream, changes)
        if changes.deleted:
            for erased in (key, *released):
                self._wake.notify_deleted(erased)
        elif changes.events:
            self._wake.notify(key)
        return outcomes

    async def _erase_with_sources(
        self, key: StreamKey, reason: str, now: datetime, locked: frozenset[StreamKey] = frozenset()
    ) -> list[StreamKey]:
        """Erase the stream (its row lock held), then, up its fork chain, every soft-deleted
        source whose last fork that was (the cascade), each under its own lock (but those in
        `locked`, decided by the caller). Answers the sources erased."""
        fork = decode_definition(self._rows[key].definition).fork
        self._erase(key, reason)
        released = []
        child = key
        while fork is not None:
            source = StreamKey(key.tenant, fork.run_id, fork.stream_id)
            links = self._forks.get(source, {})
            links.pop(child, None)
            if not links:
                self._forks.pop(source, None)
            if source in locked:
                break
            async with self._locks[source]:
                row = self._rows.get(source)
                if row is None or not self._stream(source, row).release(now):
                    break
                fork = decode_definition(row.definition).fork
                self._erase(source, "deleted")
                released.append(source)
                child = source
        return released

    def _write(self, key: StreamKey, row: _Row, stream: Stream, changes: Changes) -> None:
        """Store what a transaction's commands caused (under the stream's lock)."""
        for appended in changes.appended:
            for sequence, end_offset, record in appended.numbered():
                row.records[sequence] = StoredRecord(
                    sequence=sequence,
                    appended_at=appended.at,
                    kind=record.kind,
                    content_type=record.content_type,
                    size=record.size,
                    payload=record.payload,
                )
                row.offsets[sequence] = end_offset
        if stream.definition.direction == "input":
            rows = self.deliveries.setdefault(key, {})
            for appended in changes.appended:
                for sequence in appended.sequences:
                    rows[sequence] = DeliveryRow()
        for receipt in changes.receipts:
            row.receipts[receipt.key] = receipt
            row.receipts_created[receipt.key] = datetime.now(UTC)
        row.journal.extend(encode_event(e) for e in changes.events)
        if changes.snapshot is not None:
            row.snapshot_at = len(row.journal) - 1
        if row.snapshot_at and not stream.state.legal_hold.enabled:
            # Compaction, inline: what the PostgreSQL adapter's job does later.
            del row.journal[: row.snapshot_at]
            row.snapshot_at = 0
        self._project_objects(key, changes.events)
        if stream.state.soft_deleted:
            # Deleted while forks read it: delivers nothing more (as on PostgreSQL).
            self.deliveries.pop(key, None)
        row.state = encode_state(stream.state)
        self._drop_pruned(row, stream.state.earliest)

    def _erase(self, key: StreamKey, reason: str) -> None:
        """Everything the stream holds goes; the bodies its intents name are queued."""
        del self._rows[key]
        self.deliveries.pop(key, None)
        for k, object_id in [ik for ik in self._intents if ik[0] == key]:
            intent = self._intents.pop((k, object_id))
            self._queue(key, intent, ERASED_STREAM + reason)

    def _queue(self, key: StreamKey, intent: ObjectIntent, why: str) -> None:
        """A body is queued once; a deletion an upload armed is taken over (as on PostgreSQL)."""
        body = (intent.storage_region, intent.storage_key)
        for n, (_, region, storage_key, queued_why) in enumerate(self.deletions):
            if (region, storage_key) == body:
                if queued_why == UPLOADING:
                    self.deletions[n] = (key, *body, why)
                return
        self.deletions.append((key, *body, why))

    async def delete_run(
        self, tenant: str, run_id: str, now: datetime, check: Callable[[Stream], None] | None = None
    ) -> list[StreamKey]:
        keys = sorted(k for k in self._rows if k.tenant == tenant and k.run_id == run_id)
        if not keys:
            raise NotFound(f"no run {run_id!r}")
        async with contextlib.AsyncExitStack() as locks:
            for key in keys:  # in stream_id order, as the PostgreSQL adapter locks the rows
                await locks.enter_async_context(self._locks[key])
            keys = [k for k in keys if k in self._rows]  # deleted while we waited
            if not keys:
                raise NotFound(f"no run {run_id!r}")
            kept = kept_by_forks(keys, {k: self.forks_of(k) for k in keys})
            soft: list[tuple[StreamKey, Stream, list[Event]]] = []
            for key in keys:
                stream = self._stream(key, self._rows[key])
                if check is not None:
                    check(stream)
                if stream.state.soft_deleted:
                    continue  # erased below unless a fork outside still reads it
                stream.forked = key in kept
                soft.append((key, stream, stream.delete(now)))
            for key, stream, events in soft:
                if key in kept:  # a soft delete: the journal and the state change
                    row = self._rows[key]
                    for event in events:
                        stream.apply(event)
                    row.journal.extend(encode_event(e) for e in events)
                    row.state = encode_state(stream.state)
            erased = [k for k in keys if k not in kept]
            released = []
            for key in erased:
                released += await self._erase_with_sources(key, "deleted", now, frozenset(keys))
        for key in (*erased, *released):
            self._wake.notify_deleted(key)
        for key in kept:
            self._wake.notify(key)
        return keys

    async def tenant_streams(self, tenant: str) -> int:
        return sum(1 for key in self._rows if key.tenant == tenant)

    async def tenant_bytes(self, tenant: str) -> int:
        held = 0
        for key, row in self._rows.items():
            if key.tenant == tenant:
                held += len(row.definition) + ROW_BYTES  # (`definition_bytes`)
                held += sum(held_bytes(r) for r in row.records.values())
                # open intents pledge what their records will count (committed ones are records)
                held += sum(pledged_bytes(i) for i in decode_state(row.state).objects.values())
                held += sum(receipt_bytes(k) for k in row.receipts)  # kept for the window
        return held

    async def list_runs(
        self, tenant: str, after: str | None, limit: int, prefix: str = ""
    ) -> list[RunSummary]:
        runs: dict[str, list[datetime]] = {}
        for key, row in self._rows.items():
            state = decode_state(row.state)
            if (
                key.tenant == tenant
                and (after is None or key.run_id > after)
                and key.run_id.startswith(prefix)
            ):
                if state.soft_deleted:
                    continue
                created_at = state.created_at
                assert created_at is not None
                runs.setdefault(key.run_id, []).append(created_at)
        return [
            RunSummary(run_id=run_id, stream_count=len(times), created_at=min(times))
            for run_id, times in sorted(runs.items())[:limit]
        ]

    def _project_objects(self, key: StreamKey, events: list[Event]) -> None:
        replace = msgspec.structs.replace
        for event in events:
            match event:
                case ObjectPrepared(intent=intent):
                    self._intents[key, intent.object_id] = intent
                case ObjectUploaded(object_id=oid):
                    intent = self._intents[key, oid] = replace(
                        self._intents[key, oid], state="uploaded"
                    )
                    self._ended(key, intent.storage_region, intent.storage_key)
                case ObjectCommitted(object_id=oid, sequence=sequence):
                    self._intents[key, oid] = replace(
                        self._intents[key, oid], state="committed", sequence=sequence
                    )
                case ObjectAborted(object_id=oid) | ObjectExpired(object_id=oid):
                    state = "aborted" if isinstance(event, ObjectAborted) else "expired"
                    intent = self._intents[key, oid] = replace(self._intents[key, oid], state=state)
                    self._queue(key, intent, state)
                case RecordsPruned(through_sequence=through):
                    # A pruned record's object goes with it, its intent too (as on PostgreSQL).
                    for (k, oid), intent in list(self._intents.items()):
                        if (
                            k == key
                            and intent.state == "committed"
                            and intent.sequence is not None  # a committed intent has one
                            and intent.sequence <= through
                        ):
                            self._queue(key, intent, "pruned")
                            del self._intents[k, oid]

    async def figures(self) -> StoredFigures:
        """What /metrics reports from the store (FiguresSource). Bodies to delete are kept
        without the time they were queued at, so the deletion outbox's lag reads 0 here."""
        now = datetime.now(UTC)
        waiting = [
            self._rows[key].records[sequence].appended_at
            for key, rows in self.deliveries.items()
            if key in self._rows
            for sequence, row in rows.items()
            if not row.delivered and sequence in self._rows[key].records
        ]
        objects: dict[str, int] = {}
        for intent in self._intents.values():
            objects[intent.state] = objects.get(intent.state, 0) + 1
        return StoredFigures(
            [
                Backlog(
                    "input_delivery",
                    len(waiting),
                    (now - min(waiting)).total_seconds() if waiting else 0.0,
                ),
                # An upload's armed deletion is no backlog while its put is under way.
                Backlog("deletion", sum(d[3] != UPLOADING for d in self.deletions), 0.0),
            ],
            objects,
        )

    async def intent(self, key: StreamKey, object_id: str) -> ObjectIntent | None:
        return self._intents.get((key, object_id))

    async def forget_receipts(self, older_than: timedelta, batch: int = 1000) -> int:
        cutoff = datetime.now(UTC) - older_than
        forgotten = 0
        for row in self._rows.values():
            if decode_state(row.state).legal_hold.enabled:
                continue  # a hold removes nothing
            for key, created in list(row.receipts_created.items()):
                if created < cutoff:
                    del row.receipts[key], row.receipts_created[key]
                    forgotten += 1
        return forgotten

    async def uploading(
        self, key: StreamKey, storage_region: str, storage_key: str, due: datetime
    ) -> None:
        """Armed once, its puts counted (memory keeps neither due times nor done deletions)."""
        body = (storage_region, storage_key)
        self._uploads[body] = self._uploads.get(body, 0) + 1
        if not any((r, k) == body for _, r, k, _ in self.deletions):
            self.deletions.append((key, storage_region, storage_key, UPLOADING))

    async def upload_ended(self, key: StreamKey, storage_region: str, storage_key: str) -> None:
        self._ended(key, storage_region, storage_key)

    def _ended(self, key: StreamKey, storage_region: str, storage_key: str) -> None:
        """One put fewer under way; the last one leaves a row only armed done (gone here)."""
        body = (storage_region, storage_key)
        left = self._uploads.get(body, 0) - 1
        if left < 0:
            return
        if left == 0:
            del self._uploads[body]
            armed = (key, storage_region, storage_key, UPLOADING)
            self.deletions = [d for d in self.deletions if d != armed]
        else:
            self._uploads[body] = left

    async def expired_intents(self, now: datetime, limit: int) -> list[tuple[StreamKey, str]]:
        return [
            (k, oid)
            for (k, oid), intent in self._intents.items()
            if intent.state in ("prepared", "uploaded") and intent.expires_at <= now
        ][:limit]

    @staticmethod
    def _drop_pruned(row: _Row, earliest: int) -> None:
        # Records are kept in ascending sequence: nothing to drop is the common case, and is
        # seen at the first record (not by a scan of every record on each write).
        records = row.records
        while records:
            first = next(iter(records))
            if first >= earliest:
                return
            del records[first]

    async def expired_through(
        self, key: StreamKey, after: int, cutoff: datetime, limit: int
    ) -> int:
        row = self._rows.get(key)
        if row is None:
            return after
        sequences = sorted(s for s in row.records if s > after)[:limit]
        return expired_prefix(after, [(s, row.records[s].appended_at) for s in sequences], cutoff)

    async def journal(self, key: StreamKey) -> list[Event]:
        """From the latest snapshot on (the rows before it wait out a legal hold)."""
        row = self._rows.get(key)
        return [] if row is None else [decode_event(e) for e in row.journal[row.snapshot_at :]]

    def journal_rows(self, key: StreamKey) -> int:
        """How many journal events are stored for the stream, compacted or not."""
        return len(self._rows[key].journal)

    async def page(
        self, key: StreamKey, cursor: int, limit: int, max_bytes: int | None = None
    ) -> tuple[Position, list[StoredRecord]] | None:
        row = self._rows.get(key)
        if row is None:
            return None
        own = self._segment(row, cursor, cursor + limit)
        chain = self._chain(key, row)
        if chain:
            found = []
            for segment in segments(chain, cursor, limit):
                source = self._rows.get(segment.key)
                found.append((None, []) if source is None else self._segment(source, *segment[1:]))
            own = stitched(own, chain, found, limit)
        return own[0], within_bytes(own[1], max_bytes)

    @staticmethod
    def _segment(row: _Row, after: int, through: int) -> tuple[Position, list[StoredRecord]]:
        """The stream's position and its own records with `after < sequence <= through`."""
        state = decode_state(row.state)
        position = Position(
            head=state.head,
            earliest=state.earliest,
            closed=state.closed,
            created_at=state.created_at,
            soft_deleted=state.soft_deleted,
        )
        records = [
            row.records[s]
            for s in range(max(after + 1, state.earliest), min(state.head, through) + 1)
            if s in row.records
        ]
        return position, records

    async def chain(self, key: StreamKey, created_at: datetime | None = None) -> list[ForkLink]:
        row = self._rows.get(key)
        if row is None or (
            created_at is not None and decode_state(row.state).created_at != created_at
        ):
            return []
        return self._chain(key, row)

    def _chain(self, key: StreamKey, row: _Row) -> list[ForkLink]:
        """Up the definitions, iteratively: each link, until a stream that is no fork (or one
        that is not the incarnation its fork's link names: the chain ends there)."""
        chain: list[ForkLink] = []
        fork = decode_definition(row.definition).fork
        while fork is not None:
            link = link_of(key, fork)
            chain.append(link)
            source = self._rows.get(link.source)
            if source is None or decode_state(source.state).created_at != link.source_created_at:
                break
            fork = decode_definition(source.definition).fork
        return chain
