"""The StreamAccess port on PostgreSQL (`stream_access`, migration 0482)."""

from __future__ import annotations

import asyncpg
import pytest

from adapters.postgres.access import PostgresStreamAccess
from adapters.postgres.streams import PostgresStreams
from tests.support.access_contract import StreamAccessContract


class TestPostgresStreamAccess(StreamAccessContract):
    @pytest.fixture
    def ports(self, pool: asyncpg.Pool) -> tuple[PostgresStreams, PostgresStreamAccess]:
        return PostgresStreams(pool), PostgresStreamAccess(pool)
