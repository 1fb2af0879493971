"""The TokenStore contract on the memory adapter."""

from __future__ import annotations

import pytest

from adapters.memory.tokens import MemoryTokens
from tests.support.token_contract import TokenStoreContract


class TestMemoryTokens(TokenStoreContract):
    @pytest.fixture
    def store(self) -> MemoryTokens:
        return MemoryTokens()
