"""Records as they are appended: a stored payload, its size and how to present it again."""

from __future__ import annotations

import base64
import binascii
import hashlib
from enum import IntEnum
from typing import Any

import msgspec

from domain.definition import MAX_INLINE_RECORD_BYTES, Redaction, parse_pointer
from domain.errors import InvalidInput, RecordTooLarge

REDACTED = "[REDACTED]"


class RecordKind(IntEnum):
    JSON = 0
    BINARY = 1
    OBJECT = 2


class NewRecord(msgspec.Struct, frozen=True):
    """A record ready to store. Its size is the length of `payload` (what is written), except for
    an object's record, whose payload is the reference and whose size is the body's. It is a
    field, not computed, because the append path reads it several times per record."""

    kind: RecordKind
    content_type: str
    payload: bytes
    size: int


class RecordInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One record of an append body: inline JSON `data`, or bytes as `data_base64`."""

    data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    data_base64: str | msgspec.UnsetType = msgspec.UNSET
    content_type: str | msgspec.UnsetType = msgspec.UNSET


_json_decode = msgspec.json.Decoder().decode
_json_encode = msgspec.json.Encoder().encode


def prepare_records(inputs: list[RecordInput], redaction: Redaction) -> list[NewRecord]:
    """Turn an append body into stored payloads: compact JSON, redacted, size-checked.

    Nothing is half-done: the first bad record raises and the caller appends none of the batch.
    """
    pointers = [parse_pointer(p) for p in redaction.json_pointers]
    prepared: list[NewRecord] = []
    for index, item in enumerate(inputs):
        has_data = item.data is not msgspec.UNSET
        has_b64 = item.data_base64 is not msgspec.UNSET
        if has_data == has_b64:
            raise InvalidInput(
                f"records[{index}] must have exactly one of `data` or `data_base64`",
                field=f"records[{index}]",
            )
        if has_data:
            raw = bytes(item.data)  # type: ignore[arg-type]
            if pointers:
                payload = _json_encode(redact(_json_decode(raw), pointers))
            else:
                payload = msgspec.json.format(raw, indent=-1)
            content_type = item.content_type or "application/json"
            kind = RecordKind.JSON
        else:
            try:
                payload = base64.b64decode(item.data_base64, validate=True)  # type: ignore[arg-type]
            except (binascii.Error, ValueError):
                raise InvalidInput(
                    f"records[{index}].data_base64 is not valid base64",
                    field=f"records[{index}].data_base64",
                ) from None
            content_type = item.content_type or "application/octet-stream"
            kind = RecordKind.BINARY
        if len(content_type) > 255 or not content_type.strip():
            raise InvalidInput(
                f"records[{index}].content_type must be 1 to 255 characters",
                field=f"records[{index}].content_type",
            )
        if len(payload) > MAX_INLINE_RECORD_BYTES:
            raise RecordTooLarge(
                f"records[{index}] is {len(payload)} bytes; an inline record may be at most "
                f"{MAX_INLINE_RECORD_BYTES} bytes (use an object for larger bodies)",
                index=index,
                size=len(payload),
                limit=MAX_INLINE_RECORD_BYTES,
            )
        prepared.append(NewRecord(kind, content_type, payload, len(payload)))
    return prepared


def redact(document: Any, pointers: list[tuple[str, ...]]) -> Any:
    """Replace the value at each pointer that exists with REDACTED; absent paths are ignored."""
    for tokens in pointers:
        if not tokens:
            return REDACTED
        parent = document
        for token in tokens[:-1]:
            parent = _child(parent, token)
            if parent is None:
                break
        else:
            last = tokens[-1]
            if isinstance(parent, dict) and last in parent:
                parent[last] = REDACTED
            elif isinstance(parent, list) and _index(last, len(parent)) is not None:
                parent[_index(last, len(parent))] = REDACTED  # type: ignore[index]
    return document


def _child(node: Any, token: str) -> Any:
    if isinstance(node, dict):
        return node.get(token)
    if isinstance(node, list):
        i = _index(token, len(node))
        return None if i is None else node[i]
    return None


def _index(token: str, length: int) -> int | None:
    if token.isdigit() and (token == "0" or not token.startswith("0")):
        i = int(token)
        return i if i < length else None
    return None


def fingerprint(records: list[NewRecord]) -> bytes:
    """What makes two append requests "the same body" for an idempotency key."""
    h = hashlib.sha256()
    for r in records:
        h.update(b"%d|%d|%s|" % (r.kind, len(r.payload), r.content_type.encode()))
        h.update(r.payload)
    return h.digest()
