"""LeasedSweep on PostgreSQL (maintenance_sweeps): replicas share the table."""

from __future__ import annotations

import asyncpg
import pytest

from adapters.postgres.sweeps import PostgresSweepLeases
from tests.support.sweep_lease_contract import SweepLeaseContract


class TestPostgresSweepLeases(SweepLeaseContract):
    @pytest.fixture
    def leases(self, pool: asyncpg.Pool):
        self.pool = pool
        return lambda worker_id, lease: PostgresSweepLeases(pool, worker_id, lease)

    async def steal(self, name: str, worker_id: str) -> None:
        await self.pool.execute(
            "UPDATE maintenance_sweeps SET claimed_by = $2 WHERE name = $1", name, worker_id
        )
