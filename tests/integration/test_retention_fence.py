"""A prune is fenced by its worker's claim, in the prune's own transaction (real PostgreSQL).

The worker loop stops trusting a claim it could not renew (`ensure_claimed`), but a statement
sent in time can still arrive after the lease ran out and another worker took the job over. So
the prune checks, under the stream-row lock and in the transaction that writes it, that its
worker still holds the stream's retention job: a worker whose lease lapsed prunes nothing."""

from __future__ import annotations

import asyncio
import secrets

import asyncpg
import msgspec
import pytest

from adapters.postgres.deliveries import PostgresInputDeliveries
from adapters.postgres.jobs import PostgresRetentionJobs
from adapters.postgres.streams import _RETENTION_FENCE, PostgresStreams
from application.group_commit import GroupCommit
from application.retention import PruneRetention
from application.workers import LeaseLost
from domain.definition import Retention
from domain.stream import StreamKey
from tests.support.builders import NOW, append, definition, record

LEASE = 0.5


async def retention_stream(pool: asyncpg.Pool) -> tuple[PostgresStreams, PruneRetention, StreamKey]:
    streams = PostgresStreams(pool)
    key = StreamKey("t", "run-" + secrets.token_hex(4), "kept")
    d = definition(max_unread_items=100_000)
    await streams.create(key, msgspec.structs.replace(d, retention=Retention(max_records=3)), NOW)
    await streams.update(key, [append([record(b"%d" % i) for i in range(10)])])
    prune = PruneRetention(
        streams,
        streams,
        GroupCommit(streams),
        lambda: NOW,
        PostgresInputDeliveries(pool, "dispatcher"),
        interval_seconds=7,
    )
    return streams, prune, key


async def claim(queue: PostgresRetentionJobs, key: StreamKey):
    [job] = [j for j in await queue.claim(100) if j.key == key]
    assert job.claimed_by == queue.worker_id
    return job


async def test_a_worker_whose_claim_was_taken_over_prunes_nothing(own_pool: asyncpg.Pool) -> None:
    streams, prune, key = await retention_stream(own_pool)
    first = PostgresRetentionJobs(own_pool, "worker-a", lease_seconds=LEASE)
    second = PostgresRetentionJobs(own_pool, "worker-b", lease_seconds=30)
    stale = await claim(first, key)
    await asyncio.sleep(LEASE + 0.2)
    taken = await claim(second, key)

    with pytest.raises(LeaseLost):
        await prune.run_job(stale)
    assert (await streams.load(key)).state.earliest == 1  # nothing went

    assert await prune.run_job(taken) == 7  # the holder prunes
    assert (await streams.load(key)).state.earliest == 8


async def test_a_lapsed_claim_prunes_nothing_even_before_anyone_takes_it(
    own_pool: asyncpg.Pool,
) -> None:
    streams, prune, key = await retention_stream(own_pool)
    first = PostgresRetentionJobs(own_pool, "worker-a", lease_seconds=LEASE)
    job = await claim(first, key)
    await asyncio.sleep(LEASE + 0.2)
    with pytest.raises(LeaseLost):
        await prune.run_job(job)
    assert (await streams.load(key)).state.earliest == 1


async def test_a_held_claim_prunes_and_a_prune_outside_any_claim_is_not_fenced(
    own_pool: asyncpg.Pool,
) -> None:
    streams, prune, key = await retention_stream(own_pool)
    queue = PostgresRetentionJobs(own_pool, "worker-a", lease_seconds=30)
    job = await claim(queue, key)
    assert await prune.run_job(job) == 7
    assert (await streams.load(key)).state.earliest == 8
    await streams.update(key, [append([record(), record()])])
    assert await prune(key) == 7  # an operator's or a test's prune, under no claim
    assert (await streams.load(key)).state.earliest == 10


async def test_the_fence_holds_the_job_until_the_prune_commits(own_pool: asyncpg.Pool) -> None:
    """While a fenced prune's transaction is open, no other worker can claim the job: the claim
    skips the row the prune holds (FOR SHARE against FOR UPDATE SKIP LOCKED)."""
    _, _, key = await retention_stream(own_pool)
    first = PostgresRetentionJobs(own_pool, "worker-a", lease_seconds=LEASE)
    await claim(first, key)
    async with own_pool.acquire() as conn, conn.transaction():
        held = await conn.fetchval(_RETENTION_FENCE, *key, "worker-a")  # the prune's own check
        assert held
        await asyncio.sleep(LEASE + 0.2)  # the lease runs out while the row is held
        second = PostgresRetentionJobs(own_pool, "worker-b", lease_seconds=30)
        assert [j for j in await second.claim(100) if j.key == key] == []
    assert await claim(second, key)
