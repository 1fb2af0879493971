"""The append-receipt window on the memory adapter."""

from __future__ import annotations

import pytest

from adapters.memory.streams import MemoryStreams
from tests.support.receipt_window_contract import ReceiptWindowContract


class TestMemoryReceiptWindow(ReceiptWindowContract):
    @pytest.fixture
    def repo(self) -> MemoryStreams:
        return MemoryStreams()
