"""Append a batch of records: atomic, contiguous sequences, under durable credit."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime

import msgspec

from application.access import Caller, require_writer
from application.definitions import Definitions
from application.group_commit import GroupCommit
from application.ports import Clock, Done, Failed, Idempotency, Replayed
from application.views import AppendAnswer
from application.wake import WakeRegistry
from domain import errors
from domain.definition import MAX_BATCH_RECORDS, StreamDefinition
from domain.events import Event, RecordsAppended
from domain.records import NewRecord, RecordInput, fingerprint, prepare_records
from domain.stream import Stream, StreamKey

_answer_decoder = msgspec.json.Decoder(AppendAnswer)


class AppendCommand:
    offset_of = None

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


def check_idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not 1 <= len(value) <= 255 or not value.isprintable():
        raise errors.InvalidInput("Idempotency-Key must be 1 to 255 printable characters")
    return value


class AppendRecords:
    def __init__(
        self,
        definitions: Definitions,
        commits: GroupCommit,
        wake: WakeRegistry,
        clock: Clock,
    ) -> None:
        self._definitions = definitions
        self._commits = commits
        self._wake = wake
        self._clock = clock

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
        definition = await self._definitions.get(key)
        require_writer(caller, definition)
        records = prepare_records(
            inputs, definition.redaction, json_text_without_nul=definition.direction == "input"
        )
        idempotency = (
            Idempotency(idempotency_key, fingerprint(records)) if idempotency_key else None
        )
        if definition.limits.unread_policy == "block":
            return await self._append_blocking(caller, key, records, idempotency, definition)
        return await self._append(caller, key, records, idempotency)

    async def _append(
        self,
        caller: Caller,
        key: StreamKey,
        records: list[NewRecord],
        idempotency: Idempotency | None,
    ) -> tuple[AppendAnswer, bool]:
        command = AppendCommand(caller, records, idempotency, self._clock())
        match await self._commits.submit(key, command):
            case Done(answer=answer):
                return answer, False
            case Replayed(answer_json=raw):
                return _answer_decoder.decode(raw), True
            case Failed(error=error):
                raise error
        raise AssertionError("unreachable")

    async def _append_blocking(
        self,
        caller: Caller,
        key: StreamKey,
        records: list[NewRecord],
        idempotency: Idempotency | None,
        definition: StreamDefinition,
    ) -> tuple[AppendAnswer, bool]:
        """Credit returns only through acknowledgements: on backpressure, wait for a sign that
        the stream changed and try again, until the pinned block timeout."""
        deadline = time.monotonic() + definition.limits.block_timeout_seconds
        with self._wake.listen(key) as listener:
            while True:
                try:
                    return await self._append(caller, key, records, idempotency)
                except errors.Backpressure:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise
                    await listener.wait(remaining)
