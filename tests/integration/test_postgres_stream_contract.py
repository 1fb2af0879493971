"""The stream-port contract on PostgreSQL."""

from __future__ import annotations

import asyncpg
import pytest

from adapters.postgres.streams import PostgresStreams
from tests.support.stream_contract import StreamRepositoryContract


class TestPostgresStreams(StreamRepositoryContract):
    @pytest.fixture
    def repo(self, pool: asyncpg.Pool) -> PostgresStreams:
        return PostgresStreams(pool)
