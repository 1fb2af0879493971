"""The one loop every stream port runs under its lock: decide each command in order.

Shared by the PostgreSQL and memory adapters so that both answer the same way: an idempotency
key seen before replays (or is refused as reused), a failing command leaves no trace and does not
disturb the others, and the events of each command are applied before the next is decided.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from application.ports import Command, Done, Failed, Outcome, Replayed
from domain.errors import IdempotencyKeyReused
from domain.events import Event, RecordsAppended
from domain.records import NewRecord
from domain.stream import Stream

_encode = msgspec.json.Encoder().encode


class RecordRow(msgspec.Struct, frozen=True):
    sequence: int
    end_offset: int
    record: NewRecord


class Receipt(msgspec.Struct, frozen=True):
    key: str
    fingerprint: bytes
    answer_json: bytes


class Changes(msgspec.Struct):
    """Everything one transaction must write besides the snapshot."""

    events: list[Event] = msgspec.field(default_factory=list)
    records: list[RecordRow] = msgspec.field(default_factory=list)
    receipts: list[Receipt] = msgspec.field(default_factory=list)


def decide_all(
    stream: Stream,
    commands: Sequence[Command],
    receipts: dict[str, Receipt],
    offsets: dict[int, int],
) -> tuple[list[Outcome], Changes]:
    outcomes: list[Outcome] = []
    changes = Changes()
    for command in commands:
        idem = command.idempotency
        if idem is not None and (seen := receipts.get(idem.key)) is not None:
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
        except Exception as error:
            outcomes.append(Failed(error))
            continue
        for event in events:
            stream.apply(event)
            if isinstance(event, RecordsAppended):
                end = event.first_offset
                for sequence, record in enumerate(command.records, event.first_sequence):
                    end += record.size
                    changes.records.append(RecordRow(sequence, end, record))
        changes.events.extend(events)
        answer = command.answer(stream, events)
        if idem is not None:
            receipt = Receipt(idem.key, idem.fingerprint, _encode(answer))
            receipts[idem.key] = receipt
            changes.receipts.append(receipt)
        outcomes.append(Done(events=events, answer=answer))
    return outcomes, changes
