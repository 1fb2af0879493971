"""The worker loop: claim due jobs, run each, and record the outcome with the job.

Jobs live in PostgreSQL with a lease (`claimed_by`, `lease_until`, `attempts`,
`next_attempt_at`, `last_error`). A worker that dies simply stops renewing anything: when its
lease runs out another worker claims the job, and every handler is idempotent, so a job done
twice changes nothing the second time. Retries back off exponentially with jitter, bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec

from application.log_context import forget_stream
from domain.stream import StreamKey

log = logging.getLogger("ductor_streams.workers")


class Job(msgspec.Struct, frozen=True):
    key: StreamKey
    attempts: int
    id: int | None = None
    storage_region: str | None = None
    storage_key: str | None = None


class JobQueue(Protocol):
    async def claim(self, limit: int) -> list[Job]: ...

    async def done(self, job: Job, next_in: float | None) -> None:
        """Reschedule in `next_in` seconds, or remove the job when None."""

    async def failed(self, job: Job, error: str, retry_in: float) -> None: ...

    async def release(self, jobs: list[Job]) -> None: ...


def backoff(attempts: int, base: float = 1.0, cap: float = 300.0) -> float:
    return min(cap, base * 2 ** min(attempts, 20)) * random.uniform(0.5, 1.0)


def retry_delay(error: Exception, attempts: int, base: float) -> float:
    """An error's own `retry_in` (a refusal that is not transient), else the backoff."""
    retry_in = getattr(error, "retry_in", None)
    return backoff(attempts, base=base) if retry_in is None else retry_in


class Worker:
    def __init__(
        self,
        name: str,
        queue: JobQueue,
        handle: Callable[[Job], Awaitable[float | None]],
        poll_seconds: float = 1.0,
        batch: int = 32,
        retry_base_seconds: float = 1.0,
    ) -> None:
        self._retry_base = retry_base_seconds
        self.name = name
        self._queue = queue
        self._handle = handle
        self._poll = poll_seconds
        self._batch = batch
        self.completed = 0
        self.failures = 0

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                jobs = await self._queue.claim(self._batch)
            except Exception as error:
                log.warning("%s cannot claim jobs: %s", self.name, error)
                jobs = []
            for index, job in enumerate(jobs):
                if stopping.is_set():
                    # Graceful shutdown: hand back what this worker will not do.
                    with contextlib.suppress(Exception):
                        await self._queue.release(jobs[index:])
                    return
                await self._run_one(job)
            if not jobs:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), self._poll)

    async def _run_one(self, job: Job) -> None:
        forget_stream()
        try:
            next_in = await self._handle(job)
        except Exception as error:
            self.failures += 1
            log.warning(
                "%s failed on %s (attempt %d): %s", self.name, job.key, job.attempts + 1, error
            )
            retry_in = retry_delay(error, job.attempts, self._retry_base)
            with contextlib.suppress(Exception):
                await self._queue.failed(job, f"{type(error).__name__}: {error}", retry_in)
            return
        self.completed += 1
        try:
            await self._queue.done(job, next_in)
        except Exception as error:  # the lease will run out and another worker redo it
            log.warning("%s could not record %s: %s", self.name, job.key, error)


class Periodic:
    """A job with no queue: run `tick` every `interval` seconds (for idempotent sweeps)."""

    def __init__(self, name: str, tick: Callable[[], Awaitable[object]], interval: float) -> None:
        self.name = name
        self._tick = tick
        self._interval = interval

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            forget_stream()
            try:
                await self._tick()
            except Exception as error:
                log.warning("%s failed: %s", self.name, error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self._interval)


async def run_workers(workers: list[Worker | Periodic], stopping: asyncio.Event) -> None:
    await asyncio.gather(*(w.run(stopping) for w in workers))
