"""Storage parameters the migrations set, and what they are for (docs/architecture.md)."""

from __future__ import annotations

import asyncpg


async def test_streams_pages_keep_room_for_hot_updates(pool: asyncpg.Pool) -> None:
    """Every group commit rewrites its stream row; at fillfactor 50 a page keeps half its space
    for the next versions, so those updates stay HOT (migration 0486; the storage soak showed
    the table bloating page by page at the default 100)."""
    options = await pool.fetchval("SELECT reloptions FROM pg_class WHERE oid = 'streams'::regclass")
    assert options is not None and "fillfactor=50" in options
