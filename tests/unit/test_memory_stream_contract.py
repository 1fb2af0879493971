"""The stream-port contract on the memory adapter."""

from __future__ import annotations

import pytest

from adapters.memory.streams import MemoryStreams
from tests.support.stream_contract import ObjectIntentsContract, StreamRepositoryContract


class TestMemoryStreams(StreamRepositoryContract, ObjectIntentsContract):
    @pytest.fixture
    def repo(self) -> MemoryStreams:
        return MemoryStreams()
