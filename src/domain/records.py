"""Records as they are appended: a stored payload, its size and how to present it again."""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from collections.abc import Iterable
from enum import IntEnum
from typing import Any, Protocol

import msgspec

from domain.definition import MAX_INLINE_RECORD_BYTES, Redaction, parse_pointer
from domain.digits import bounded_integer
from domain.errors import InvalidInput, RecordTooLarge
from domain.text import check_media_type, has_escaped_nul

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


# What a record counts in its tenant's bytes beyond its own (DUCTOR_STREAMS_MAX_BYTES_PER_TENANT):
# its row's share of what storing it takes (a row, index entries, its part of the journal). A
# record of no bytes takes them all, and counted at nothing, a tenant at its limit could still
# append 13 MB a second of empty records.
ROW_BYTES = 128


class _Stored(Protocol):
    @property
    def kind(self) -> RecordKind: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def size(self) -> int: ...


# What an idempotent append's receipt counts in its tenant's bytes beyond its key, for the day it
# is kept: its row (`ROW_BYTES`), its fingerprint (a SHA-256) and its answer (an append's: seven
# numbers, at most about 250 bytes). Counted at nothing, a tenant at its limit could append to a
# stream that keeps nothing (or append empty records and prune them) under a new key each time,
# and hold its append rate times a day of receipts.
RECEIPT_BYTES = ROW_BYTES + 32 + 256


def receipt_bytes(key: str) -> int:
    """What the receipt of an append under idempotency key `key` counts in its tenant's bytes."""
    return len(key.encode()) + RECEIPT_BYTES


def held_bytes(record: _Stored) -> int:
    """What a record counts in its tenant's bytes: its size, its row (`ROW_BYTES`), and for an
    object's record the reference stored in the object's place (its schema among it)."""
    extra = len(record.payload) if record.kind == RecordKind.OBJECT else 0
    return record.size + extra + ROW_BYTES


class RecordInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One record of an append body: inline JSON `data`, or bytes as `data_base64`."""

    data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    data_base64: str | msgspec.UnsetType = msgspec.UNSET
    content_type: str | msgspec.UnsetType = msgspec.UNSET


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is beyond what an IEEE double can hold")
    return value


# Redaction decodes and re-encodes; the hook makes an overflowing number its own 400.
_json_decode = msgspec.json.Decoder(float_hook=_finite).decode
# Every JSON record is decoded once, to find a number that overflows a double. A regular
# expression used to pick the records that might (a three-digit exponent, or 210 digits in a
# row), but searching for it cost more than decoding: 2.8 vs 0.4 µs for a 100-byte record, 2.2
# ms vs 31 µs for 60 KB (timeit), and it was half of a batched append's server CPU (py-spy).
_json_encode = msgspec.json.Encoder().encode


def prepare_records(
    inputs: list[RecordInput], redaction: Redaction, *, input_stream: bool = False
) -> list[NewRecord]:
    """Turn an append body into stored payloads: compact JSON, redacted, size-checked.

    `input_stream`: its records reach the workflow wait service as JSON, which must hold them
    all. PostgreSQL's jsonb (the default wait service) cannot hold U+0000 in a string, and an
    engine's client (DBOS's) cannot decode an integer longer than Python decodes (over 4,300
    digits): one such record would stop the stream's delivery for good, so both are 400.

    Nothing is half-done: the first bad record raises and the caller appends none of the batch.
    This runs for every record a server receives, so the common case (inline JSON with the
    default content type) takes the shortest path; every check still applies to every record.
    """
    pointers = (
        Pointers([parse_pointer(p) for p in redaction.json_pointers])
        if redaction.json_pointers
        else None
    )
    prepared: list[NewRecord] = []
    add = prepared.append
    unset, compact, json_kind = msgspec.UNSET, _compact, RecordKind.JSON
    check_finite = _check_deliverable if input_stream else _check_finite
    for index, item in enumerate(inputs):
        data, content_type = item.data, item.content_type
        if data is not unset and item.data_base64 is unset:
            if pointers is not None:
                payload = _json_encode(redact(_decode(index, data), pointers))
            else:
                payload = compact(data, indent=-1)
                check_finite(index, payload)
            kind, default = json_kind, "application/json"
            if input_stream and has_escaped_nul(payload):
                raise InvalidInput(
                    f"records[{index}].data holds U+0000, which an input stream cannot deliver",
                    field=f"records[{index}].data",
                )
        else:
            payload, kind = _binary(index, item), RecordKind.BINARY
            default = "application/octet-stream"
        if not content_type:  # absent or empty: the kind's default (known good)
            content_type = default
        else:
            _check_content_type(index, content_type)
        size = len(payload)
        if size > MAX_INLINE_RECORD_BYTES:
            raise _too_large(index, size)
        add(NewRecord(kind, content_type, payload, size))
    return prepared


_compact = msgspec.json.format


def compact_json_records(values: list[msgspec.Raw], document: bytes) -> list[NewRecord] | None:
    """`prepare_records` for JSON `values` (compact already, with no content type) of a stream
    with no redaction that is not an input stream, as one pass: `document`, the compact JSON
    they are the values of, is decoded once to find a number no double holds, instead of each
    value on its own; each value is a record as it is. None when the document holds a value
    that the general path must refuse or keep one by one (a number past a double's range, an
    integer longer than Python decodes): the caller then prepares them with `prepare_records`.
    For 100,000 small messages this takes 35 ms where the general path took 97 (most of it
    a compaction and a decode per value), and the request's event loop is held that much less."""
    try:
        _json_decode(document)
    except msgspec.ValidationError:
        return None
    json_kind, json_type, limit = RecordKind.JSON, "application/json", MAX_INLINE_RECORD_BYTES
    prepared: list[NewRecord] = []
    add = prepared.append
    for index, value in enumerate(values):
        payload = bytes(value)
        size = len(payload)
        if size > limit:
            raise _too_large(index, size)
        add(NewRecord(json_kind, json_type, payload, size))
    return prepared


def _too_large(index: int, size: int) -> RecordTooLarge:
    return RecordTooLarge(
        f"records[{index}] is {size} bytes; an inline record may be at most "
        f"{MAX_INLINE_RECORD_BYTES} bytes (use an object for larger bodies)",
        index=index,
        size=size,
        limit=MAX_INLINE_RECORD_BYTES,
    )


def _decode(index: int, data: msgspec.Raw | bytes) -> Any:
    """The data as Python values, for redaction: it must decode, and hold no infinite number."""
    try:
        return _json_decode(data)
    except msgspec.ValidationError as error:
        _refuse_overflow(index, error)
        raise InvalidInput(
            f"records[{index}].data cannot be redacted: {error}", field=f"records[{index}].data"
        ) from None


def _check_finite(index: int, payload: bytes) -> None:
    """400 for a number that decodes to ±infinity: clients would read Infinity or fail."""
    try:
        _json_decode(payload)
    except msgspec.ValidationError as error:
        # Unless it is that: an integer longer than Python decodes (over 4,300 digits), kept as is.
        _refuse_overflow(index, error)


def _check_deliverable(index: int, payload: bytes) -> None:
    """`_check_finite`, and 400 for an integer longer than Python decodes: an input stream's
    record must decode wherever it is delivered."""
    try:
        _json_decode(payload)
    except msgspec.ValidationError as error:
        _refuse_overflow(index, error)
        raise InvalidInput(
            f"records[{index}].data holds an integer of over 4,300 digits, which an input "
            "stream cannot deliver",
            field=f"records[{index}].data",
        ) from None


def _refuse_overflow(index: int, error: msgspec.ValidationError) -> None:
    if "IEEE double" in str(error):
        raise InvalidInput(
            f"records[{index}].data holds a number no IEEE double can hold",
            field=f"records[{index}].data",
        ) from None


def _check_content_type(index: int, content_type: str) -> None:
    check_media_type(f"records[{index}].content_type", content_type)


def _binary(index: int, item: RecordInput) -> bytes:
    """The decoded bytes of a `data_base64` record (which must not also have `data`)."""
    if item.data is not msgspec.UNSET or isinstance(item.data_base64, msgspec.UnsetType):
        raise InvalidInput(
            f"records[{index}] must have exactly one of `data` or `data_base64`",
            field=f"records[{index}]",
        )
    try:
        return base64.b64decode(item.data_base64, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(
            f"records[{index}].data_base64 is not valid base64",
            field=f"records[{index}].data_base64",
        ) from None


class Pointers:
    """Redaction pointers as a tree of their tokens, built once per request: a document is
    walked once for all of them, each of its nodes at most once, rather than once per pointer.
    64 pointers 60 tokens deep cost 0.5 s per 1,000 records walked one by one (each pointer
    from the root), and 2.7 s per 100,000 small records that hold none of them."""

    __slots__ = ("children", "redact")

    def __init__(self, pointers: Iterable[tuple[str, ...]] = ()) -> None:
        self.children: dict[str, Pointers] = {}
        self.redact = False  # a pointer ends here: the value is replaced whole
        for tokens in pointers:
            node = self
            for token in tokens:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Pointers()
                node = child
            node.redact = True


def redact(document: Any, pointers: Pointers | list[tuple[str, ...]]) -> Any:
    """Replace the value at each pointer that exists with REDACTED; absent paths are ignored.
    A pointer below another's value finds it redacted already: the outer one wins, whatever
    their order."""
    tree = pointers if isinstance(pointers, Pointers) else Pointers(pointers)
    if tree.redact:
        return REDACTED
    pending: list[tuple[Any, dict[str, Pointers]]] = [(document, tree.children)]
    while pending:
        node, children = pending.pop()
        if isinstance(node, dict):
            if len(children) <= len(node):
                found = [(t, c) for t, c in children.items() if t in node]
            else:
                found = [(t, children[t]) for t in node if t in children]
            for token, child in found:
                if child.redact:
                    node[token] = REDACTED
                elif child.children:
                    pending.append((node[token], child.children))
        elif isinstance(node, list):
            length = len(node)
            for token, child in children.items():
                if (i := _index(token, length)) is not None:
                    if child.redact:
                        node[i] = REDACTED
                    elif child.children:
                        pending.append((node[i], child.children))
    return document


def _index(token: str, length: int) -> int | None:
    if token == "0" or not token.startswith("0"):
        i = bounded_integer(token, length - 1) if length else None
        return i
    return None


def fingerprint(records: list[NewRecord]) -> bytes:
    """What makes two append requests "the same body" for an idempotency key."""
    h = hashlib.sha256()
    for r in records:
        h.update(b"%d|%d|%s|" % (r.kind, len(r.payload), r.content_type.encode()))
        h.update(r.payload)
    return h.digest()
