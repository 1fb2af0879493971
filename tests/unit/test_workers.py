"""The worker loop keeps its claims while it works, and stops a job whose claim was taken over."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

import pytest

from application.errors import NotFound
from application.workers import Job, Worker, ensure_claimed
from domain.stream import StreamKey


def job(n: int) -> Job:
    return Job(key=StreamKey("t", "r", f"s{n}"), attempts=0)


class Queue:
    """A queue in memory that records what the worker asks of it."""

    def __init__(self, jobs: list[Job], lease_seconds: float = 0.3) -> None:
        self.lease_seconds = lease_seconds
        self._due = list(jobs)
        self.renewals: list[list[Job]] = []
        self.taken_over: set[Job] = set()
        self.renew_fails = False
        self.recorded: list[Job] = []
        self.refused: list[Job] = []

    async def claim(self, limit: int) -> list[Job]:
        claimed, self._due = self._due[:limit], self._due[limit:]
        return claimed

    async def renew(self, jobs: list[Job]) -> list[Job]:
        if self.renew_fails:
            raise ConnectionRefusedError("PostgreSQL is down")
        self.renewals.append(list(jobs))
        return [j for j in jobs if j in self.taken_over]

    async def done(self, job: Job, next_in: float | None) -> None:
        self.recorded.append(job)

    async def failed(self, job: Job, error: str, retry_in: float) -> None:
        self.refused.append(job)

    async def release(self, jobs: list[Job]) -> None:
        pass


async def run_until(worker: Worker, finished: asyncio.Event, timeout: float = 10) -> None:
    stopping = asyncio.Event()
    running = asyncio.create_task(worker.run(stopping))
    try:
        await asyncio.wait_for(finished.wait(), timeout)
    finally:
        stopping.set()
        await asyncio.wait_for(running, 5)


async def test_a_job_longer_than_its_lease_has_its_claims_renewed_while_it_runs() -> None:
    first, second = job(1), job(2)
    queue = Queue([first, second], lease_seconds=0.3)
    finished = asyncio.Event()

    async def handle(j: Job) -> None:
        if j == first:
            await asyncio.sleep(1.0)  # more than three leases
        else:
            finished.set()

    await run_until(Worker("w", queue, handle, poll_seconds=0.01), finished)
    # Every ~0.1 s while the first ran, both claims (the second not even started) were renewed.
    early = [r for r in queue.renewals if first in r]
    assert len(early) >= 5
    assert all(second in r for r in early)
    assert queue.recorded == [first, second]


async def test_a_job_whose_claim_was_taken_over_is_stopped_and_not_recorded() -> None:
    taken, after = job(1), job(2)
    queue = Queue([taken, after], lease_seconds=0.3)
    stopped = asyncio.Event()
    finished = asyncio.Event()
    ran: list[Job] = []

    async def handle(j: Job) -> None:
        ran.append(j)
        if j == taken:
            queue.taken_over.add(taken)  # another worker took it over meanwhile
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                stopped.set()
                raise
        finished.set()

    await run_until(Worker("w", queue, handle, poll_seconds=0.01), finished)
    assert stopped.is_set()
    assert ran == [taken, after]  # the rest of the batch goes on
    assert taken not in queue.recorded and taken not in queue.refused
    assert queue.recorded == [after]


async def test_a_claimed_job_taken_over_before_it_started_is_never_run() -> None:
    slow, lost = job(1), job(2)
    queue = Queue([slow, lost], lease_seconds=0.3)
    queue.taken_over.add(lost)
    finished = asyncio.Event()
    ran: list[Job] = []

    async def handle(j: Job) -> None:
        ran.append(j)
        await asyncio.sleep(0.5)  # long enough for a renewal to report `lost`
        finished.set()

    await run_until(Worker("w", queue, handle, poll_seconds=0.01), finished)
    await asyncio.sleep(0.1)
    assert ran == [slow]
    assert queue.recorded == [slow]


async def test_a_renewal_that_cannot_reach_postgresql_does_not_stop_a_job_within_its_lease() -> (
    None
):
    slow = job(1)
    queue = Queue([slow], lease_seconds=0.9)  # trusted for 0.675 s, renewed every 0.225 s
    queue.renew_fails = True
    finished = asyncio.Event()

    async def handle(j: Job) -> None:
        await asyncio.sleep(0.45)  # past a failed renewal, within what the claim is trusted for
        finished.set()

    await run_until(Worker("w", queue, handle, poll_seconds=0.01), finished)
    await asyncio.sleep(0.05)
    assert queue.recorded == [slow]


async def test_a_job_whose_claim_cannot_be_renewed_stops_before_its_lease_runs_out() -> None:
    slow = job(1)
    queue = Queue([slow], lease_seconds=0.3)
    queue.renew_fails = True
    acted: list[float] = []
    started = asyncio.Event()

    async def handle(j: Job) -> None:
        started.set()
        await asyncio.sleep(0.5)  # longer than the lease, and no renewal gets through
        ensure_claimed()
        acted.append(time.monotonic())

    worker = Worker("w", queue, handle, poll_seconds=0.01)
    stopping = asyncio.Event()
    running = asyncio.create_task(worker.run(stopping))
    await started.wait()
    began = time.monotonic()
    async with asyncio.timeout(2):
        while worker.expired == 0:
            await asyncio.sleep(0.01)
    # Stopped at 3/4 of the lease after its claim was sent: before another may take it over.
    assert time.monotonic() - began < 0.3
    await asyncio.sleep(0.4)
    stopping.set()
    await running
    assert acted == []
    assert queue.recorded == [] and queue.refused == []  # the next holder decides


async def test_a_worker_runs_up_to_its_concurrency_of_a_batchs_jobs_side_by_side() -> None:
    jobs = [job(n) for n in range(3)]
    queue = Queue(jobs)
    together = 0
    most = 0
    finished = asyncio.Event()

    async def handle(j: Job) -> None:
        nonlocal together, most
        together += 1
        most = max(most, together)
        await asyncio.sleep(0.1)
        together -= 1
        if len(queue.recorded) == 2:  # this one is the third
            finished.set()

    await run_until(Worker("w", queue, handle, poll_seconds=0.01, concurrency=2), finished)
    await asyncio.sleep(0.05)
    assert most == 2
    assert sorted(j.key.stream_id for j in queue.recorded) == ["s0", "s1", "s2"]


async def test_a_worker_with_a_slot_free_claims_only_what_it_can_start() -> None:
    """With `batch` equal to `concurrency`, a claim while a job runs asks for the free slots
    only: a job claimed beyond them would wait, its lease held, behind the running one."""
    queue = Queue([job(n) for n in range(5)])
    asked: list[int] = []
    claim = queue.claim

    async def recording(limit: int) -> list[Job]:
        asked.append(limit)
        return await claim(limit)

    queue.claim = recording  # type: ignore[method-assign]
    slow_done, finished = asyncio.Event(), asyncio.Event()

    async def handle(j: Job) -> None:
        if j.key.stream_id == "s0":
            await slow_done.wait()  # holds one of the two slots throughout
        elif len(queue.recorded) == 3:  # s1, s2, s3 recorded: this is s4
            slow_done.set()
            finished.set()

    await run_until(Worker("w", queue, handle, poll_seconds=0.01, batch=2, concurrency=2), finished)
    assert asked[0] == 2  # nothing running: s0 and s1
    assert asked[1:4] == [1, 1, 1]  # s0 running: s2, s3 and s4 one at a time


class UnreachableQueue(Queue):
    """A queue whose claims fail (the database out of reach) until `reachable` is set."""

    def __init__(self) -> None:
        super().__init__([])
        self.reachable = asyncio.Event()
        self.claims: list[float] = []

    async def claim(self, limit: int) -> list[Job]:
        self.claims.append(asyncio.get_running_loop().time())
        if not self.reachable.is_set():
            raise FileNotFoundError(2, "No such file or directory")
        return []


async def test_a_worker_that_cannot_claim_backs_off_and_logs_the_outage_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = UnreachableQueue()
    worker = Worker(
        "dispatcher",
        queue,
        handle=lambda j: asyncio.sleep(0),
        poll_seconds=0.01,
        claim_backoff_cap_seconds=0.2,
        outage_log_seconds=0.5,
    )
    stopping = asyncio.Event()
    caplog.set_level(logging.INFO, logger="ductor_streams.workers")
    running = asyncio.create_task(worker.run(stopping))
    try:
        await asyncio.sleep(1.2)
        failed = len(queue.claims)
        # Polling every 0.01 s would be ~120 claims; backing off to 0.1-0.2 s is at most ~15.
        assert 4 <= failed <= 20, queue.claims
        gaps = [b - a for a, b in itertools.pairwise(queue.claims)]
        assert max(gaps[-3:]) >= 0.1  # the backoff reached its cap (0.2 s, jitter to half)
        outage = [r.getMessage() for r in caplog.records]
        # The first failure, then one line per 0.5 s while it lasts: 2 or 3 lines, not one a claim.
        assert 2 <= len(outage) <= 3, outage
        assert "the database is unreachable" in outage[0]
        assert "No such file or directory" in outage[0]
        assert all("database" in line for line in outage)

        caplog.clear()
        queue.reachable.set()
        await asyncio.sleep(0.5)
        back = [r.getMessage() for r in caplog.records]
        assert len(back) == 1 and "again" in back[0], back
        # Once back, it polls at its own interval again.
        assert len(queue.claims) - failed >= 10
    finally:
        stopping.set()
        await asyncio.wait_for(running, 5)


async def test_a_job_whose_stream_is_gone_is_no_failure_and_warns_of_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gone, after = job(1), job(2)
    queue = Queue([gone, after])
    finished = asyncio.Event()

    async def handle(j: Job) -> None:
        if j == gone:
            raise NotFound("no stream 's1' in run 'r'")
        finished.set()

    worker = Worker("w", queue, handle, poll_seconds=0.01)
    with caplog.at_level(logging.INFO, logger="ductor_streams"):
        await run_until(worker, finished)
    assert worker.failures == 0
    assert queue.refused == [gone]  # retried later, as before, should its row still be there
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
