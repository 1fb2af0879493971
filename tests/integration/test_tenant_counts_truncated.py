"""A TRUNCATE of a counted table (migration 0513), on real PostgreSQL: it fires none of the
triggers that count rows in and out, so the streams' and tokens' counts are emptied by a trigger
of its own, and the bytes are counted again by the storage cleanup's next fold."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from adapters.postgres.tenant_counts import (
    _FOLD,
    fold_tenant_counts,
    tenant_bytes,
    tenant_streams,
    tenant_tokens,
)
from tests.support.postgres import database_before

_STREAM = (
    "INSERT INTO streams (tenant, run_id, stream_id, definition, created_at, version, state)"
    " VALUES ($1, 'r', $2, $3, now(), 1, '\\x00')"
)
_EVENT = (
    "INSERT INTO workflow_wait_events (event_id, tenant, run_id, stream_id, sequence, payload,"
    " size) VALUES ($1, $2, 'r', 's0', $3, '{\"x\": 1}', 1000)"
)
_TOKEN = (
    "INSERT INTO api_tokens (token_hash, tenant, principal, scopes)"
    " VALUES ($1, $2, 'p', '{streams:read}')"
)


async def _due(pool: asyncpg.Pool) -> list[str]:
    return [r[0] for r in await pool.fetch("SELECT truncated FROM tenant_recounts_due")]


async def test_a_truncate_empties_the_counts_or_has_the_bytes_counted_again(
    postgres_admin_url: str, tmp_path: Path
) -> None:
    async with database_before(postgres_admin_url, 10_000, tmp_path) as url:  # every migration
        pool = await asyncpg.create_pool(url, min_size=1, max_size=3)
        try:
            for tenant in "ab":
                for n in range(3):
                    await pool.execute(_STREAM, tenant, f"s{n}", b"d" * 100)
                await pool.execute(_TOKEN, tenant.encode(), tenant)
            for n in range(4):
                await pool.execute(_EVENT, f"e{n}", "a", n)
            streams_only = 3 * (100 + 128)
            assert await tenant_bytes(pool, "a") == streams_only + 4 * (1000 + 128)
            assert await tenant_bytes(pool, "b") == streams_only

            # The engine's events emptied at once: counted again at the next fold.
            await pool.execute("TRUNCATE workflow_wait_events")
            assert await _due(pool) == ["workflow_wait_events"]
            await fold_tenant_counts(pool)
            assert await _due(pool) == []
            assert await tenant_bytes(pool, "a") == streams_only
            assert await tenant_bytes(pool, "b") == streams_only

            # While the tables stay too busy to lock, the fold raises and the mark stays.
            await pool.execute(_EVENT, "e9", "a", 9)
            await pool.execute("TRUNCATE workflow_wait_events")
            async with pool.acquire() as holder, holder.transaction():
                await holder.execute("LOCK TABLE stream_records IN ROW EXCLUSIVE MODE")
                with pytest.raises(asyncpg.LockNotAvailableError):
                    await fold_tenant_counts(pool)
            assert await _due(pool) == ["workflow_wait_events"]
            assert await tenant_bytes(pool, "a") == streams_only + 1000 + 128
            await fold_tenant_counts(pool)
            assert await tenant_bytes(pool, "a") == streams_only

            # The tokens' and the streams' counts have one source each: emptied with it.
            assert [await tenant_tokens(pool, t) for t in "ab"] == [1, 1]
            await pool.execute("TRUNCATE api_tokens")
            assert [await tenant_tokens(pool, t) for t in "ab"] == [0, 0]
            assert await _due(pool) == []  # the tokens are not bytes
            assert [await tenant_streams(pool, t) for t in "ab"] == [3, 3]
            await pool.execute("TRUNCATE streams CASCADE")
            assert [await tenant_streams(pool, t) for t in "ab"] == [0, 0]
            assert await _due(pool) == ["streams"]
            await fold_tenant_counts(pool)
            assert [await tenant_bytes(pool, t) for t in "ab"] == [0, 0]
            # A count emptied is counted from there on.
            await pool.execute(_STREAM, "a", "again", b"")
            await pool.execute(_TOKEN, b"again", "a")
            assert await tenant_streams(pool, "a") == 1
            assert await tenant_tokens(pool, "a") == 1
            assert await tenant_bytes(pool, "a") == 128
        finally:
            await pool.close()


async def test_a_truncate_racing_the_fold_leaves_no_count_behind(
    postgres_admin_url: str, tmp_path: Path
) -> None:
    """The fold moved an ended backend's row into a new row of backend 0 and committed while the
    TRUNCATE's trigger emptied the count: its DELETE, which saw only the rows committed when it
    began, left the new row, and a tenant with no stream counted one (migration 0515)."""
    async with database_before(postgres_admin_url, 10_000, tmp_path) as url:
        setup, folding, truncating = [await asyncpg.connect(url) for _ in range(3)]
        try:
            await setup.execute(_STREAM, "x", "s0", b"")
            await setup.execute(
                "UPDATE tenant_stream_counts SET backend = $1 WHERE tenant = 'x'", 2**31 - 7
            )  # as if its backend had ended
            fold = _FOLD.format(table="tenant_stream_counts", column="streams")
            async with folding.transaction():
                assert await folding.fetchval(fold) == 1  # moved into backend 0, uncommitted
                truncate = asyncio.ensure_future(truncating.execute("TRUNCATE streams CASCADE"))
                await asyncio.sleep(0.5)
                assert not truncate.done()  # it waits for the fold
            await asyncio.wait_for(truncate, 10)
            assert await tenant_streams(setup, "x") == 0
        finally:
            for conn in (setup, folding, truncating):
                await conn.close()
