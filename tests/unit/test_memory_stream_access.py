"""The StreamAccess port on the memory adapter."""

from __future__ import annotations

import pytest

from adapters.memory.access import MemoryStreamAccess
from adapters.memory.streams import MemoryStreams
from tests.support.access_contract import StreamAccessContract


class TestMemoryStreamAccess(StreamAccessContract):
    @pytest.fixture
    def ports(self) -> tuple[MemoryStreams, MemoryStreamAccess]:
        streams = MemoryStreams()
        return streams, MemoryStreamAccess(streams)
