"""Append a batch of records: atomic, contiguous sequences, under durable credit."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TypeVar

import msgspec

from application import tracing
from application.access import Caller, require_writer
from application.definitions import Definitions
from application.errors import Unauthenticated
from application.group_commit import GroupCommit, run_one
from application.input_delivery import event_bytes
from application.live_slots import LiveSlots, Slot
from application.ports import Clock, Done, Failed, Idempotency, Replayed
from application.throughput import DURABLE_STREAMS
from application.tokens import Lease, TokenCache
from application.views import AppendAnswer
from application.waiting import back_to_work, give_turn, renew_budget, until_client_leaves
from application.wake import Listener, WakeRegistry
from domain import errors
from domain.definition import (
    MAX_BATCH_RECORDS,
    MAX_COMMAND_RECORDS,
    MAX_INLINE_RECORD_BYTES,
    StreamDefinition,
)
from domain.events import Event, RecordsAppended
from domain.producers import ProducerClaim, check_claim, check_writer_seq
from domain.records import NewRecord, RecordInput, RecordKind, fingerprint, prepare_records
from domain.stream import Stream, StreamKey

_answer_decoder = msgspec.json.Decoder(AppendAnswer)
_T = TypeVar("_T")


class AppendCommand:
    offset_of = None
    producer = None
    # What the default wait service's events of its records will hold, when it appends to an
    # input stream (`AppendRecords.copies_of`): counted in its tenant's bytes with its records.
    copies = 0
    # Committed by its stream's owner among this host's processes (application/group_commit.py):
    # it crosses to that process whole (adapters/peers.py), and its decision needs nothing of
    # the process that received it.
    forwardable = True

    def __init__(
        self,
        caller: Caller,
        records: Sequence[NewRecord],
        idempotency: Idempotency | None,
        now: datetime,
    ) -> None:
        self.caller = caller
        self.records = records
        self.idempotency = idempotency
        self.now = now

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        require_writer(self.caller, stream.definition)
        return stream.append(list(self.records), self.now)

    def answer(self, stream: Stream, events: list[Event]) -> AppendAnswer:
        appended = events[0]
        assert isinstance(appended, RecordsAppended)
        return AppendAnswer(
            first_sequence=appended.first_sequence,
            last_sequence=appended.last_sequence,
            head=stream.head,
            credit=stream.credit(),
        )


class NotificationCommand(AppendCommand):
    """The service's own append of a notification (a pull-wake subscription's wake event): not
    held back by the stream's unread ceiling, since no one acknowledges a wake stream (its
    workers read it and claim), and a ceiling reached would stop waking them for good. The
    total quotas and everything else still apply. Rare: committed where it arrives."""

    forwardable = False

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        require_writer(self.caller, stream.definition)
        return stream.append(list(self.records), self.now, flow_controlled=False)


class Produced(msgspec.Struct, frozen=True):
    """What a Durable Streams write did."""

    head: int  # the stream's head after this request (or now, if a duplicate)
    closed: bool  # the stream is closed after this request
    duplicate: bool  # a retry of what was already applied: nothing was appended
    producer_epoch: int | None  # the claim's epoch, echoed
    producer_seq: int | None  # the highest sequence accepted for (stream, producer, epoch)
    created_at: datetime | None = None  # the stream's incarnation (its offsets carry it)


class ProduceCommand:
    """A Durable Streams append (and/or close), decided by `Stream.produce` under the row lock.
    It has no idempotency key: the producer claim, kept in the stream's state, is what makes a
    retry safe."""

    idempotency: Idempotency | None = None
    offset_of = None
    surface = DURABLE_STREAMS  # counted by application/throughput.py
    forwardable = True  # as AppendCommand's
    copies = 0  # as AppendCommand's

    def __init__(
        self,
        caller: Caller,
        records: Sequence[NewRecord],
        now: datetime,
        *,
        producer: ProducerClaim | None = None,
        writer_seq: str | None = None,
        close: bool = False,
        content_conflict: str | None = None,
    ) -> None:
        self.caller = caller
        self.records = records
        self.now = now
        self.producer = producer
        self.writer_seq = writer_seq
        self.close = close
        self.content_conflict = content_conflict

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        require_writer(self.caller, stream.definition)
        return stream.produce(
            list(self.records),
            self.now,
            producer=self.producer,
            writer_seq=self.writer_seq,
            close=self.close,
            content_conflict=self.content_conflict,
        )

    def answer(self, stream: Stream, events: list[Event]) -> Produced:
        claim, seq = self.producer, None
        if claim is not None:
            known = stream.state.producers.get(claim.producer_id)
            seq = known.last_seq if known is not None and known.epoch == claim.epoch else claim.seq
        return Produced(
            head=stream.head,
            closed=stream.state.closed,
            duplicate=not events,
            producer_epoch=None if claim is None else claim.epoch,
            producer_seq=seq,
            created_at=stream.state.created_at,
        )


def check_idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not 1 <= len(value) <= 255 or not value.isprintable():
        raise errors.InvalidInput("Idempotency-Key must be 1 to 255 printable characters")
    return value


# An append body whose records hold more than this many bytes is prepared off the event loop.
OFF_LOOP_BYTES = 1024 * 1024


def _inline_bytes(inputs: list[RecordInput]) -> int:
    total = 0
    for item in inputs:
        if isinstance(item.data, msgspec.Raw):
            total += len(item.data)
        elif isinstance(item.data_base64, str):
            total += len(item.data_base64)
    return total


class AppendRecords:
    def __init__(
        self,
        definitions: Definitions,
        commits: GroupCommit,
        wake: WakeRegistry,
        clock: Clock,
        slots: LiveSlots | None = None,
        copies_kept: bool = False,
        tokens: TokenCache | None = None,
    ) -> None:
        self._definitions = definitions
        self._commits = commits
        self._wake = wake
        self._clock = clock
        # A write waiting for credit holds its token as an open connection does: revoked or
        # expired meanwhile, it ends (401) and appends nothing.
        self._tokens = tokens
        # The wait service keeps a copy of each input record in the database (the default,
        # `workflow_wait_events`), counted in its tenant's bytes once it lands.
        self._copies_kept = copies_kept
        # An append that waits for credit (`block`) holds its connection open like a waiting
        # read: it takes one of its principal's live-connection slots while it waits.
        self._slots = slots or LiveSlots(1_000)

    @tracing.use_case("append records")
    async def __call__(
        self,
        caller: Caller,
        run_id: str,
        stream_id: str,
        inputs: list[RecordInput],
        idempotency_key: str | None = None,
    ) -> tuple[AppendAnswer, bool]:
        """Answer, and whether it is the replay of an earlier request with the same key."""
        caller.require("streams:write")
        key = caller.key(run_id, stream_id)
        idempotency_key = check_idempotency_key(idempotency_key)
        if not 1 <= len(inputs) <= MAX_BATCH_RECORDS:
            raise errors.InvalidInput(
                f"an append carries 1 to {MAX_BATCH_RECORDS} records, not {len(inputs)}"
            )
        definition, records, idempotency = await self._prepared(
            caller, key, inputs, idempotency_key
        )
        copies = self.copies_of(key, definition, records)
        if definition.limits.unread_policy == "block":
            return await self._blocking(
                caller,
                key,
                definition,
                lambda: self._append(caller, key, records, idempotency, copies=copies),
            )
        return await self._append(caller, key, records, idempotency, copies=copies)

    def writing(self, caller: Caller, run_id: str, stream_id: str) -> StreamKey:
        """A Durable Streams write's first decision, before anything else is read: the caller
        may write streams, and the IDs name one (its key)."""
        caller.require("streams:write")
        return caller.key(run_id, stream_id)

    @staticmethod
    def check_claims(producer: ProducerClaim | None, writer_seq: str | None) -> None:
        """A write's producer claim and `Stream-Seq`, valid in themselves (before its body is
        read and its stream looked at)."""
        if producer is not None:
            check_claim(producer)
        if writer_seq is not None:
            check_writer_seq(writer_seq)

    @staticmethod
    def check_content(*, has_content: bool, close: bool) -> None:
        """A write carries content unless it closes (decided before its stream is looked at)."""
        if not has_content and not close:
            raise errors.InvalidInput("an append holds at least one record unless it closes")

    async def writable(self, caller: Caller, key: StreamKey) -> StreamDefinition:
        """The definition of the stream a write goes to, which the caller may write."""
        definition = await self._definitions.get(key, runs=caller.runs)
        require_writer(caller, definition)
        return definition

    async def produce(
        self,
        caller: Caller,
        run_id: str,
        stream_id: str,
        records: Sequence[NewRecord],
        *,
        producer: ProducerClaim | None = None,
        writer_seq: str | None = None,
        close: bool = False,
    ) -> Produced:
        """A Durable Streams append of prepared records: validated, appended and (with `close`)
        closed in one decision under the row lock, through the group commit like a native
        append. No records: close only (idempotent). Raises what `Stream.produce` refuses with,
        `Backpressure` (after waiting, under the `block` policy) included."""
        key = self.writing(caller, run_id, stream_id)
        self.check_content(has_content=bool(records), close=close)
        self.check_claims(producer, writer_seq)
        definition = await self.writable(caller, key)
        return await self.produce_checked(
            caller, key, definition, records, producer=producer, writer_seq=writer_seq, close=close
        )

    @tracing.use_case("produce")
    async def produce_checked(
        self,
        caller: Caller,
        key: StreamKey,
        definition: StreamDefinition,
        records: Sequence[NewRecord],
        *,
        producer: ProducerClaim | None = None,
        writer_seq: str | None = None,
        close: bool = False,
        content_conflict: str | None = None,
    ) -> Produced:
        """`produce`, once `writing`, `check_claims`, `check_content` and `writable` have
        decided (the protocol makes them in its own order, around reading the body).
        `content_conflict`: the body is not of the stream's content type, which the stream
        decides under its lock (closed, or a conflict: `Stream.produce`)."""
        if len(records) > MAX_COMMAND_RECORDS:
            raise errors.RequestTooLarge(
                f"an append carries at most {MAX_COMMAND_RECORDS} records, not {len(records)}"
            )
        for index, record in enumerate(records):
            if record.size > MAX_INLINE_RECORD_BYTES and record.kind != RecordKind.OBJECT:
                raise errors.RecordTooLarge(
                    f"records[{index}] is {record.size} bytes; an inline record may be at most "
                    f"{MAX_INLINE_RECORD_BYTES} bytes",
                    index=index,
                    size=record.size,
                    limit=MAX_INLINE_RECORD_BYTES,
                )

        copies = self.copies_of(key, definition, records)

        def command() -> ProduceCommand:
            made = ProduceCommand(
                caller,
                records,
                self._clock(),
                producer=producer,
                writer_seq=writer_seq,
                close=close,
                content_conflict=content_conflict,
            )
            made.copies = copies
            return made

        if records and definition.limits.unread_policy == "block":
            return await self._blocking(
                caller, key, definition, lambda: run_one(self._commits, key, command())
            )
        answer: Produced = await run_one(self._commits, key, command())
        return answer

    async def notify(
        self,
        caller: Caller,
        run_id: str,
        stream_id: str,
        inputs: list[RecordInput],
        idempotency_key: str | None = None,
    ) -> tuple[AppendAnswer, bool]:
        """An append of the service's own notification (`NotificationCommand`), checked as
        `__call__` checks a caller's, never held back by the unread ceiling (so never waits)."""
        key = caller.key(run_id, stream_id)
        checked = check_idempotency_key(idempotency_key)
        definition, records, idempotency = await self._prepared(caller, key, inputs, checked)
        copies = self.copies_of(key, definition, records)
        return await self._append(
            caller, key, records, idempotency, NotificationCommand, copies=copies
        )

    async def _prepared(
        self, caller: Caller, key: StreamKey, inputs: list[RecordInput], idempotency_key: str | None
    ) -> tuple[StreamDefinition, list[NewRecord], Idempotency | None]:
        """The stream's definition (its caller a writer), the records as the stream stores
        them, and the request's idempotency (its key and the records' fingerprint)."""
        definition = await self._definitions.get(key, runs=caller.runs)
        require_writer(caller, definition)
        prepare = functools.partial(
            prepare_records,
            inputs,
            definition.redaction,
            input_stream=definition.direction == "input",
        )
        # A large body is prepared in a thread, as a large Durable Streams body is: each
        # record's check is a C call that holds the interpreter (1,000 records of 64 KiB of
        # numbers: about 2 s in all), and in a thread the event loop, every other request of
        # this process, gets it back between records rather than after them all.
        records = (
            await asyncio.to_thread(prepare)
            if _inline_bytes(inputs) > OFF_LOOP_BYTES
            else prepare()
        )
        idempotency = (
            Idempotency(idempotency_key, fingerprint(records)) if idempotency_key else None
        )
        return definition, records, idempotency

    async def _append(
        self,
        caller: Caller,
        key: StreamKey,
        records: list[NewRecord],
        idempotency: Idempotency | None,
        kind: type[AppendCommand] = AppendCommand,
        *,
        copies: int = 0,
    ) -> tuple[AppendAnswer, bool]:
        command = kind(caller, records, idempotency, self._clock())
        command.copies = copies
        match await self._commits.submit(key, command):
            case Done(answer=answer):
                return answer, False
            case Replayed(answer_json=raw):
                return _answer_decoder.decode(raw), True
            case Failed(error=error):
                raise error
        raise AssertionError("unreachable")

    def copies_of(
        self, key: StreamKey, definition: StreamDefinition, records: Sequence[NewRecord]
    ) -> int:
        """What the wait service's events of these records will count in the tenant's bytes,
        at most (`input_delivery.event_bytes`), when it keeps them and the stream is an input:
        charged with the records, since the events land after the decision (charged only as
        they landed, a tenant's records with long IDs and content types and small payloads
        made events 12 times their count, past its limit)."""
        if not self._copies_kept or definition.direction != "input":
            return 0
        return sum(event_bytes(key, record) for record in records)

    async def _blocking(
        self,
        caller: Caller,
        key: StreamKey,
        definition: StreamDefinition,
        attempt: Callable[[], Awaitable[_T]],
    ) -> _T:
        """`blocking` for `caller` (`waiting_for_credit`)."""
        return await waiting_for_credit(
            caller, self._slots, self._tokens, self._wake, key, definition, attempt
        )


async def waiting_for_credit(
    caller: Caller,
    slots: LiveSlots,
    tokens: TokenCache | None,
    wake: WakeRegistry,
    key: StreamKey,
    definition: StreamDefinition,
    attempt: Callable[[], Awaitable[_T]],
) -> _T:
    """`blocking`, holding one of the caller's live-connection slots while it waits (past the
    principal's, the tenant's or a run's cap, 429 `too-many-subscriptions` instead of waiting:
    16,600 appends blocked for credit once held every connection granian accepts), and its
    token: revoked or expired meanwhile, the wait ends with 401 and nothing is written."""
    slot: Slot | None = None
    lease: Lease | None = None

    def admit() -> Lease | None:
        nonlocal slot, lease
        slot = slots.admit(caller)
        if tokens is not None:
            lease = tokens.hold(caller)
        return lease

    try:
        return await blocking(wake, key, definition, attempt, admit)
    finally:
        slots.release(caller, slot)
        if lease is not None and tokens is not None:
            tokens.release(lease)


async def blocking(
    wake: WakeRegistry,
    key: StreamKey,
    definition: StreamDefinition,
    attempt: Callable[[], Awaitable[_T]],
    before_waiting: Callable[[], Lease | None] | None = None,
) -> _T:
    """`attempt()` under `unread_policy: block` (an append's, or an object commit's record).
    Credit returns only through acknowledgements: on backpressure, wait for a sign that the
    stream changed and try again, until the pinned block timeout. `before_waiting` is called
    once, before the first wait (it may refuse it by raising); the lease it answers, once
    ended (its token revoked or expired), ends the wait with 401 before another attempt."""
    deadline = time.monotonic() + definition.limits.block_timeout_seconds
    lease: Lease | None = None
    with wake.listen(key) as listener:
        try:
            return await attempt()
        except errors.Backpressure:
            if deadline - time.monotonic() <= 0:
                raise
            if before_waiting is not None:
                lease = before_waiting()
        if lease is not None:
            lease.on_end(listener.wake)
        # From its first wait on, a client that leaves ends it (where its entrypoint watches
        # it, one watch for every wait): its append is not made for nobody once credit comes
        # back, nor its live slot held. An attempt already under way when it leaves commits,
        # as any request's does whose client leaves mid-commit.
        return await until_client_leaves(_waiting(listener, deadline, attempt, lease))


async def _waiting(
    listener: Listener, deadline: float, attempt: Callable[[], Awaitable[_T]], lease: Lease | None
) -> _T:
    """`blocking`'s waits for a sign that the stream changed, each followed by an attempt."""
    while True:
        # Waits for an acknowledgement, a request of the same tenant: its turn at work goes
        # back (application/waiting.py), or its acks could wait for it.
        give_turn()
        await listener.wait(max(0.0, deadline - time.monotonic()))
        if lease is not None and lease.ended:
            raise Unauthenticated("unknown, revoked or expired token")
        # Woken: a new attempt. Its waits on the database are bounded afresh (those of the
        # attempts that found no credit are not an outage: 300 writers blocked on one stream
        # answered 503 after 11 s of them), and it takes its turn at work again, so that an
        # acknowledgement does not set every blocked writer of the tenant to work at once.
        renew_budget()
        await back_to_work()
        if lease is not None and lease.ended:  # (revoked while it waited for its turn)
            raise Unauthenticated("unknown, revoked or expired token")
        try:
            return await attempt()
        except errors.Backpressure:
            if deadline - time.monotonic() <= 0:
                raise
