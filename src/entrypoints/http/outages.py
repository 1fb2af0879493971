"""PostgreSQL or the object store out of reach: 503 `unavailable` with Retry-After, never 500."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import asyncpg
from litestar import Request, Response

from entrypoints.http import problems

log = logging.getLogger("ductor_streams")


def unavailable(_: Request, error: Exception) -> Response[bytes]:
    log.warning("database unavailable: %s", type(error).__name__)
    return problems.problem(
        "unavailable",
        "the database is unavailable; retry shortly",
        status=503,
        headers={"Retry-After": "1"},
    )


def outage_handlers() -> dict[type[Exception], Callable[[Request, Any], Response[Any]]]:
    """The exception handlers the application registers for outages."""
    return {
        asyncpg.PostgresConnectionError: unavailable,
        asyncpg.InterfaceError: unavailable,
        ConnectionError: unavailable,
    }
