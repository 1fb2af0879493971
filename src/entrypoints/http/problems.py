"""The Litestar exception handlers: each translates what it is given into the one problem
answer of entrypoints/edge/problems.py. Only Litestar's own exceptions (its 404, 405, 413,
body errors, and its validation of a route's parameters) are translated here; everything else
is `edge.problem_for`'s."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, InternalServerException, ValidationException
from litestar.params import ParameterKwarg

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
    "validation_error",
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


def validation_error(request: Request, error: ValidationException) -> Response[bytes]:
    """Litestar refused a value of the route's parameters (a query's `limit`, `cursor` or
    `wait`, a path's token id): 400, with `field` naming the parameter and a detail saying what
    it must be, in the client's terms. What it must be is what the handler declares, its type
    and bounds (`Parameter(ge=, le=, pattern=)`), which the OpenAPI document says of it too;
    msgspec's own words ("Expected `int`, got `str`") speak of the decoder, not of the API."""
    refusals = error.extra if isinstance(error.extra, list) else []
    said = [_what_it_must_be(request, r) for r in refusals if isinstance(r, dict)]
    if not said:
        return problem("invalid-input", error.detail or "the request is not valid", status=400)
    detail = "; ".join(words for _, words in said)
    fields = [name for name, _ in said if name is not None]
    if not fields:
        return problem("invalid-input", detail, status=400)
    return problem("invalid-input", detail, status=400, field=fields[0])  # the first named


def _what_it_must_be(request: Request, refusal: dict[str, Any]) -> tuple[str | None, str]:
    """The parameter a refusal names as the client wrote it (None for one that names none),
    and what it must be."""
    key, source = refusal.get("key"), refusal.get("source")
    declared = request.route_handler.parsed_fn_signature.parameters.get(key) if key else None
    if key is None or source not in ("query", "path") or declared is None:
        # Not a parameter the handler declares: the framework's words, as they are.
        named = None if source == "body" else key
        return named, f"{key or '?'}: {refusal.get('message', '')}"
    kwarg = declared.kwarg_definition
    name = (kwarg.query if isinstance(kwarg, ParameterKwarg) else None) or key
    if source == "query":
        given = request.query_params.getall(name, [])
        value = given[-1] if given else None  # of a repeated one, the last is the one taken
    else:
        value = request.path_params.get(key)
    got = "" if value is None else f", not {_quoted(str(value))}"
    # `int`, or `int | None`: the type a value must have.
    kinds = {t.annotation for t in declared.inner_types if not t.is_none_type}
    kind = kinds.pop() if declared.is_optional and len(kinds) == 1 else declared.annotation
    if kind is int or kind is float:
        bounds = _bounds(kwarg) if isinstance(kwarg, ParameterKwarg) else ""
        number = "a whole number" if kind is int else "a number"
        return name, f"{name} must be {number}{bounds}{got}"
    pattern = kwarg.pattern if isinstance(kwarg, ParameterKwarg) else None
    if pattern:
        return name, f"{name} must match {pattern}{got}"
    return name, f"{name}: {refusal.get('message', '')}"


def _bounds(kwarg: ParameterKwarg) -> str:
    def number(bound: float) -> str:
        return str(bound) if isinstance(bound, int) else f"{bound:g}"

    if kwarg.ge is not None and kwarg.le is not None:
        return f" from {number(kwarg.ge)} to {number(kwarg.le)}"
    said = [
        f"{words} {number(bound)}"
        for words, bound in (
            ("at least", kwarg.ge),
            ("greater than", kwarg.gt),
            ("at most", kwarg.le),
            ("less than", kwarg.lt),
        )
        if bound is not None
    ]
    return " " + " and ".join(said) if said else ""


def _quoted(value: str, longest: int = 40) -> str:
    """What the client sent, quoted, and cut short when long (a 5,000-digit number, say)."""
    return repr(value if len(value) <= longest else value[:longest] + "…")


def internal_error(request: Request, error: Exception) -> Response[bytes]:
    return respond(edge.problem_for(error, request.method, request.url.path))
