"""Domain errors. Each carries a stable machine `code`; entrypoints map codes to statuses."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    code: str = "invalid-input"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class InvalidInput(DomainError):
    code = "invalid-input"


class RecordTooLarge(DomainError):
    code = "record-too-large"


class RequestTooLarge(DomainError):
    """The request carries more than one request may (413), though its bytes are within the
    body limit: a Durable Streams body of more messages than one append takes."""

    code = "request-too-large"


class ContentClassForbidden(DomainError):
    code = "content-class-forbidden"


class StreamClosed(DomainError):
    code = "stream-closed"


class Backpressure(DomainError):
    """The unread ceiling is reached; `retry_after` is a whole number of seconds."""

    code = "backpressure"

    def __init__(self, detail: str, retry_after: int = 1, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after = retry_after


class QuotaExhausted(DomainError):
    code = "quota-exhausted"


class DefinitionConflict(DomainError):
    code = "definition-conflict"


class AckRegression(DomainError):
    code = "ack-regression"


class AckAheadOfHead(DomainError):
    code = "ack-ahead-of-head"


class CrossScopeAck(DomainError):
    code = "cross-scope-ack"


class UnknownConsumer(DomainError):
    code = "not-found"


class TooManyConsumers(DomainError):
    """A stream's consumers are bounded (per kind: holding credit, tracking): a first ack past
    the bound is refused. 409, not 429: waiting frees nothing, only a removal does."""

    code = "too-many-consumers"


class CursorAheadOfHead(DomainError):
    code = "cursor-ahead-of-head"


class CursorUnknown(DomainError):
    """A page cursor (`after`) that names nothing the listing can resume from: which names are
    known is the stream's (or the tenant's) state, not the request's shape."""

    code = "cursor-unknown"


class CursorExpired(DomainError):
    """Retention removed `cursor + 1`: carries requested, earliest, latest and reason."""

    code = "cursor-expired"


class LegalHoldActive(DomainError):
    code = "legal-hold-active"


class IdempotencyKeyReused(DomainError):
    code = "idempotency-key-reused"


class ObjectTooLarge(DomainError):
    code = "object-too-large"


class ObjectMissing(DomainError):
    """Nothing is stored under an object key (a missing body, not an unknown intent)."""

    code = "not-found"


class ObjectStateConflict(DomainError):
    code = "object-state-conflict"


class TooManyOpenObjects(DomainError):
    """The stream already has as many open (prepared or uploaded) object intents as it may."""

    code = "too-many-open-objects"


class DigestMismatch(DomainError):
    code = "digest-mismatch"


class SizeMismatch(DomainError):
    code = "size-mismatch"


class StreamGone(DomainError):
    """The stream was deleted while forks still read its records (the Durable Streams soft
    delete): it answers 410 until its last fork is gone, and its ID cannot be created again."""

    code = "stream-gone"


class ProducerEpochStale(DomainError):
    """An idempotent producer's epoch is below the stream's: carries `current_epoch`."""

    code = "producer-epoch-stale"


class ProducerSequenceGap(DomainError):
    """An idempotent producer skipped sequences: carries `expected_seq` and `received_seq`."""

    code = "producer-sequence-gap"


class WriterSequenceRegression(DomainError):
    """A `Stream-Seq` not above the last one appended: carries `last_seq`."""

    code = "stream-seq-regression"
