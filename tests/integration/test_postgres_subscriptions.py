"""The subscription store's contract on PostgreSQL (migration 0496), the stream-creation
trigger that links what a glob matches included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from entrypoints.config import Settings
from entrypoints.container import Container, resolved, start, stop
from tests.support.subscription_contract import SubscriptionStoreContract


class TestPostgresSubscriptions(SubscriptionStoreContract):
    @pytest.fixture
    async def app(self, database_url: str) -> AsyncIterator[tuple[Any, Any]]:
        container = Container(settings=Settings(database_url=database_url, pool_min_size=1))
        services = await start(container)
        yield services, await resolved(container.subscription_store())
        await stop(container)
