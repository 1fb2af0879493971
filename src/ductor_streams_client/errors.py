"""The client's errors: one class per problem `code` of the service, under `StreamsError`.

Every error answer of the service is a problem (RFC 9457) with a stable machine `code`; the
client raises the class of that code (`NotFound`, `Backpressure`, `CursorExpired`, ...), all
subclasses of `StreamsError`, so `except StreamsError` still catches everything. A code this
client does not know raises `StreamsError` itself; the service unreachable (refused, reset,
timed out) raises `StreamsConnectionError` (code `connection-error`, status 0)."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx


class StreamsError(Exception):
    """A request failed.

    `status` is the HTTP status (0 when no answer arrived), `code` the service's stable machine
    code (`connection-error` when unreachable), `detail` the human sentence, `problem` the whole
    problem body (with a code's extra fields), and `retry_after` the seconds of `Retry-After`
    when the answer carried one."""

    code_of_class: str | None = None

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        problem: dict[str, Any] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.code = code
        self.detail = detail
        self.problem: dict[str, Any] = problem if problem is not None else {}
        self.retry_after = retry_after
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.status == 0:
            return f"{self.code}: {self.detail}"
        return f"{self.status} {self.code}: {self.detail}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, code={self.code!r}, "
            f"detail={self.detail!r})"
        )

    def __reduce__(self) -> Any:
        return (
            _rebuild,
            (type(self), self.status, self.code, self.detail, self.problem, self.retry_after),
        )

    @classmethod
    def from_response(cls, response: httpx.Response) -> StreamsError:
        """The error of an error answer whose body has been read: the class of its `code`."""
        body: Any = None
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            text = response.text.strip()
            detail = text[:500] or response.reason_phrase
            if "html" in response.headers.get("content-type", "").lower():
                # A proxy's or gateway's error page, not the service: say so, not the markup.
                detail = (
                    f"{response.reason_phrase or 'an error'}: an HTML page, not a problem of "
                    "the service (a proxy or gateway answered)"
                )
            body = {
                "status": response.status_code,
                "code": f"http-{response.status_code}",
                "detail": detail,
                "text": text[:2000],
            }
        return error_for(
            response.status_code,
            str(body.get("code") or f"http-{response.status_code}"),
            str(body.get("detail") or body.get("title") or response.reason_phrase),
            body,
            retry_after=parse_retry_after(response.headers.get("retry-after")),
        )

    @classmethod
    def from_transport(cls, error: httpx.TransportError, url: str) -> StreamsConnectionError:
        reason = str(error) or type(error).__name__
        return StreamsConnectionError(
            0,
            "connection-error",
            f"cannot reach {url}: {reason}",
            {"code": "connection-error", "detail": reason, "exception": type(error).__name__},
        )


def _rebuild(
    kind: type[StreamsError],
    status: int,
    code: str,
    detail: str,
    problem: dict[str, Any],
    retry_after: float | None,
) -> StreamsError:
    return kind(status, code, detail, problem, retry_after=retry_after)


class StreamsConnectionError(StreamsError):
    """No answer arrived: connection refused or reset, DNS failure, timeout (status 0)."""

    code_of_class = "connection-error"


class UnexpectedAnswer(StreamsError):
    """The service answered something this client cannot read (not the documented shape)."""

    code_of_class = "unexpected-answer"


# -- 4xx -------------------------------------------------------------------------------------------


class InvalidInput(StreamsError):
    """400: malformed or out-of-range input; `field` names the culprit when known."""

    code_of_class = "invalid-input"

    @property
    def field(self) -> str | None:
        value = self.problem.get("field")
        return None if value is None else str(value)


class CursorAheadOfHead(StreamsError):
    """400: a cursor greater than the head (`cursor`, `head`)."""

    code_of_class = "cursor-ahead-of-head"

    @property
    def head(self) -> int | None:
        return _int(self.problem.get("head"))


class CursorUnknown(StreamsError):
    """400: a listing's `after` names nothing to resume from: no object of the stream, no
    token of the tenant (`field`)."""

    code_of_class = "cursor-unknown"


class AckAheadOfHead(StreamsError):
    """400: an acknowledgement above the head (`sequence`, `head`)."""

    code_of_class = "ack-ahead-of-head"


class Unauthenticated(StreamsError):
    """401: no, unknown, revoked or expired token."""

    code_of_class = "unauthenticated"


class Forbidden(StreamsError):
    """403: a scope is missing, or the stream's pinned authorization does not list the caller."""

    code_of_class = "forbidden"


class CrossScopeAck(StreamsError):
    """403: the consumer is bound to another principal."""

    code_of_class = "cross-scope-ack"


class EgressRegionDenied(StreamsError):
    """403: this deployment's egress region may not deliver the stream's data."""

    code_of_class = "egress-region-denied"


class ProducerEpochStale(StreamsError):
    """403: a Durable Streams producer epoch older than the stream's."""

    code_of_class = "producer-epoch-stale"


class NotFound(StreamsError):
    """404: no such path, run, stream, consumer or object (or another tenant's, or deleted)."""

    code_of_class = "not-found"


class MethodNotAllowed(StreamsError):
    """405: the path does not serve this method."""

    code_of_class = "method-not-allowed"


class StreamClosed(StreamsError):
    """409: append, prepare or commit on a closed stream."""

    code_of_class = "stream-closed"


class DefinitionConflict(StreamsError):
    """409: the stream exists with another definition."""

    code_of_class = "definition-conflict"


class QuotaExhausted(StreamsError):
    """409: the stream's total ceiling is reached."""

    code_of_class = "quota-exhausted"


class TooManyConsumers(StreamsError):
    """409: the stream has as many consumers of this kind as it may; an admin removes one."""

    code_of_class = "too-many-consumers"


class TooManyLinks(StreamsError):
    """409: the subscription names as many streams as it may (1,000); unlink some, or link
    them by a pattern."""

    code_of_class = "too-many-links"


class AckRegression(StreamsError):
    """409: an acknowledgement below the consumer's (`acked_sequence`)."""

    code_of_class = "ack-regression"


class ObjectStateConflict(StreamsError):
    """409: an object operation its state does not allow."""

    code_of_class = "object-state-conflict"


class TooManyOpenObjects(StreamsError):
    """409: the stream has as many open object intents as it may (`max_open_objects`): commit
    or abort one first."""

    code_of_class = "too-many-open-objects"


class LegalHoldActive(StreamsError):
    """409: deleting a stream (or run) under legal hold; nothing was deleted."""

    code_of_class = "legal-hold-active"


class ProducerSequenceGap(StreamsError):
    """409: a Durable Streams producer sequence skipped ahead."""

    code_of_class = "producer-sequence-gap"


class StreamSeqRegression(StreamsError):
    """409: a Durable Streams `Stream-Seq` not above the last."""

    code_of_class = "stream-seq-regression"


class CursorExpired(StreamsError):
    """410: retention removed the record after the cursor. `requested` is the first record
    wanted, `earliest` the lowest retained, `latest` the head."""

    code_of_class = "cursor-expired"

    @property
    def requested(self) -> int | None:
        return _int(self.problem.get("requested"))

    @property
    def earliest(self) -> int | None:
        return _int(self.problem.get("earliest"))

    @property
    def latest(self) -> int | None:
        return _int(self.problem.get("latest"))

    @property
    def reason(self) -> str | None:
        value = self.problem.get("reason")
        return None if value is None else str(value)


class StreamGone(StreamsError):
    """410: a Durable Streams stream that was deleted."""

    code_of_class = "stream-gone"


class RecordTooLarge(StreamsError):
    """413: an inline record over the limit (`index`, `size`, `limit`); use an object."""

    code_of_class = "record-too-large"


class RequestTooLarge(StreamsError):
    """413: a JSON request body over 8 MiB."""

    code_of_class = "request-too-large"


class RequestTimeout(StreamsError):
    """408: the request body stopped coming, or took too long to arrive; nothing was done."""

    code_of_class = "request-timeout"


class ObjectTooLarge(StreamsError):
    """413: a prepare declaring more than 32 MiB, or an upload announcing more."""

    code_of_class = "object-too-large"


class UnsupportedMediaType(StreamsError):
    """415: a body encoding the service does not store."""

    code_of_class = "unsupported-media-type"


class RangeNotSatisfiable(StreamsError):
    """416: a download range naming no byte of the body (`size`)."""

    code_of_class = "range-not-satisfiable"


class Misdirected(StreamsError):
    """421: the stream's metadata home is not this deployment's region."""

    code_of_class = "misdirected"


class DigestMismatch(StreamsError):
    """422: uploaded or downloaded bytes differ from the announced SHA-256."""

    code_of_class = "digest-mismatch"


class SizeMismatch(StreamsError):
    """422: uploaded bytes differ in size from the intent (shorter, or longer: refused as
    they pass the prepared size)."""

    code_of_class = "size-mismatch"


class IdempotencyKeyReused(StreamsError):
    """422: an idempotency key reused with another request."""

    code_of_class = "idempotency-key-reused"


class ContentClassForbidden(StreamsError):
    """422: a content class the service refuses (raw hidden model reasoning)."""

    code_of_class = "content-class-forbidden"


class Backpressure(StreamsError):
    """429: the stream's unread ceiling is reached; wait `retry_after` seconds (acknowledge to
    free credit). `unread_items` and `unread_bytes` say how full it is."""

    code_of_class = "backpressure"

    @property
    def unread_items(self) -> int | None:
        return _int(self.problem.get("unread_items"))

    @property
    def unread_bytes(self) -> int | None:
        return _int(self.problem.get("unread_bytes"))


class TooManySubscriptions(StreamsError):
    """429: the principal's live connections (subscriptions and waiting reads) in that server
    process are at the cap."""

    code_of_class = "too-many-subscriptions"


class TooManyRequests(StreamsError):
    """429: the tenant has as many request bodies arriving on that server process as it may,
    or as many of their bytes held; retry after `retry_after` seconds."""

    code_of_class = "too-many-requests"


class SubscriptionNotFound(StreamsError):
    """404: no such subscription (or another tenant's, or deleted)."""

    code_of_class = "subscription-not-found"


class SubscriptionConflict(StreamsError):
    """409: a subscription with this id exists with another configuration."""

    code_of_class = "subscription-conflict"


class WebhookUrlRejected(StreamsError):
    """400: the webhook URL may not be used (not https, or a private, link-local,
    multicast, unspecified or metadata address)."""

    code_of_class = "webhook-url-rejected"


class WakeTokenInvalid(StreamsError):
    """401: the callback or claim token is missing, forged, expired or another
    subscription's."""

    code_of_class = "wake-token-invalid"


class Fenced(StreamsError):
    """409: the wake named (generation, wake id) is no longer the subscription's current one;
    `generation` is the current one."""

    code_of_class = "fenced"

    @property
    def generation(self) -> int | None:
        return _int(self.problem.get("generation"))


class AlreadyClaimed(StreamsError):
    """409: another worker holds the pull-wake subscription: `current_holder` names it, and
    `generation` is its wake's."""

    code_of_class = "already-claimed"

    @property
    def current_holder(self) -> str | None:
        value = self.problem.get("current_holder")
        return None if value is None else str(value)

    @property
    def generation(self) -> int | None:
        return _int(self.problem.get("generation"))


class NoPendingWork(StreamsError):
    """409: a claim found no stream of the subscription past its cursor."""

    code_of_class = "no-pending-work"


class InvalidOffset(StreamsError):
    """409: an ack names a stream the subscription does not link, goes back, or
    passes the stream's head."""

    code_of_class = "invalid-offset"


class WrongSubscriptionType(StreamsError):
    """400: a webhook route on a pull-wake subscription, or the reverse."""

    code_of_class = "wrong-subscription-type"


class InternalError(StreamsError):
    """500: a bug in the service (nothing was half-applied)."""

    code_of_class = "internal"


class Unavailable(StreamsError):
    """503: PostgreSQL or the object store is out of reach, or the process is stopping."""

    code_of_class = "unavailable"


CLASS_OF_CODE: dict[str, type[StreamsError]] = {
    kind.code_of_class: kind
    for kind in (
        StreamsConnectionError,
        UnexpectedAnswer,
        InvalidInput,
        CursorAheadOfHead,
        CursorUnknown,
        AckAheadOfHead,
        Unauthenticated,
        Forbidden,
        CrossScopeAck,
        EgressRegionDenied,
        ProducerEpochStale,
        NotFound,
        MethodNotAllowed,
        StreamClosed,
        DefinitionConflict,
        QuotaExhausted,
        TooManyConsumers,
        TooManyLinks,
        AckRegression,
        ObjectStateConflict,
        TooManyOpenObjects,
        LegalHoldActive,
        ProducerSequenceGap,
        StreamSeqRegression,
        CursorExpired,
        StreamGone,
        RecordTooLarge,
        RequestTooLarge,
        RequestTimeout,
        ObjectTooLarge,
        UnsupportedMediaType,
        RangeNotSatisfiable,
        Misdirected,
        DigestMismatch,
        SizeMismatch,
        IdempotencyKeyReused,
        ContentClassForbidden,
        Backpressure,
        TooManySubscriptions,
        TooManyRequests,
        SubscriptionNotFound,
        SubscriptionConflict,
        WebhookUrlRejected,
        WakeTokenInvalid,
        Fenced,
        AlreadyClaimed,
        NoPendingWork,
        InvalidOffset,
        WrongSubscriptionType,
        InternalError,
        Unavailable,
    )
    if kind.code_of_class is not None
}
"""The class raised for each `code`; any other code raises `StreamsError`."""


def error_for(
    status: int,
    code: str,
    detail: str,
    problem: dict[str, Any] | None = None,
    *,
    retry_after: float | None = None,
) -> StreamsError:
    """The error of `code`: its class from `CLASS_OF_CODE`, else `StreamsError`."""
    kind = CLASS_OF_CODE.get(code, StreamsError)
    return kind(status, code, detail, problem, retry_after=retry_after)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
