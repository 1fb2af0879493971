"""The Litestar exception handlers: each translates what it is given into the one problem
answer of entrypoints/edge/problems.py. Only Litestar's own exceptions (its 404, 405, 413,
validation and body errors) are translated here; everything else is `edge.problem_for`'s."""

from __future__ import annotations

from litestar import Request, Response
from litestar.exceptions import HTTPException, InternalServerException, ValidationException

from domain.errors import DomainError
from entrypoints.edge import problems as edge
from entrypoints.edge.checks import check_scope
from entrypoints.edge.head_method import allowed, method_of
from entrypoints.edge.problems import (
    PROBLEM_JSON,
    PROBLEM_TYPE_BASE,
    STATUS_OF_CODE,
    TITLE_OF_CODE,
    Problem,
)

__all__ = [
    "PROBLEM_JSON",
    "PROBLEM_TYPE_BASE",
    "STATUS_OF_CODE",
    "TITLE_OF_CODE",
    "domain_error",
    "http_error",
    "internal_error",
    "problem",
    "respond",
]


def respond(answer: Problem) -> Response[bytes]:
    return Response(
        content=answer.body,
        status_code=answer.status,
        media_type=PROBLEM_JSON,
        headers=answer.headers or None,
    )


def problem(
    code: str,
    detail: str,
    *,
    status: int | None = None,
    headers: dict[str, str] | None = None,
    **extra: object,
) -> Response[bytes]:
    return respond(edge.problem(code, detail, status=status, headers=headers, **extra))


def domain_error(_: Request, error: DomainError) -> Response[bytes]:
    return respond(edge.of_domain_error(error))


# What Litestar raises (as a 500) when the request body ends before it is complete: the client
# half-closed or disconnected short of its Content-Length, or sent a malformed chunked body.
_BODY_CUT_SHORT = "client disconnected prematurely"


def http_error(request: Request, error: HTTPException) -> Response[bytes]:
    if isinstance(error, InternalServerException) and error.detail == _BODY_CUT_SHORT:
        return respond(edge.cut_short())
    status = error.status_code
    if status == 413:
        return respond(edge.too_large())
    if status == 404:
        # The server decoded an encoded slash into a separator, and the path it made matches
        # no route, so the guard that refuses one never ran: it is refused here the same way.
        try:
            check_scope(request.scope)
        except DomainError as refused:
            return respond(edge.of_domain_error(refused))
    code = {
        400: "invalid-input",
        401: "unauthenticated",
        403: "forbidden",
        404: "not-found",
        405: "method-not-allowed",
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
    if status == 405:
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
    return respond(edge.problem_for(error, request.method, request.url.path))
