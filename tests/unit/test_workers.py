"""The worker loop keeps its claims while it works, and stops a job whose claim was taken over."""

from __future__ import annotations

import asyncio

from application.workers import Job, Worker
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


async def test_a_renewal_that_cannot_reach_postgresql_does_not_stop_the_job() -> None:
    slow = job(1)
    queue = Queue([slow], lease_seconds=0.3)
    queue.renew_fails = True
    finished = asyncio.Event()

    async def handle(j: Job) -> None:
        await asyncio.sleep(0.5)
        finished.set()

    await run_until(Worker("w", queue, handle, poll_seconds=0.01), finished)
    await asyncio.sleep(0.05)
    assert queue.recorded == [slow]


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
