"""The request checks of entrypoints/edge/checks.py as a Litestar guard on every route; and
`OPTIONS` on the Durable Streams surface (other than a CORS preflight, answered before
routing) is authenticated like the surface's other methods."""

from __future__ import annotations

from typing import Any

from entrypoints.edge.checks import UnsupportedMediaType, check_scope

__all__ = ["UnsupportedMediaType", "check_request", "check_scope"]


async def check_request(connection: Any, _: Any) -> None:
    scope = connection.scope
    if check_scope(scope) and scope["method"] == "OPTIONS":
        services = connection.app.state.services
        await services.authenticate(connection.headers.get("authorization"))
