"""Group commit: append coalescing for every command, across streams.

Every append to a stream serializes on its row lock and each commit waits for a WAL flush, so a
handler that commits request by request is capped near 1 / (commit latency). Instead, per
process, requests queue here per stream, and one leader task per commit group (`commit_group`:
every stream of one PostgreSQL) takes what is queued for many streams at once and hands it to
the port as one batch: each stream's requests are decided in order under that stream's row lock
(locked in one fixed order), and the whole batch commits in one transaction, one WAL flush.
While it commits, new requests queue for the next batch, so batches grow exactly as fast as load
does and a lone request waits for nobody. Spread over a hundred streams a stream rarely has two
requests waiting; the batch is what keeps that load from paying a transaction per request.

Large work commits aside, in a transaction of its own beside the leader's (at most `max_aside`
at once): for the second or so it takes, the other streams' requests go on committing in the
leader's batches instead of waiting for it. A request that is large by itself (thousands of
records, or megabytes: `aside_records`, `aside_bytes`) always commits aside, in a batch of its
own stream's requests alone: it never shares a transaction with other streams' requests. Many
small requests that together reach those thresholds commit aside too while a slot is free.
With every slot busy the leader passes over the streams whose next request is large (they stay
ready, in their place) and commits the others in batches kept below the thresholds, so a small
append never waits for a large transaction. A stream committing aside is not taken again until
its batch ends, and a stream is always taken from its oldest request, so each stream's requests
still commit in arrival order.

Each stream's answer is its own: a refused request (or a stream that is gone) answers alone,
and the port isolates a failing stream from the others of its batch. The leader is a task of
its own, not a request, so a client that hangs up mid-commit cancels only its own wait, never
the batch's transaction.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Hashable
from itertools import islice
from typing import TYPE_CHECKING, TypeVar

from application import tracing
from application.ports import (
    AnsweringCommand,
    Command,
    CommitPeers,
    Done,
    Failed,
    Outcome,
    PeerUnavailable,
    StreamRepository,
)
from application.tenant_limits import ByteLimit
from application.throughput import Throughput
from application.waiting import Expired, Unanswered, expire, spending
from domain.events import RecordsAppended
from domain.records import held_bytes, receipt_bytes
from domain.stream import StreamKey

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext

# A command, its request's future, (while tracing) the span context of its request, and its
# records' count and bytes (counted once, as it is queued).
_Pending = tuple[Command, asyncio.Future[Outcome], "SpanContext | None", int, int]
_Batch = list[tuple[StreamKey, list[_Pending]]]
T = TypeVar("T")


def commit_group(key: StreamKey) -> Hashable:
    """Which streams may share a transaction: the one grouping key of the commit path.

    On one PostgreSQL every stream may (the same constant). Distributed by run over shards (the
    schema keys on tenant and run first), a transaction that spans shards becomes a distributed
    one; there this answers the stream's shard, its run's co-location group, so that each batch
    stays on one node (docs/architecture.md)."""
    return None


# A request, or a batch, of at least this many records, or bytes, commits aside (below), at most
# `MAX_ASIDE` at once per process: a request of 100,000 messages took its batch 1-1.5 s, and
# every other stream's appends waited for it; 4,000 records of 1.9 KB held them 0.2 s. One-record
# appends never make batches this large (64 connections make at most 64 requests a batch);
# batched appends of a thousand records do, and commit aside, each stream's still in order. With
# every slot busy, large requests wait for one while the leader commits the small ones.
ASIDE_RECORDS = 5_000
ASIDE_BYTES = 4 * 1024 * 1024
MAX_ASIDE = 2


def claimed_bytes(command: Command) -> int:
    """The most a command may add to its tenant's bytes: its records', their wait events'
    (`copies`: an input stream's, with the default wait service), its receipt's (an idempotent
    append's), and what an object's intent pledges (`pledge`: a commit's is its record's size
    taken back, so it claims none)."""
    claimed = sum(held_bytes(r) for r in command.records) + getattr(command, "pledge", 0)
    claimed += getattr(command, "copies", 0)
    if (idem := command.idempotency) is not None:
        claimed += receipt_bytes(idem.key)
    return claimed


def _frees(command: Command) -> bool:
    """Whether the command may give its tenant's bytes back: an erasure, a prune, an object's
    abort or expiry (`frees`)."""
    return getattr(command, "erases", False) or getattr(command, "frees", False)


def _late() -> Unanswered:
    """What a request another process sent gets once its sender stopped waiting for it: it
    never commits."""
    return Unanswered("the process that commits this stream", 0.0)


def _fail(taken: list[_Pending], error: BaseException) -> None:
    """Each of these requests, not answered yet, answered with `error`."""
    for pending in taken:
        future = pending[1]
        if not future.done():
            future.set_exception(error)


class GroupCommit:
    def __init__(
        self,
        streams: StreamRepository,
        max_group_records: int = 20_000,
        max_group_bytes: int = 32 * 1024 * 1024,
        max_batch_streams: int = 256,
        group_of: Callable[[StreamKey], Hashable] = commit_group,
        throughput: Throughput | None = None,
        aside_records: int = ASIDE_RECORDS,
        aside_bytes: int = ASIDE_BYTES,
        max_aside: int = MAX_ASIDE,
        byte_limit: ByteLimit | None = None,
    ) -> None:
        self._streams = streams
        self._byte_limit = byte_limit
        self.throughput = throughput or Throughput()
        self._max_records = max_group_records
        self._max_bytes = max_group_bytes
        self._max_streams = max_batch_streams
        self._group_of = group_of
        # Per stream, what waits for the next batch; a stream is here exactly while it has a
        # queue, and a queue is removed once it is taken whole (bounded by active streams).
        self._queues: dict[StreamKey, list[_Pending]] = {}
        # The queued requests another process sent, by future: when their sender stops waiting.
        self._deadlines: dict[asyncio.Future[Outcome], float] = {}
        # Per commit group, the streams with requests waiting, oldest first.
        self._ready: dict[Hashable, dict[StreamKey, None]] = {}
        self._leaders: set[asyncio.Task[None]] = set()
        self._peers: CommitPeers | None = None
        if max_aside < 1:
            raise ValueError("large requests commit aside only: max_aside must be 1 or more")
        self._aside_records = aside_records
        self._aside_bytes = aside_bytes
        self._max_aside = max_aside
        # The streams of the batches committing aside, and those batches' tasks; a leader
        # with only such streams ready waits for `_aside_done`.
        self._aside_streams: set[StreamKey] = set()
        self._aside: set[asyncio.Task[None]] = set()
        self._aside_done = asyncio.Event()

    def forward_to(self, peers: CommitPeers | None) -> None:
        """Commit each stream's appends where its owner among `peers` is (None: here)."""
        self._peers = peers

    async def submit(self, key: StreamKey, command: Command) -> Outcome:
        """`command`'s outcome, committed with the others waiting for its stream: by this
        process, or, for an append (`forwardable`) whose stream another process of this host
        commits (`CommitPeers.owner`), by that one. While tracing, each process commits its
        own, so that an append's trace stays in one process.

        With a limit on the tenants' bytes, a command that may store some reserves them here
        and carries its tenant's room (`tenant_room`) to its decision, wherever it is
        committed; its outcome gives the reservation back with what it stored."""
        limit = self._byte_limit if self._byte_limit and self._byte_limit.limit else None
        if limit is None or (claimed := claimed_bytes(command)) <= 0:
            outcome = await self._submit(key, command)
            if limit is not None and type(outcome) is Done and outcome.events and _frees(command):
                limit.forget(key.tenant)  # read again: what it gave back is there to take
            return outcome
        caller = getattr(command, "caller", None)
        shown = caller is None or caller.runs is None
        room = await limit.reserve(key.tenant, claimed, shown=shown)
        command.tenant_room = room  # type: ignore[attr-defined]
        stored = 0
        try:
            outcome = await self._submit(key, command)
            if type(outcome) is Done:
                stored = outcome.stored
            return outcome
        finally:
            limit.release(key.tenant, claimed, stored)

    async def _submit(self, key: StreamKey, command: Command) -> Outcome:
        peers = self._peers
        if peers is not None and getattr(command, "forwardable", False) and not tracing.on():
            owner = peers.owner(key)
            if owner is not None:
                with spending() as seconds:
                    try:
                        return await peers.submit(owner, key, command, seconds)
                    except PeerUnavailable:
                        pass  # nothing was sent: committed here
        return await self.submit_here(key, command)

    def enqueue(self, key: StreamKey, command: Command) -> asyncio.Future[Outcome]:
        """`command` queued for its stream's next batch: the future of its outcome, which the
        leader sets (or fails with its batch). What another process sent is queued so
        (adapters/peers.py), bounded by that process's wait."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        queue = self._queues.get(key)
        records = command.records
        pending = (command, future, tracing.current(), len(records), sum(r.size for r in records))
        if queue is not None:
            queue.append(pending)
            if len(queue) == 1 and self._aside:
                # Its stream's queue was left empty (its large head expired while passed
                # over): this request is its head now, and its leader may be waiting.
                self._aside_done.set()
        else:
            self._queues[key] = [pending]
            group = self._group_of(key)
            ready = self._ready.get(group)
            if ready is not None:
                ready[key] = None
                if self._aside and self._takeable(key, self._max_aside - len(self._aside)):
                    # Its leader may be waiting for an aside with nothing it may take ready:
                    # this stream needs no aside to end.
                    self._aside_done.set()
            else:
                self._ready[group] = {key: None}
                leader = asyncio.create_task(self._lead(group), name=f"append-leader {group}")
                self._leaders.add(leader)
                leader.add_done_callback(self._leaders.discard)
        return future

    def enqueue_until(
        self, key: StreamKey, command: Command, deadline: float
    ) -> asyncio.Future[Outcome]:
        """`enqueue`, bounded as `submit_here` bounds a request of this process: at `deadline`
        (`time.monotonic()`: one clock for every process of the host) a command no leader took
        yet is removed, never to commit, and its future fails. Its sender answered its client
        503 then; committed after that, it would land after what the client wrote next."""
        if deadline == math.inf:
            return self.enqueue(key, command)
        left = deadline - time.monotonic()
        if left <= 0:  # late already (read after a stall): never queued
            late: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
            late.set_exception(_late())
            return late
        future = self.enqueue(key, command)
        # Also looked at as a leader takes its stream (`_take_batches`): a leader that goes on
        # after a stall runs before the timer, though its deadline has passed.
        self._deadlines[future] = deadline
        timer = asyncio.get_running_loop().call_later(left, self._drop, key, future)

        def ended(_: asyncio.Future[Outcome]) -> None:
            timer.cancel()
            self._deadlines.pop(future, None)

        future.add_done_callback(ended)
        return future

    def _drop(self, key: StreamKey, future: asyncio.Future[Outcome]) -> None:
        """`future`'s command out of its stream's queue, if no leader took it yet."""
        queued = self._queues.get(key)
        if queued is not None and not future.done() and self._unqueue(queued, future):
            future.set_exception(_late())

    def _unqueue(self, queued: list[_Pending], future: asyncio.Future[Outcome]) -> bool:
        """`future`'s request out of its stream's queue; False if no longer there (a leader
        took it)."""
        for i, pending in enumerate(queued):
            if pending[1] is future:
                del queued[i]
                if i == 0 and self._aside:
                    # A large head passed over while the aside slots are busy: what follows it
                    # may be small, and its leader waiting.
                    self._aside_done.set()
                return True
        return False

    def _drop_late(self, queue: list[_Pending]) -> None:
        """The requests of `queue` whose senders stopped waiting (`enqueue_until`), out."""
        now = time.monotonic()
        deadlines = self._deadlines
        late = [p for p in queue if deadlines.get(p[1], now + 1) <= now]
        if late:
            queue[:] = [p for p in queue if deadlines.get(p[1], now + 1) > now]
            for pending in late:
                if not pending[1].done():
                    pending[1].set_exception(_late())

    async def submit_here(self, key: StreamKey, command: Command) -> Outcome:
        """`command`'s outcome, committed by this process's leader for its stream's group."""
        future = self.enqueue(key, command)
        # The request waits within its budget (application/waiting.py), not for as long as a
        # silent database holds the batch: at the bound it answers 503, and says whether its
        # command could still commit (a leader took it) or never will (still queued: removed).
        loop = asyncio.get_running_loop()
        with spending() as seconds:
            # A timer on the request's own future, not asyncio.timeout: the cheapest bound on
            # the path every append takes (the leader checks `done()` before it answers).
            timer = loop.call_later(seconds, expire, future)
            try:
                return await future
            except Expired:
                queued = self._queues.get(key)
                if queued is not None and self._unqueue(queued, future):
                    raise Unanswered("the database", seconds) from None
                raise Unanswered("the database", seconds, outcome_unknown=True) from None
            finally:
                timer.cancel()

    async def _lead(self, group: Hashable) -> None:
        ready = self._ready[group]
        try:
            while ready:
                large, small, heavy = self._take_batches(ready)
                if large:
                    self._commit_aside(large)
                if small:
                    if heavy:  # (only while a slot is free for it: `_take_batches`)
                        self._commit_aside(small)
                    else:
                        await self._commit(small)
                elif not large and ready and self._aside and not self._any_takeable(ready):
                    # (Nothing taken also when the streams it looked at had only expired
                    # requests: then others may be ready, and it looks again.) Every ready
                    # stream commits aside, or waits for a slot: an aside's end, a stream
                    # that needs none, or a large head expired wakes it (`_aside_done`).
                    self._aside_done.clear()
                    await self._aside_done.wait()
        finally:
            for key in ready:
                _fail(self._queues.pop(key, []), RuntimeError("the append leader stopped"))
            del self._ready[group]

    def _commit_aside(self, batch: _Batch) -> None:
        """Commit `batch` in a task of its own; its streams stay out of other batches until it
        ends (`_take_batches` passes them over)."""
        keys = [key for key, _ in batch]
        self._aside_streams.update(keys)

        def ended(task: asyncio.Task[None]) -> None:
            # A done callback, not the coroutine's `finally`: it runs for a task cancelled
            # before its first step too, and the task leaves `_aside` before the leader wakes
            # (else the leader counts an ended aside and leaves the next large batch waiting).
            self._aside.discard(task)
            self._aside_streams.difference_update(keys)
            if task.cancelled():  # a cancelled `_commit` answers all; unanswered: it never began
                for _, taken in batch:
                    _fail(taken, RuntimeError("the append leader stopped"))
            self._aside_done.set()

        task = asyncio.create_task(self._commit(batch), name="append-aside")
        self._aside.add(task)
        task.add_done_callback(ended)

    async def _commit(self, batch: _Batch) -> None:
        """One batch's transaction, and each request's answer."""
        try:
            if tracing.on():
                results = await self._traced_update(batch)
            else:
                results = await self._streams.update_many(
                    [(key, [p[0] for p in taken]) for key, taken in batch]
                )
        except BaseException as error:
            # Nothing of this batch was committed (or we cannot know): each request fails,
            # and an idempotency key makes its retry safe either way.
            for _, taken in batch:
                _fail(taken, error)
            if not isinstance(error, Exception):
                raise
            return
        for (_, taken), result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):  # that stream alone failed
                _fail(taken, result)
                continue
            self.throughput.committed([p[0] for p in taken], result)
            for pending, outcome in zip(taken, result, strict=True):
                future = pending[1]
                if not future.done():
                    future.set_result(outcome)

    async def _traced_update(self, batch: _Batch) -> list[list[Outcome] | Exception]:
        """The batch's commit as a span: a child of its first request's, linked to the others'
        (a batch commits several requests at once); each append's context is kept for the
        spans of its live delivery and dispatch."""
        contexts = [p[2] for _, taken in batch for p in taken]
        # Its records may be read and delivered (woken by the commit's notification) before
        # this task resumes to learn their sequences: until then they are these appends'.
        for key, taken in batch:
            tracing.APPENDS.committing(key, [p[2] for p in taken if p[2] is not None])
        try:
            with tracing.span(
                "group commit",
                parent=contexts[0],
                links=[c for c in contexts[1:] if c is not None],
                attributes={
                    "ductor_streams.commands": len(contexts),
                    "ductor_streams.streams": len(batch),
                },
            ):
                results = await self._streams.update_many(
                    [(key, [p[0] for p in taken]) for key, taken in batch]
                )
        finally:
            for key, _ in batch:
                tracing.APPENDS.committed(key)
        for (key, taken), result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                continue
            for pending, outcome in zip(taken, result, strict=True):
                context = pending[2]
                if context is not None and type(outcome) is Done:
                    for event in outcome.events:
                        if type(event) is RecordsAppended:
                            tracing.APPENDS.appended(
                                key, event.first_sequence, event.last_sequence, context
                            )
        return results

    def _large_head(self, queue: list[_Pending]) -> bool:
        """Whether this stream's next request is large by itself: it commits aside, its
        stream alone in its batch."""
        if not queue:
            return False
        head = queue[0]
        return head[3] >= self._aside_records or head[4] >= self._aside_bytes

    def _takeable(self, key: StreamKey, free: int) -> bool:
        """Whether the leader may take from this ready stream, with `free` aside slots: not
        while it commits aside, nor while its next request is large and no slot is free (an
        empty queue, its requests expired, is taken to be removed)."""
        if key in self._aside_streams:
            return False
        return free > 0 or not self._large_head(self._queues[key])

    def _any_takeable(self, ready: dict[StreamKey, None]) -> bool:
        free = self._max_aside - len(self._aside)
        return any(self._takeable(key, free) for key in ready)

    def _take_batches(self, ready: dict[StreamKey, None]) -> tuple[_Batch, _Batch, bool]:
        """Two batches from the oldest ready streams the leader may take (`_takeable`; at most
        `max_batch_streams` of them). The large one, only while an aside slot is free: the
        oldest of them whose next request is large, alone, with what follows that request on
        its stream within the batch's bounds on records and bytes. The small one: the others'
        small requests, each stream's from its oldest up to its first large one, within the
        batch's bounds while a slot would be left for it (and then whether it is heavy enough
        to commit aside: `aside_records`, `aside_bytes`), else below those thresholds, to
        commit in the leader's turn without keeping the other streams waiting long. A stream
        with requests left stays ready, in its place."""
        free = self._max_aside - len(self._aside)
        queues = self._queues
        candidates = (
            islice(ready, self._max_streams)
            if free > 0 and not self._aside_streams
            else islice((k for k in ready if self._takeable(k, free)), self._max_streams)
        )
        window = list(candidates)
        if self._deadlines:  # forwarded requests: those past their sender's wait are dropped
            for key in window:
                self._drop_late(queues[key])
                if not queues[key]:  # (emptied: no longer a stream with requests waiting)
                    del queues[key], ready[key]
            window = [key for key in window if key in queues]
        takes_large = free > 0 and any(self._large_head(queues[key]) for key in window)
        bounds = (
            (self._max_records, self._max_bytes)
            if free - (1 if takes_large else 0) > 0
            else (self._aside_records - 1, self._aside_bytes - 1)
        )
        budget = list(bounds)  # what is left of the small batch's bounds
        large: _Batch = []
        small: _Batch = []
        for key in window:
            queue = queues[key]
            if self._large_head(queue):
                if takes_large and not large:
                    whole = [self._max_records, self._max_bytes]
                    large.append((key, self._take(queue, whole, first=True, small_only=False)))
            elif budget[0] > 0 and budget[1] > 0:
                taken = self._take(queue, budget, first=not small, small_only=True)
                if taken:
                    small.append((key, taken))
            if not queue:
                del queues[key], ready[key]
            if (budget[0] <= 0 or budget[1] <= 0) and (large or not takes_large):
                break
        records, size = bounds[0] - budget[0], bounds[1] - budget[1]
        return large, small, records >= self._aside_records or size >= self._aside_bytes

    def _take(
        self, queue: list[_Pending], budget: list[int], first: bool, small_only: bool
    ) -> list[_Pending]:
        """What fits in `budget` (records, bytes) from the head of `queue`, up to its first
        large request if `small_only`; the batch's first request always fits, however large."""
        taken = 0
        for pending in queue:
            n, b = pending[3], pending[4]
            if small_only and (n >= self._aside_records or b >= self._aside_bytes):
                break
            if (taken or not first) and (n > budget[0] or b > budget[1]):
                break
            budget[0] -= n
            budget[1] -= b
            taken += 1
            first = False
        group = queue[:taken]
        del queue[:taken]
        return group

    async def drain(self) -> None:
        """Wait for every batch under way (used at shutdown)."""
        while self._leaders or self._aside:
            await asyncio.gather(*self._leaders, *self._aside, return_exceptions=True)


async def run_one(commits: GroupCommit, key: StreamKey, command: AnsweringCommand[T]) -> T:
    """Submit one command that is never replayed and return its answer (or raise its error)."""
    outcome = await commits.submit(key, command)
    if isinstance(outcome, Failed):
        raise outcome.error
    assert isinstance(outcome, Done)
    answer: T = outcome.answer  # what `command.answer` returned
    return answer
