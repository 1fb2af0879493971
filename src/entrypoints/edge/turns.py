"""Each tenant's turns at work, taken at a request's first step (application/waiting.py, "Turns
at work").

A request whose bearer token this process knows already (its token cache), and whose head
announces no body, takes one of its tenant's turns here, before any other work is done for it:
routing, parsing and the handlers' steps. The event loop runs every request's steps in turn,
so a tenant whose requests are all at work (a herd of long-polls answered together, polling
again at once) would otherwise make every step of another tenant's request wait behind a step
of each of its own. Past the tenant's turns, its request waits here, costing nothing per turn
of the loop, in arrival order, until one of its own ends, starts waiting for a live event or
starts its answer (writing it is the client's pace, not work); or is answered 429
`too-many-requests` (Retry-After, the connection closed) when its budget runs out first. A
token the cache does not know takes its turn when it authenticates; a request with a body
takes it once its body is in (application/waiting.py, `body_arrived`); one whose route reads no
body (a close, an object's commit or abort) as it authenticates."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from application import waiting
from application.tokens import MAX_TOKEN_CHARS, TokenCache, token_hash
from entrypoints.edge import writing
from entrypoints.edge.browser import allowed_origin, answer_headers
from entrypoints.edge.exchange import Exchange
from entrypoints.edge.head import RequestHead
from entrypoints.edge.head_method import method_of
from entrypoints.edge.problems import PROBLEM_JSON, of_domain_error

_BEARER = b"bearer "


def cached_tenant(scope: dict, cache: TokenCache) -> str | None:
    """The tenant of the request's bearer token, if this process's token cache knows it."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            if len(value) > MAX_TOKEN_CHARS + 16 or value[:7].lower() != _BEARER:
                return None
            try:
                token = value[7:].decode("ascii").strip()
            except UnicodeDecodeError:
                return None
            if not token or token.count(".") == 2:
                return None  # a JWT: the cache knows none (its turn comes as it authenticates)
            caller = cache.get(token_hash(token))
            return None if caller is None else caller.tenant
    return None


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


def with_turns(app: Any, cache: TokenCache, origins: Iterable[str]) -> Any:
    """`app`, each HTTP request of a known token at work on one of its tenant's turns. Inside
    the request's budget (it waits within it)."""
    permitted = allowed_origin(origins)

    async def gated(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if (tenant := cached_tenant(scope, cache)) is not None:
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
