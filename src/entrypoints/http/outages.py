"""The Litestar exception handlers for outages (entrypoints/edge/outages.py decides which
errors are one, entrypoints/edge/problems.py answers them)."""

from __future__ import annotations

from litestar import Request, Response
from litestar.types import ExceptionHandlersMap

from entrypoints.edge import problems as edge
from entrypoints.edge.outages import OUTAGE_FAMILIES, outage_of
from entrypoints.http.problems import respond

__all__ = ["outage_handlers", "outage_of", "unavailable"]


def unavailable(request: Request, error: Exception) -> Response[bytes]:
    return respond(edge.unavailable(request.method, request.url.path, error))


def outage_handlers() -> ExceptionHandlersMap:
    """The exception handlers the application registers for outages: every family an outage
    can come from, each handler answering 500 for the members that are not one."""
    return {family: unavailable for family in OUTAGE_FAMILIES}
