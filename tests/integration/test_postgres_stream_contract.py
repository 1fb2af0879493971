"""The stream-port contract on PostgreSQL."""

from __future__ import annotations

import asyncpg
import pytest

from adapters.postgres.streams import PostgresStreams
from tests.support.stream_contract import ObjectIntentsContract, StreamRepositoryContract


class TestPostgresStreams(StreamRepositoryContract, ObjectIntentsContract):
    @pytest.fixture
    def repo(self, pool: asyncpg.Pool) -> PostgresStreams:
        return PostgresStreams(pool)
