"""Stream expiry: the last-access log, the one check every route makes, and the sweep.

A read never writes the stream row. Each process keeps the last access of every stream with an
expiry in memory (`touch`) and flushes what changed every `flush_seconds` (F), in one statement,
to the access table. What a crash (kill -9) can lose is the accesses since its last flush. So
that this never costs more than 2F of a stream's life, an access is written at once (before the
request is answered) when the latest access this process knows to be recorded is 2F old or
older: then, after any access at `t`, the table holds an access no older than `t - 2F`, crash or
not. A stream in steady use is flushed every F and never waits on that write; one used now and
then pays it at most once per 2F. Every decision allows for exactly that margin:

- a route answers 404 only once `last access + idle_seconds + 2F` has passed, taking the latest
  access it knows (its own touches, or the recorded one), so a stream is never found expired
  before `idle_seconds` after an access that happened anywhere, even one lost in a crash;
- the sweep erases only once `recorded last access + idle_seconds + grace` has passed, with
  grace at least 2F, for the same reason.

`expires_at` is absolute and needs no margin. A legal hold suspends both: a held stream is
neither 404 nor erased, whatever its expiry; lifting the hold is a write, so an idle stream's
window starts again then, and one past its `expires_at` goes at the next sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Iterator
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import TypeVar

from application.errors import NotFound
from application.ports import (
    Clock,
    Done,
    Idempotency,
    RunSummary,
    StreamAccess,
    StreamRepository,
)
from domain.definition import StreamDefinition
from domain.events import Event
from domain.stream import Stream, StreamKey

T = TypeVar("T")

log = logging.getLogger("ductor_streams.expiry")

# Streams whose latest access this process remembers, beyond which the oldest are forgotten (a
# forgotten one costs one query at its next request, nothing more).
MAX_REMEMBERED = 100_000

# False while handling a request that only asks what an access would answer (HEAD): it is
# checked like any other (404 once expired) but does not count as an access.
_counts_as_access: ContextVar[bool] = ContextVar("ductor_counts_as_access", default=True)


@contextlib.contextmanager
def not_an_access() -> Iterator[None]:
    """Within this block, `AccessLog.check` never touches: the requests it handles (HEAD) do
    not keep an `idle_seconds` stream alive."""
    token = _counts_as_access.set(False)
    try:
        yield
    finally:
        _counts_as_access.reset(token)


class AccessLog:
    """This process's knowledge of last accesses: what it touched (and has yet to flush) and
    what it has read back from the access table."""

    def __init__(self, store: StreamAccess, clock: Clock, flush_seconds: float = 1.0) -> None:
        self._store = store
        self._clock = clock
        self.flush_seconds = flush_seconds
        # How far the recorded last access may lag the true one: twice the flush interval.
        self.slack = timedelta(seconds=2 * flush_seconds)
        self._pending: dict[StreamKey, datetime] = {}
        self._known: dict[StreamKey, datetime] = {}  # the latest access known here
        self._recorded: dict[StreamKey, datetime] = {}  # the latest known to be in the table
        self._open: dict[StreamKey, int] = {}  # open subscriptions per stream
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.flushed = 0  # statements written, for tests and metrics

    # -- knowledge --------------------------------------------------------------------------------

    async def live_runs(
        self, tenant: str, after: str | None, limit: int, prefix: str = ""
    ) -> list[RunSummary]:
        """The tenant's runs page, counting only streams that do not answer 404 as expired."""
        return await self._store.live_runs(tenant, after, limit, self._clock(), self.slack, prefix)

    def touch(self, key: StreamKey, now: datetime) -> None:
        """A read or write reached the stream at `now` (only streams with an expiry)."""
        pending = self._pending.get(key)
        if pending is None or pending < now:
            self._pending[key] = now
        self.remember(key, now)

    def remember(self, key: StreamKey, at: datetime, *, recorded: bool = False) -> None:
        """Learn of an access at `at`; `recorded`: one the access table holds."""
        for seen in (self._known, self._recorded) if recorded else (self._known,):
            known = seen.get(key)
            if known is None:
                if len(seen) >= MAX_REMEMBERED:
                    del seen[next(iter(seen))]
                seen[key] = at
            elif known < at:
                seen[key] = at

    def known(self, key: StreamKey) -> datetime | None:
        return self._known.get(key)

    async def expired(
        self,
        key: StreamKey,
        definition: StreamDefinition,
        now: datetime,
        *,
        held: bool | None = None,
    ) -> bool:
        """Whether the stream is past its expiry, on the best knowledge here. No query while
        this process has seen the stream accessed within its window (the hot path), nor for a
        stream without an expiry or before its `expires_at`."""
        expiry = definition.expiry
        if not expiry.enabled:
            return False
        known = self._known.get(key)
        if expiry.expires_at is not None:
            if now < expiry.expires_at:
                return False
            if held is not None:
                # Absolute: no access counts, and the hold is at hand. (Asking for the access
                # row would find none once the sweep erased the stream after the caller loaded
                # it: the stream would be answered as if alive.)
                return not held
        elif known is not None and not expiry.passed(now, known, self.slack):
            return False
        record = await self._store.last_access(key)
        if record is None:
            # No stream (the caller's lookup answers 404 for that) or no row. The sweep erases
            # both once the stream is expired: a caller that loaded the stream before that, and
            # knows it past its idle expiry, finds it expired still (it was answered 200 again
            # just after a 404, from what it had loaded: a CI flake).
            idle = expiry.expires_at is None
            return idle and known is not None and expiry.passed(now, known, self.slack)
        self.remember(key, record.last_access, recorded=True)
        if held is None:
            held = record.legal_hold
        return not held and expiry.passed(now, self._known[key], self.slack)

    async def check(
        self,
        key: StreamKey,
        definition: StreamDefinition,
        *,
        held: bool | None = None,
        touch: bool = True,
    ) -> None:
        """404 for an expired stream; otherwise the access counts (unless `touch` is False, or
        within `not_an_access`)."""
        if not definition.expiry.enabled:
            return
        now = self._clock()
        if await self.expired(key, definition, now, held=held):
            raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
        if touch and _counts_as_access.get():
            self.touch(key, now)
            recorded = self._recorded.get(key)
            if recorded is None or now - recorded >= self.slack:
                # Written before the answer: a crash now cannot lose more than 2F of life.
                await self._store.record_access({key: now})
                self.remember(key, now, recorded=True)

    def visible(self, streams: list[Stream], run_access: dict[str, datetime]) -> list[Stream]:
        """The streams of one run that are not expired (for listing: no access counts)."""
        now = self._clock()
        alive = []
        for stream in streams:
            key = stream.key
            if (at := run_access.get(key.stream_id)) is not None:
                self.remember(key, at, recorded=True)
            if stream.state.legal_hold.enabled or not stream.definition.expiry.passed(
                now, self._known.get(key), self.slack
            ):
                alive.append(stream)
        return alive

    async def keep_touching(
        self, key: StreamKey, definition: StreamDefinition, items: AsyncGenerator[T, None]
    ) -> AsyncGenerator[T, None]:
        """Pass `items` through, touching the stream at each one (a subscription's deliveries
        and heartbeats: an open subscription keeps its stream alive)."""
        # Touched at each flush too, however long the heartbeat is against idle_seconds.
        with self.kept_open(key, definition):
            async with contextlib.aclosing(items):
                async for item in items:
                    if definition.expiry.enabled:
                        self.touch(key, self._clock())
                    yield item

    @contextlib.contextmanager
    def kept_open(self, key: StreamKey, definition: StreamDefinition) -> Iterator[None]:
        """While in it, the stream counts as accessed at every flush: a live connection on it
        (a subscription, a read waiting for the next append) keeps an idle-expiring stream
        alive, as its reads do."""
        if not definition.expiry.enabled:
            yield
            return
        self._open[key] = self._open.get(key, 0) + 1
        try:
            yield
        finally:
            if (left := self._open[key] - 1) > 0:
                self._open[key] = left
            else:
                del self._open[key]

    # -- flushing ---------------------------------------------------------------------------------

    async def flush(self) -> int:
        """Write every access touched since the last flush, in one statement. On failure they
        stay pending (merged with newer ones) for the next flush."""
        if self._open:
            now = self._clock()
            for key in self._open:
                self.touch(key, now)
        if not self._pending:
            return 0
        batch, self._pending = self._pending, {}
        try:
            await self._store.record_access(batch)
        except BaseException:
            for key, at in batch.items():
                pending = self._pending.get(key)
                if pending is None or pending < at:
                    self._pending[key] = at
            raise
        for key, at in batch.items():
            self.remember(key, at, recorded=True)
        self.flushed += 1
        return len(batch)

    async def run(self) -> None:
        """Flush every `flush_seconds`, at a fixed rate (a slow flush does not push the next
        one later), until `close`."""
        next_at = time.monotonic()
        while True:
            next_at += self.flush_seconds
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), max(0.0, next_at - time.monotonic()))
            try:
                await self.flush()
            except Exception as error:  # the database is out of reach: kept for the next one
                kept = len(self._pending)
                log.warning("cannot record stream accesses (%d kept): %s", kept, error)
            if self._stopping.is_set():  # that was the last flush
                return
            next_at = max(next_at, time.monotonic() - self.flush_seconds)

    def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self.run())

    async def close(self) -> None:
        """Stop flushing, after a last flush of what is pending (a graceful stop loses none)."""
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
        else:
            with contextlib.suppress(Exception):
                await self.flush()


class ExpireCommand:
    """Erase the stream if it is still expired under the row lock (held or used meanwhile: no)."""

    idempotency: Idempotency | None = None
    records = ()
    offset_of = None
    producer = None
    erases = True

    def __init__(self, now: datetime, last_access: datetime | None, grace: timedelta) -> None:
        self.now = now
        self.last_access = last_access
        self.grace = grace

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        return stream.expire(self.now, self.last_access, self.grace)

    def answer(self, stream: Stream, events: list[Event]) -> bool:
        return bool(events)


class SweepExpired:
    """One sweep: find expired streams in bounded batches and erase each under its row lock.

    A plain async callable (run by a `Periodic`, or by any job runner): idempotent, and safe on
    several processes at once (the row lock orders them; the second finds nothing to do)."""

    def __init__(
        self,
        streams: StreamRepository,
        access: StreamAccess,
        clock: Clock,
        grace: timedelta,
        access_log: AccessLog | None = None,
        batch: int = 100,
        rounds: int = 10,
    ) -> None:
        self._streams = streams
        self._access = access
        self._clock = clock
        self._grace = grace
        self._log = access_log
        self._batch = batch
        self._rounds = rounds

    async def __call__(self) -> int:
        """Answer how many streams it erased (at most `batch` times `rounds` per sweep)."""
        erased = 0
        for _ in range(self._rounds):
            keys = await self._access.expiry_candidates(self._clock(), self._grace, self._batch)
            for key in keys:
                erased += await self._expire(key)
            if len(keys) < self._batch:
                break
        return erased

    async def _expire(self, key: StreamKey) -> int:
        # Read again right before the lock: an access recorded since the candidates were found
        # keeps the stream; so does one this process has not flushed yet.
        record = await self._access.last_access(key)
        if record is None:
            return 0
        last = record.last_access
        if self._log is not None and (known := self._log.known(key)) is not None:
            last = max(last, known)
        try:
            [outcome] = await self._streams.update(
                key, [ExpireCommand(self._clock(), last, self._grace)]
            )
        except NotFound:
            return 0
        if isinstance(outcome, Done) and outcome.events:
            log.info("erased expired stream %s", key)
            return 1
        return 0
