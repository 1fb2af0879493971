"""What the service answers, as frozen msgspec Structs.

They mirror the service's answer schemas (its OpenAPI document, `GET /schema/openapi.json`,
names them `StreamDocument`, `AppendAnswer`, `RecordsPage`, ...); a test checks every field the
document declares against these, so the two cannot drift apart unnoticed. Unknown fields in an
answer are ignored, so a newer service does not break an older client.

Everything is immutable and hashable where its fields are; `msgspec.to_builtins(value)` turns any
of them back into plain JSON-ready Python values."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any, Literal

import msgspec

__all__ = [
    "AckAnswer",
    "AppendAnswer",
    "Authorization",
    "Closed",
    "CommitAnswer",
    "Consumer",
    "ConsumersPage",
    "Credit",
    "Deleted",
    "Event",
    "Expiry",
    "FollowItem",
    "Gone",
    "InputDelivery",
    "LegalHold",
    "Limits",
    "ObjectIntent",
    "ObjectRef",
    "OpenObject",
    "OpenObjectsPage",
    "Placement",
    "Record",
    "RecordsPage",
    "Redaction",
    "Retention",
    "Revoked",
    "RunSummary",
    "RunsPage",
    "StreamDocument",
    "StreamList",
    "StreamState",
]


class _Answer(msgspec.Struct, frozen=True, kw_only=True):
    # Each subclass repeats `frozen=True`: msgspec inherits it, but a type checker (which reads
    # Structs as dataclasses) takes a subclass without it for a mutable one.
    """A part of an answer (frozen, unknown fields ignored)."""


class _Setting(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A part of a stream definition: what the document answers, and what `create_stream`
    takes. Fields left at their defaults are not sent, so the service fills its own in."""


# -- the stream definition ---------------------------------------------------------------------


class Limits(_Setting, frozen=True):
    """The stream's unread ceiling (credit) and total ceiling. `unread_policy` is `reject`
    (429 at once) or `block` (wait up to `block_timeout_seconds` for acknowledgements)."""

    max_unread_items: int = 10_000
    max_unread_bytes: int = 67_108_864
    max_total_items: int | None = None
    max_total_bytes: int | None = None
    unread_policy: Literal["reject", "block"] = "reject"
    block_timeout_seconds: int | float = 30


class Retention(_Setting, frozen=True):
    """Records older than `max_age_seconds`, or beyond the newest `max_records`, are removed by
    the service's workers (None: kept)."""

    max_age_seconds: int | None = None
    max_records: int | None = None


class Redaction(_Setting, frozen=True):
    """RFC 6901 pointers whose values are replaced by `"[REDACTED]"` before storing."""

    json_pointers: tuple[str, ...] = ()


class Placement(_Answer, frozen=True):
    """Where the stream's data may live and go (regions)."""

    metadata_home: str
    metadata_replicas: tuple[str, ...]
    object_regions: tuple[str, ...]
    client_egress_regions: tuple[str, ...]
    log_region: str


class Authorization(_Setting, frozen=True):
    """The principals that may read and write the stream (`"*"`: all of the tenant)."""

    readers: tuple[str, ...] = ("*",)
    writers: tuple[str, ...] = ("*",)


class Expiry(_Setting, frozen=True):
    """When the stream expires: `idle_seconds` after its last access (sliding), or at
    `expires_at` (absolute). At most one is set; neither means never."""

    idle_seconds: int | None = None
    expires_at: datetime | None = None


# -- the stream document -------------------------------------------------------------------------


class Credit(_Answer, frozen=True):
    """What is unread against the unread ceiling (computed under the stream's lock)."""

    unread_items: int
    unread_bytes: int
    max_unread_items: int
    max_unread_bytes: int

    @property
    def items_left(self) -> int:
        """How many more records fit before an append answers 429."""
        return max(0, self.max_unread_items - self.unread_items)


class Consumer(_Answer, frozen=True):
    """A consumer and the sequence it acknowledged through. `holds_credit`: whether it holds
    the writers back (created by a writer or an admin), or only tracks its position (created
    by a principal that may only read)."""

    consumer_id: str
    acked_sequence: int
    holds_credit: bool = True


class ConsumersPage(_Answer, frozen=True):
    """One page of a stream's consumers, ascending by `consumer_id`; `next_after` is the
    `after` of the next page (None: this is the last)."""

    consumers: tuple[Consumer, ...]
    next_after: str | None


class LegalHold(_Answer, frozen=True):
    """The stream's legal hold: while `enabled`, nothing of the stream is removed or deleted."""

    enabled: bool
    reason: str | None
    updated_at: datetime | None


class OpenObject(_Answer, frozen=True):
    """An object intent not yet committed, aborted or expired (state `prepared`/`uploaded`)."""

    object_id: str
    state: str
    size: int
    content_type: str
    created_at: datetime
    expires_at: datetime


class InputDelivery(_Answer, frozen=True):
    """An input stream's delivery to the workflow wait service."""

    delivered_through: int
    pending: int
    last_error: str | None


class OpenObjectsPage(_Answer, frozen=True):
    """One page of a stream's open object intents, oldest first; `next_after` is the `after`
    of the next page (None: this is the last)."""

    objects: tuple[OpenObject, ...]
    next_after: str | None


class StreamState(_Answer, frozen=True):
    """The stream's state: `head` (last sequence, 0 when empty), `earliest` (lowest retained),
    `closed`, the legal hold, totals, consumers, credit and open object intents."""

    head: int
    earliest: int
    closed: bool
    closed_at: datetime | None
    legal_hold: LegalHold
    total_items: int
    total_bytes: int
    consumers: tuple[Consumer, ...]  # the first 100 by consumer_id: see `list_consumers`
    credit: Credit
    open_objects: tuple[OpenObject, ...]  # the first 20, oldest first (all: list_open_objects)
    open_objects_count: int = 0  # of all open intents
    open_objects_bytes: int = 0  # what they pledge against max_total_bytes
    input_delivery: InputDelivery | None = None
    consumer_count: int | None = None  # every consumer (None: a service that did not say)


class ForkOrigin(_Answer, frozen=True):
    """What a fork (made through the Durable Streams surface) inherits: its source's records 1
    to `through` (of the source created at `source_created_at`); its `state` counts only its
    own, after `through`."""

    run_id: str
    stream_id: str
    source_created_at: datetime
    through: int


class StreamDocument(_Answer, frozen=True):
    """A stream: its definition as stored (defaults filled in), `run_id`, `created_at`, `state`;
    for a stream made through the Durable Streams surface its `content_type`, and for a fork
    what it forks (`fork`)."""

    stream_id: str
    run_id: str
    direction: Literal["output", "input"]
    content_class: str
    schema: Any
    limits: Limits
    retention: Retention
    redaction: Redaction
    placement: Placement
    authorization: Authorization
    expiry: Expiry
    created_at: datetime
    state: StreamState
    content_type: str | None = None
    fork: ForkOrigin | None = None


class StreamList(_Answer, frozen=True):
    """One page of a run's streams that the caller may read, ascending by `stream_id`;
    `next_after` is the `after` of the next page (None: this is the last)."""

    streams: tuple[StreamDocument, ...]
    next_after: str | None = None


class RunSummary(_Answer, frozen=True):
    """A run of the tenant: its streams' count and when its oldest stream was created."""

    run_id: str
    stream_count: int
    created_at: datetime


class RunsPage(_Answer, frozen=True):
    """One page of runs, ascending by `run_id`; `next_after` is the `after` of the next page
    (None: this is the last)."""

    runs: tuple[RunSummary, ...]
    next_after: str | None


class Usage(_Answer, frozen=True):
    """What the tenant holds against its limits, counted when asked (`StreamsClient.usage`):
    its streams, its bytes (each stream its definition and each record its size, each with 128
    bytes for its row, an object's record its reference too, its append receipts and input
    records' wait events while they are kept, and what its open object intents pledge), its
    tokens (revoked and expired ones too, until they are forgotten) and its subscriptions. A
    limit of None is no limit."""

    streams: int
    max_streams: int | None
    bytes: int
    max_bytes: int | None
    tokens: int = 0  # (a server of an earlier version does not say)
    max_tokens: int | None = None
    subscriptions: int = 0  # webhook and pull-wake (a server of an earlier version does not say)
    max_subscriptions: int | None = None


# -- tokens ----------------------------------------------------------------------------------------


class MintedToken(_Answer, frozen=True):
    """A token just minted: `token` is shown this once (the service keeps only its hash)."""

    token: str
    id: str
    tenant: str
    principal: str
    scopes: tuple[str, ...]
    runs: tuple[str, ...] | None
    expires_at: datetime | None


class TokenInfo(_Answer, frozen=True):
    """A token of the tenant as listed: never the token itself."""

    id: str
    tenant: str
    principal: str
    scopes: tuple[str, ...]
    runs: tuple[str, ...] | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenList(_Answer, frozen=True):
    """One page of the tenant's tokens by creation; `next_after` is the `after` of the next page
    (None: this is the last)."""

    tokens: tuple[TokenInfo, ...]
    next_after: str | None = None


# -- records ---------------------------------------------------------------------------------------


class AppendAnswer(_Answer, frozen=True):
    """An append's sequences (`first_sequence` to `last_sequence`), the head after it and the
    credit left. A replay of an idempotent retry answers the first append's answer."""

    first_sequence: int
    last_sequence: int
    head: int
    credit: Credit


class AckAnswer(_Answer, frozen=True):
    """A consumer's acknowledgement and the stream's credit after it."""

    consumer_id: str
    acked_sequence: int
    credit: Credit


class ObjectRef(_Answer, frozen=True):
    """The object a record carries (download it with `get_object_body`)."""

    object_id: str
    size: int
    sha256: str
    content_type: str
    schema: Any = None


class Record(_Answer, frozen=True):
    """One record. Exactly one of three kinds (`kind`):

    - `"json"`: `data` is the decoded JSON value;
    - `"bytes"`: `bytes` is the raw bytes (`data_base64` on the wire);
    - `"object"`: `object` is the `ObjectRef` of a committed object.

    `size` is the stored byte length; `content_type` the record's media type."""

    sequence: int
    appended_at: datetime
    size: int
    content_type: str
    data: Any = None
    data_base64: str | None = None
    object: ObjectRef | None = None

    @property
    def kind(self) -> Literal["json", "bytes", "object"]:
        if self.object is not None:
            return "object"
        if self.data_base64 is not None:
            return "bytes"
        return "json"

    @property
    def bytes(self) -> bytes | None:
        """The raw bytes of a binary record (None for a JSON or object record)."""
        if self.data_base64 is None:
            return None
        return base64.b64decode(self.data_base64)


class RecordsPage(_Answer, frozen=True):
    """Records with `sequence > cursor`, ascending. Pass `next_cursor` as the next cursor."""

    records: tuple[Record, ...]
    next_cursor: int
    head: int
    earliest: int
    closed: bool


# -- objects ---------------------------------------------------------------------------------------


class ObjectIntent(_Answer, frozen=True):
    """An object and its state (`prepared`, `uploaded`, `committed`, `aborted`, `expired`).
    `expires_at` is the upload-and-commit deadline while open; `sequence` the record's once
    committed; `upload` (`{"method", "url"}`) is set in a prepare answer only."""

    object_id: str
    state: str
    size: int
    sha256: str
    content_type: str
    schema: Any
    expires_at: datetime | None
    created_at: datetime
    sequence: int | None
    upload: dict[str, str] | None = None


class CommitAnswer(_Answer, frozen=True):
    """A committed object: the sequence of the record that carries it."""

    sequence: int
    object_id: str


# -- follow() events -------------------------------------------------------------------------------


class Closed(_Answer, frozen=True):
    """The stream is closed and every record through `head` was delivered: the end."""

    head: int


class Gone(_Answer, frozen=True):
    """Retention removed records this follower had not received (`requested` onwards): the
    follow ends. `earliest` is the lowest still retained, `latest` the head."""

    requested: int
    earliest: int
    latest: int
    reason: str = "retention"


class Deleted(_Answer, frozen=True):
    """The stream was deleted (or expired and was erased): the follow ends."""


class Revoked(_Answer, frozen=True):
    """The follower's token was revoked or expired: the follow ends."""


Event = Closed | Gone | Deleted | Revoked
"""A follow's final event: one of them ends every follow that does not fail."""

FollowItem = Record | Event
"""What `follow()` yields: records, then (unless it fails) one final `Event`."""


# -- subscriptions -----------------------------------------------------------------------------


class SubscriptionStream(_Answer, frozen=True):
    """A stream named by run and stream IDs (a subscription's wake stream)."""

    run_id: str
    stream_id: str


class SubscriptionPattern(_Answer, frozen=True):
    """Globs over run IDs and stream IDs (`*` matches any part of one ID)."""

    run_id: str
    stream_id: str


class WebhookSigning(_Answer, frozen=True):
    alg: str
    kid: str
    jwks_url: str


class SubscriptionWebhook(_Answer, frozen=True):
    url: str
    signing: WebhookSigning


class SubscriptionLink(_Answer, frozen=True):
    """One stream of a subscription: how it is linked, its acknowledged sequence and head."""

    run_id: str
    stream_id: str
    link_type: str
    acked_sequence: int
    head: int
    pending: bool


class SubscriptionWake(_Answer, frozen=True):
    generation: int
    wake_id: str
    holder: str | None


class Subscription(_Answer, frozen=True):
    id: str
    type: str
    pattern: SubscriptionPattern | None
    # The pattern as the Durable Streams surface writes it (`run/stream` globs, `**`); `pattern`
    # is null when it is no glob per ID.
    path_pattern: str | None
    streams: tuple[SubscriptionLink, ...]
    webhook: SubscriptionWebhook | None
    wake_stream: SubscriptionStream | None
    lease_ttl_ms: int
    created_at: datetime
    status: str
    description: str | None
    generation: int
    wake: SubscriptionWake | None
    # Why the last delivery failed, while `status` is "failed" (to a token with streams:admin;
    # None otherwise, and from a server older than this field).
    last_error: str | None = None


class SubscriptionList(_Answer, frozen=True):
    subscriptions: tuple[Subscription, ...]


class WakeClaim(_Answer, frozen=True):
    """A claimed pull-wake: ack and release with `token`, fenced by (generation, wake_id)."""

    wake_id: str
    generation: int
    token: str
    streams: tuple[SubscriptionLink, ...]
    lease_ttl_ms: int


class WakeAnswer(_Answer, frozen=True):
    ok: bool
    next_wake: bool
