"""INTERIM, until `AppendRecords.produce` and `CreateStream.create_resolved` land: the same
signatures over the native use cases (not atomic, no producers, no Stream-Seq). Removed once
the domain work is merged."""

from __future__ import annotations

import base64
from collections.abc import Sequence

import msgspec

from application.access import Caller
from domain.definition import StreamDefinition
from domain.producers import ProducerClaim
from domain.records import NewRecord, RecordInput, RecordKind


class Produced(msgspec.Struct, frozen=True):
    head: int
    closed: bool
    duplicate: bool
    producer_epoch: int | None
    producer_seq: int | None


def _inputs(records: Sequence[NewRecord]) -> list[RecordInput]:
    return [
        RecordInput(data=msgspec.Raw(r.payload))
        if r.kind == RecordKind.JSON
        else RecordInput(
            data_base64=base64.b64encode(r.payload).decode(), content_type=r.content_type
        )
        for r in records
    ]


async def produce(
    services: object,
    caller: Caller,
    run_id: str,
    stream_id: str,
    records: Sequence[NewRecord],
    *,
    producer: ProducerClaim | None = None,
    writer_seq: str | None = None,
    close: bool = False,
) -> Produced:
    head = None
    if records:
        answer, _ = await services.append_records(caller, run_id, stream_id, _inputs(records))  # type: ignore[attr-defined]
        head = answer.head
    closed = False
    if close:
        document = await services.close_stream(caller, run_id, stream_id)  # type: ignore[attr-defined]
        head, closed = document.state.head, True
    assert head is not None
    return Produced(head, closed, False, None, None)


async def create_resolved(
    services: object,
    caller: Caller,
    run_id: str,
    definition: StreamDefinition,
    *,
    initial: Sequence[NewRecord] = (),
    closed: bool = False,
) -> tuple[object, bool]:
    create = services.create_stream  # type: ignore[attr-defined]
    key = caller.key(run_id, definition.stream_id)
    expires_at = definition.expiry.expires_at
    if expires_at is not None and expires_at <= create._clock():
        from domain.errors import InvalidInput

        raise InvalidInput("Stream-Expires-At has already passed", field="Stream-Expires-At")
    stream, created = await create._streams.create(key, definition, create._clock())
    if created and definition.expiry.enabled:
        create._access.remember(key, create._clock(), recorded=True)
    if not created and await create._access.expired(
        key, stream.definition, create._clock(), held=stream.state.legal_hold.enabled
    ):
        from application.expiry import ExpireCommand

        command = ExpireCommand(create._clock(), create._access.known(key), create._access.slack)
        await create._streams.update(key, [command])
        stream, created = await create._streams.create(key, definition, create._clock())
    if not created and stream.definition != definition:
        from domain.errors import DefinitionConflict

        raise DefinitionConflict("the stream exists with another configuration")
    if created and (initial or closed):
        await produce(services, caller, run_id, definition.stream_id, initial, close=closed)
        stream = await create._streams.load(key) or stream
    return stream, created
