"""OPTIONS on any path answers 204 with `Allow` listing every method the path serves.

Litestar 2 adds an OPTIONS handler to each path by itself, but it answers from the methods of
the first handler registered on the path only: OPTIONS on `…/records` said `OPTIONS, POST`,
not GET (litestar-org/litestar#4169, fixed in Litestar 3). Its answer is mended at our edge,
from what Litestar says publicly: each route's methods (`HTTPRoute.methods`, by its
`path_format`) and the route a request matched (`scope["path_template"]`), so Litestar's own
handler stays as it is. OPTIONS needs no token: it says nothing a 405 would not."""

from __future__ import annotations

from typing import Any

from litestar import Litestar
from litestar.routes import HTTPRoute

from entrypoints.edge.head_method import allowed


def every_method_in_options(app: Litestar, asgi: Any) -> Any:
    """`asgi` (the application's router), with the Allow header of each 204 answer to OPTIONS
    listing every method of the route it matched."""
    allow_of = {
        route.path_format: allowed(route.methods).encode()
        for route in app.routes
        if isinstance(route, HTTPRoute)
    }

    async def adapter(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await asgi(scope, receive, send)
            return

        async def with_allow(message: dict) -> None:
            if message["type"] == "http.response.start" and message["status"] == 204:
                allow = allow_of.get(scope.get("path_template", ""))
                if allow is not None:
                    message["headers"] = [
                        (name, allow if name.lower() == b"allow" else value)
                        for name, value in message.get("headers", ())
                    ]
            await send(message)

        await asgi(scope, receive, with_allow)

    return adapter
