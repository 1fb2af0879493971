"""The stream definition: every field is pinned at creation and immutable afterwards."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, cast, get_args

import msgspec

from domain.errors import ContentClassForbidden, InvalidInput
from domain.ids import ID_PATTERN, check_id, new_stream_id
from domain.text import (
    DOCUMENTED_JSON_TEXT,
    DOCUMENTED_TEXT,
    TEXT_CHARACTER,
    check_json_size,
    check_json_text,
    check_text,
)

MAX_INLINE_RECORD_BYTES = 65_536
MAX_OBJECT_BYTES = 33_554_432
# Records a native append request may carry; a Durable Streams request (whose JSON array is
# flattened into messages, and whose clients batch up to 1 MiB of them) may carry up to
# MAX_COMMAND_RECORDS, the most one decision of the aggregate takes.
MAX_BATCH_RECORDS = 1_000
MAX_COMMAND_RECORDS = 100_000
# A definition is read by every request on its stream and kept decoded in each process's cache:
# what a caller may put in it is bounded (a schema as compact JSON, redaction pointers, pinned
# principals), so one stream cannot make every request on it, or the cache, heavy.
MAX_SCHEMA_BYTES = 65_536
MAX_REDACTION_POINTERS = 64
MAX_POINTER_CHARS = 1_024
MAX_PRINCIPALS = 100
# Regions a placement list may name: a stream's definition is read whole by each of its
# requests and listings, and unbounded lists made definitions of 8 MB (120,000 regions).
MAX_REGIONS = 64
MAX_SEQUENCE = 2**63 - 1
# The largest integer every JSON client holds exactly (an IEEE double's 53-bit significand); well
# inside PostgreSQL's bigint, so any count or byte total up to it can be stored and added to.
MAX_EXACT_INTEGER = 2**53 - 1
# 100 years of 365 days: `now - max_age` stays a valid timestamp for the pruner for centuries.
MAX_RETENTION_AGE_SECONDS = 100 * 365 * 86_400
MAX_BLOCK_TIMEOUT_SECONDS = 300
# The same century as retention: `last_access + idle_seconds` stays a valid timestamp.
MAX_IDLE_SECONDS = MAX_RETENTION_AGE_SECONDS

Direction = Literal["output", "input"]
ContentClass = Literal[
    "application_data",
    "model_output",
    "model_reasoning_summary",
    "tool_io",
    "logs",
    "telemetry",
]
# Raw hidden model reasoning is not an allowed stream content class: it is named so that it is
# refused with its own code rather than as an unknown value.
FORBIDDEN_CONTENT_CLASSES = frozenset({"model_reasoning_raw"})
UnreadPolicy = Literal["reject", "block"]
# `$(?!\n)`: msgspec matches with re.search, where `$` alone also matches before a final newline.
Region = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$(?!\n)")]
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=MAX_EXACT_INTEGER)]
_Timeout = msgspec.Meta(ge=0, le=MAX_BLOCK_TIMEOUT_SECONDS)
# An int stays an int and a fraction a float, so the stored definition decodes to exactly what
# the create answer showed (a plain float field turns the default 30 into 30.0 on the way back).
BlockTimeout = Annotated[int, _Timeout] | Annotated[float, _Timeout]
Principal = Annotated[str, msgspec.Meta(min_length=1, max_length=256), DOCUMENTED_TEXT]
# Documented only (extra_json_schema): resolve_definition checks these, with their own answers.
_SomeRegions = Annotated[
    tuple[Region, ...], msgspec.Meta(max_length=MAX_REGIONS, extra_json_schema={"minItems": 1})
]
_Replicas = Annotated[tuple[Region, ...], msgspec.Meta(max_length=MAX_REGIONS)]


class Limits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_unread_items: PositiveInt = 10_000
    max_unread_bytes: PositiveInt = 67_108_864
    max_total_items: PositiveInt | None = None
    max_total_bytes: PositiveInt | None = None
    unread_policy: UnreadPolicy = "reject"
    block_timeout_seconds: BlockTimeout = 30


class Retention(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_age_seconds: Annotated[int, msgspec.Meta(ge=1, le=MAX_RETENTION_AGE_SECONDS)] | None = None
    max_records: PositiveInt | None = None


class Expiry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """When the stream goes: `idle_seconds` after its last read or write (sliding), or at
    `expires_at` (absolute, RFC 3339 with a timezone). At most one is set; neither is forever."""

    idle_seconds: Annotated[int, msgspec.Meta(ge=1, le=MAX_IDLE_SECONDS)] | None = None
    expires_at: Annotated[datetime, msgspec.Meta(tz=True)] | None = None

    @property
    def enabled(self) -> bool:
        return self.idle_seconds is not None or self.expires_at is not None

    def due(self, last_access: datetime | None) -> datetime | None:
        """The instant the stream expires, given its last access (None: it never does)."""
        if self.expires_at is not None:
            return self.expires_at
        if self.idle_seconds is not None and last_access is not None:
            return last_access + timedelta(seconds=self.idle_seconds)
        return None

    def passed(self, now: datetime, last_access: datetime | None, grace: timedelta) -> bool:
        """Whether `now` is past the expiry; an idle one only `grace` later (the margin for
        accesses not yet recorded where `last_access` was read)."""
        due = self.due(last_access)
        if due is None:
            return False
        return now >= (due if self.expires_at is not None else due + grace)


JsonPointer = Annotated[
    str,
    msgspec.Meta(
        max_length=MAX_POINTER_CHARS,
        extra_json_schema={"pattern": f"^(?:/{TEXT_CHARACTER}*)?$"},
    ),
]


class Redaction(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    # Each pointer is applied to every record appended: their number is bounded.
    json_pointers: Annotated[
        tuple[JsonPointer, ...], msgspec.Meta(max_length=MAX_REDACTION_POINTERS)
    ] = ()


class Placement(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    metadata_home: Region
    metadata_replicas: tuple[Region, ...]
    object_regions: tuple[Region, ...]
    client_egress_regions: tuple[Region, ...]
    log_region: Region


# An empty list would make a stream no one can ever use; "*" is how to say "everyone".
Principals = Annotated[tuple[Principal, ...], msgspec.Meta(min_length=1, max_length=MAX_PRINCIPALS)]


class Authorization(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    readers: Principals = ("*",)
    writers: Principals = ("*",)

    def may_read(self, principal: str) -> bool:
        return "*" in self.readers or principal in self.readers

    def may_write(self, principal: str) -> bool:
        return "*" in self.writers or principal in self.writers


class Fork(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A stream that inherits a prefix of another: it reads the source's records 1..`through`
    (without copying them) and its own records from `through + 1` on. The source is named by
    key and creation time (a source deleted and created again is another stream). `offset` and
    `sub_offset` are what the creating request asked for, kept so that the same request again
    is recognised as the same definition."""

    run_id: str
    stream_id: str
    source_created_at: datetime
    through: int
    offset: int | None = None
    sub_offset: int = 0


# How many forks a chain may hold, the root not counted: a fork of a stream at this depth is
# refused (400). A read of a fork costs one row per ancestor (its position: where retention left
# the inherited prefix), so this bounds every fork read; branching a conversation a hundred
# times over, each branch forked from the last, is far past any use seen, and a flat fan-out
# (many forks of one source) is not limited by it at all.
MAX_FORK_DEPTH = 100


class StreamDefinition(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    stream_id: str
    direction: Direction
    content_class: ContentClass
    schema: Any
    limits: Limits
    retention: Retention
    redaction: Redaction
    placement: Placement
    authorization: Authorization
    # Last, with a default: definitions stored before expiry existed decode as never expiring.
    expiry: Expiry = msgspec.field(default_factory=Expiry)
    # The Durable Streams surface (docs/durable-streams.md): the media type a stream created through
    # it carries (None: a native stream), and what it forks. Last, with defaults, so definitions
    # stored before they existed decode unchanged.
    content_type: str | None = None
    fork: Fork | None = None


# Documented: the document says "one of: sliding, absolute, never" (resolve_definition refuses
# both, with its answer); a value given as null is as if absent.
_ABSENT = {"type": "null"}
_AT_MOST_ONE = msgspec.Meta(
    extra_json_schema={
        "oneOf": [
            {
                "title": "Sliding",
                "required": ["idle_seconds"],
                "properties": {"idle_seconds": {"type": "integer"}, "expires_at": _ABSENT},
            },
            {
                "title": "Absolute",
                "required": ["expires_at"],
                "properties": {"expires_at": {"type": "string"}, "idle_seconds": _ABSENT},
            },
            {
                "title": "Never",
                "properties": {"idle_seconds": _ABSENT, "expires_at": _ABSENT},
            },
        ],
        "description": "idle_seconds or expires_at, not both (neither: it never expires).",
    }
)


class PlacementRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    metadata_home: Region | None = None
    metadata_replicas: _Replicas | None = None
    object_regions: _SomeRegions | None = None
    client_egress_regions: _SomeRegions | None = None
    log_region: Region | None = None


class DefinitionRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a caller sends to create a stream: everything but `direction` may be left out."""

    direction: Direction
    stream_id: Annotated[str, msgspec.Meta(extra_json_schema={"pattern": ID_PATTERN})] | None = None
    # A str, not ContentClass, so that a forbidden class gets its own code (documented: allowed).
    content_class: Annotated[
        str, msgspec.Meta(extra_json_schema={"enum": list(get_args(ContentClass))})
    ] = "application_data"
    schema: Annotated[Any, DOCUMENTED_JSON_TEXT] = None
    limits: Limits = msgspec.field(default_factory=Limits)
    retention: Retention = msgspec.field(default_factory=Retention)
    redaction: Redaction = msgspec.field(default_factory=Redaction)
    placement: PlacementRequest = msgspec.field(default_factory=PlacementRequest)
    authorization: Authorization = msgspec.field(default_factory=Authorization)
    expiry: Annotated[Expiry, _AT_MOST_ONE] = msgspec.field(default_factory=Expiry)


_CONTENT_CLASSES: frozenset[str] = frozenset(get_args(ContentClass))


def resolve_definition(
    request: DefinitionRequest, *, region: str, egress_region: str
) -> StreamDefinition:
    """Fill the deployment's defaults in and check what the types alone cannot."""
    stream_id = (
        new_stream_id() if request.stream_id is None else check_id("stream_id", request.stream_id)
    )
    if request.content_class in FORBIDDEN_CONTENT_CLASSES:
        raise ContentClassForbidden(
            f"content_class {request.content_class!r} is not allowed: raw hidden model reasoning "
            "may not be carried by a stream"
        )
    if request.content_class not in _CONTENT_CLASSES:
        raise InvalidInput(
            f"content_class must be one of {sorted(_CONTENT_CLASSES)}", field="content_class"
        )
    check_json_text("schema", request.schema)
    check_json_size("schema", request.schema, MAX_SCHEMA_BYTES)
    for pointer in request.redaction.json_pointers:
        check_text("redaction.json_pointers", pointer)
        check_pointer(pointer)
    for principal in request.authorization.readers:
        check_text("authorization.readers", principal)
    for principal in request.authorization.writers:
        check_text("authorization.writers", principal)
    p = request.placement
    placement = Placement(
        metadata_home=p.metadata_home or region,
        metadata_replicas=p.metadata_replicas or (),
        object_regions=p.object_regions if p.object_regions is not None else (region,),
        client_egress_regions=(
            p.client_egress_regions if p.client_egress_regions is not None else (egress_region,)
        ),
        log_region=p.log_region or region,
    )
    if not placement.object_regions:
        raise InvalidInput("placement.object_regions must name at least one region")
    if not placement.client_egress_regions:
        raise InvalidInput("placement.client_egress_regions must name at least one region")
    expiry = request.expiry
    if expiry.idle_seconds is not None and expiry.expires_at is not None:
        raise InvalidInput(
            "expiry takes idle_seconds or expires_at, not both", field="expiry.expires_at"
        )
    if expiry.expires_at is not None:  # one instant, one spelling: the document shows it in UTC
        try:
            expiry = Expiry(expires_at=expiry.expires_at.astimezone(UTC))
        except OverflowError:  # 9999-12-31T23:59:59-14:00 is past year 9999 in UTC
            raise InvalidInput(
                "expiry.expires_at is outside years 1 to 9999 in UTC", field="expiry.expires_at"
            ) from None
    return StreamDefinition(
        stream_id=stream_id,
        direction=request.direction,
        content_class=cast(ContentClass, request.content_class),  # one of them: checked above
        schema=request.schema,
        limits=request.limits,
        retention=request.retention,
        redaction=request.redaction,
        placement=placement,
        authorization=request.authorization,
        expiry=expiry,
    )


def check_pointer(pointer: str) -> tuple[str, ...]:
    """`parse_pointer`, for a definition being made: a `~` followed by anything but 0 or 1 is
    refused too. (Not when a stored definition's pointers are read for an append: one made
    before this check would have stopped its stream's appends.)"""
    if _BAD_ESCAPE.search(pointer):
        raise InvalidInput(
            f"redaction pointer {pointer!r} is not a JSON pointer (RFC 6901): '~' is written "
            "'~0' and '/' inside a name '~1', so '~' is always followed by 0 or 1",
            field="redaction.json_pointers",
        )
    return parse_pointer(pointer)


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """RFC 6901: "" is the whole document, otherwise "/"-separated, ~1 is "/" and ~0 is "~"."""
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise InvalidInput(
            f"redaction pointer {pointer!r} is not a JSON pointer (RFC 6901): it must start with /",
            field="redaction.json_pointers",
        )
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/"))


_BAD_ESCAPE = re.compile(r"~(?![01])")


def with_source_pins(requested: StreamDefinition, source: StreamDefinition) -> StreamDefinition:
    """A fork's definition: what its creation asked for, with its source's pins, which it reads
    the records of. A fork must never be a way around them, so it takes the source's
    `authorization` (who may read and write those records), `redaction` (what is removed from
    them, on the fork's own appends too), `placement` (where they live and may be delivered)
    and `content_class` (what they are). Its expiry, limits and retention are its own: the
    fork pins the prefix it inherits against the source's retention instead (fork_reads)."""
    return msgspec.structs.replace(
        requested,
        authorization=source.authorization,
        redaction=source.redaction,
        placement=source.placement,
        content_class=source.content_class,
    )
