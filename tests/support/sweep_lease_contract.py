"""LeasedSweep on every SweepLeases adapter, subclassed per adapter.

A subclass provides the fixture `leases`: a factory `leases(worker_id, lease_seconds)` of
adapters that share one store (as replicas share the database). Each test uses a sweep name of
its own."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time

from application.workers import LeasedSweep

LEASE = 0.5


def sweep_name() -> str:
    return "test-sweep-" + secrets.token_hex(4)


class Ticks:
    """A tick that takes `seconds` (longer than a lease, so only renewal keeps the claim) and
    counts how many run at once."""

    def __init__(self, seconds: float, fail: bool = False) -> None:
        self.seconds = seconds
        self.fail = fail
        self.running = 0
        self.most_at_once = 0
        self.started: list[float] = []
        self.finished = 0
        self.cancelled = 0

    async def __call__(self) -> int:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        self.started.append(time.monotonic())
        try:
            await asyncio.sleep(self.seconds)
            if self.fail:
                raise RuntimeError("the sweep broke")
            self.finished += 1
            return 1
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1


async def until(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(*sweeps: LeasedSweep):
    stopping = asyncio.Event()
    tasks = [asyncio.create_task(s.run(stopping)) for s in sweeps]
    try:
        yield
    finally:
        stopping.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)


class SweepLeaseContract:
    async def test_two_runners_never_run_one_sweep_at_once(self, leases) -> None:
        name, tick = sweep_name(), Ticks(seconds=LEASE * 2)  # outlives its lease: renewed
        a = LeasedSweep(name, tick, 0.01, leases("a", LEASE), poll_seconds=0.01)
        b = LeasedSweep(name, tick, 0.01, leases("b", LEASE), poll_seconds=0.01)
        async with running(a, b):
            await until(lambda: tick.finished >= 3)
            assert tick.cancelled == 0  # nobody took a live runner's sweep (before stopping)
        assert tick.most_at_once == 1
        assert a.runs + b.runs >= 3

    async def test_a_killed_holders_claim_is_taken_over_once_its_lease_runs_out(
        self, leases
    ) -> None:
        name, tick = sweep_name(), Ticks(seconds=0.0)
        dead = leases("dead", LEASE)
        assert await dead.claim(name) is not None  # then killed: it never renews nor finishes
        claimed_at = time.monotonic()
        alive = LeasedSweep(name, tick, 60.0, leases("alive", LEASE), poll_seconds=0.02)
        async with running(alive):
            await until(lambda: tick.finished >= 1)
        assert tick.started[0] - claimed_at >= LEASE * 0.9  # not before the lease ran out
        assert not await dead.renew(name)  # the dead claim is gone for good

    async def test_a_done_sweep_is_not_due_again_before_its_interval(self, leases) -> None:
        name, tick = sweep_name(), Ticks(seconds=0.0)
        first = LeasedSweep(name, tick, 60.0, leases("first", LEASE), poll_seconds=0.02)
        second = LeasedSweep(name, tick, 60.0, leases("second", LEASE), poll_seconds=0.02)
        async with running(first, second):
            await until(lambda: tick.finished >= 1)
            await asyncio.sleep(LEASE * 2)
        assert tick.finished == 1  # one run across both: the next is due in 60 s

    async def test_a_restart_with_a_shorter_interval_takes_effect_at_once(self, leases) -> None:
        name, tick = sweep_name(), Ticks(seconds=0.0)
        before = LeasedSweep(name, tick, 3600.0, leases("before", LEASE), poll_seconds=0.02)
        async with running(before):
            await until(lambda: tick.finished >= 1)  # next due in an hour
        after = LeasedSweep(name, tick, 0.05, leases("after", LEASE), poll_seconds=0.02)
        async with running(after):  # the same sweep, restarted with a 0.05 s interval
            await until(lambda: tick.finished >= 3)
        assert tick.finished >= 3

    async def test_a_failing_sweep_is_retried_with_its_attempts_counted(self, leases) -> None:
        name, tick = sweep_name(), Ticks(seconds=0.0, fail=True)
        sweep = LeasedSweep(
            name, tick, 0.05, leases("w", LEASE), poll_seconds=0.01, retry_base_seconds=0.01
        )
        async with running(sweep):
            await until(lambda: sweep.failures >= 2)
        other = leases("other", LEASE)
        attempts = None
        for _ in range(200):  # claim between retries: the attempts the failures recorded
            attempts = await other.claim(name)
            if attempts is not None:
                break
            await asyncio.sleep(0.01)
        assert attempts is not None and attempts >= 2

    async def test_a_runner_whose_claim_was_taken_stops_its_tick(self, leases) -> None:
        name, tick = sweep_name(), Ticks(seconds=LEASE * 3)
        slow = leases("slow", LEASE)
        runner = LeasedSweep(name, tick, 60.0, slow, poll_seconds=0.02)
        async with running(runner):
            await until(lambda: tick.running == 1)
            await self.steal(name, "thief")
            await until(lambda: tick.cancelled == 1)
        assert tick.finished == 0 and runner.runs == 0

    async def test_a_runner_stopping_mid_tick_hands_the_sweep_back(self, leases) -> None:
        name, tick = sweep_name(), Ticks(seconds=60.0)
        runner = LeasedSweep(name, tick, 60.0, leases("leaving", 60.0), poll_seconds=0.02)
        async with running(runner):
            await until(lambda: tick.running == 1)
        assert tick.cancelled == 1
        assert await leases("next", LEASE).claim(name) is not None  # at once, not in 60 s

    async def steal(self, name: str, worker_id: str) -> None:
        """Hand the claim on `name` to another worker (as a takeover after a lost lease)."""
        raise NotImplementedError
