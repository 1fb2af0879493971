"""LeasedSweep on the memory adapter."""

from __future__ import annotations

import pytest

from adapters.memory.sweeps import MemorySweepLeases, SweepTable
from tests.support.sweep_lease_contract import SweepLeaseContract


class TestMemorySweepLeases(SweepLeaseContract):
    @pytest.fixture
    def leases(self):
        self.table = SweepTable()
        return lambda worker_id, lease: MemorySweepLeases(self.table, worker_id, lease)

    async def steal(self, name: str, worker_id: str) -> None:
        self.table.rows[name].claimed_by = worker_id
