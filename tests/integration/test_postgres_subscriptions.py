"""The subscription store's contract on PostgreSQL (migration 0496), the stream-creation
trigger that links what a glob matches included."""

from __future__ import annotations

import contextlib
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from application.subscriptions import WAKE_EVENT, AckRequest, Change
from domain.subscriptions import AlreadyClaimed, Fenced, NoPendingWork, StreamPath
from entrypoints.config import Settings
from entrypoints.container import Container, provided, start, stop
from tests.support.subscription_contract import (
    ADMIN,
    BASE,
    WRITER,
    SubscriptionStoreContract,
    append,
    create,
    pull_wake,
    uid,
    webhook,
)


class TestPostgresSubscriptions(SubscriptionStoreContract):
    @pytest.fixture
    async def app(self, database_url: str) -> AsyncIterator[tuple[Any, Any]]:
        container = Container(settings=Settings(database_url=database_url, pool_min_size=1))
        services = await start(container)
        yield services, await provided(container.subscription_store)
        await stop(container)


@contextlib.contextmanager
def meanwhile(store: Any, action: Callable[[], Awaitable[None]]) -> Iterator[None]:
    """Within it, each decision of `store` runs `action` once it has read the subscription (its
    row held, its links and their heads read), before it decides."""
    deciding = store._deciding

    async def then_action(*args: Any) -> Any:
        found = await deciding(*args)
        await action()
        return found

    store._deciding = then_action
    try:
        yield
    finally:
        store._deciding = deciding


@pytest.fixture
async def deployed(database_url: str) -> AsyncIterator[tuple[Any, Any]]:
    """The use cases on this database, as a server process has them: (container, services)."""
    container = Container(settings=Settings(database_url=database_url, pool_min_size=1))
    services = await start(container)
    yield container, services
    await stop(container)


async def test_delivered_wakes_are_forgotten_after_their_age(database_url: str) -> None:

    from adapters.postgres.subscriptions import PostgresSubscriptions
    from tests.support.subscription_contract import (
        ADMIN,
        BASE,
        append,
        create,
        uid,
        webhook,
    )

    container = Container(settings=Settings(database_url=database_url, pool_min_size=1))
    services = await start(container)
    try:
        run, sid = uid("run"), uid("sub")
        await services.subscriptions.put(ADMIN, sid, webhook(f"{run}/*"), BASE)
        await create(services, ADMIN, run, "s")
        await append(services, ADMIN, run, "s")
        store = await provided(container.subscription_store)
        assert isinstance(store, PostgresSubscriptions)
        await store.update(ADMIN.tenant, sid, services.subscriptions.tick)
        pool = await provided(container.pool)
        key = (ADMIN.tenant, sid)
        count = "SELECT count(*) FROM ds_wake_deliveries WHERE tenant = $1 AND subscription_id = $2"
        await pool.execute(
            "UPDATE ds_wake_deliveries SET delivered_at = now() - interval '2 hours'"
            " WHERE tenant = $1 AND subscription_id = $2",
            *key,
        )
        await store.forget_delivered(3 * 3600)
        assert await pool.fetchval(count, *key) == 1  # younger than the age: kept
        await store.forget_delivered(3600)
        assert await pool.fetchval(count, *key) == 0
    finally:
        await stop(container)


async def test_a_stream_created_while_a_glob_subscription_is_made_is_linked(
    database_url: str,
) -> None:
    """The race of migration 0497: a stream's creating transaction (its link trigger has run,
    seeing no subscription yet) is still open when a glob subscription matching it is made (its
    backfill cannot see the uncommitted stream). The subscription's creation waits for it, so
    the stream is linked once both have committed."""
    import asyncio

    from tests.support.subscription_contract import ADMIN, BASE, create, uid, webhook

    container = Container(settings=Settings(database_url=database_url, pool_min_size=1))
    services = await start(container)
    try:
        run, sid = uid("run"), uid("sub")
        await create(services, ADMIN, run, "template")
        pool = await provided(container.pool)
        links = (
            "SELECT stream_id FROM ds_subscription_links"
            " WHERE tenant = $1 AND subscription_id = $2 ORDER BY stream_id"
        )
        async with pool.acquire() as racer:
            transaction = racer.transaction()
            await transaction.start()
            await racer.execute(
                "INSERT INTO streams (tenant, run_id, stream_id, definition, created_at, version,"
                " state) SELECT tenant, run_id, 'racer', definition, now(), version, state"
                " FROM streams WHERE tenant = $1 AND run_id = $2 AND stream_id = 'template'",
                ADMIN.tenant,
                run,
            )
            making = asyncio.create_task(
                services.subscriptions.put(ADMIN, sid, webhook(f"{run}/*"), BASE)
            )
            await asyncio.sleep(0.5)
            assert not making.done()  # it waits for the creation under way
            await transaction.commit()
        await asyncio.wait_for(making, 10)
        assert [r[0] for r in await pool.fetch(links, ADMIN.tenant, sid)] == ["racer", "template"]
    finally:
        await stop(container)


async def test_a_stream_erased_while_a_decision_is_made_is_unlinked_after_it(
    deployed: tuple[Any, Any],
) -> None:
    """A stream's erasure unlinks it from the subscriptions holding links to it, each held
    first (migration 0498): one erased while a decision holds its subscription waits for the
    decision, then removes the link the decision wrote. (Written back after the erasure, the
    link named an erased stream, and a stream created again under its ID started from its
    cursor: its first records never woke the subscription.)"""
    import asyncio

    from domain.subscriptions import Link, StreamPath
    from tests.support.subscription_contract import ADMIN, BASE, append, create, uid, webhook

    container, services = deployed
    run, sid = uid("run"), uid("sub")
    await create(services, ADMIN, run, "a")
    await append(services, ADMIN, run, "a", 3)
    await services.subscriptions.put(ADMIN, sid, webhook(streams=[f"{run}/a"]), BASE)
    pool = await provided(container.pool)
    store = await provided(container.subscription_store)
    path = StreamPath(run, "a")
    erasing: list[asyncio.Task[Any]] = []

    async def erase() -> None:  # the links are read by now
        erasing.append(
            asyncio.create_task(
                pool.execute(
                    "DELETE FROM streams WHERE tenant = $1 AND run_id = $2 AND stream_id = 'a'",
                    ADMIN.tenant,
                    run,
                )
            )
        )
        await asyncio.sleep(0.3)
        assert not erasing[0].done()  # the erasure waits for the decision

    def decide(sub: Any, _heads: Any) -> Any:
        from application.subscriptions import Change

        return Change(sub.with_links({path: Link(path, True, False, 2)})), None

    with meanwhile(store, erase):
        await store.update(ADMIN.tenant, sid, decide)
    await asyncio.wait_for(erasing[0], 10)
    links = "SELECT acked FROM ds_subscription_links WHERE tenant = $1 AND subscription_id = $2"
    assert await pool.fetch(links, ADMIN.tenant, sid) == []


async def test_a_stream_created_again_starts_every_link_to_it_at_zero(
    deployed: tuple[Any, Any],
) -> None:
    """Migration 0498: a link row already there when a stream is created (named before it
    existed, or written back from a previous incarnation) gets the new stream's cursor, 0."""
    from tests.support.subscription_contract import ADMIN, BASE, create, uid, webhook

    container, services = deployed
    run, sid = uid("run"), uid("sub")
    await services.subscriptions.put(ADMIN, sid, webhook(f"{run}/*"), BASE)
    pool = await provided(container.pool)
    await pool.execute(
        "INSERT INTO ds_subscription_links"
        " (tenant, subscription_id, run_id, stream_id, explicit, glob, acked)"
        " VALUES ($1, $2, $3, 'a', true, false, 10)",
        ADMIN.tenant,
        sid,
        run,
    )
    await create(services, ADMIN, run, "a")
    row = await pool.fetchrow(
        "SELECT explicit, glob, acked FROM ds_subscription_links"
        " WHERE tenant = $1 AND subscription_id = $2 AND run_id = $3",
        ADMIN.tenant,
        sid,
        run,
    )
    assert tuple(row) == (True, True, 0)


async def test_a_stream_created_while_a_matching_subscription_is_deleted_is_created(
    deployed: tuple[Any, Any],
) -> None:
    """The creation's trigger links the streams a glob matches: one matching a subscription
    whose deletion is under way waits for it, then links nothing (its link's foreign key failed
    the creation, a 500)."""
    import asyncio

    from tests.support.subscription_contract import ADMIN, BASE, create, uid, webhook

    container, services = deployed
    run, sid = uid("run"), uid("sub")
    await services.subscriptions.put(ADMIN, sid, webhook(f"{run}/*"), BASE)
    pool = await provided(container.pool)
    async with pool.acquire() as deleting:
        transaction = deleting.transaction()
        await transaction.start()
        await deleting.execute(
            "DELETE FROM ds_subscriptions WHERE tenant = $1 AND subscription_id = $2",
            ADMIN.tenant,
            sid,
        )
        creating = asyncio.create_task(create(services, ADMIN, run, "a"))
        await asyncio.sleep(0.5)
        assert not creating.done()  # it waits for the deletion under way
        await transaction.commit()
    await asyncio.wait_for(creating, 10)
    links = "SELECT count(*) FROM ds_subscription_links WHERE tenant = $1 AND run_id = $2"
    assert await pool.fetchval(links, ADMIN.tenant, run) == 0


async def test_a_stream_created_while_a_decision_holds_its_subscription_never_deadlocks(
    deployed: tuple[Any, Any],
) -> None:
    """A subscription's decision holds its row (FOR UPDATE), then writes its links; the
    creation's trigger holds the subscriptions it touches first, then their links. The other
    order (the trigger resetting a stale link's cursor first) made a cycle: a deadlock, one of
    the two failing (the creation with a 500)."""
    import asyncio

    from tests.support.subscription_contract import ADMIN, BASE, create, uid, webhook

    container, services = deployed
    run, sid = uid("run"), uid("sub")
    await services.subscriptions.put(ADMIN, sid, webhook(f"{run}/*"), BASE)
    pool = await provided(container.pool)
    link = (
        "INSERT INTO ds_subscription_links"
        " (tenant, subscription_id, run_id, stream_id, explicit, glob, acked)"
        " VALUES ($1, $2, $3, 'a', true, false, 10)"
    )
    await pool.execute(link, ADMIN.tenant, sid, run)
    async with pool.acquire() as deciding:
        transaction = deciding.transaction()
        await transaction.start()
        await deciding.execute(
            "SELECT 1 FROM ds_subscriptions WHERE tenant = $1 AND subscription_id = $2 FOR UPDATE",
            ADMIN.tenant,
            sid,
        )
        creating = asyncio.create_task(create(services, ADMIN, run, "a"))
        await asyncio.sleep(0.5)
        assert not creating.done()  # it waits for the decision
        await deciding.execute(
            "UPDATE ds_subscription_links SET acked = 5"
            " WHERE tenant = $1 AND subscription_id = $2 AND run_id = $3",
            ADMIN.tenant,
            sid,
            run,
        )
        await transaction.commit()
    await asyncio.wait_for(creating, 10)
    acked = await pool.fetchval(
        "SELECT acked FROM ds_subscription_links WHERE tenant = $1 AND run_id = $2",
        ADMIN.tenant,
        run,
    )
    assert acked == 0  # the new stream's cursor, whatever the decision wrote before


async def test_a_stream_linked_by_name_while_it_is_erased_and_created_again_starts_at_zero(
    deployed: tuple[Any, Any],
) -> None:
    """Adding a stream to a subscription links it at its head, read in the decision. If the
    stream was erased and created again between that read and the decision's commit, the new
    stream's link started from the old one's head: its first records never woke the
    subscription. The decision now holds the streams it names (FOR KEY SHARE) from before it
    reads their heads until it commits: the erasure waits for it, then unlinks them."""
    import asyncio

    from domain.subscriptions import StreamPath
    from tests.support.subscription_contract import ADMIN, BASE, append, create, uid, webhook

    container, services = deployed
    run, sid = uid("run"), uid("sub")
    await create(services, ADMIN, run, "a")
    await append(services, ADMIN, run, "a", 3)
    await services.subscriptions.put(ADMIN, sid, webhook(streams=[f"{run}/b"]), BASE)
    pool = await provided(container.pool)
    store = await provided(container.subscription_store)
    again: list[asyncio.Task[Any]] = []

    async def erase_and_create() -> None:
        await services.delete_stream(ADMIN, run, "a")
        await create(services, ADMIN, run, "a")

    async def recreate() -> None:  # the named stream's head is read by now
        again.append(asyncio.create_task(erase_and_create()))
        await asyncio.sleep(0.5)  # time enough for both, unless the erasure waits
        assert not again[0].done()  # it waits for the decision

    with meanwhile(store, recreate):
        await services.subscriptions.add_streams(ADMIN, sid, (StreamPath(run, "a"),))
    await asyncio.wait_for(again[0], 10)
    acked = await pool.fetchval(
        "SELECT acked FROM ds_subscription_links"
        " WHERE tenant = $1 AND subscription_id = $2 AND run_id = $3 AND stream_id = 'a'",
        ADMIN.tenant,
        sid,
        run,
    )
    # The erasure, after the decision, unlinked it: no link at the old stream's head (3).
    assert acked is None


async def test_due_wakes_are_claimed_in_turn_across_tenants_a_few_of_each_at_most(
    pool,
) -> None:
    """A tenant whose receivers hang holds at most `per_tenant` delivery slots across every
    process: another tenant's wake, due later, goes out before the first tenant's backlog."""
    from adapters.postgres.subscriptions import PostgresWakeDeliveries

    noisy, quiet = "noisy-" + secrets.token_hex(3), "quiet-" + secrets.token_hex(3)
    async with pool.acquire() as conn:
        for tenant, count, after in ((noisy, 20, 0), (quiet, 2, 5)):
            for n in range(count):
                sub = f"s{n}"
                await conn.execute(
                    "INSERT INTO ds_subscriptions (tenant, subscription_id, kind, state)"
                    " VALUES ($1, $2, 'webhook', '\\x')",
                    tenant,
                    sub,
                )
                await conn.execute(
                    "INSERT INTO ds_wake_deliveries (tenant, subscription_id, generation,"
                    " wake_id, kind, payload, url, created_by, next_attempt_at)"
                    " VALUES ($1, $2, 1, 'w', 'webhook', '\\x', 'https://h.example/',"
                    " 'p', now() - make_interval(secs => $3))",
                    tenant,
                    sub,
                    30 - after - n * 0.01,  # the noisy tenant's are all due earlier
                )
    try:
        one = PostgresWakeDeliveries(pool, "claims-1", per_tenant=4)
        other = PostgresWakeDeliveries(pool, "claims-2", per_tenant=4)
        mine = (noisy, quiet)  # other tests' wakes may be due in this database too

        def counted(jobs) -> Counter:  # type: ignore[no-untyped-def]
            return Counter(job.key.tenant for job in jobs if job.key.tenant in mine)

        first = await one.claim(100)
        assert counted(first) == {noisy: 4, quiet: 2}, counted(first)
        # Under way in another process count too: the noisy tenant gets no more webhook
        # slots, but its wake events (pull-wake: no receiver to hang) are not held back.
        async with pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO ds_subscriptions (tenant, subscription_id, kind, state)"
                " VALUES ($1, 'pull', 'pull-wake', '\\x')",
                noisy,
            )
            await conn.execute(
                "INSERT INTO ds_wake_deliveries (tenant, subscription_id, generation, wake_id,"
                " kind, payload, wake_run, wake_stream, created_by)"
                " VALUES ($1, 'pull', 1, 'w', 'wake-event', '\\x', 'r', 'wake', 'p')",
                noisy,
            )
        claimed = [job.key.stream_id for job in await other.claim(100) if job.key.tenant in mine]
        assert claimed == ["pull"], claimed
        async with pool.acquire() as conn:
            await conn.execute(
                "DELETE FROM ds_subscriptions WHERE tenant = $1 AND subscription_id = 'pull'",
                noisy,
            )
        for job in first:
            if job.key.tenant == noisy:
                await one.done(job, None)
        assert counted(await other.claim(100)) == {noisy: 4}
        # A retry (here: the noisy tenant's other wakes, failed once) waits behind a first
        # attempt of the same tenant, unless it has been due for over a minute.
        async with pool.acquire() as conn:
            await conn.execute(
                "UPDATE ds_wake_deliveries SET claimed_by = NULL, lease_until = NULL,"
                " attempts = 1 WHERE tenant = $1 AND delivered_at IS NULL",
                noisy,
            )
            await conn.execute(
                "UPDATE ds_wake_deliveries SET attempts = 0, next_attempt_at = now()"
                " WHERE tenant = $1 AND subscription_id = 's19'",
                noisy,
            )
            # A retry due for over a minute competes as a first attempt would.
            await conn.execute(
                "UPDATE ds_wake_deliveries SET next_attempt_at = now() - interval '2 minutes'"
                " WHERE tenant = $1 AND subscription_id = 's12'",
                noisy,
            )
        claimed = [job.key.stream_id for job in await one.claim(100) if job.key.tenant == noisy]
        assert len(claimed) == 4 and {"s19", "s12"} <= set(claimed), claimed
    finally:
        async with pool.acquire() as conn:
            await conn.execute(
                "DELETE FROM ds_subscriptions WHERE tenant = ANY($1)", [noisy, quiet]
            )
            # Other tests' wakes this test claimed go back to being due at once.
            await conn.execute(
                "UPDATE ds_wake_deliveries SET claimed_by = NULL, lease_until = NULL"
                " WHERE claimed_by = ANY($1)",
                ["claims-1", "claims-2"],
            )


async def _backlog(pool, tenant: str, count: int, start: int = 0, kind: str = "webhook") -> None:  # type: ignore[no-untyped-def]
    """`count` due webhooks of `tenant`, one per subscription, in one statement each."""
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO ds_subscriptions (tenant, subscription_id, kind, state)"
            " SELECT $1, 's' || i, 'webhook', '\\x' FROM generate_series($2::int, $3::int) i",
            tenant,
            start,
            start + count - 1,
        )
        await conn.execute(
            "INSERT INTO ds_wake_deliveries (tenant, subscription_id, generation, wake_id, kind,"
            " payload, url, created_by, attempts, next_attempt_at)"
            " SELECT $1, 's' || i, 1, 'w', $4, '\\x', 'https://h.example/', 'p', i % 2,"
            " now() - make_interval(secs => i % 90) FROM generate_series($2::int, $3::int) i",
            tenant,
            start,
            start + count - 1,
            kind,
        )
        await conn.execute("ANALYZE ds_wake_deliveries")


async def test_a_claim_reads_no_more_of_a_tenant_for_a_larger_backlog(pool) -> None:  # type: ignore[no-untyped-def]
    """A claim's cost does not grow with a tenant's backlog: a tenant with 2,000 or 20,000 due
    webhooks on receivers that hang (all its slots under way) costs a claim the same pages.
    Ranking every due row, as the claim once did, read ten times as many."""
    import json

    from adapters.postgres.subscriptions import _CLAIM, PostgresWakeDeliveries

    tenant = "backlog-" + secrets.token_hex(3)
    queue = PostgresWakeDeliveries(pool, "claims-cost", per_tenant=4)

    async def pages() -> int:
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            try:
                plan = await conn.fetchval(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _CLAIM,
                    queue.worker_id,
                    queue.lease_seconds,
                    32,
                    queue.per_tenant,
                    "",
                    1_000_000,
                )
            finally:
                await tx.rollback()
        top = json.loads(plan)[0]["Plan"]
        return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])

    try:
        await _backlog(pool, tenant, 2_000)
        first = await queue.claim(100)
        assert sum(job.key.tenant == tenant for job in first) == 4  # its slots: all under way
        small = await pages()
        await _backlog(pool, tenant, 18_000, start=2_000)
        large = await pages()
        assert large < small * 1.5 + 50, (small, large)
    finally:
        async with pool.acquire() as conn:
            await conn.execute("DELETE FROM ds_subscriptions WHERE tenant = $1", tenant)


async def test_claims_walk_the_tenants_a_window_at_a_time_and_come_back(pool) -> None:  # type: ignore[no-untyped-def]
    """With more tenants than a claim looks at, successive claims take the next ones in turn
    and then start again: every tenant's wakes go out, none is skipped for good."""
    from adapters.postgres.subscriptions import PostgresWakeDeliveries

    prefix = "walk-" + secrets.token_hex(3)
    tenants = [f"{prefix}-{n}" for n in range(5)]
    for tenant in tenants:
        await _backlog(pool, tenant, 3)
    queue = PostgresWakeDeliveries(pool, "claims-walk", per_tenant=1, tenant_window=2)
    try:
        seen: list[set[str]] = []
        for _ in range(60):  # other tests' tenants may take some windows' places
            jobs = [job for job in await queue.claim(100) if job.key.tenant.startswith(prefix)]
            seen.append({job.key.tenant for job in jobs})
            # A claim looks at two tenants at most, and each has one slot.
            assert len(jobs) <= 2 and len(seen[-1]) == len(jobs), jobs
            for job in jobs:
                await queue.done(job, None)
            if sum(len(claimed) for claimed in seen) == 15:
                break
        served = [tenant for claimed in seen for tenant in sorted(claimed)]
        # Every wake of every tenant went out, each tenant served again after the others.
        assert Counter(served) == {tenant: 3 for tenant in tenants}, served
    finally:
        async with pool.acquire() as conn:
            await conn.execute("DELETE FROM ds_subscriptions WHERE tenant = ANY($1)", tenants)


async def test_claims_take_tenants_round_robin_from_where_the_last_one_stopped(pool) -> None:  # type: ignore[no-untyped-def]
    """With more due work than a claim takes, each claim goes on from the tenant after the last
    one the previous claim served, wrapping past the last tenant: every tenant gets as many
    turns (a claim once served the same tenants again and again while others waited)."""
    from adapters.postgres.subscriptions import PostgresWakeDeliveries

    prefix = "rr-" + secrets.token_hex(3)
    tenants = [f"{prefix}-{n}" for n in range(3)]
    for tenant in tenants:
        await _backlog(pool, tenant, 6, kind="wake-event")  # not capped: only the turn counts
    queue = PostgresWakeDeliveries(pool, "claims-rr", tenant_window=2)
    try:
        served: Counter[str] = Counter()
        # Other tests' tenants may be in the database (and in a window): claimed until all of
        # these are served, the turns never further apart than one.
        for _ in range(120):  # one row a claim: each claim is the next tenant's turn
            jobs = [job for job in await queue.claim(1) if job.key.tenant.startswith(prefix)]
            served.update(job.key.tenant for job in jobs)
            for job in jobs:
                await queue.done(job, None)
            counts = [served[tenant] for tenant in tenants]
            assert max(counts) - min(counts) <= 1, served
            if sum(counts) == 18:
                break
        assert served == {tenant: 6 for tenant in tenants}, served
    finally:
        async with pool.acquire() as conn:
            await conn.execute("DELETE FROM ds_subscriptions WHERE tenant = ANY($1)", tenants)


async def test_changes_of_one_subscription_wait_for_each_other_holding_no_connection(
    deployed: tuple[Any, Any],
) -> None:
    """Ten changes of one subscription at once, its row held by another transaction: one of
    them waits on the row, on a connection of the pool; the other nine wait for it in the
    process, holding none. (Each waited on the row, on a connection of its own: a flood of one
    wake's acks held its tenant's share of the pool, and another tenant's appends waited for
    connections.) They all apply, in turn, once the row is free."""
    import asyncio

    from tests.support.subscription_contract import ADMIN, BASE, uid, webhook

    container, services = deployed
    sid = uid("sub")
    await services.subscriptions.put(ADMIN, sid, webhook(f"{uid('run')}/*"), BASE)
    store = await provided(container.subscription_store)
    pool = await provided(container.pool)
    decided: list[int] = []

    def decide(n: int):  # type: ignore[no-untyped-def]
        def deciding(sub, heads):  # type: ignore[no-untyped-def]
            decided.append(n)
            return None, n

        return deciding

    async with pool.acquire() as holding, holding.transaction():
        await holding.execute(
            "SELECT 1 FROM ds_subscriptions WHERE tenant = $1 AND subscription_id = $2 FOR UPDATE",
            ADMIN.tenant,
            sid,
        )
        changes = [
            asyncio.create_task(store.update(ADMIN.tenant, sid, decide(n))) for n in range(10)
        ]
        await asyncio.sleep(0.5)
        in_use = pool.get_size() - pool.get_idle_size()  # (this one, holding the row, too)
        assert in_use <= 3, f"{in_use - 1} connections wait on the subscription's row"
        assert not any(change.done() for change in changes)
    assert await asyncio.wait_for(asyncio.gather(*changes), 10) == list(range(10))
    assert decided == list(range(10))


_MARKS = (
    "SELECT stream_id, head FROM ds_subscription_pending"
    " WHERE tenant = $1 AND subscription_id = $2 ORDER BY stream_id"
)


async def _subscribed(services: Any, names: tuple[str, ...], pull: bool = False) -> tuple[str, str]:
    """A run of its own with the streams `names` (and `wake`, for a pull-wake), and a
    subscription of its own over the run's `e*`: (run, subscription ID)."""
    run, sid = uid("run"), uid("sub")
    for name in (("wake",) if pull else ()) + names:
        await create(services, ADMIN, run, name)
    config = pull_wake(f"{run}/e*", f"{run}/wake") if pull else webhook(f"{run}/e*")
    await services.subscriptions.put(ADMIN, sid, config, BASE)
    return run, sid


async def test_an_append_marks_the_links_it_passes_and_their_acks_remove_the_marks(
    deployed: tuple[Any, Any],
) -> None:
    """Migration 0508: the append's write statement marks each link its stream now stands past
    (with the head), a decision reads the marks rather than every link, and removes those its
    acks caught up with."""

    container, services = deployed
    run, sid = await _subscribed(services, ("ea", "eb", "ec"), pull=True)
    pool = await provided(container.pool)
    assert await pool.fetch(_MARKS, ADMIN.tenant, sid) == []
    await append(services, ADMIN, run, "ea", 2)
    await append(services, ADMIN, run, "eb")
    await append(services, ADMIN, run, "ea")
    assert [tuple(r) for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)] == [("ea", 3), ("eb", 1)]
    sub, heads, token = await services.subscriptions.claim(WRITER, sid, "w")
    assert sub.wake is not None
    assert [(s.path.stream_id, s.tail) for s in sub.streams(heads)] == [("ea", 3), ("eb", 1)]
    acks = [AckRequest(StreamPath(run, "ea"), 3), AckRequest(StreamPath(run, "eb"), 0)]
    await services.subscriptions.callback(
        token, sid, sub.generation, sub.wake.wake_id, acks, False, "wake-event"
    )
    # a's cursor reached its mark, b's did not.
    assert [tuple(r) for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)] == [("eb", 1)]


async def test_a_mark_an_append_raises_while_a_decision_removes_it_stays(
    deployed: tuple[Any, Any],
) -> None:
    """A decision acknowledges a stream up to the head it read, and then removes its mark. An
    append raising the mark meanwhile holds it: the removal passes over it (waiting, holding the
    subscription's row, it deadlocked with a run's deletion), and the mark stays at the
    append's head, so the append still wakes the subscription. Raised and committed before the
    removal, the mark is judged by its new head: kept too. (A removal that judged by the head
    the decision read dropped it.)"""
    import asyncio

    container, services = deployed
    run, sid = await _subscribed(services, ("ea",))
    await append(services, ADMIN, run, "ea")
    pool = await provided(container.pool)
    store = await provided(container.subscription_store)
    path = StreamPath(run, "ea")

    def caught_up(sub: Any, heads: Any) -> Any:
        assert heads[path] == 1
        return Change(sub.acknowledged([(path, 1)], heads)), None

    async with pool.acquire() as appending:
        transaction = appending.transaction()
        await transaction.start()
        await appending.execute(
            "UPDATE ds_subscription_pending SET head = 2"
            " WHERE tenant = $1 AND subscription_id = $2 AND stream_id = 'ea'",
            ADMIN.tenant,
            sid,
        )
        await asyncio.wait_for(store.update(ADMIN.tenant, sid, caught_up), 5)  # no wait
        await transaction.commit()
    assert [tuple(r) for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)] == [("ea", 2)]
    # Raised and committed while a decision's snapshot still shows the old head.
    await pool.execute(
        "UPDATE ds_subscription_pending SET head = 3"
        " WHERE tenant = $1 AND subscription_id = $2 AND stream_id = 'ea'",
        ADMIN.tenant,
        sid,
    )
    await store.update(ADMIN.tenant, sid, caught_up)
    assert [tuple(r) for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)] == [("ea", 3)]


async def test_the_sweep_marks_what_no_append_marked_and_forgets_what_is_settled(
    deployed: tuple[Any, Any],
) -> None:
    """A decision sees pending work through the marks alone; a link past its cursor without a
    mark (an append of a process of an earlier version, which writes none) is marked by the
    scheduler's pass over the streams an announcement names, or by its sweep over every link.
    The sweep forgets marks whose link is gone or caught up."""

    container, services = deployed
    run, sid = await _subscribed(services, ("ea", "eb"), pull=True)
    await append(services, ADMIN, run, "ea")
    await append(services, ADMIN, run, "eb")
    pool = await provided(container.pool)
    store = await provided(container.subscription_store)
    forget = "DELETE FROM ds_subscription_pending WHERE tenant = $1 AND subscription_id = $2"
    await pool.execute(forget, ADMIN.tenant, sid)
    with pytest.raises(NoPendingWork):
        await services.subscriptions.claim(WRITER, sid, "w")
    await store.due(1000, [ADMIN.key(run, "ea")])  # an announcement of `a`
    assert [tuple(r) for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)] == [("ea", 1)]
    await pool.execute(forget, ADMIN.tenant, sid)
    store._mark_all_every = 0.0  # (every minute at most, by default)
    assert (ADMIN.tenant, sid) in await store.due(100_000)  # the sweep
    assert [tuple(r) for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)] == [("ea", 1), ("eb", 1)]
    sub, _, token = await services.subscriptions.claim(WRITER, sid, "w")
    assert sub.wake is not None and len(sub.wake.tails) == 2
    acks = [AckRequest(StreamPath(run, "ea"), 1)]
    await services.subscriptions.callback(
        token, sid, sub.generation, sub.wake.wake_id, acks, False, "wake-event"
    )
    # A mark its link's cursor reached (a process of an earlier version removes none), and one
    # of no link: forgotten by the sweep.
    mark = (
        "INSERT INTO ds_subscription_pending (tenant, subscription_id, run_id, stream_id, head)"
        " VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT (tenant, subscription_id, run_id, stream_id) DO UPDATE SET head = $5"
    )
    await pool.execute(mark, ADMIN.tenant, sid, run, "ea", 1)
    await pool.execute(mark, ADMIN.tenant, sid, run, "gone", 5)
    await store.due(100_000)
    assert [tuple(r) for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)] == [("eb", 1)]


async def test_appends_decisions_and_sweeps_on_the_same_marks_never_deadlock(
    deployed: tuple[Any, Any],
) -> None:
    """Appends (each group commit marking the links of the streams it wrote), a worker's claims
    and acks (each removing the marks it caught up with) and sweeps (marking every link past
    its cursor, forgetting what is settled) on one subscription's marks, side by side for a
    few seconds: nothing fails (a deadlock would fail one of them), and once every stream is
    acknowledged no mark is left and no link is past its cursor."""
    import asyncio
    import math
    import time

    container, services = deployed
    run, sid = uid("run"), uid("sub")
    names = [f"e{i}" for i in range(12)]
    for name in ("wake", *names):
        await create(services, ADMIN, run, name)
    await services.subscriptions.put(ADMIN, sid, pull_wake(f"{run}/e*", f"{run}/wake"), BASE)
    store = await provided(container.subscription_store)
    pool = await provided(container.pool)
    until = time.monotonic() + 4
    counts = Counter[str]()

    async def appender(offset: int) -> None:
        n = offset
        while time.monotonic() < until:
            await append(services, ADMIN, run, names[n % len(names)])
            n += 5
            counts["append"] += 1

    async def worker() -> None:
        while time.monotonic() < until:
            try:
                sub, heads, token = await services.subscriptions.claim(WRITER, sid, "w")
            except (NoPendingWork, AlreadyClaimed):
                await asyncio.sleep(0.01)
                continue
            assert sub.wake is not None
            acks = [AckRequest(s.path, s.tail) for s in sub.streams(heads)]
            try:
                await services.subscriptions.callback(
                    token, sid, sub.generation, sub.wake.wake_id, acks, True, WAKE_EVENT
                )
                counts["ack"] += 1
            except Fenced:
                pass

    async def sweeper() -> None:
        while time.monotonic() < until:
            await store.due(1000)
            counts["sweep"] += 1
            await asyncio.sleep(0.05)

    store._mark_all_every = math.inf  # the sweeps forget marks, and mark nothing
    await asyncio.gather(*(appender(i) for i in range(5)), worker(), worker(), sweeper())
    assert counts["append"] > 50 and counts["ack"] > 5, counts
    # No mark lost, none left behind: every link past its cursor, and no other, is marked at
    # its stream's head (nothing here marks links but the appends and the decisions).
    sub, heads = await services.subscriptions.get(ADMIN, sid)
    marks = {r[0]: r[1] for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)}
    pending = {k.path.stream_id: heads[k.path] for k in sub.links if heads[k.path] > k.acked}
    assert {n: h for n, h in marks.items() if n in pending} == pending
    assert all(n in pending for n in marks), (marks, pending)
    # Everything acknowledged: a last wake, if one is pending, acked to the heads.
    for _ in range(20):
        try:
            sub, heads, token = await services.subscriptions.claim(WRITER, sid, "last")
        except NoPendingWork:
            break
        except AlreadyClaimed:
            await asyncio.sleep(1.1)  # a lease the workers left runs out
            continue
        assert sub.wake is not None
        _, heads = await services.subscriptions.get(ADMIN, sid)  # every stream's
        everything = [AckRequest(path, head) for path, head in heads.items()]
        await services.subscriptions.callback(
            token, sid, sub.generation, sub.wake.wake_id, everything, True, WAKE_EVENT
        )
    sub, heads = await services.subscriptions.get(ADMIN, sid)
    assert not sub.has_pending(heads)
    assert await pool.fetch(_MARKS, ADMIN.tenant, sid) == []


async def test_a_stream_created_again_forgets_the_marks_of_its_previous_incarnation(
    deployed: tuple[Any, Any],
) -> None:
    """A mark left by an erased stream (the sweep forgets it within seconds) names a head the
    stream created again under its ID has not reached: kept, it made the subscription due at
    every sweep with nothing to deliver. The creation forgets it."""

    container, services = deployed
    run, sid = await _subscribed(services, ("ea",))
    await append(services, ADMIN, run, "ea", 3)
    pool = await provided(container.pool)
    assert [tuple(r) for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)] == [("ea", 3)]
    await services.delete_stream(ADMIN, run, "ea")
    await create(services, ADMIN, run, "ea")
    assert await pool.fetch(_MARKS, ADMIN.tenant, sid) == []
    await append(services, ADMIN, run, "ea")
    assert [tuple(r) for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)] == [("ea", 1)]


async def test_a_write_that_moves_no_head_takes_no_mark(deployed: tuple[Any, Any]) -> None:
    """A write that moves no stream's head (a close, here; a deletion kept for forks, in a
    run's deletion) leaves the stream's marks untouched. An upsert that changed nothing still
    locked the mark: a run's deletion held it while a decision waited for it, holding its
    subscription, which the deletion's erasures then waited for (a deadlock)."""
    import asyncio

    container, services = deployed
    run, sid = await _subscribed(services, ("ea",))
    await append(services, ADMIN, run, "ea", 2)
    pool = await provided(container.pool)
    async with pool.acquire() as holding, holding.transaction():
        await holding.execute(
            "SELECT 1 FROM ds_subscription_pending"
            " WHERE tenant = $1 AND subscription_id = $2 FOR UPDATE",
            ADMIN.tenant,
            sid,
        )
        await asyncio.wait_for(services.close_stream(ADMIN, run, "ea"), 5)
    assert [tuple(r) for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)] == [("ea", 2)]


async def test_an_append_between_a_links_head_and_its_commit_is_marked(
    deployed: tuple[Any, Any],
) -> None:
    """A decision linking a stream by name reads its head, and an append commits before the
    decision does: the append's statement cannot see the link yet (nor the scheduler's marking
    of its announcement, if it runs before the decision commits). Once committed, the decision
    marks the links it made that stand past their cursors."""

    container, services = deployed
    run, sid = uid("run"), uid("sub")
    await create(services, ADMIN, run, "x")
    await create(services, ADMIN, run, "a")
    await append(services, ADMIN, run, "a", 2)
    await services.subscriptions.put(ADMIN, sid, webhook(streams=[f"{run}/x"]), BASE)
    pool = await provided(container.pool)
    store = await provided(container.subscription_store)

    async def append_one() -> None:  # committed before the decision
        await append(services, ADMIN, run, "a")

    with meanwhile(store, append_one):
        await services.subscriptions.add_streams(ADMIN, sid, (StreamPath(run, "a"),))
    sub, heads = await services.subscriptions.get(ADMIN, sid)
    link = sub.link(StreamPath(run, "a"))
    assert link is not None and link.acked == 2 and heads[link.path] == 3
    assert [tuple(r) for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)] == [("a", 3)]


async def test_the_sweep_forgets_a_mark_of_a_stream_erased_and_named_again(
    deployed: tuple[Any, Any],
) -> None:
    """A stream with a pending link is erased (its link goes, its mark stays until the sweep),
    and named again before the sweep, as a stream not there yet (its link at 0): the old
    stream's mark is neither caught up with nor without a link, and kept the subscription due
    at every sweep. The sweep forgets a mark whose stream is gone."""

    container, services = deployed
    run, sid = uid("run"), uid("sub")
    await create(services, ADMIN, run, "a")
    await services.subscriptions.put(ADMIN, sid, webhook(streams=[f"{run}/a"]), BASE)
    await append(services, ADMIN, run, "a", 7)
    pool = await provided(container.pool)
    store = await provided(container.subscription_store)
    await services.delete_stream(ADMIN, run, "a")
    await services.subscriptions.add_streams(ADMIN, sid, (StreamPath(run, "a"),))
    assert [tuple(r) for r in await pool.fetch(_MARKS, ADMIN.tenant, sid)] == [("a", 7)]
    assert (ADMIN.tenant, sid) not in await store.due(100_000)
    assert await pool.fetch(_MARKS, ADMIN.tenant, sid) == []


async def test_the_marks_look_links_and_streams_up_through_their_indexes(
    deployed: tuple[Any, Any],
) -> None:
    """Every statement that goes from a mark (or a written stream) to its link or stream finds
    it through the index of that table's key, whatever the planner prefers on tables this
    small (`enable_seqscan` off: a scan is taken only where no index can serve). The marks'
    key columns once had a collation of their own (`C`): compared with the links' and the
    streams' keys, no index of theirs could serve, and each mark's look-up was a pass over
    every link of every tenant (10,000 pending marks of one tenant stopped every tenant's
    wakes)."""
    from adapters.postgres.marks import MARK_WRITTEN
    from adapters.postgres.subscriptions import (
        _FORGET_CAUGHT_UP,
        _FORGET_UNLINKED,
        _NAMED_LINKS,
        _PENDING_LINKS,
        _SETTLE,
    )

    container, services = deployed
    run, sid = await _subscribed(services, ("ea",))
    await append(services, ADMIN, run, "ea")
    written = (
        "WITH written AS (SELECT $1::text AS tenant, $2::text AS run_id, $3::text AS stream_id,"
        f" $4::bigint AS head) {MARK_WRITTEN}"
    )
    statements: list[tuple[str, tuple[Any, ...]]] = [
        (_PENDING_LINKS, (ADMIN.tenant, sid, "", "", 1000)),
        (_NAMED_LINKS, (ADMIN.tenant, sid, [run], ["ea"])),
        (_SETTLE, (ADMIN.tenant, sid, [run], ["ea"], [1])),
        (_FORGET_CAUGHT_UP, ()),
        (_FORGET_UNLINKED, ()),
        (written, (ADMIN.tenant, run, "ea", 2)),
    ]
    pool = await provided(container.pool)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        for statement, args in statements:
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + statement, *args))
            for table in ("ds_subscription_links", "streams"):
                assert f"Seq Scan on {table}" not in plan, plan


async def test_linking_streams_waits_on_the_tenants_census_only_to_link_a_wake_stream(
    deployed: tuple[Any, Any], database_url: str
) -> None:
    """A webhook writes no wake event, and a stream no wake is written to makes no ring, so
    linking such streams (`POST .../streams`) does not wait for the tenant's other changes: a
    webhook's takes no census lock, a pull-wake's takes it shared. Linking a wake stream to a
    pull-wake takes it alone (it looks at every pull-wake of the tenant for a ring), and so
    does linking to a pull-wake while one made before its wake stream had columns is left."""
    import asyncio

    import asyncpg

    from application.access import Caller
    from tests.support.subscription_contract import ADMIN, BASE, pull_wake, uid, webhook

    _, services = deployed
    # A tenant of its own: no other test takes its census lock meanwhile.
    ADMIN = Caller(tenant=uid("census"), principal="alice", scopes=ADMIN.scopes)
    run, hook, pull, other = uid("run"), uid("hook"), uid("pull"), uid("other")
    await services.subscriptions.put(ADMIN, hook, webhook(f"{run}/s*"), BASE)
    await services.subscriptions.put(ADMIN, pull, pull_wake(f"{run}/s*", f"{run}/w"), BASE)
    await services.subscriptions.put(ADMIN, other, pull_wake(f"{run}/t*", f"{run}/w2"), BASE)
    lock = "SELECT pg_advisory_xact_lock{}(hashtextextended('ds-census:' || $1, 0))"

    async def linking(holder: asyncpg.Connection, shared: bool, sub: str, stream: str) -> bool:
        """Whether linking `stream` to `sub` waits while `holder` holds the census lock."""
        async with holder.transaction():
            await holder.execute(lock.format("_shared" if shared else ""), ADMIN.tenant)
            waiting = asyncio.ensure_future(
                services.subscriptions.add_streams(ADMIN, sub, (StreamPath(run, stream),))
            )
            await asyncio.wait({waiting}, timeout=0.5)
            waited = not waiting.done()
        await asyncio.wait_for(waiting, 5)
        return waited

    holder = await asyncpg.connect(database_url)
    try:
        assert not await linking(holder, False, hook, "x")  # a webhook's: no lock
        assert await linking(holder, False, pull, "y")  # a pull-wake's: behind a creation
        assert not await linking(holder, True, pull, "z")  # but not behind its like
        assert await linking(holder, True, pull, "w2")  # a wake stream: the lock alone
        # One made before the columns (as a process of an earlier version makes one): every
        # pull-wake link takes the lock alone until it is changed, which fills them in.
        await holder.execute(
            "UPDATE ds_subscriptions SET wake_run = NULL, wake_stream = NULL"
            " WHERE tenant = $1 AND subscription_id = $2",
            ADMIN.tenant,
            other,
        )
        assert await linking(holder, True, pull, "v")
        assert await linking(holder, True, other, "u")  # and its own change fills them in
        assert not await linking(holder, True, pull, "q")
    finally:
        await holder.close()
    linked = {k.path for k in (await services.subscriptions.get(ADMIN, pull))[0].links}
    assert {StreamPath(run, s) for s in ("y", "z", "w2", "v", "q")} <= linked
