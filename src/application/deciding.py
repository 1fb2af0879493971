"""The one loop every stream port runs under its lock: decide each command in order.

Shared by the PostgreSQL and memory adapters so that both answer the same way: an idempotency
key seen before replays (or is refused as reused), a failing command leaves no trace and does not
disturb the others, and the events of each command are applied before the next is decided.

Snapshots are taken here too, so both adapters take them at the same versions: when a group's
events carry the version across a multiple of `snapshot_every`, a `StreamSnapshotted` follows
them in the same transaction. Counting versions (not commands or groups) makes it deterministic
and independent of how commands were grouped, and a failed command, which emits nothing, cannot
cause one. The journal before the latest snapshot is then redundant: the compaction job removes
it, so a stream's journal holds O(snapshot_every + one group) events, not every event ever.

An adapter may hand over a state without its consumers (the PostgreSQL one does, so that an
append costs the same however many a stream has): a decision that needs them, an ack, a
removal, a snapshot or a stream document, raises `ConsumersNotLoaded` out of `decide_all`, and
the adapter reads them and decides the whole group again from the state as it read it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

import msgspec

from application.errors import NotFound
from application.ports import Command, Done, Failed, Outcome, Replayed
from application.tenant_limits import TenantRoom
from domain.errors import IdempotencyKeyReused
from domain.events import (
    Event,
    ObjectAborted,
    ObjectCommitted,
    ObjectExpired,
    ObjectPrepared,
    RecordsAppended,
    StreamDeleted,
    StreamSnapshotted,
)
from domain.objects import pledged_bytes
from domain.records import NewRecord, held_bytes, receipt_bytes
from domain.state import ConsumersNotLoaded
from domain.stream import Stream

_encode = msgspec.json.Encoder().encode

# Versions between snapshots (DUCTOR_STREAMS_SNAPSHOT_EVERY_EVENTS). A snapshot costs one encode
# of the state; at 1,000 that is well under 1% of the group commits that lead to it.
SNAPSHOT_EVERY = 1000


class AppendedRecords(msgspec.Struct, frozen=True):
    """The records of one append, in order: sequences from `first_sequence`, their bytes
    contiguous after `first_offset` (each record's end offset is the running sum of sizes).
    Kept as the batch it came in, not a row object per record: the adapters number the records
    as they write them, in one pass."""

    first_sequence: int
    first_offset: int
    at: datetime
    records: Sequence[NewRecord]
    # Its records' wait events are charged to its tenant (`copies`: an input stream's, with
    # the default wait service): each delivery row pledges its event's bytes until it lands.
    charged: bool = False

    def numbered(self) -> Iterator[tuple[int, int, NewRecord]]:
        """(sequence, end offset, record) of each record."""
        end = self.first_offset
        for sequence, record in enumerate(self.records, self.first_sequence):
            end += record.size
            yield sequence, end, record

    @property
    def sequences(self) -> range:
        return range(self.first_sequence, self.first_sequence + len(self.records))


class Receipt(msgspec.Struct, frozen=True):
    key: str
    fingerprint: bytes
    answer_json: bytes


class Changes(msgspec.Struct):
    """Everything one transaction must write besides the snapshot."""

    events: list[Event] = msgspec.field(default_factory=list)
    appended: list[AppendedRecords] = msgspec.field(default_factory=list)
    receipts: list[Receipt] = msgspec.field(default_factory=list)
    snapshot: StreamSnapshotted | None = None  # the last of `events`, when one was taken
    # A command erased the stream (a `StreamDeleted` among `events`): the transaction erases it
    # instead of writing. Kept, not searched for: every stream of a batch asks several times.
    deleted: bool = False


def decide_all(
    stream: Stream,
    commands: Sequence[Command],
    receipts: dict[str, Receipt],
    offsets: dict[int, int],
    snapshot_every: int = SNAPSHOT_EVERY,
) -> tuple[list[Outcome], Changes]:
    outcomes: list[Outcome] = []
    changes = Changes()
    version_before = stream.state.version
    # Offsets a command needs that were not stored yet: of records an earlier command of this
    # group appends (an ack of a record in the same commit as its append answered 500).
    wanted = {
        c.offset_of for c in commands if c.offset_of is not None and c.offset_of not in offsets
    }
    for command in commands:
        if stream.state.deleted:
            # Erased earlier in this group: a command after it finds no stream, as it would
            # in the next transaction.
            key = stream.key
            outcomes.append(Failed(NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")))
            continue
        idem = command.idempotency
        if (
            idem is not None
            and (seen := receipts.get(idem.key)) is not None
            and not stream.state.soft_deleted  # gone: 410, as every write is (its decision)
        ):
            if seen.fingerprint == idem.fingerprint:
                outcomes.append(Replayed(answer_json=seen.answer_json))
            else:
                outcomes.append(
                    Failed(
                        IdempotencyKeyReused(
                            f"Idempotency-Key {idem.key!r} was used before with another request"
                        )
                    )
                )
            continue
        try:
            events = command.decide(
                stream, None if command.offset_of is None else offsets.get(command.offset_of)
            )
        except ConsumersNotLoaded:
            raise  # not the command's failure: the adapter reads the consumers and decides again
        except Exception as error:
            outcomes.append(Failed(error))
            continue
        # The tenant's limit (application/tenant_limits.py): decided here, after a retry of
        # what was stored is recognized above or by the decision (a duplicate stores nothing),
        # so that one is answered as before at the limit. What gives room back (an abort; a
        # commit turns its pledge into its record) is never refused. The room already leaves
        # out what the earlier requests of its process may store, this group's among them
        # (`ByteLimit.reserve`): counted again here, a busy stream's batches were refused at the
        # limit less their own bytes.
        room: TenantRoom | None = getattr(command, "tenant_room", None)
        adding = 0
        if room is not None:
            adding = stored_bytes(stream, events, command.records, getattr(command, "copies", 0))
            if idem is not None:  # its receipt, kept a day
                adding += receipt_bytes(idem.key)
        if room is not None and adding > 0 and room.held + adding > room.limit:
            outcomes.append(Failed(room.refusal(adding)))
            continue
        for event in events:
            stream.apply(event)
            if isinstance(event, RecordsAppended):
                appended = AppendedRecords(
                    event.first_sequence,
                    event.first_offset,
                    event.at,
                    command.records,
                    getattr(command, "copies", 0) > 0,
                )
                changes.appended.append(appended)
                if wanted and any(event.first_sequence <= s <= event.last_sequence for s in wanted):
                    for sequence, end_offset, _ in appended.numbered():
                        if sequence in wanted:
                            offsets[sequence] = end_offset
        changes.events.extend(events)
        answer = command.answer(stream, events)
        if idem is not None:
            receipt = Receipt(idem.key, idem.fingerprint, _encode(answer))
            receipts[idem.key] = receipt
            changes.receipts.append(receipt)
        outcomes.append(Done(events=events, answer=answer, stored=adding))
    changes.deleted = any(type(e) is StreamDeleted for e in changes.events)
    if changes.events and not stream.state.deleted:  # an erased stream keeps no journal
        changes.snapshot = snapshot_if_due(
            stream, version_before, snapshot_every, changes.events[-1].at
        )
        if changes.snapshot is not None:
            changes.events.append(changes.snapshot)
    return outcomes, changes


def stored_bytes(
    stream: Stream, events: Sequence[Event], records: Sequence[NewRecord], copies: int = 0
) -> int:
    """What these events of a command appending `records`, not yet applied to `stream`, add to
    its tenant's bytes (`held_bytes`): its records (and `copies`, their wait events', once they
    are appended: a producer's duplicate appends nothing), and what open object intents pledge,
    less the pledges they end (a commit ends its intent's pledge as its record takes it up: the
    two together add nothing)."""
    size = 0
    for event in events:
        match event:
            case RecordsAppended():
                size += sum(held_bytes(r) for r in records) + copies
            case ObjectPrepared(intent=intent):
                size += pledged_bytes(intent)
            case (
                ObjectCommitted(object_id=ended)
                | ObjectAborted(object_id=ended)
                | ObjectExpired(object_id=ended)
            ):
                pledged = stream.state.objects.get(ended)
                if pledged is not None:
                    size -= pledged_bytes(pledged)
    return size


def snapshot_if_due(
    stream: Stream, version_before: int, snapshot_every: int, now: datetime
) -> StreamSnapshotted | None:
    """Snapshot (and apply it) when the version went past a multiple of `snapshot_every` since
    `version_before`."""
    if stream.state.version // snapshot_every <= version_before // snapshot_every:
        return None
    [snapshot] = stream.snapshot(now)
    assert isinstance(snapshot, StreamSnapshotted)
    stream.apply(snapshot)
    return snapshot
