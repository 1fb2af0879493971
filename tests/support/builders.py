"""Small builders shared by the unit and integration tests."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

import msgspec

from application.access import SCOPES, Caller
from application.append_records import AppendCommand
from application.ports import Idempotency
from domain.definition import DefinitionRequest, Limits, StreamDefinition, resolve_definition
from domain.records import NewRecord, RecordKind, fingerprint
from domain.stream import StreamKey

NOW = datetime(2026, 1, 1, tzinfo=UTC)
WRITER = Caller(tenant="t1", principal="writer", scopes=frozenset(SCOPES))
READER = Caller(tenant="t1", principal="reader", scopes=frozenset({"streams:read"}))


def definition(stream_id: str = "s", **limits: object) -> StreamDefinition:
    request = DefinitionRequest(
        direction="output", stream_id=stream_id, limits=msgspec.convert(limits, Limits)
    )
    return resolve_definition(request, region="local", egress_region="local")


def new_key(tenant: str = "t1") -> StreamKey:
    return StreamKey(tenant, "run-" + secrets.token_hex(4), "s")


def record(payload: bytes = b'{"n":1}') -> NewRecord:
    return NewRecord(RecordKind.JSON, "application/json", payload, len(payload))


def append(
    records: Sequence[NewRecord] | None = None,
    key: str | None = None,
    caller: Caller = WRITER,
) -> AppendCommand:
    records = list(records) if records is not None else [record()]
    idem = Idempotency(key, fingerprint(records)) if key else None
    return AppendCommand(caller, records, idem, NOW)
