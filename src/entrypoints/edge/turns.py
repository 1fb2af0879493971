"""Each tenant's turns at work, taken at a request's first step (application/waiting.py, "Turns
at work").

A request whose bearer token this process knows already (its token cache, or a JWT it verified
and remembers), and whose head announces no body, takes one of its tenant's turns here, before
any other work is done for it: routing, parsing and the handlers' steps. The event loop runs
every request's steps in turn, so a tenant whose requests are all at work (a herd of long-polls
answered together, polling again at once) would otherwise make every step of another tenant's
request wait behind a step of each of its own. Past the tenant's turns, its request waits here,
costing nothing per turn of the loop, in arrival order, until one of its own ends, starts
waiting for a live event or starts its answer (writing it is the client's pace, not work); or
is answered 429 `too-many-requests` (Retry-After, the connection closed) when its budget runs
out first. A token the process does not know takes its turn when it authenticates. A request
with a body is admitted here (counted in its tenant's turns from now: application/waiting.py,
`_reserve`) and takes its turn once its body is in (`body_arrived`); one whose route reads no
body (a close, an object's commit or abort) as it authenticates; an upload (its body streamed
to the store) takes none, and is not counted."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from application import waiting
from application.jwts import is_jwt
from application.tokens import MAX_TOKEN_CHARS, TokenCache, token_hash
from entrypoints.edge import writing
from entrypoints.edge.browser import allowed_origin, answer_headers
from entrypoints.edge.exchange import Exchange
from entrypoints.edge.head import RequestHead
from entrypoints.edge.head_method import method_of
from entrypoints.edge.paths import DURABLE_STREAMS_PREFIX, NATIVE_PREFIX, STREAM_PATH
from entrypoints.edge.problems import PROBLEM_JSON, of_domain_error
from entrypoints.edge.wake_links import DS

_BEARER = b"bearer "
# A webhook's callback, a pull-wake ack or release, on either surface: their bearer token is the
# wake's own (application/subscriptions.py, WakeTokens), which names the tenant.
_WAKE_ROUTE = re.compile(
    f"(?:{re.escape(NATIVE_PREFIX)}|{re.escape(DURABLE_STREAMS_PREFIX + STREAM_PATH + DS)})"
    r"/subscriptions/([^/]+)/(?:callback|ack|release)"
)


def _bearer(scope: dict) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            if len(value) > MAX_TOKEN_CHARS + 16 or value[:7].lower() != _BEARER:
                return None
            try:
                return value[7:].decode("ascii").strip() or None
            except UnicodeDecodeError:
                return None
    return None


def wake_tenant(scope: dict, tenant_of: Callable[[str, str], str]) -> str | None:
    """The tenant a wake route's token was signed for (its signature checked), if the request
    is one; None otherwise, or if the token is not valid (the route answers that)."""
    if scope["method"] != "POST" or (route := _WAKE_ROUTE.fullmatch(scope["path"])) is None:
        return None
    token = _bearer(scope)
    if token is None:
        return None
    try:
        return tenant_of(token, route.group(1))
    except Exception:
        return None


def cached_tenant(scope: dict, cache: TokenCache) -> str | None:
    """The tenant of the request's bearer token, if this process has resolved it before
    (trusted still or not: its tenant is all the gate asks; a JWT: if this process verified it
    and remembers it)."""
    token = _bearer(scope)
    if token is None:
        return None
    if is_jwt(token):
        caller = cache.jwt_caller(token)
        return None if caller is None else caller.tenant
    return cache.tenant_of(token_hash(token))


async def refuse(scope: dict, send: Any, error: waiting.TooManyAtWork, permitted: Any) -> None:
    """429 `too-many-requests`, the connection closed: its body, if it has one, is not read.
    An exchange as any other answer is: its request id (`X-Request-Id`, and in the request log
    at DEBUG), its latency counted (route `unmatched`: the router never saw it)."""
    problem = of_domain_error(error)
    with Exchange(method_of(scope), scope["path"], RequestHead(scope["headers"])) as exchange:
        exchange.status = problem.status
        headers = [
            (b"content-type", PROBLEM_JSON.encode()),
            *((k.lower().encode(), v.encode()) for k, v in problem.headers.items()),
            *answer_headers(scope, permitted),
            (b"x-request-id", exchange.request_id.encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": problem.status, "headers": headers})
        body = b"" if scope["method"] == "HEAD" else problem.body
        await send({"type": "http.response.body", "body": body})


def answering(send: Any) -> Any:
    """`send`, the request's turn given back as its answer starts: what is left is writing it,
    at its client's pace (a client that reads a large answer slowly holds no turn). A large
    body is written in pieces, within a bound, charged to its tenant meanwhile
    (entrypoints/edge/writing.py)."""

    async def sending(message: dict) -> None:
        if message["type"] == "http.response.start":
            waiting.give_turn()
        elif message["type"] == "http.response.body" and len(message.get("body", b"")) > (
            writing.WRITE_BYTES
        ):
            await writing.in_pieces(send, message)
            return
        await send(message)

    return sending


def with_turns(
    app: Any,
    cache: TokenCache,
    origins: Iterable[str],
    tenant_of_wake: Callable[[str, str], str] | None = None,
) -> Any:
    """`app`, each HTTP request of a known token at work on one of its tenant's turns. Inside
    the request's budget (it waits within it). `tenant_of_wake(token, subscription_id)`: the
    tenant of a wake route's token (a flood of wake acks past their tenant's queue is refused
    here, before routing, as any other request of a known token)."""
    permitted = allowed_origin(origins)

    async def gated(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        tenant = cached_tenant(scope, cache)
        if tenant is None and tenant_of_wake is not None:
            tenant = wake_tenant(scope, tenant_of_wake)
            if tenant is not None:
                waiting.act_for(tenant)  # (its body is charged to that tenant too)
        if tenant is not None:
            try:
                await waiting.take_turn(tenant)
            except waiting.TooManyAtWork as error:
                await refuse(scope, send, error, permitted)
                return
        try:
            await app(scope, receive, answering(send))
        except Exception as error:
            if not writing.cut_short(error):
                raise
            # Its answer was cut short (its client took too long): nothing more to say, and
            # granian closes the connection of an answer left unfinished.

    return gated
