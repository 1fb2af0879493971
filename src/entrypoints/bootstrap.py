"""Bringing the service's database up before anything serves: the configured PostgreSQL or the
embedded one, its migrations, the bootstrap token, and the development token of the embedded
defaults. Used by `serve`, `worker` and the token commands (entrypoints/cli.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import asyncpg

from adapters.postgres.embedded import start_embedded
from adapters.postgres.migrations import migrate
from adapters.postgres.tokens import PostgresTokens
from application.access import SCOPES
from application.tokens import IssueToken, make_caller, token_hash
from entrypoints.config import PREFIX, Settings

log = logging.getLogger("ductor_streams")
# Starts of the embedded PostgreSQL tried before `serve` gives up.
EMBEDDED_STARTS = 3


class CommandError(Exception):
    """A command that cannot go on: its message is printed as one line on stderr, and the
    command exits with `exit_code` (2, a usage error, unless told otherwise)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def reaching_the_database() -> Iterator[None]:
    """Opening connections to PostgreSQL: a URL that cannot be used, or a database that cannot
    be reached, stops the command with one line (a CommandError) instead of a traceback. A URL
    asyncpg refuses (its ClientConfigurationError is a ValueError, as is an unparsable host; a
    port past 65535 is an OverflowError) is a bad setting, exit 2, named but not shown (it may
    hold a password); a database that does not answer or refuses us is exit 1, as the token
    commands always said it."""
    try:
        yield
    except (ValueError, OverflowError) as error:
        raise CommandError(f"{PREFIX}DATABASE_URL cannot be used: {error}") from None
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise CommandError(f"cannot reach the database: {error}", exit_code=1) from None


async def connect(url: str, **options: Any) -> asyncpg.Connection:
    """`asyncpg.connect`, its failure to connect as one line (`reaching_the_database`)."""
    with reaching_the_database():
        return await asyncpg.connect(url, **options)


async def create_pool(url: str, **options: Any) -> asyncpg.Pool:
    """`asyncpg.create_pool` (which opens its first connections), the same way."""
    with reaching_the_database():
        return await asyncpg.create_pool(url, **options)


def database_url(settings: Settings) -> str:
    """The configured PostgreSQL, or the embedded one under DATA_DIR/pg (started if needed)."""
    if settings.database_url:
        return settings.database_url
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = settings.data_dir / "pg"
    for attempt in range(EMBEDDED_STARTS):
        try:
            url = start_embedded(pgdata)
            break
        except (subprocess.SubprocessError, OSError) as error:
            # (A postmaster killed while it starts: pg_ctl fails; a second start recovers it.)
            if attempt + 1 == EMBEDDED_STARTS:
                raise CommandError(
                    f"the embedded PostgreSQL could not be started ({error}): its log is "
                    f"{pgdata / 'log'}"
                ) from None
            log.warning("the embedded PostgreSQL did not start (%s); trying again", error)
    os.environ[PREFIX + "DATABASE_URL"] = url  # the server's worker processes inherit it
    return url


async def prepare(url: str, settings: Settings) -> str | None:
    """Migrate, make sure the bootstrap token exists, and on the embedded defaults without any
    configured token, create a development token once. Returns the token to announce, if any."""
    conn = await connect(url)
    try:
        for name in await migrate(conn):
            log.info("applied migration %s", name)
    finally:
        await conn.close()
    pool = await create_pool(url, min_size=1, max_size=2)
    try:
        issue = IssueToken(PostgresTokens(pool))
        if settings.bootstrap_token:
            caller = make_caller("default", "bootstrap", list(SCOPES))
            await issue(caller, settings.bootstrap_token)
            if await PostgresTokens(pool).find(token_hash(settings.bootstrap_token)) is None:
                # A revocation is deliberate (the token may have leaked): a restart with the
                # same setting does not undo it.
                log.warning(
                    "the configured %sBOOTSTRAP_TOKEN was revoked and stays revoked; "
                    "configure a new value to have a working bootstrap token",
                    PREFIX,
                )
            return None
        if not settings.embedded:
            return None
        dev_file = settings.data_dir / "dev-token"
        if dev_file.exists():
            token = dev_file.read_text().strip()
            if await PostgresTokens(pool).find(token_hash(token)) is not None:
                return token
        token = await issue(make_caller("default", "developer", list(SCOPES)))
        dev_file.write_text(token + "\n")
        dev_file.chmod(0o600)
        return token
    finally:
        await pool.close()
