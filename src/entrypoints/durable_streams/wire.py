"""The Durable Streams wire format: offsets, cursors, content types, header values, bodies.

Pure translation between the protocol's text and the service's values; nothing here reads
storage. Every malformed value is `InvalidInput` (400), never a 500."""

from __future__ import annotations

import math
import re
import secrets
import time
from datetime import UTC, datetime

import msgspec

from domain import offsets
from domain.definition import (
    MAX_COMMAND_RECORDS,
    MAX_IDLE_SECONDS,
    MAX_INLINE_RECORD_BYTES,
    Redaction,
)
from domain.digits import bounded_integer
from domain.errors import InvalidInput, RecordTooLarge, RequestTooLarge
from domain.ids import ID_PATTERN
from domain.offsets import Offset
from domain.records import (
    NewRecord,
    RecordInput,
    RecordKind,
    compact_json_records,
    prepare_records,
)
from domain.text import check_media_type, media_type_parts
from entrypoints.edge.json_body import LONE_SURROGATE, SURROGATE
from entrypoints.edge.json_depth import MAX_JSON_DEPTH, nests_deeper_than

# -- offsets -------------------------------------------------------------------------------------
# The offset format is the domain's (domain/offsets.py): the minting stream's incarnation, "_",
# the sequence, 16 digits each. "-1" is the start, "now" the head; neither is ever minted.
START = "-1"
NOW = "now"


def parse_offset(
    value: str, *, field: str = "offset", also: str = " (or -1, or now)"
) -> Offset | None:
    """The offset `value` spells (None for `now`; `-1` is `offsets.START`), not yet resolved
    against a stream (`Minting.resolve`). `also`: the sentinels the caller takes, as its
    refusal names them."""
    if value == START:
        return offsets.START
    if value == NOW:
        return None
    offset = offsets.parse(value)
    if offset is None:
        raise InvalidInput(
            f"{field} {value[:80]!r} is not an offset this server issued{also}",
            field=field,
        )
    return offset


def parse_fork_offset(value: str) -> Offset:
    """`Stream-Fork-Offset`: an offset the server returned (PROTOCOL.md section 8: a fork
    offset is one previously returned), or `-1`, the start (a fork that inherits nothing). `now`
    names no fixed point: to fork at the head, leave the header out."""
    field = "Stream-Fork-Offset"
    if value == NOW:
        raise InvalidInput(
            "Stream-Fork-Offset must be an offset the server returned (or -1): `now` is not "
            "one; leave the header out to fork at the source's head",
            field=field,
        )
    offset = parse_offset(value, field=field, also=" (or -1)")
    assert offset is not None
    return offset


# -- fork sources ----------------------------------------------------------------------------------
# `Stream-Forked-From` is the path of a stream on this server, relative to the mount
# (`/v1/stream/src` names `/api/durable-streams/v1/stream/src`): one or two IDs after
# `/v1/stream/`, nothing else. A scheme or host, the mount's own prefix, `.` or `..` segments,
# percent-encoding, a query or a fragment are refused, never resolved.
_ID_TEXT = ID_PATTERN.removeprefix("^").removesuffix("$")  # never `.` or `..`, never `%`
_FORK_SOURCE = re.compile(rf"/v1/stream/(?:({_ID_TEXT})/)?({_ID_TEXT})")


def fork_source(value: str, default_run: str = "default") -> tuple[str, str]:
    """(run ID, stream ID) of the stream `Stream-Forked-From` names."""
    match = _FORK_SOURCE.fullmatch(value)
    if match is None:
        raise InvalidInput(
            f"Stream-Forked-From {value[:200]!r} is not a stream path on this server: it must "
            "be /v1/stream/<streamID> or /v1/stream/<runID>/<streamID>",
            field="Stream-Forked-From",
        )
    run_id, stream_id = match.groups()
    return run_id or default_run, stream_id


# -- cursors (PROTOCOL.md 10.1) ------------------------------------------------------------------
CURSOR_EPOCH = datetime(2024, 10, 9, tzinfo=UTC).timestamp()
CURSOR_INTERVAL_SECONDS = 20
_DIGITS = re.compile(r"[0-9]+")
# A cursor up to this many digits is compared as a number; a longer one (no interval this
# server issues comes near it) is only ever ahead of the interval, and gets a greater one of its
# length + 1 ("1" and as many zeros): strictly greater, and bounded by what the client sent.
_SHORT_CURSOR_DIGITS = 18


def next_cursor(client_cursor: str | None, now: float | None = None) -> str:
    """The interval number now; strictly past the client's cursor when it has caught up (a
    random jitter of 1 to 3600 seconds, in intervals), so cursors never repeat or go back."""
    interval = int(
        ((time.time() if now is None else now) - CURSOR_EPOCH) // CURSOR_INTERVAL_SECONDS
    )
    if client_cursor is not None and client_cursor.isascii() and _DIGITS.fullmatch(client_cursor):
        digits = client_cursor.lstrip("0") or "0"
        if len(digits) > _SHORT_CURSOR_DIGITS:
            return "1" + "0" * len(digits)
        theirs = bounded_integer(digits, 10**_SHORT_CURSOR_DIGITS)
        assert theirs is not None  # at most _SHORT_CURSOR_DIGITS digits
        if theirs >= interval:
            jitter_seconds = 1 + secrets.randbelow(3600)
            interval = theirs + max(1, math.ceil(jitter_seconds / CURSOR_INTERVAL_SECONDS))
    return str(interval)


# -- content types -------------------------------------------------------------------------------
DEFAULT_CONTENT_TYPE = "application/octet-stream"
JSON = "application/json"


_QUOTED_TOKEN = re.compile(r'"[!#$%&\'*+.^_`|~0-9A-Za-z-]+"')


def normalize_content_type(value: str, *, field: str = "Content-Type") -> str:
    """A media type as stored: the type and subtype lower-cased, parameters trimmed (names
    lower-cased), so that `TEXT/PLAIN` and `text/plain` are one stream configuration."""
    value = value.strip()
    check_media_type(field, value)
    essence, parameters = media_type_parts(value)
    parts = [essence.lower()]
    for name, val in parameters:
        if _QUOTED_TOKEN.fullmatch(val):  # `"utf-8"` and `utf-8` are one value (RFC 9110 5.6.6)
            val = val[1:-1]
        parts.append(f"{name.lower()}={val}")
    return "; ".join(parts)


def essence(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def is_json(content_type: str) -> bool:
    return content_type == JSON or essence(content_type) == JSON


def is_text(content_type: str) -> bool:
    """What SSE carries as text: `text/*` and `application/json`; everything else is base64."""
    kind = essence(content_type)
    return kind.startswith("text/") or kind == JSON


# -- header values -------------------------------------------------------------------------------
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
MAX_PRODUCER_INTEGER = 2**53 - 1


def is_true(value: str | None) -> bool:
    """`Stream-Closed`: present only when exactly `true`, in any case (4.1); anything else is
    as if absent."""
    return value is not None and value.strip().lower() == "true"


def decimal(name: str, value: str, *, maximum: int, minimum: int = 0) -> int:
    """A decimal integer from `minimum` to `maximum`: no sign, leading zero, point or
    exponent."""
    text = value.strip()
    number = bounded_integer(text, maximum) if _DECIMAL.fullmatch(text) else None
    if number is None or number < minimum:
        least = (
            "a non-negative decimal integer"
            if minimum == 0
            else f"a decimal integer from {minimum}"
        )
        raise InvalidInput(
            f"{name} must be {least} up to {maximum} (no sign, leading zeros, decimal point or "
            f"exponent), not {value[:40]!r}",
            field=name,
        )
    return number


def ttl_seconds(value: str) -> int:
    return decimal("Stream-TTL", value, maximum=MAX_IDLE_SECONDS, minimum=1)  # seconds


_datetime = msgspec.json.Decoder(datetime)


def expires_at(value: str) -> datetime:
    """An RFC 3339 timestamp with its offset (`Z` or `+hh:mm`), as UTC."""
    text = value.strip()
    try:
        parsed = _datetime.decode(msgspec.json.encode(text))
    except msgspec.ValidationError:
        parsed = None
    if parsed is None or parsed.tzinfo is None or "T" not in text.upper():
        raise InvalidInput(
            f"Stream-Expires-At must be an RFC 3339 timestamp with a timezone, not {value[:60]!r}",
            field="Stream-Expires-At",
        )
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+14:00 is before year 1 in UTC
        raise InvalidInput(
            f"Stream-Expires-At {value[:60]!r} is outside years 1 to 9999 in UTC",
            field="Stream-Expires-At",
        ) from None


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


# -- bodies --------------------------------------------------------------------------------------
_raw_items = msgspec.json.Decoder(list[msgspec.Raw])
_raw = msgspec.json.Decoder(msgspec.Raw)
_compact = msgspec.json.format
_NO_REDACTION = Redaction()


_BOM = b"\xef\xbb\xbf"


def json_messages(body: bytes, *, allow_empty_array: bool) -> list[RecordInput]:
    """A JSON-mode body as its messages: one value, or the elements of a top-level array
    (flattened one level, 9.1.2). Must be valid UTF-8 JSON nesting at most MAX_JSON_DEPTH."""
    return [RecordInput(data=v) for v in _json_values(body, allow_empty_array)[0]]


def _json_values(body: bytes, allow_empty_array: bool) -> tuple[list[msgspec.Raw], bytes]:
    """`json_messages`'s values, compact, and the compact document they are the values of."""
    if not body.isascii():
        try:
            body.decode()
        except UnicodeDecodeError as error:
            raise InvalidInput(f"the body is not valid UTF-8 (byte {error.start})") from None
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and nests_deeper_than(
        body, MAX_JSON_DEPTH
    ):
        raise InvalidInput(f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    # A byte order mark before the text is ignored (RFC 8259 8.1 lets a parser do so; some
    # writers put one there). Messages are stored compact, so it is not kept.
    stripped = body.removeprefix(_BOM).strip()
    if not stripped:
        raise InvalidInput("the body holds no JSON value, only whitespace")
    try:
        document = _compact(stripped, indent=-1)  # one pass: every message compact
        if document.startswith(b"["):
            items = _raw_items.decode(document)
        else:
            items = [_raw.decode(document)]
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        if LONE_SURROGATE.search(stripped):
            raise InvalidInput(
                f"the body is not valid JSON for this service: {SURROGATE}"
            ) from None
        raise InvalidInput(f"the body is not valid JSON: {error}") from None
    if not items and not allow_empty_array:
        raise InvalidInput("an empty JSON array appends nothing: send at least one message")
    if len(items) > MAX_COMMAND_RECORDS:
        raise RequestTooLarge(
            f"one request carries at most {MAX_COMMAND_RECORDS} messages, not {len(items)}"
        )
    return items, document


def json_records(
    body: bytes,
    *,
    allow_empty_array: bool,
    redaction: Redaction = _NO_REDACTION,
    input_stream: bool = False,
) -> list[NewRecord]:
    """JSON messages as native JSON records, prepared by the native append's rules for the
    stream's definition: compact, redacted, size-checked (413 over 64 KiB each), and for an
    input stream without U+0000 (its delivery could not carry it)."""
    try:
        values, document = _json_values(body, allow_empty_array)
        if not redaction.json_pointers and not input_stream:
            fast = compact_json_records(values, document)
            if fast is not None:
                return fast
        return prepare_records(
            [RecordInput(data=v) for v in values], redaction, input_stream=input_stream
        )
    except RecordTooLarge as error:  # in the protocol's words: it has no objects to point to
        index, size = error.extra["index"], error.extra["size"]
        raise RecordTooLarge(
            f"message {index} is {size} bytes (compact JSON); a message may be at most "
            f"{MAX_INLINE_RECORD_BYTES} bytes",
            **error.extra,
        ) from None


def byte_records(body: bytes, content_type: str) -> list[NewRecord]:
    """Bytes as records of at most the inline limit each, in order (one atomic batch)."""
    step = MAX_INLINE_RECORD_BYTES
    chunks = [body[i : i + step] for i in range(0, len(body), step)]
    if len(chunks) > MAX_COMMAND_RECORDS:
        raise InvalidInput("the body is larger than one request may append")
    return [NewRecord(RecordKind.BINARY, content_type, chunk, len(chunk)) for chunk in chunks]


def records_for(
    body: bytes,
    content_type: str,
    *,
    creating: bool,
    redaction: Redaction = _NO_REDACTION,
    input_stream: bool = False,
) -> list[NewRecord]:
    if not body:
        return []
    if is_json(content_type):
        return json_records(
            body, allow_empty_array=creating, redaction=redaction, input_stream=input_stream
        )
    return byte_records(body, content_type)
