"""HEAD wherever GET is served (RFC 9110 §9.3.2): the same status and headers, no body.

Litestar 2 serves HEAD only from handlers declared for it, and refuses to declare one for a
handler that answers a body. So HEAD is adapted around the whole application instead: the
request is routed and handled as the GET it mirrors (one code path, so the status and headers
cannot drift apart: Content-Type, Content-Length, ETag, problem answers, 401's
WWW-Authenticate, 405's Allow), and whatever body the GET would send is dropped. Three things
differ, and each is decided where it matters:

- it is not an access for expiry: the request runs within `expiry.not_an_access`;
- handlers that would start costly work for a body (following a subscription, reading an
  object body from its store) ask `is_head` and answer the headers without it;
- metrics and logs name it HEAD (`method_of`).

Allow (on 405 and OPTIONS) lists HEAD wherever it lists GET (`allowed`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from application.expiry import not_an_access

_HEAD = "ductor_streams.head"  # set in the scope of a HEAD request handled as GET


def serve_head(app: Any) -> Any:
    async def adapter(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await app(scope, receive, send)
            return
        # A copy: the server reads the scope it passed (uvicorn decides from its method whether
        # the answer carries Content-Length bytes).
        scope = {**scope, "method": "GET", _HEAD: True}
        ended = False

        async def headers_only(message: dict) -> None:
            nonlocal ended
            if message["type"] != "http.response.body":
                await send(message)
            elif not ended:
                ended = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        with not_an_access():
            await app(scope, receive, headers_only)

    return adapter


def is_head(scope: Any) -> bool:
    """Whether the request is a HEAD, handled as its GET."""
    return bool(scope.get(_HEAD, False))


def method_of(scope: Any) -> str:
    """The method the client sent."""
    return "HEAD" if scope.get(_HEAD) else scope["method"]


def allowed(methods: Iterable[str]) -> str:
    """An Allow header's value: the methods, sorted, with HEAD wherever GET is."""
    served = {method.strip() for method in methods}
    if "GET" in served:
        served.add("HEAD")
    return ", ".join(sorted(served))
