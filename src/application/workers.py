"""The worker loop: claim due jobs, run each, and record the outcome with the job.

Jobs live in PostgreSQL with a lease (`claimed_by`, `lease_until`, `attempts`,
`next_attempt_at`, `last_error`). While a worker holds claims (the job it runs and the rest of
the batch it claimed) it renews their leases every quarter of the lease, so a slow job is never
taken from a live worker, and a short lease is enough. A worker that dies simply stops renewing:
when its lease runs out another worker claims the job, and every handler is idempotent, so a job
done twice changes nothing the second time. A renewal that finds a claim gone (the lease ran out
while the worker could not renew, and another worker took the job) stops that job here.
A worker that cannot reach PostgreSQL cannot renew, and must not go on acting on claims another
worker may take over: each claim is trusted here only for `HELD_FOR_LEASES` (3/4) of a lease after
the last moment it was known held (when the claim or renewal that succeeded was sent). Then the
job's task is cancelled, and `ensure_claimed()`, which a handler calls right before an effect
outside PostgreSQL (a publish, a body's removal), refuses. The rest of the lease is the margin
before anyone else may claim it, so a partitioned worker that comes back never acts under a
lease another took over; what it writes to PostgreSQL is checked against `claimed_by` in the
statement itself (a prune in its own transaction: `retention.PruneCommand`), and the wait
service's idempotency by event id is the last line, not the first.
Retries back off exponentially with jitter, bounded. So does claiming while the database is out
of reach, and the outage is logged once when it starts, then at most once per `OUTAGE_LOG_SECONDS`,
and once when it ends, rather than once per poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, Protocol

import msgspec

from application.errors import NotFound
from application.log_context import forget_stream
from domain.stream import StreamKey

log = logging.getLogger("ductor_streams.workers")

# A worker that cannot claim waits longer each time, up to this: back within seconds of the
# database, without a dispatcher's 0.1 s poll hammering (and logging about) an outage.
CLAIM_BACKOFF_CAP_SECONDS = 5.0
OUTAGE_LOG_SECONDS = 30.0
# How often a claim is renewed, and how much of a lease a worker trusts it for, counted from when
# the claim (or its last renewal) was sent: a renewal has half a lease to get through after the
# one before (with the default lease, 3 s), so only a worker that cannot reach PostgreSQL gets
# to the end, and the last quarter is the margin for an effect already under way.
RENEW_EVERY_LEASES = 1 / 4
HELD_FOR_LEASES = 3 / 4


class LeaseLost(Exception):
    """This worker no longer knows it holds the claim: the job stops before acting."""


class Claim:
    """This process's view of one claimed job: trusted until `until` (monotonic), then the
    job's task is cancelled. Extended by each renewal that succeeded."""

    __slots__ = ("_handle", "_held_for", "_on_expiry", "task", "until")

    def __init__(self, sent_at: float, lease_seconds: float, on_expiry: Callable[[], None]) -> None:
        self._held_for = lease_seconds * HELD_FOR_LEASES
        self._on_expiry = on_expiry
        self.task: asyncio.Task[Any] | None = None
        self.until = sent_at + self._held_for
        self._handle = asyncio.get_running_loop().call_at(_loop_time(self.until), self._expired)

    def renewed(self, sent_at: float) -> None:
        until = sent_at + self._held_for
        if until > self.until:
            self.until = until
            self._handle.cancel()
            self._handle = asyncio.get_running_loop().call_at(_loop_time(until), self._expired)

    def left(self) -> float:
        return self.until - time.monotonic()

    def _expired(self) -> None:
        if self.left() > 0:  # renewed meanwhile
            return
        self._on_expiry()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def drop(self) -> None:
        self._handle.cancel()


def _loop_time(monotonic_at: float) -> float:
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_at - time.monotonic())


_current_claim: contextvars.ContextVar[Claim | None] = contextvars.ContextVar("claim", default=None)


def ensure_claimed() -> float | None:
    """Called by a job right before an effect: the seconds its claim is still trusted for
    (None outside a claimed job), or LeaseLost when none are left."""
    claim = _current_claim.get()
    if claim is None:
        return None
    left = claim.left()
    if left <= 0:
        raise LeaseLost("the claim could not be renewed in time; another worker may hold it")
    return left


def claim_renewed(sent_at: float) -> None:
    """The running job renewed its own claim (a statement sent at `sent_at` extended it)."""
    claim = _current_claim.get()
    if claim is not None:
        claim.renewed(sent_at)


class Job(msgspec.Struct, frozen=True):
    key: StreamKey
    attempts: int
    id: int | None = None
    storage_region: str | None = None
    storage_key: str | None = None
    reason: str | None = None  # why a body is to be removed (deletion jobs)
    # Deletion jobs: until when a put of the body may still land (it is deleted again then).
    upload_until: datetime | None = None
    # The worker the queue recorded as the claim's holder, where an effect in PostgreSQL is
    # fenced by it (a prune checks, in its own transaction, that this worker still holds it).
    claimed_by: str | None = None


class JobQueue(Protocol):
    lease_seconds: float

    async def claim(self, limit: int) -> list[Job]: ...

    async def renew(self, jobs: list[Job]) -> list[Job]:
        """Extend the lease of each of `jobs` this worker still holds; answer those it no
        longer holds (taken over by another worker, or finished)."""

    async def done(self, job: Job, next_in: float | None) -> None:
        """Reschedule in `next_in` seconds, or remove the job when None."""

    async def failed(self, job: Job, error: str, retry_in: float) -> None: ...

    async def release(self, jobs: list[Job]) -> None: ...


def backoff(attempts: int, base: float = 1.0, cap: float = 300.0) -> float:
    return min(cap, base * 2.0 ** min(attempts, 20)) * random.uniform(0.5, 1.0)


def retry_delay(error: Exception, attempts: int, base: float) -> float:
    """An error's own `retry_in` (a refusal that is not transient), else the backoff."""
    retry_in = getattr(error, "retry_in", None)
    return backoff(attempts, base=base) if retry_in is None else retry_in


class Worker:
    """Runs up to `concurrency` claimed jobs at a time, and claims more once everything it
    claimed has started and a slot is free, holding at most `batch` at once. Jobs are
    independent rows (input dispatch claims one row per stream), so they may run side by side."""

    def __init__(
        self,
        name: str,
        queue: JobQueue,
        handle: Callable[[Job], Awaitable[float | None]],
        poll_seconds: float = 1.0,
        batch: int = 32,
        retry_base_seconds: float = 1.0,
        concurrency: int = 1,
        claim_backoff_cap_seconds: float = CLAIM_BACKOFF_CAP_SECONDS,
        outage_log_seconds: float = OUTAGE_LOG_SECONDS,
    ) -> None:
        self._retry_base = retry_base_seconds
        self._claim_backoff_cap = claim_backoff_cap_seconds
        self._outage = Outage(name, outage_log_seconds)
        self._concurrency = concurrency
        self.name = name
        self._queue = queue
        self._handle = handle
        self._poll = poll_seconds
        self._batch = batch
        self.completed = 0
        self.failures = 0
        self.expired = 0  # claims given up because they could not be renewed in time

    async def run(self, stopping: asyncio.Event) -> None:
        held: list[Job] = []  # claimed and not finished; the renewal drops the ones taken over
        waiting: list[Job] = []  # claimed, not started
        running: dict[Job, asyncio.Task[None]] = {}
        claims: dict[Job, Claim] = {}
        renewing = asyncio.create_task(self._keep_claims(held, running, claims))
        stopped = asyncio.create_task(stopping.wait())
        claim_at = 0.0  # monotonic: not before, while claims fail
        try:
            while not stopping.is_set():
                pause = self._poll
                if not waiting and len(running) < self._concurrency:
                    if time.monotonic() < claim_at:
                        jobs = []
                        pause = claim_at - time.monotonic()
                    else:
                        sent = time.monotonic()
                        jobs = await self._claim(max(1, self._batch - len(running)))
                        for job in jobs:
                            claims[job] = Claim(
                                sent,
                                self._queue.lease_seconds,
                                functools.partial(self._expired, job, held, waiting),
                            )
                        if self._outage.failures:
                            pause = max(
                                self._poll,
                                backoff(
                                    self._outage.failures,
                                    base=self._poll,
                                    cap=self._claim_backoff_cap,
                                ),
                            )
                            claim_at = time.monotonic() + pause
                    held.extend(jobs)
                    waiting.extend(jobs)
                while waiting and len(running) < self._concurrency and not stopping.is_set():
                    job = waiting.pop(0)
                    if job in held:  # not taken over before it started
                        claim = claims[job]
                        running[job] = claim.task = asyncio.create_task(self._run_one(job, claim))
                # Wake when a job ends, or (with a slot free) to claim again at the next poll.
                full = len(running) >= self._concurrency or bool(waiting)
                await asyncio.wait(
                    [*running.values(), stopped],
                    timeout=None if full and running else pause,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                self._reap(running, held, claims)
                for job in [j for j in claims if j not in held and j not in running]:
                    claims.pop(job).drop()  # expired before it started
            # Graceful shutdown: hand back what this worker will not start, finish the rest.
            with contextlib.suppress(Exception):
                await self._queue.release([j for j in waiting if j in held])
            if running:
                await asyncio.wait(running.values())
                self._reap(running, held, claims)
        finally:
            for claim in claims.values():
                claim.drop()
            tasks = [renewing, stopped, *running.values()]  # running: only when cancelled
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)

    def _expired(self, job: Job, held: list[Job], waiting: list[Job]) -> None:
        """The claim on `job` was not renewed in time: stop acting on it, before its lease
        runs out and another worker may take it over."""
        log.warning(
            "%s stops acting on %s: its claim could not be renewed (the database is out of "
            "reach?) and another worker may take it over",
            self.name,
            job.key,
        )
        self.expired += 1
        with contextlib.suppress(ValueError):
            held.remove(job)
        with contextlib.suppress(ValueError):
            waiting.remove(job)

    async def _claim(self, limit: int) -> list[Job]:
        """Up to `limit` jobs: what it holds (running, and claimed to start next) stays within
        `batch`, so with `batch` equal to `concurrency` nothing it claims waits behind another
        job, its lease held while other workers (or other tenants' jobs) could have run it."""
        try:
            jobs = await self._queue.claim(limit)
        except Exception as error:
            self._outage.failed(error)
            return []
        self._outage.recovered()
        return jobs

    def _reap(
        self, running: dict[Job, asyncio.Task[None]], held: list[Job], claims: dict[Job, Claim]
    ) -> None:
        for job, task in list(running.items()):
            if task.done():
                del running[job]
                claim = claims.pop(job, None)
                if claim is not None:
                    claim.drop()
                with contextlib.suppress(ValueError):
                    held.remove(job)
                if task.cancelled() and (claim is None or claim.left() > 0):
                    log.warning(
                        "%s: %s lost its lease (taken over by another worker, or its job ended "
                        "with its stream's deletion)",
                        self.name,
                        job.key,
                    )

    async def _keep_claims(
        self, held: list[Job], running: dict[Job, asyncio.Task[None]], claims: dict[Job, Claim]
    ) -> None:
        every = self._queue.lease_seconds * RENEW_EVERY_LEASES
        while True:
            await asyncio.sleep(every)
            if not held:
                continue
            sent = time.monotonic()
            try:
                lost = await self._queue.renew(list(held))
            except Exception as error:  # PostgreSQL is out of reach: try again, it may be back
                log.warning("%s cannot renew its leases: %s", self.name, error)
                continue
            for job in lost:
                with contextlib.suppress(ValueError):
                    held.remove(job)
                task = running.get(job)
                if task is not None:
                    task.cancel()
            for job in held:
                claim = claims.get(job)
                if claim is not None:
                    claim.renewed(sent)

    async def _run_one(self, job: Job, claim: Claim) -> None:
        forget_stream()
        _current_claim.set(claim)
        try:
            next_in = await self._handle(job)
        except LeaseLost as error:
            log.warning("%s stopped %s before acting: %s", self.name, job.key, error)
            return
        except Exception as error:
            if isinstance(error, NotFound):
                # Its stream was deleted meanwhile, and its job's row with it: no failure (a
                # storm of deletions made one warning of each). Recorded as one all the same,
                # in case the row is still there.
                log.info("%s: %s is gone: %s", self.name, job.key, error)
            else:
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


class Outage:
    """A worker's claims failing in a row: logged when it starts, then at most once per
    `log_seconds` while it lasts, and once when a claim succeeds again."""

    def __init__(self, name: str, log_seconds: float, doing: str = "claim jobs") -> None:
        self.name = name
        self.doing = doing
        self.failures = 0
        self._log_seconds = log_seconds
        self._started = 0.0
        self._logged_at = 0.0

    def failed(self, error: Exception) -> None:
        now = time.monotonic()
        self.failures += 1
        if self.failures == 1:
            self._started = self._logged_at = now
            log.warning(
                "%s cannot %s: the database is unreachable (%s: %s); retrying with backoff",
                self.name,
                self.doing,
                type(error).__name__,
                error,
            )
        elif now - self._logged_at >= self._log_seconds:
            self._logged_at = now
            log.warning(
                "%s still cannot %s: the database has been unreachable for %.0f s "
                "(%d attempts; last: %s: %s)",
                self.name,
                self.doing,
                now - self._started,
                self.failures,
                type(error).__name__,
                error,
            )

    def recovered(self) -> None:
        if self.failures:
            log.info(
                "%s can %s again: the database is reachable after %.0f s (%d failed attempts)",
                self.name,
                self.doing,
                time.monotonic() - self._started,
                self.failures,
            )
            self.failures = 0


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


class SweepLeases(Protocol):
    """One row per named sweep, claimed with a lease: whoever holds it is the only runner of
    that sweep across every process sharing the store."""

    lease_seconds: float

    async def claim(self, name: str, interval: float | None = None) -> int | None:
        """Claim `name` when it is due and nobody holds a live lease on it (its row is created
        on first use, due at once); answer its failed attempts so far, or None. On this
        process's first claim of `name`, a next run scheduled further than `interval` ahead (by
        a process with a longer interval, or before a restart) is brought in to `interval` from
        now, so a shortened interval takes effect at once."""

    async def renew(self, name: str) -> bool:
        """Extend this worker's lease on `name`; False when it no longer holds it."""

    async def done(self, name: str, next_in: float) -> None:
        """Release `name`, due again in `next_in` seconds, its attempts and error cleared."""

    async def failed(self, name: str, error: str, retry_in: float) -> None:
        """Release `name`, due again in `retry_in` seconds, one more attempt recorded."""

    async def release(self, name: str) -> None:
        """Give `name` back, due as it was (a worker shutting down mid-sweep)."""


class LeasedSweep:
    """A sweep that one worker runs at a time across every replica: `tick` every `interval`
    seconds, under a lease in `leases` (see SweepLeases).

    Each process polls for the claim every `poll_seconds` at most (and at least once an
    interval). While `tick` runs, the lease is renewed every quarter of it, like a Worker's claims,
    so a long sweep keeps its claim and a short lease is enough; a renewal that finds the claim
    gone (the lease ran out and another worker took the sweep) stops the tick here. A tick that
    raises is retried with backoff. A process killed mid-tick stops renewing, and another takes
    the sweep over once its lease runs out: a tick must be idempotent and work in bounded steps
    (each one its own statement), so a tick cut short loses nothing but time.

    `tick` is a plain `async def tick() -> int` (what it removed, for the log)."""

    def __init__(
        self,
        name: str,
        tick: Callable[[], Coroutine[Any, Any, int]],
        interval: float,
        leases: SweepLeases,
        poll_seconds: float = 5.0,
        retry_base_seconds: float = 1.0,
        outage_log_seconds: float = OUTAGE_LOG_SECONDS,
    ) -> None:
        self.name = name
        self._tick = tick
        self._interval = interval
        self._leases = leases
        self._poll = min(poll_seconds, interval)
        self._retry_base = retry_base_seconds
        self._outage = Outage(name, outage_log_seconds)
        self.runs = 0
        self.failures = 0
        self.removed = 0

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            forget_stream()
            sent = time.monotonic()
            try:
                attempts = await self._leases.claim(self.name, self._interval)
            except Exception as error:  # logged once an outage, not once a poll
                self._outage.failed(error)
                attempts = None
            else:
                self._outage.recovered()
            if attempts is not None:
                await self._run_claimed(attempts, stopping, sent)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self._poll)

    def _expired(self) -> None:
        log.warning(
            "%s stops: its lease could not be renewed (the database is out of reach?) and "
            "another worker may take the sweep over",
            self.name,
        )

    async def _run_claimed(self, attempts: int, stopping: asyncio.Event, sent: float) -> None:
        claim = Claim(sent, self._leases.lease_seconds, lambda: self._expired())
        context = contextvars.copy_context()
        context.run(_current_claim.set, claim)
        ticking = claim.task = asyncio.create_task(self._tick(), context=context)
        stopped = asyncio.create_task(stopping.wait())
        try:
            while not ticking.done():
                await asyncio.wait(
                    [ticking, stopped],
                    timeout=self._leases.lease_seconds * RENEW_EVERY_LEASES,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if ticking.done():
                    break
                if stopping.is_set():  # shutting down: hand the sweep back, due as it was
                    ticking.cancel()
                    with contextlib.suppress(Exception):
                        await self._leases.release(self.name)
                    return
                renewing = time.monotonic()
                try:
                    held = await self._leases.renew(self.name)
                except Exception as error:  # out of reach: try again, it may be back
                    log.warning("%s cannot renew its lease: %s", self.name, error)
                    continue
                if not held:
                    ticking.cancel()
                    log.warning("%s was taken over by another worker", self.name)
                    return
                claim.renewed(renewing)
        finally:
            claim.drop()
            stopped.cancel()
            if not ticking.done():
                ticking.cancel()
            await asyncio.wait([ticking, stopped])
        if ticking.cancelled():  # its claim expired: it stopped acting (logged then)
            return
        try:
            removed = ticking.result()
        except Exception as error:
            self.failures += 1
            log.warning("%s failed (attempt %d): %s", self.name, attempts + 1, error)
            with contextlib.suppress(Exception):
                await self._leases.failed(
                    self.name,
                    f"{type(error).__name__}: {error}",
                    backoff(attempts, base=self._retry_base, cap=max(self._interval, 1.0)),
                )
            return
        self.runs += 1
        self.removed += removed or 0
        if removed:
            log.info("%s removed %d", self.name, removed)
        try:
            await self._leases.done(self.name, self._interval)
        except Exception as error:  # the lease runs out; the sweep is simply run again
            log.warning("%s could not record its run: %s", self.name, error)


class Runs(Protocol):
    """A background worker: runs until `stopping` is set."""

    async def run(self, stopping: asyncio.Event) -> None: ...


async def run_workers(workers: Sequence[Runs], stopping: asyncio.Event) -> None:
    await asyncio.gather(*(w.run(stopping) for w in workers))
