"""The stream-port contract on the memory adapter."""

from __future__ import annotations

import pytest

from adapters.memory.streams import MemoryStreams
from application.wake import WakeRegistry
from domain.stream import StreamKey
from tests.support.stream_contract import (
    SNAPSHOT_EVERY,
    CrossStreamContract,
    DurableStreamsContract,
    ForkContract,
    JournalContract,
    ObjectIntentsContract,
    StreamRepositoryContract,
)


class TestMemoryStreams(
    StreamRepositoryContract,
    ObjectIntentsContract,
    JournalContract,
    ForkContract,
    DurableStreamsContract,
    CrossStreamContract,
):
    @pytest.fixture
    def repo(self) -> MemoryStreams:
        return MemoryStreams()

    @pytest.fixture
    def reopen(self, repo: MemoryStreams):
        """The memory adapter is its own storage: a restart keeps it."""
        return lambda: repo

    @pytest.fixture
    def waking_repo(self) -> tuple[MemoryStreams, WakeRegistry]:
        registry = WakeRegistry()
        return MemoryStreams(wake=registry), registry

    @pytest.fixture
    def snapshotting_repo(self) -> MemoryStreams:
        return MemoryStreams(snapshot_every=SNAPSHOT_EVERY)

    @pytest.fixture
    def compact(self):
        async def compact(repo: MemoryStreams, key: StreamKey) -> None:
            """The memory adapter compacts inline, in the update that journals a snapshot."""

        return compact

    @pytest.fixture
    def journal_rows(self, snapshotting_repo: MemoryStreams):
        async def journal_rows(key: StreamKey) -> int:
            return snapshotting_repo.journal_rows(key)

        return journal_rows
