"""The object-store contract on the memory adapter."""

from __future__ import annotations

import pytest

from adapters.objects.memory import MemoryObjectStore
from tests.support.object_store_contract import ObjectStoreContract


class TestMemoryObjectStore(ObjectStoreContract):
    @pytest.fixture
    def store(self) -> MemoryObjectStore:
        return MemoryObjectStore()
