"""Large-object intents: prepared -> uploaded -> committed, or aborted / expired.

An intent pins everything a later step checks: scope, idempotency key, digest, size, content
type, schema, the authorization receipt (who decided, with which scopes, when), its expiry and the
server-owned storage key. Open intents (prepared or uploaded) live in the stream's state so the
commit that turns one into a record is decided under the same row lock as every append."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from domain.definition import MAX_OBJECT_BYTES
from domain.errors import InvalidInput
from domain.records import NewRecord, RecordKind, held_bytes
from domain.text import (
    DOCUMENTED_JSON_TEXT,
    DOCUMENTED_MEDIA_TYPE,
    DOCUMENTED_TEXT,
    check_json_size,
    check_json_text,
    check_media_type,
    check_text,
)

# The longest an intent may stay open (docs/http-api.md, "Objects").
MAX_INTENT_SECONDS = 24 * 3600
# An open intent lives in its stream's state, which every commit on the stream rewrites, and an
# object record carries its schema to every reader: both stay small.
MAX_OBJECT_SCHEMA_BYTES = 4_096

ObjectState = Literal["prepared", "uploaded", "committed", "aborted", "expired"]
# `$(?!\n)`: msgspec matches with re.search, where `$` alone also matches before a final newline.
Sha256Hex = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$(?!\n)")]


class AuthorizationReceipt(msgspec.Struct, frozen=True):
    principal: str
    scopes: tuple[str, ...]
    decided_at: datetime


class ObjectRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A prepare body."""

    idempotency_key: Annotated[str, msgspec.Meta(min_length=1, max_length=255), DOCUMENTED_TEXT]
    # The 32 MiB cap is documented here but decided by the prepare: over it is 413
    # `object-too-large`, the one answer for an object body too large wherever it is found,
    # and not the 400 of a body field's other bounds. The schema says so, beside the bound.
    size: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            description=f"The body's size in bytes. Over the maximum ({MAX_OBJECT_BYTES}, "
            "32 MiB) is 413 object-too-large, not 400: the answer for an object too large "
            "wherever it is found",
            extra_json_schema={"maximum": MAX_OBJECT_BYTES},
        ),
    ]
    sha256: Sha256Hex
    content_type: Annotated[
        str, msgspec.Meta(min_length=1, max_length=255), DOCUMENTED_MEDIA_TYPE
    ] = "application/octet-stream"
    schema: Annotated[Any, DOCUMENTED_JSON_TEXT] = None
    # At most a day: an open intent holds one of its stream's open-intent places and pledges
    # its size against the stream's total ceiling until it is committed, aborted or expires.
    expires_in_seconds: Annotated[int, msgspec.Meta(ge=1, le=MAX_INTENT_SECONDS)] = 3600

    def __post_init__(self) -> None:
        # Raised while decoding, a ValueError becomes the decoder's ValidationError: 400.
        try:
            check_text("idempotency_key", self.idempotency_key)
            check_media_type("content_type", self.content_type)
            check_json_text("schema", self.schema)
            check_json_size("schema", self.schema, MAX_OBJECT_SCHEMA_BYTES)
        except InvalidInput as error:
            raise ValueError(error.detail) from None


class ObjectIntent(msgspec.Struct, frozen=True):
    object_id: str
    idempotency_key: str
    state: ObjectState
    size: int
    sha256: str
    content_type: str
    schema: Any
    storage_region: str
    storage_key: str
    receipt: AuthorizationReceipt
    expires_at: datetime
    created_at: datetime
    sequence: int | None = None

    def same_request(self, request: ObjectRequest | ObjectIntent) -> bool:
        return (
            self.size == request.size
            and self.sha256 == request.sha256
            and self.content_type == request.content_type
            and self.schema == request.schema
        )


class ObjectReference(msgspec.Struct, frozen=True):
    """What a committed object's record carries instead of inline data."""

    object_id: str
    size: int
    sha256: str
    content_type: str
    schema: Any


_encode_reference = msgspec.json.Encoder().encode


def object_record(intent: ObjectIntent) -> NewRecord:
    """The record an intent's commit appends: its reference, in the object's place."""
    reference = ObjectReference(
        object_id=intent.object_id,
        size=intent.size,
        sha256=intent.sha256,
        content_type=intent.content_type,
        schema=intent.schema,
    )
    return NewRecord(
        kind=RecordKind.OBJECT,
        content_type=intent.content_type,
        payload=_encode_reference(reference),
        size=intent.size,
    )


def pledged_bytes(intent: ObjectIntent) -> int:
    """What an open intent counts in its tenant's bytes: what its record will, once committed."""
    return held_bytes(object_record(intent))
