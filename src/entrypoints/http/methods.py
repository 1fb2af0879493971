"""OPTIONS on any path answers 204 with `Allow` listing every method the path serves.

Litestar 2 adds an OPTIONS handler to each path by itself, but it answers from the methods of
the first handler registered on the path only: OPTIONS on `…/records` said `OPTIONS, POST`,
not GET (litestar-org/litestar#4169, fixed in Litestar 3). Once the application is built, each
such handler is pointed at its whole path. OPTIONS needs no token: it says nothing a 405 would
not."""

from __future__ import annotations

from typing import Any

from litestar import Litestar, Response
from litestar.routes import HTTPRoute

from entrypoints.http.head import allowed

_DEFAULT_OPTIONS_HANDLER = "options_handler"  # the name of Litestar's generated handler


def list_every_method_in_options(app: Litestar) -> None:
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        handler, _ = route.route_handler_map["OPTIONS"]
        if handler.handler_name == _DEFAULT_OPTIONS_HANDLER:
            # The replacement keeps the generated handler's signature (it takes the scope),
            # which Litestar has already inspected to call it.
            handler._fn = _answer_options(allowed(route.methods))


def _answer_options(allow: str) -> Any:
    def options_handler(scope: Any) -> Response[None]:
        return Response(content=None, status_code=204, headers={"Allow": allow})

    return options_handler
