"""Browser-facing headers around the whole application: the security headers of PROTOCOL.md
12.7 on every answer, and CORS for the origins in DUCTOR_STREAMS_CORS_ORIGINS (both surfaces).

An answer may carry a stream's or an object's bytes under the media type its writer chose (a
protocol stream created as `text/html` is read as `text/html`, from the console's own origin):
every answer that sets no policy of its own gets a Content-Security-Policy that runs nothing
and loads nothing (`default-src 'none'; sandbox`), besides `nosniff`, so a browser that opens
one renders it inert. It is not decided by the path: the router reaches the same handler
under `//api/…` as under `/api/…`. The console's page sets its own policy, which is kept.
An answer that says nothing of caching gets `Cache-Control: no-store`: what the service answers
is a tenant's data.

What the CORS headers say depends on the request's Origin (present, allowed or not), so every
answer carries `Vary: Origin`: a cache never hands one origin's answer to another.

A preflight (`OPTIONS` with `Access-Control-Request-Method`) from an allowed origin is answered
here, before routing and without a token; it lists `authorization` explicitly (a `*` does not
cover it). Answers to an allowed origin expose the protocol's headers to its scripts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from entrypoints.edge.exchange import Exchange
from entrypoints.edge.head import RequestHead

SECURITY = (
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-resource-policy", b"cross-origin"),
)
CONTENT_POLICY = (b"content-security-policy", b"default-src 'none'; sandbox")
# What an answer says of caching when it says nothing itself: records, tokens and stream
# documents are a tenant's data, and kept by no cache (a Durable Streams read says which of its
# answers a cache may keep, and the console's page says its own).
NOT_STORED = (b"cache-control", b"no-store")
VARY = (b"vary", b"Origin")
METHODS = b"GET, HEAD, POST, PUT, DELETE, OPTIONS"
ALLOWED_HEADERS = (
    "authorization, content-type, if-none-match, idempotency-key, last-event-id, "
    "stream-ttl, stream-expires-at, stream-closed, stream-seq, stream-forked-from, "
    "stream-fork-offset, stream-fork-sub-offset, producer-id, producer-epoch, producer-seq"
)
EXPOSED = (
    b"Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, "
    b"Stream-Expires-At, ETag, Location, Retry-After, Producer-Epoch, Producer-Seq, "
    b"Producer-Expected-Seq, Producer-Received-Seq, stream-sse-data-encoding, Content-Type, "
    b"Idempotent-Replayed, WWW-Authenticate, Allow, Repr-Digest, Content-Range"
)
PREFLIGHT = "preflight"  # the route label of a CORS preflight answered here
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")


def _header(scope: dict, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return None


def _requested_headers(value: bytes | None) -> list[str]:
    """The header names a preflight asks for, when they are plain tokens."""
    if not value:
        return []
    names = [n.strip().lower() for n in value.decode("latin-1").split(",")]
    return [n for n in names if n and set(n) <= _TOKEN_CHARS]


def allowed_origin(origins: Iterable[str]) -> Any:
    """Whether a request's Origin may read answers: a function of the header's value."""
    allowed = frozenset(o.strip().rstrip("/") for o in origins if o.strip())
    anyone = "*" in allowed
    return lambda origin: anyone or origin.decode("latin-1") in allowed


def _always(scope: dict) -> list[tuple[bytes, bytes]]:
    """The headers every answer gets, whatever its path and origin: the security headers, the
    content policy and `Cache-Control: no-store` (each unless the answer sets its own) and
    `Vary: Origin`."""
    return [*SECURITY, CONTENT_POLICY, NOT_STORED, VARY]


def answer_headers(scope: dict, cors: Any) -> list[tuple[bytes, bytes]]:
    """What `browser_headers` adds to an answer that sets none of them itself (an app in front
    of it that answers alone adds these): the security headers, the content policy, `Vary`,
    and CORS for an allowed origin."""
    headers = _always(scope)
    origin = _header(scope, b"origin")
    if origin is not None and cors(origin):
        headers.append((b"access-control-allow-origin", origin))
        headers.append((b"access-control-expose-headers", EXPOSED))
    return headers


def _varies_by_origin(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        k.lower() == b"vary" and b"origin" in v.lower().replace(b" ", b"").split(b",")
        for k, v in headers
    )


def browser_headers(app: Any, origins: Iterable[str]) -> Any:
    permitted = allowed_origin(origins)

    async def adapter(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        origin = _header(scope, b"origin")
        cors = origin is not None and permitted(origin)
        if (
            cors
            and scope["method"] == "OPTIONS"
            and _header(scope, b"access-control-request-method") is not None
        ):
            asked = _requested_headers(_header(scope, b"access-control-request-headers"))
            listed = ALLOWED_HEADERS.split(", ")
            allow = ", ".join([*listed, *(n for n in asked if n not in listed)])
            # Answered here, before the router and the request pipeline around it: its id,
            # metric and debug line are given here too.
            head = RequestHead(scope.get("headers", ()))
            with Exchange("OPTIONS", scope["path"], head, route=PREFLIGHT) as exchange:
                headers = [
                    *_always(scope),
                    (b"access-control-allow-origin", origin),
                    (b"access-control-allow-methods", METHODS),
                    (b"access-control-allow-headers", allow.encode()),
                    (b"access-control-max-age", b"600"),
                    (b"content-length", b"0"),
                    (b"x-request-id", exchange.request_id.encode()),
                ]
                exchange.status = 204
                await send({"type": "http.response.start", "status": 204, "headers": headers})
                await send({"type": "http.response.body", "body": b""})
            return

        always = _always(scope)

        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {k.lower() for k, _ in headers}
                varies = _varies_by_origin(headers)
                headers.extend(
                    h for h in always if h[0] not in present or (h[0] == b"vary" and not varies)
                )
                if cors:
                    headers.append((b"access-control-allow-origin", origin))
                    headers.append((b"access-control-expose-headers", EXPOSED))
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, with_headers)

    return adapter
