"""The subscription store's contract on the memory adapter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from entrypoints.container import memory_container, start, stop
from tests.support.subscription_contract import SubscriptionStoreContract


class TestMemorySubscriptions(SubscriptionStoreContract):
    @pytest.fixture
    async def app(self) -> AsyncIterator[tuple[Any, Any]]:
        container = memory_container()
        services = await start(container)
        yield services, container.subscription_store()
        await stop(container)
