"""The Stream aggregate: decide (check invariants, return events), then apply (the only mutation).

Credit is O(1) by construction: the state keeps running totals (`total_items`, `total_bytes` =
the cumulative byte offset after the head) and each consumer keeps the cumulative offset after its
acknowledged record, so unread items and bytes after the minimum acknowledgement are subtractions.
That minimum is kept too (`credit_floor`, over the consumers that hold credit), moved only when an
ack or a removal moves the slowest consumer: an append never looks at the consumers.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import NamedTuple

import msgspec

from domain import errors
from domain import events as ev
from domain.definition import MAX_COMMAND_RECORDS, StreamDefinition
from domain.objects import ObjectIntent
from domain.producers import MAX_PRODUCERS, ProducerClaim, check_claim, check_writer_seq
from domain.records import ROW_BYTES, NewRecord
from domain.state import (
    Consumer,
    ConsumersNotLoaded,
    CreditFloor,
    LegalHold,
    Producer,
    copy_state,
    slowest_holding,
)
from domain.state import StreamState as StreamState  # re-exported for the adapters
from domain.state import decode_state as decode_state
from domain.state import encode_state as encode_state


class StreamKey(NamedTuple):
    """(tenant, run_id, stream_id): tenancy is the first part of every key."""

    tenant: str
    run_id: str
    stream_id: str

    def __str__(self) -> str:
        return f"{self.tenant}/{self.run_id}/{self.stream_id}"


class Credit(msgspec.Struct, frozen=True):
    unread_items: int
    unread_bytes: int
    max_unread_items: int
    max_unread_bytes: int


def tracking_share(max_consumers: int) -> int:
    """How many of a stream's consumers that only track their position one principal may
    have: a tenth of their room, at least one."""
    return max(1, max_consumers // 10)


class Stream:
    """One stream: its immutable definition and its state, changed only by `apply`.

    `forked` and `pinned_through` are facts the port reads under the row lock, not state:
    whether forks still reference this stream's records (it turns a delete or an expiry into a
    soft delete), and the highest sequence one of them inherits (0: none), which retention
    never prunes.

    `unloaded_producers`: how many of the stream's producers the port left out of
    `state.producers`. A port that keeps producers apart from the state loads only those a
    decision needs (the ones its commands name, and, when a new one would pass
    `MAX_PRODUCERS`, the least recent), so an append costs the same however many producers
    the stream has; the rest still count against the bound."""

    __slots__ = ("definition", "forked", "key", "pinned_through", "state", "unloaded_producers")

    def __init__(
        self,
        key: StreamKey,
        definition: StreamDefinition,
        state: StreamState,
        *,
        forked: bool = False,
        pinned_through: int = 0,
        unloaded_producers: int = 0,
    ) -> None:
        self.key = key
        self.definition = definition
        self.state = state
        self.forked = forked
        self.pinned_through = pinned_through
        self.unloaded_producers = unloaded_producers

    # -- creation -------------------------------------------------------------------------------

    @classmethod
    def create(
        cls, key: StreamKey, definition: StreamDefinition, now: datetime
    ) -> tuple[Stream, ev.StreamCreated]:
        stream = cls(key, definition, StreamState())
        created = ev.StreamCreated(version=1, at=now, definition=definition)
        stream.apply(created)
        return stream, created

    @classmethod
    def replay(cls, key: StreamKey, journal: list[ev.AnyEvent]) -> Stream:
        """The stream a journal rebuilds: from its creation, or (once compaction removed what
        came before) from a snapshot, then every later event."""
        first = journal[0]
        if not isinstance(first, ev.StreamCreated | ev.StreamSnapshotted):
            raise ValueError("a journal starts with StreamCreated or StreamSnapshotted")
        stream = cls(key, first.definition, StreamState(version=first.version - 1))
        for event in journal:
            stream.apply(event)
        return stream

    # -- queries --------------------------------------------------------------------------------

    @property
    def head(self) -> int:
        return self.state.head

    def min_acknowledgement(self) -> tuple[int, int]:
        """(sequence, offset) after which records are unread: the slowest consumer that holds
        credit, or all (a consumer that only tracks its position holds nothing back)."""
        s = self.state
        floor = s.credit_floor
        if floor is None or floor.sequence < s.earliest - 1:
            return s.earliest - 1, s.pruned_bytes
        return floor.sequence, max(floor.offset, s.pruned_bytes)

    def require_consumers(self) -> dict[str, Consumer]:
        """Every consumer, for a decision that needs them; raises if they were not read."""
        if not self.state.consumers_loaded:
            raise ConsumersNotLoaded(str(self.key))
        return self.state.consumers

    def credit(self) -> Credit:
        seq, offset = self.min_acknowledgement()
        limits = self.definition.limits
        return Credit(
            unread_items=self.state.head - seq,
            unread_bytes=self.state.total_bytes - offset,
            max_unread_items=limits.max_unread_items,
            max_unread_bytes=limits.max_unread_bytes,
        )

    # -- commands (decide) ----------------------------------------------------------------------

    def append(
        self, records: list[NewRecord], now: datetime, *, flow_controlled: bool = True
    ) -> list[ev.Event]:
        """`flow_controlled` False: the service's own notification (a pull-wake's wake event),
        which the unread ceiling does not hold back; the total quotas still apply."""
        self.require_live()
        s, limits = self.state, self.definition.limits
        if not 1 <= len(records) <= MAX_COMMAND_RECORDS:
            raise errors.InvalidInput(f"a batch holds 1 to {MAX_COMMAND_RECORDS} records")
        if s.closed:
            raise errors.StreamClosed(
                "the stream is closed: nothing more can be appended", head=s.head
            )
        items, size = len(records), sum(r.size for r in records)
        total_items, total_bytes = limits.max_total_items, limits.max_total_bytes
        if total_items is not None and s.total_items + items > total_items:
            self._refuse_total(items, s.total_items, total_items, "records", "items")
        if total_bytes is not None and s.total_bytes + size > total_bytes:
            self._refuse_total(size, s.total_bytes, total_bytes, "bytes", "bytes")
        if flow_controlled and (items > limits.max_unread_items or size > limits.max_unread_bytes):
            raise errors.InvalidInput(
                f"a batch of {items} records and {size} bytes can never fit the unread ceiling "
                f"({limits.max_unread_items} records, {limits.max_unread_bytes} bytes)"
            )
        credit = self.credit()
        if flow_controlled and (
            credit.unread_items + items > limits.max_unread_items
            or credit.unread_bytes + size > limits.max_unread_bytes
        ):
            raise errors.Backpressure(
                "the unread ceiling is reached: consumers must acknowledge before more is appended",
                retry_after=max(1, math.ceil(min(limits.block_timeout_seconds, 1.0))),
                unread_items=credit.unread_items,
                unread_bytes=credit.unread_bytes,
            )
        return [
            ev.RecordsAppended(
                version=s.version + 1,
                at=now,
                first_sequence=s.head + 1,
                last_sequence=s.head + items,
                first_offset=s.total_bytes,
                bytes=size,
            )
        ]

    def produce(
        self,
        records: list[NewRecord],
        now: datetime,
        *,
        producer: ProducerClaim | None = None,
        writer_seq: str | None = None,
        close: bool = False,
        content_conflict: str | None = None,
    ) -> list[ev.Event]:
        """A Durable Streams write: append `records` and, with `close`, close the stream, in one
        decision (no records: close only). No events is a duplicate, which appends nothing: a
        producer's retry of a claim already accepted, or a close of a closed stream.

        The order of the checks is the protocol's. Closed first: a closed stream refuses (with
        its head), but to the retry of the claim that closed it and to a close-only request
        without a claim, which are duplicates. Then the producer's claim, before `Stream-Seq`,
        so that a retry carrying both is the producer's duplicate, not a sequence regression
        (the conformance suite's "producer duplicate should return 204 even with Stream-Seq").
        Then `Stream-Seq`, then credit and quotas exactly as `append`.

        `content_conflict`: the body is not of the stream's content type (why, in words). A
        closed stream says it is closed (with its head) rather than that; an open one refuses it
        as a conflict with its definition."""
        s = self.state
        if content_conflict is not None:
            self.require_live()
            if s.closed:
                raise errors.StreamClosed("the stream is closed", head=s.head)
            raise errors.DefinitionConflict(content_conflict, field="Content-Type")
        if not records and not close:
            raise errors.InvalidInput("an append holds at least one record unless it closes")
        self.require_live()  # soft-deleted: 410 before anything else is looked at
        if producer is not None:
            check_claim(producer)
        if writer_seq is not None:
            check_writer_seq(writer_seq)
        if s.closed:
            if producer is None and not records:  # close-only is idempotent
                return []
            if producer is not None and producer == s.closed_by:  # the closing request again
                return []
            raise errors.StreamClosed(
                "the stream is closed: nothing more can be appended", head=s.head
            )
        if producer is not None and self._is_duplicate(producer):
            return []
        # Code point order is the byte order of the UTF-8 encodings: byte-wise lexicographic.
        if writer_seq is not None and s.writer_seq is not None and writer_seq <= s.writer_seq:
            raise errors.WriterSequenceRegression(
                f"Stream-Seq {writer_seq!r} is not above the stream's last, {s.writer_seq!r}",
                last_seq=s.writer_seq,
            )
        events: list[ev.Event] = []
        if records:
            [appended] = self.append(records, now)
            if producer is not None or writer_seq is not None:
                appended = msgspec.structs.replace(
                    appended, producer=producer, writer_seq=writer_seq
                )
            events.append(appended)
        if close:
            events.append(
                ev.StreamClosed(
                    version=s.version + len(events) + 1,
                    at=now,
                    producer=producer,
                    writer_seq=None if records else writer_seq,
                )
            )
        return events

    def _is_duplicate(self, claim: ProducerClaim) -> bool:
        """PROTOCOL.md §5.2.1: whether the claim was accepted before; raises if it is refused."""
        known = self.state.producers.get(claim.producer_id)
        if known is None:
            if claim.seq != 0:
                raise errors.ProducerSequenceGap(
                    f"producer {claim.producer_id!r} is new to this stream: its first sequence "
                    f"is 0, not {claim.seq}",
                    expected_seq=0,
                    received_seq=claim.seq,
                )
            return False
        if claim.epoch < known.epoch:
            raise errors.ProducerEpochStale(
                f"producer {claim.producer_id!r} is at epoch {known.epoch}: epoch {claim.epoch} "
                "is fenced off",
                current_epoch=known.epoch,
            )
        if claim.epoch > known.epoch:
            if claim.seq != 0:
                raise errors.InvalidInput(
                    f"a new producer epoch starts at sequence 0, not {claim.seq}",
                    field="producer_seq",
                )
            return False
        if claim.seq <= known.last_seq:
            return True
        if claim.seq > known.last_seq + 1:
            raise errors.ProducerSequenceGap(
                f"producer {claim.producer_id!r} expects sequence {known.last_seq + 1} in epoch "
                f"{known.epoch}, not {claim.seq}",
                expected_seq=known.last_seq + 1,
                received_seq=claim.seq,
            )
        return False

    @staticmethod
    def _refuse_total(batch: int, used: int, ceiling: int, unit: str, field: str) -> None:
        """A batch bigger than the whole ceiling is the request's fault while room is left (400,
        like the unread ceiling); once the total is used up, or when it would fit an emptier
        stream, the stream's quota is what refuses it (409)."""
        if batch > ceiling and used < ceiling:
            raise errors.InvalidInput(
                f"a batch of {batch} {unit} can never fit the stream's total ceiling of "
                f"{ceiling} {unit}"
            )
        if used >= ceiling:
            detail = f"the stream's total ceiling of {ceiling} {unit} is reached"
        else:
            detail = (
                f"a batch of {batch} {unit} would pass the stream's total ceiling of {ceiling} "
                f"{unit}: {used} are used"
            )
        raise errors.QuotaExhausted(
            detail, **{f"total_{field}": used, f"max_total_{field}": ceiling}
        )

    def acknowledge(
        self,
        consumer_id: str,
        principal: str,
        sequence: int,
        offset: int | None,
        now: datetime,
        *,
        holds_credit: bool = True,
        max_consumers: int | None = None,
    ) -> list[ev.Event]:
        """`offset` is the cumulative byte offset after record `sequence` (None if not retained).

        `holds_credit` says whether the caller may hold the writers back (it may write the
        stream, or administer it); it decides what a new consumer is, and is ignored for an
        existing one, which stays what it was created as. `max_consumers` bounds each kind
        (holding credit, tracking) separately, so that principals that may only read can never
        use up the room of those that hold credit; and one principal's tracking consumers to a
        tenth of their room (`tracking_share`), so that one reader (a shared link's, say) can
        never use up the others'."""
        self.require_live()
        s = self.state
        consumers = self.require_consumers()
        existing = consumers.get(consumer_id)
        if existing is not None and existing.principal != principal:
            raise errors.CrossScopeAck(
                f"consumer {consumer_id!r} belongs to another principal",
            )
        if existing is None and max_consumers is not None:
            same_kind = s.holding_count if holds_credit else s.consumer_count - s.holding_count
            if same_kind >= max_consumers:
                kind = "hold credit" if holds_credit else "only track their position"
                raise errors.TooManyConsumers(
                    f"the stream has {same_kind} consumers that {kind}, its most: an admin "
                    "removes one before another can be created",
                    consumers=same_kind,
                    max_consumers=max_consumers,
                    holds_credit=holds_credit,
                )
            if not holds_credit:
                share = tracking_share(max_consumers)
                mine = sum(
                    1 for c in consumers.values() if c.principal == principal and not c.holds_credit
                )
                if mine >= share:
                    raise errors.TooManyConsumers(
                        f"principal {principal!r} has {mine} consumers that only track their "
                        f"position on this stream, its most (a tenth of the stream's "
                        f"{max_consumers}): an admin removes one before another can be created",
                        consumers=mine,
                        max_consumers=share,
                        holds_credit=holds_credit,
                    )
        if existing is not None:
            holds_credit = existing.holds_credit
        if sequence < 0:
            raise errors.InvalidInput("an acknowledged sequence is 0 or more")
        if sequence > s.head:
            raise errors.AckAheadOfHead(
                f"cannot acknowledge {sequence}: the stream's head is {s.head}",
                sequence=sequence,
                head=s.head,
            )
        if existing is not None:
            if sequence < existing.acked_sequence:
                raise errors.AckRegression(
                    f"consumer {consumer_id!r} already acknowledged {existing.acked_sequence}; "
                    "acknowledgements only advance",
                    acked_sequence=existing.acked_sequence,
                )
            if sequence == existing.acked_sequence:
                return []
        if sequence == 0:
            offset = 0
        elif sequence < s.earliest:
            # Pruned: its exact offset is gone, but credit never counts below pruned_bytes.
            offset = s.pruned_bytes
        elif offset is None:
            raise ValueError(f"the offset after retained record {sequence} must be supplied")
        return [
            ev.ConsumerAcknowledged(
                version=s.version + 1,
                at=now,
                consumer_id=consumer_id,
                principal=principal,
                sequence=sequence,
                offset=offset,
                holds_credit=holds_credit,
            )
        ]

    def remove_consumer(self, consumer_id: str, now: datetime) -> list[ev.Event]:
        """An admin's removal: what the consumer held back is released. A legal hold does not
        refuse it (a hold keeps records, not readers' positions)."""
        self.require_live()
        if consumer_id not in self.require_consumers():
            raise errors.UnknownConsumer(f"no consumer {consumer_id!r} on this stream")
        return [ev.ConsumerRemoved(version=self.state.version + 1, at=now, consumer_id=consumer_id)]

    def close(self, now: datetime) -> list[ev.Event]:
        self.require_live()
        if self.state.closed:
            return []
        return [ev.StreamClosed(version=self.state.version + 1, at=now)]

    def set_legal_hold(self, enabled: bool, reason: str | None, now: datetime) -> list[ev.Event]:
        self.require_live()
        hold = self.state.legal_hold
        if hold.enabled == enabled and hold.reason == reason:
            return []
        return [
            ev.LegalHoldChanged(
                version=self.state.version + 1, at=now, enabled=enabled, reason=reason
            )
        ]

    def prune(
        self, through_sequence: int, pruned_bytes: int, reason: str, now: datetime
    ) -> list[ev.Event]:
        """Drop every record up to `through_sequence`; refused while a legal hold is on.

        A fork pins the prefix it inherits: nothing is pruned while a fork (live, or
        soft-deleted and kept for its own forks) reads a retained record, that is while
        `pinned_through` reaches `earliest`. Records go from the front only, so the first
        record a fork needs stops the whole prune; the stream keeps its `earliest`."""
        s = self.state
        if s.legal_hold.enabled:
            raise errors.LegalHoldActive("a legal hold prevents pruning")
        if through_sequence > s.head:
            raise errors.InvalidInput("cannot prune past the head")
        if through_sequence < s.earliest or self.pinned_through >= s.earliest:
            return []
        if not s.pruned_bytes <= pruned_bytes <= s.total_bytes:
            raise errors.InvalidInput("pruned_bytes must lie between the pruned and total offsets")
        return [
            ev.RecordsPruned(
                version=s.version + 1,
                at=now,
                through_sequence=through_sequence,
                pruned_bytes=pruned_bytes,
                reason=reason,
            )
        ]

    def delete(self, now: datetime, reason: str = "deleted") -> list[ev.Event]:
        """Erase the stream (records, journal, receipts, consumers, intents); refused while a
        legal hold is on. With forks still reading it, soft-delete it instead."""
        self.require_live()
        if self.state.legal_hold.enabled:
            raise errors.LegalHoldActive(
                "a legal hold is on: the stream cannot be deleted until it is lifted",
                stream_id=self.key.stream_id,
            )
        if self.state.deleted:
            return []
        return [self._gone(now, reason)]

    def _gone(self, now: datetime, reason: str) -> ev.Event:
        version = self.state.version + 1
        if self.forked:
            return ev.StreamSoftDeleted(version=version, at=now, reason=reason)
        return ev.StreamDeleted(version=version, at=now, reason=reason)

    def release(self, now: datetime) -> list[ev.Event]:
        """Erase a soft-deleted stream once no fork reads it any more (the cascade of its last
        fork's erasure); anything else stays."""
        s = self.state
        if not s.soft_deleted or s.deleted or self.forked:
            return []
        return [ev.StreamDeleted(version=s.version + 1, at=now, reason="released")]

    def require_live(self) -> None:
        """A soft-deleted stream answers 410 to every direct operation."""
        if self.state.soft_deleted:
            raise errors.StreamGone(
                f"stream {self.key.stream_id!r} was deleted; only its forks still read its records"
            )

    # -- expiry ---------------------------------------------------------------------------------

    def expired(self, now: datetime, last_access: datetime | None, grace: timedelta) -> bool:
        """Past its expiry (an idle one `grace` later) and not under a legal hold, which
        suspends expiry: a held stream stays whole and readable however long it is idle."""
        if self.state.legal_hold.enabled:
            return False
        return self.definition.expiry.passed(now, last_access, grace)

    def expire(
        self, now: datetime, last_access: datetime | None, grace: timedelta = timedelta(0)
    ) -> list[ev.Event]:
        """Erase the stream if it is expired (decided under the row lock, so a hold put on
        meanwhile, or an access recorded meanwhile, keeps it)."""
        s = self.state
        if s.deleted or s.soft_deleted or not self.expired(now, last_access, grace):
            return []
        return [self._gone(now, "expired")]

    # -- object intents ---------------------------------------------------------------------------

    def prepare_object(
        self, intent: ObjectIntent, now: datetime, max_open: int | None = None
    ) -> list[ev.Event]:
        """A new intent pledges its declared size: it is refused (`quota-exhausted`) unless it
        fits the stream's total ceiling with what is stored and every open intent's pledge,
        and (`too-many-open-objects`) once `max_open` intents are open. The same request again
        is answered as it was, whatever the stream holds since."""
        self.require_live()
        if self.state.closed:
            raise errors.StreamClosed("the stream is closed: no object can be prepared")
        existing = self.state.objects.get(intent.object_id)
        if existing is not None:
            if existing.receipt.principal != intent.receipt.principal:
                # Another principal's intent: nothing of it (its ID, its upload URL) is answered.
                raise errors.IdempotencyKeyReused(
                    f"idempotency_key {intent.idempotency_key!r} is in use on this stream by "
                    "another request"
                )
            if existing.idempotency_key == intent.idempotency_key and existing.same_request(intent):
                return []
            raise errors.IdempotencyKeyReused(
                f"idempotency_key {intent.idempotency_key!r} was used with other fields"
            )
        self._check_pledge(intent.size, max_open)
        return [ev.ObjectPrepared(version=self.state.version + 1, at=now, intent=intent)]

    def open_objects(self) -> tuple[int, int]:
        """How many intents are open (prepared or uploaded), and the bytes they pledge."""
        objects = self.state.objects
        return len(objects), sum(i.size for i in objects.values())

    def _check_pledge(self, size: int, max_open: int | None) -> None:
        s, limits = self.state, self.definition.limits
        open_count, pledged = self.open_objects()
        if max_open is not None and open_count >= max_open:
            raise errors.TooManyOpenObjects(
                f"the stream has {open_count} open object intents, the most it may have: "
                "commit or abort one first (or let it expire)",
                open_objects=open_count,
                max_open_objects=max_open,
            )
        # Each open intent will append one record of its declared size when committed.
        if limits.max_total_items is not None and (
            s.total_items + open_count + 1 > limits.max_total_items
        ):
            raise errors.QuotaExhausted(
                f"the stream's total ceiling of {limits.max_total_items} records leaves no room "
                f"for another object: {s.total_items} are stored and {open_count} open intents "
                "are pledged",
                total_items=s.total_items,
                open_objects=open_count,
                max_total_items=limits.max_total_items,
            )
        if limits.max_total_bytes is not None and (
            s.total_bytes + pledged + size > limits.max_total_bytes
        ):
            raise errors.QuotaExhausted(
                f"an object of {size} bytes would pass the stream's total ceiling of "
                f"{limits.max_total_bytes} bytes: {s.total_bytes} are stored and {pledged} "
                "pledged by open intents",
                size=size,
                total_bytes=s.total_bytes,
                pledged_bytes=pledged,
                max_total_bytes=limits.max_total_bytes,
            )

    def _open_object(self, object_id: str) -> ObjectIntent:
        self.require_live()
        intent = self.state.objects.get(object_id)
        if intent is None:
            raise errors.ObjectStateConflict(f"object {object_id!r} is not open")
        return intent

    def mark_uploaded(self, object_id: str, now: datetime) -> list[ev.Event]:
        intent = self._open_object(object_id)
        if intent.state != "prepared":
            raise errors.ObjectStateConflict(f"object {object_id!r} is already {intent.state}")
        if intent.expires_at <= now:
            raise errors.ObjectStateConflict(f"object {object_id!r} expired")
        return [ev.ObjectUploaded(version=self.state.version + 1, at=now, object_id=object_id)]

    def commit_object(
        self, object_id: str, stored_size: int, stored_sha256: str, record: NewRecord, now: datetime
    ) -> list[ev.Event]:
        """Turn an uploaded intent into a record, once the store's evidence agrees with it."""
        intent = self._open_object(object_id)
        if intent.state != "uploaded":
            raise errors.ObjectStateConflict(
                f"object {object_id!r} is {intent.state}: upload its body before committing"
            )
        if intent.expires_at <= now:  # its deadline to upload and commit: the sweep expires it
            raise errors.ObjectStateConflict(f"object {object_id!r} expired")
        if stored_size != intent.size:
            raise errors.SizeMismatch(
                f"the store holds {stored_size} bytes; the intent pins {intent.size}",
                stored=stored_size,
                expected=intent.size,
            )
        if stored_sha256 != intent.sha256:
            raise errors.DigestMismatch("the stored body's SHA-256 is not the pinned one")
        [appended] = self.append([record], now)
        assert isinstance(appended, ev.RecordsAppended)
        return [
            appended,
            ev.ObjectCommitted(
                version=appended.version + 1,
                at=now,
                object_id=object_id,
                sequence=appended.first_sequence,
            ),
        ]

    def abort_object(self, object_id: str, now: datetime) -> list[ev.Event]:
        self._open_object(object_id)
        return [ev.ObjectAborted(version=self.state.version + 1, at=now, object_id=object_id)]

    def expire_object(self, object_id: str, now: datetime) -> list[ev.Event]:
        intent = self.state.objects.get(object_id)
        if intent is None or intent.expires_at > now:
            return []
        return [ev.ObjectExpired(version=self.state.version + 1, at=now, object_id=object_id)]

    def snapshot(self, now: datetime) -> list[ev.Event]:
        """A journal entry that carries the whole state (and the definition, whose
        `StreamCreated` compaction removes), so that every event before it can go."""
        self.require_consumers()  # a snapshot carries every consumer
        version = self.state.version + 1
        state = copy_state(self.state)
        state.version = version
        return [
            ev.StreamSnapshotted(version=version, at=now, definition=self.definition, state=state)
        ]

    # -- apply: the only code that changes state, and the only code replay runs ---------------

    def apply(self, event: ev.Event) -> None:
        s = self.state
        if event.version != s.version + 1:
            raise ValueError(f"event version {event.version} does not follow {s.version}")
        if s.deleted:
            raise ValueError("nothing follows StreamDeleted")
        match event:
            case ev.StreamSnapshotted():
                if event.state.version != event.version:
                    raise ValueError("a snapshot carries the state at its own version")
                # A copy: the event stays as it was journaled whatever happens to the state.
                self.state = copy_state(event.state)
                return
            case ev.StreamCreated():
                s.created_at = event.at
                if (fork := event.definition.fork) is not None:
                    # The inherited prefix is the source's: nothing of it is held or counted.
                    s.head, s.earliest = fork.through, fork.through + 1
            case ev.RecordsAppended():
                items = event.last_sequence - event.first_sequence + 1
                s.head = event.last_sequence
                s.total_items += items
                s.total_bytes += event.bytes
                if event.producer is not None:
                    self._accept(event.producer, event.at)
                if event.writer_seq is not None:
                    s.writer_seq = event.writer_seq
            case ev.ConsumerAcknowledged():
                consumers = self.require_consumers()
                before = consumers.get(event.consumer_id)
                consumers[event.consumer_id] = Consumer(
                    principal=event.principal,
                    acked_sequence=event.sequence,
                    acked_offset=event.offset,
                    updated_at=event.at,
                    holds_credit=event.holds_credit,
                )
                if before is None:
                    s.consumer_count += 1
                    s.holding_count += event.holds_credit
                if event.holds_credit:
                    acked = CreditFloor(sequence=event.sequence, offset=event.offset)
                    _move_floor(s, before, acked)
            case ev.ConsumerRemoved():
                gone = self.require_consumers().pop(event.consumer_id)
                s.consumer_count -= 1
                if gone.holds_credit:
                    s.holding_count -= 1
                    _move_floor(s, gone, None)
            case ev.StreamClosed():
                s.closed = True
                s.closed_at = event.at
                if event.producer is not None:
                    self._accept(event.producer, event.at)
                    s.closed_by = event.producer
                if event.writer_seq is not None:
                    s.writer_seq = event.writer_seq
            case ev.LegalHoldChanged():
                s.legal_hold = LegalHold(
                    enabled=event.enabled, reason=event.reason, updated_at=event.at
                )
            case ev.RecordsPruned():
                s.earliest = event.through_sequence + 1
                s.pruned_bytes = event.pruned_bytes
            case ev.ObjectPrepared():
                s.objects[event.intent.object_id] = event.intent
            case ev.ObjectUploaded():
                s.objects[event.object_id] = msgspec.structs.replace(
                    s.objects[event.object_id], state="uploaded"
                )
            case ev.ObjectCommitted() | ev.ObjectAborted() | ev.ObjectExpired():
                del s.objects[event.object_id]
            case ev.StreamDeleted():
                s.deleted = True
            case ev.StreamSoftDeleted():
                s.soft_deleted = True
            case _:
                raise TypeError(f"unknown event {type(event).__name__}")
        s.version = event.version

    def _accept(self, claim: ProducerClaim, at: datetime) -> None:
        """Remember an accepted claim. A new producer past `MAX_PRODUCERS` makes the stream
        forget the one that wrote least recently (on a tie, the lowest producer ID), so replay
        forgets the same one, and a port that loaded only the least recent ones finds it."""
        producers = self.state.producers
        if (
            claim.producer_id not in producers
            and len(producers) + self.unloaded_producers >= MAX_PRODUCERS
        ):
            del producers[min(producers, key=lambda p: (producers[p].updated_at, p))]
        producers[claim.producer_id] = Producer(
            epoch=claim.epoch, last_seq=claim.seq, updated_at=at
        )


def _move_floor(s: StreamState, before: Consumer | None, after: CreditFloor | None) -> None:
    """A consumer that holds credit moved from `before` to `after` (None: created, removed).
    The floor is the minimum of every such consumer's (sequence, offset): it is recomputed over
    all of them only when the consumer that moved was at it, so acks of any other cost O(1)."""
    floor = s.credit_floor
    if before is not None and floor == CreditFloor(
        sequence=before.acked_sequence, offset=before.acked_offset
    ):
        s.credit_floor = slowest_holding(s.consumers)
    elif after is not None and (
        floor is None or (after.sequence, after.offset) < (floor.sequence, floor.offset)
    ):
        s.credit_floor = after


_definition_encoder = msgspec.json.Encoder()
_definition_decoder = msgspec.json.Decoder(StreamDefinition)


def encode_definition(definition: StreamDefinition) -> bytes:
    return _definition_encoder.encode(definition)


def definition_bytes(definition: StreamDefinition) -> int:
    """What a stream counts in its tenant's bytes (DUCTOR_STREAMS_MAX_BYTES_PER_TENANT): its
    definition as stored (its schema among it) and its row (`ROW_BYTES`)."""
    return len(encode_definition(definition)) + ROW_BYTES


def decode_definition(payload: bytes) -> StreamDefinition:
    return _definition_decoder.decode(payload)
