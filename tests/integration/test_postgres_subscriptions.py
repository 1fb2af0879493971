"""The subscription store's contract on PostgreSQL (migration 0496), the stream-creation
trigger that links what a glob matches included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from entrypoints.config import Settings
from entrypoints.container import Container, provided, start, stop
from tests.support.subscription_contract import SubscriptionStoreContract


class TestPostgresSubscriptions(SubscriptionStoreContract):
    @pytest.fixture
    async def app(self, database_url: str) -> AsyncIterator[tuple[Any, Any]]:
        container = Container(settings=Settings(database_url=database_url, pool_min_size=1))
        services = await start(container)
        yield services, await provided(container.subscription_store)
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
