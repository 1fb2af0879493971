"""Numbered plain-SQL migrations, applied in order under an advisory lock and recorded."""

from __future__ import annotations

import os
import re
from pathlib import Path

import asyncpg

# The project's migrations/ folder; DUCTOR_STREAMS_MIGRATIONS_DIR may point elsewhere.
DEFAULT_DIR = Path(__file__).resolve().parents[3] / "migrations"
_LOCK_ID = 0x6475_6374_6F72  # "ductor": one advisory lock for every process of a deployment
_NAME = re.compile(r"^(\d+)_[\w-]+\.sql$")


def migrations_dir() -> Path:
    return Path(os.environ.get("DUCTOR_STREAMS_MIGRATIONS_DIR", DEFAULT_DIR))


def pending_files(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


async def migrate(conn: asyncpg.Connection, directory: Path | None = None) -> list[str]:
    """Apply what is not applied yet; return the names applied. Safe to run from many processes
    at once: they queue on the advisory lock and the later ones find nothing to do."""
    directory = directory or migrations_dir()
    applied: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_ID)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, path in pending_files(directory):
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(path.read_text())
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    version,
                    path.name,
                )
            applied.append(path.name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_ID)
    return applied
