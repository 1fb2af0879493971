"""The append-receipt window on PostgreSQL."""

from __future__ import annotations

import asyncpg
import pytest

from adapters.postgres.streams import PostgresStreams
from tests.support.receipt_window_contract import ReceiptWindowContract


class TestPostgresReceiptWindow(ReceiptWindowContract):
    @pytest.fixture
    def repo(self, pool: asyncpg.Pool) -> PostgresStreams:
        return PostgresStreams(pool)
