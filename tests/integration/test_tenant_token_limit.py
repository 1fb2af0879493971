"""A tenant's limit on the tokens it holds (DUCTOR_STREAMS_MAX_TOKENS_PER_TENANT), on real
PostgreSQL and real server and worker processes: every token kept counts (revoked and expired
ones too, until the workers forget them), mints at once count against each other, and past the
limit a mint is 409 while another tenant mints as before."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from adapters.postgres.migrations import migrate
from adapters.postgres.tenant_counts import fold_tenant_counts, tenant_tokens
from tests.conftest import SERVER_ENV, Tokens
from tests.support.postgres import database_before
from tests.support.server import ServerProcess, WorkerProcess

LIMIT = 5
TOKENS = "/api/workflow-streams/tokens"


@pytest.fixture(scope="module")
def limited(own_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose tenants may hold 5 tokens each, on a database of this module's own (its
    worker forgets every expired token there)."""
    process = ServerProcess(
        database_url=own_database,
        data_dir=tmp_path_factory.mktemp("tokens-limited"),
        env={**SERVER_ENV, "DUCTOR_STREAMS_MAX_TOKENS_PER_TENANT": str(LIMIT)},
    ).start()
    yield process
    process.stop()


def mint(api: httpx.AsyncClient, seconds: int = 600) -> asyncio.Future[httpx.Response]:
    return asyncio.ensure_future(
        api.post(TOKENS, json={"scopes": ["streams:read"], "expires_in_seconds": seconds})
    )


async def kept(pool: asyncpg.Pool, tenant: str) -> int:
    """The tenant's tokens kept, as its rows hold them and as migration 0512's triggers count
    them (the same, or the test fails)."""
    # One snapshot for both reads: the sweep may forget tokens between two statements.
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        count: int = await conn.fetchval(
            "SELECT count(*) FROM api_tokens WHERE tenant = $1", tenant
        )
        assert await tenant_tokens(conn, tenant) == count
    return count


async def test_past_its_limit_a_tenant_mints_no_more_tokens_and_the_others_do(
    limited: ServerProcess, own_pool: asyncpg.Pool
) -> None:
    tokens = Tokens(own_pool)
    tenant = "t-" + secrets.token_hex(5)
    async with await tokens.client(limited, tenant) as api:  # its own token counts: 1
        # Ten at once: each counts against the others, so four are minted.
        answers = await asyncio.gather(*(mint(api) for _ in range(10)))
        assert sorted(a.status_code for a in answers) == [201] * 4 + [409] * 6
        refused = next(a for a in answers if a.status_code == 409)
        assert refused.headers["content-type"].startswith("application/problem+json")
        problem = refused.json()
        assert problem["code"] == "quota-exhausted" and problem["max_tokens"] == LIMIT
        assert await kept(own_pool, tenant) == LIMIT
        # A revoked token still counts (its row keeps it revoked until it is forgotten).
        minted = next(a for a in answers if a.status_code == 201).json()
        assert (await api.delete(f"{TOKENS}/{minted['id']}")).status_code == 204
        assert (await mint(api)).status_code == 409
        # The tokens it holds still work.
        assert (await api.get(TOKENS)).status_code == 200
    async with await tokens.client(limited, "t-" + secrets.token_hex(5)) as other:
        assert (await mint(other)).status_code == 201


async def test_expired_tokens_count_until_the_workers_forget_them(
    limited: ServerProcess, own_pool: asyncpg.Pool, own_database: str, tmp_path: Path
) -> None:
    tokens = Tokens(own_pool)
    tenant = "t-" + secrets.token_hex(5)
    async with await tokens.client(limited, tenant) as api:
        answers = [await mint(api, seconds=1) for _ in range(LIMIT)]
        assert [a.status_code for a in answers] == [201] * (LIMIT - 1) + [409]
        await asyncio.sleep(1.5)  # expired: still kept, still counted
        assert (await mint(api)).status_code == 409
        sweeper = WorkerProcess(
            database_url=own_database,
            data_dir=tmp_path,
            env={
                "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.1",
                "DUCTOR_STREAMS_CLEANUP_AGE_SECONDS": "0.1",
                "DUCTOR_STREAMS_CLEANUP_INTERVAL_SECONDS": "0.2",
                "DUCTOR_STREAMS_WORKER_LEASE_SECONDS": "2",
            },
        ).start()
        try:
            async with asyncio.timeout(20):
                while await kept(own_pool, tenant) > 1:
                    await asyncio.sleep(0.1)
        finally:
            sweeper.stop()
        # The server reads the count again within a second: the room is back.
        async with asyncio.timeout(10):
            while (answer := await mint(api)).status_code == 409:
                await asyncio.sleep(0.2)
        assert answer.status_code == 201, answer.text


async def test_the_count_folds_and_migration_0512_counts_the_tokens_already_there(
    own_pool: asyncpg.Pool, postgres_admin_url: str, tmp_path: Path
) -> None:
    tenant = "t-" + secrets.token_hex(5)
    await own_pool.execute(
        "INSERT INTO tenant_token_counts (tenant, backend, tokens) "
        "VALUES ($1, $2, 4), ($1, $3, -1), ($1, 0, 10)",
        tenant,
        2**31 - 5,  # no backend has these
        2**31 - 6,
    )
    await fold_tenant_counts(own_pool)
    rows = await own_pool.fetch(
        "SELECT backend, tokens FROM tenant_token_counts WHERE tenant = $1", tenant
    )
    assert [tuple(r) for r in rows] == [(0, 13)]
    await own_pool.execute("DELETE FROM tenant_token_counts WHERE tenant = $1", tenant)

    async with database_before(postgres_admin_url, 512, tmp_path) as url:
        conn = await asyncpg.connect(url)
        try:
            token = (
                "INSERT INTO api_tokens (token_hash, tenant, principal, scopes)"
                " VALUES ($1, $2, 'p', '{streams:read}')"
            )
            for n, owner in enumerate(["a", "a", "b"]):
                await conn.execute(token, bytes([n]), owner)
            assert "0512_tenant_token_counts.sql" in await migrate(conn)
            assert [await tenant_tokens(conn, t) for t in "abc"] == [2, 1, 0]
            # Stored again under its hash (the bootstrap token at each start): not twice.
            await conn.execute(
                token + " ON CONFLICT (token_hash) DO UPDATE SET principal = 'q'", bytes([0]), "a"
            )
            await conn.execute("DELETE FROM api_tokens WHERE tenant = 'b'")
            assert [await tenant_tokens(conn, t) for t in "ab"] == [2, 0]
            # Stored again for another tenant: it moves; revoked, it stays.
            await conn.execute(
                token + " ON CONFLICT (token_hash) DO UPDATE SET tenant = excluded.tenant",
                bytes([0]),
                "c",
            )
            await conn.execute("UPDATE api_tokens SET revoked_at = now()")
            assert [await tenant_tokens(conn, t) for t in "abc"] == [1, 0, 1]
        finally:
            await conn.close()
