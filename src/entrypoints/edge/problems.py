"""Every error answer is application/problem+json (RFC 9457) with a stable machine `code`: the
one serializer of both surfaces, and the one choice of answer for an error, framework-free.

`problem_for(error, method, path)` is what the Litestar exception handlers (http/problems.py,
http/outages.py) and the append front (entrypoints/front.py) all call, so a refusal is answered
alike whichever way the request came: a domain error by its code, a body refused by the edge
(too large, cut short) as the edge's own errors, an outage of a backing service 503 with
Retry-After, anything else 500 `internal` (logged)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgspec

from domain.errors import Backpressure, DomainError
from entrypoints.edge.metrics import HOT
from entrypoints.edge.outages import RETRY_AFTER_SECONDS, is_outage_family, outage_of

log = logging.getLogger("ductor_streams.http")

PROBLEM_TYPE_BASE = "https://ductor.dev/problems/"
PROBLEM_JSON = "application/problem+json"

STATUS_OF_CODE: dict[str, int] = {
    "unauthenticated": 401,
    "forbidden": 403,
    "not-found": 404,
    "invalid-input": 400,
    "cursor-ahead-of-head": 400,
    "cursor-unknown": 400,
    "cursor-expired": 410,
    "record-too-large": 413,
    "request-too-large": 413,
    "request-timeout": 408,
    "object-too-large": 413,
    "range-not-satisfiable": 416,
    "backpressure": 429,
    "too-many-subscriptions": 429,
    "too-many-requests": 429,
    "quota-exhausted": 409,
    "stream-closed": 409,
    "definition-conflict": 409,
    "ack-regression": 409,
    "ack-ahead-of-head": 400,
    "cross-scope-ack": 403,
    "too-many-consumers": 409,
    "too-many-links": 409,
    "object-state-conflict": 409,
    "too-many-open-objects": 409,
    "digest-mismatch": 422,
    "size-mismatch": 422,
    "idempotency-key-reused": 422,
    "content-class-forbidden": 422,
    "egress-region-denied": 403,
    "misdirected": 421,
    "legal-hold-active": 409,
    "stream-gone": 410,
    "producer-epoch-stale": 403,
    "producer-sequence-gap": 409,
    "stream-seq-regression": 409,
    "method-not-allowed": 405,
    "unsupported-media-type": 415,
    "unavailable": 503,
    "internal": 500,
    # Subscriptions (docs/durable-streams.md, "Subscriptions").
    "subscription-not-found": 404,
    "subscription-conflict": 409,
    "webhook-url-rejected": 400,
    "wake-token-invalid": 401,
    "fenced": 409,
    "already-claimed": 409,
    "no-pending-work": 409,
    "invalid-offset": 409,
    "wrong-subscription-type": 400,
}

TITLE_OF_CODE: dict[str, str] = {
    code: code.replace("-", " ").capitalize() for code in STATUS_OF_CODE
}

_encode = msgspec.json.Encoder().encode


class Problem(msgspec.Struct, frozen=True):
    """A problem answer: its status, the headers it carries besides its Content-Type, and its
    encoded body. Each framework adapter sends it as it is."""

    status: int
    headers: dict[str, str]
    body: bytes


def problem(
    code: str,
    detail: str,
    *,
    status: int | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Problem:
    status = status or STATUS_OF_CODE.get(code, 400)
    HOT.problem(code)
    body = {
        "type": PROBLEM_TYPE_BASE + code,
        "title": TITLE_OF_CODE.get(code, code),
        "status": status,
        "detail": detail,
        "code": code,
        **extra,
    }
    return Problem(status, headers or {}, _encode(body))


# -- what the edge itself refuses ---------------------------------------------------------------


class BodyTooLarge(Exception):
    """The request body is (or says it is) larger than the route accepts: 413."""


class BodyTimedOut(Exception):
    """The request body stopped coming (no piece within the idle bound) or was not complete
    within the total bound: 408, and the connection is closed."""


class TooManyBodies(Exception):
    """The caller's tenant has as many request bodies arriving on this process as it may, or
    as many of their bytes held: 429, and the connection is closed (the body is not read)."""


class BodyCutShort(Exception):
    """The request body ended before it was complete: the client half-closed or disconnected
    short of its Content-Length, or sent a malformed chunked body. Nothing was done: 400."""


def too_large() -> Problem:
    return problem(
        "request-too-large", "the request body is larger than this route accepts", status=413
    )


def timed_out() -> Problem:
    return problem(
        "request-timeout",
        "the request body stopped coming, or took too long to arrive: nothing was done",
        status=408,
    )


def too_many_bodies() -> Problem:
    return problem(
        "too-many-requests",
        "this tenant has as many request bodies arriving on this server process as it may "
        "(or as many bytes of them held): nothing was done; retry shortly",
        headers={"Retry-After": "1"},
    )


def cut_short() -> Problem:
    return problem(
        "invalid-input",
        "the request body ended before it was complete (shorter than its Content-Length, "
        "or malformed chunked encoding): nothing was done",
    )


# -- errors of the application and of backing services ------------------------------------------


def of_domain_error(error: DomainError, headers: dict[str, str] | None = None) -> Problem:
    """A domain error's answer; `headers` are what the surface adds (the protocol's own)."""
    added: dict[str, str] = {}
    if isinstance(error, Backpressure):
        added["Retry-After"] = str(error.retry_after)
    if error.code in ("unauthenticated", "wake-token-invalid"):
        added["WWW-Authenticate"] = 'Bearer realm="ductor-streams"'
    if headers:
        added.update(headers)
    return problem(error.code, error.detail, headers=added or None, **error.extra)


def internal(method: str, path: str, error: BaseException) -> Problem:
    log.exception("unhandled error on %s %s", method, path, exc_info=error)
    return problem("internal", "an internal error occurred; nothing was half-applied", status=500)


class QuietWarnings:
    """At most one warning per `seconds` for each backing service out of reach; the requests
    answered 503 in the rest of that window are told in one line at its end (all of them are in
    `ductor_streams_problems_total{code="unavailable"}`). A database that does not answer, or
    a tenant whose requests wait out their budgets on it, is otherwise a warning per request:
    tens of thousands of lines a minute, saying one thing."""

    def __init__(self, seconds: float = 1.0, clock: Any = time.monotonic) -> None:
        self._seconds = seconds
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warn(self, what: str, kind: str, method: str, path: str) -> None:
        now = self._clock()
        if now - self._last.get(what, -self._seconds) < self._seconds:
            if what not in self._held:
                self._held[what] = 0
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    pass  # (no loop: told with the next warning)
                else:
                    left = self._seconds - (now - self._last[what])
                    loop.call_later(max(left, 0.0), self._tell, what)
            self._held[what] += 1
            return
        self._last[what] = now
        self._tell(what)
        log.warning("%s is unavailable (%s) on %s %s", what, kind, method, path)

    def _tell(self, what: str) -> None:
        held = self._held.pop(what, 0)
        if held:
            log.warning(
                "%s was unavailable for %d more requests in the last %g s",
                what,
                held,
                self._seconds,
            )


_outages = QuietWarnings()


def unavailable(method: str, path: str, error: BaseException) -> Problem:
    """An outage's answer (503, Retry-After), or 500 if the error is no outage after all."""
    what = outage_of(error)
    if what is None:
        return internal(method, path, error)
    _outages.warn(what, type(error).__name__, method, path)
    retry = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if getattr(error, "outcome_unknown", False):
        # COMMIT was sent and no answer came: the write may have committed. Never said to have
        # failed: only a retry with the same Idempotency-Key is safe (docs/errors.md).
        return problem(
            "unavailable",
            f"{what} did not confirm the write, which may have been committed (or still be "
            "committing); only a retry with the same Idempotency-Key is safe",
            status=503,
            headers=retry,
            outcome="unknown",
        )
    return problem(
        "unavailable", f"{what} is unavailable; retry shortly", status=503, headers=retry
    )


def problem_for(error: BaseException, method: str, path: str) -> Problem:
    """The answer to any error raised while serving a request, outside the framework's own
    exceptions (which its adapter translates first)."""
    if isinstance(error, DomainError):
        return of_domain_error(error)
    if isinstance(error, BodyTooLarge):
        return too_large()
    if isinstance(error, BodyCutShort):
        return cut_short()
    if isinstance(error, BodyTimedOut):
        return timed_out()
    if isinstance(error, TooManyBodies):
        return too_many_bodies()
    if is_outage_family(error):
        return unavailable(method, path, error)
    return internal(method, path, error)
