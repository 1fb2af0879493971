"""LeasedSweep on the memory adapter."""

from __future__ import annotations

import asyncio
import logging

import pytest

from adapters.memory.sweeps import MemorySweepLeases, SweepTable
from application.workers import LeasedSweep
from tests.support.sweep_lease_contract import SweepLeaseContract, Ticks, running, until


class TestMemorySweepLeases(SweepLeaseContract):
    @pytest.fixture
    def leases(self):
        self.table = SweepTable()
        return lambda worker_id, lease: MemorySweepLeases(self.table, worker_id, lease)

    async def steal(self, name: str, worker_id: str) -> None:
        self.table.rows[name].claimed_by = worker_id


class _Unreachable(MemorySweepLeases):
    def __init__(self) -> None:
        super().__init__()
        self.down = True

    async def claim(self, name: str, interval: float | None = None) -> int | None:
        if self.down:
            raise OSError("connection refused")
        return await super().claim(name, interval)


async def test_a_store_out_of_reach_is_logged_once_and_the_sweep_runs_once_it_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "ductor_streams.workers")
    leases, tick = _Unreachable(), Ticks(seconds=0.0)
    sweep = LeasedSweep("outage-sweep", tick, 0.01, leases, poll_seconds=0.01)
    async with running(sweep):
        await until(lambda: caplog.text.count("cannot claim") >= 1)
        await asyncio.sleep(0.2)  # some twenty failed polls
        leases.down = False
        await until(lambda: tick.finished >= 1)
    assert caplog.text.count("cannot claim") == 1
    assert "can claim jobs again" in caplog.text
