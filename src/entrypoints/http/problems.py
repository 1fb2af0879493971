"""Every error is application/problem+json (RFC 9457) with a stable machine `code`."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, InternalServerException, ValidationException

from domain.errors import Backpressure, DomainError
from entrypoints.http.head import allowed, method_of
from entrypoints.http.observability import HOT

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
    "object-too-large": 413,
    "range-not-satisfiable": 416,
    "backpressure": 429,
    "too-many-subscriptions": 429,
    "quota-exhausted": 409,
    "stream-closed": 409,
    "definition-conflict": 409,
    "ack-regression": 409,
    "ack-ahead-of-head": 400,
    "cross-scope-ack": 403,
    "too-many-consumers": 409,
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
}

TITLE_OF_CODE: dict[str, str] = {
    code: code.replace("-", " ").capitalize() for code in STATUS_OF_CODE
}

_encode = msgspec.json.Encoder().encode


def problem(
    code: str,
    detail: str,
    *,
    status: int | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response[bytes]:
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
    return Response(
        content=_encode(body), status_code=status, media_type=PROBLEM_JSON, headers=headers
    )


def domain_error(_: Request, error: DomainError) -> Response[bytes]:
    headers: dict[str, str] = {}
    if isinstance(error, Backpressure):
        headers["Retry-After"] = str(error.retry_after)
    if error.code == "unauthenticated":
        headers["WWW-Authenticate"] = 'Bearer realm="ductor-streams"'
    return problem(error.code, error.detail, headers=headers or None, **error.extra)


# What Litestar raises (as a 500) when the request body ends before it is complete: the client
# half-closed or disconnected short of its Content-Length, or sent a malformed chunked body.
_BODY_CUT_SHORT = "client disconnected prematurely"


def http_error(request: Request, error: HTTPException) -> Response[bytes]:
    if isinstance(error, InternalServerException) and error.detail == _BODY_CUT_SHORT:
        return problem(
            "invalid-input",
            "the request body ended before it was complete (shorter than its Content-Length, "
            "or malformed chunked encoding): nothing was done",
        )
    status = error.status_code
    code = {
        400: "invalid-input",
        401: "unauthenticated",
        403: "forbidden",
        404: "not-found",
        405: "method-not-allowed",
        413: "request-too-large",
        415: "unsupported-media-type",
        503: "unavailable",
    }.get(status, "invalid-input" if status < 500 else "internal")
    detail = error.detail
    if isinstance(error, ValidationException) and isinstance(error.extra, list):
        detail = (
            "; ".join(
                f"{e.get('key', '?')}: {e.get('message', '')}"
                for e in error.extra
                if isinstance(e, dict)
            )
            or detail
        )
    headers = None
    if status == 413:
        detail = "the request body is larger than this route accepts"
    elif status == 405:
        # RFC 9110 §15.5.6: a 405 lists the methods the path serves. The router names them in
        # the exception's headers, in no particular order.
        allow = allowed(
            method
            for name, value in (error.headers or {}).items()
            if name.lower() == "allow"
            for method in value.split(",")
        )
        headers = {"Allow": allow}
        detail = f"{method_of(request.scope)} is not served here; this path serves {allow}"
    return problem(code, detail, status=status, headers=headers)


def internal_error(request: Request, error: Exception) -> Response[bytes]:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=error)
    return problem("internal", "an internal error occurred; nothing was half-applied", status=500)
