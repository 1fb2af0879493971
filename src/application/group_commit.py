"""Group commit: append coalescing for every command on one stream.

Every append to a stream serializes on its row lock and each commit waits for a WAL flush, so a
handler that commits request by request is capped near 1 / (commit latency) per stream. Instead,
per process and per stream, requests queue here and one leader task takes everything queued,
decides each request in order under a single row lock, and commits them together: per-request
credit, receipts and sequences, one transaction, one flush. While it commits, new requests queue
for the next group, so groups grow exactly as fast as load does and a lone request waits for
nobody. The leader is a task of its own, not a request, so a client that hangs up mid-commit
cancels only its own wait, never the group's transaction.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, TypeVar

from application import tracing
from application.ports import AnsweringCommand, Command, Done, Failed, Outcome, StreamRepository
from application.throughput import Throughput
from application.waiting import Unanswered, spending
from domain.events import RecordsAppended
from domain.stream import StreamKey

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext

# A command, its request's future and (while tracing) the span context of its request.
_Pending = tuple[Command, asyncio.Future[Outcome], "SpanContext | None"]
T = TypeVar("T")


class _Expired(Exception):
    """A request's wait for its group reached its bound."""


def _expire(future: asyncio.Future[Outcome]) -> None:
    if not future.done():
        future.set_exception(_Expired())


class GroupCommit:
    def __init__(
        self,
        streams: StreamRepository,
        max_group_records: int = 20_000,
        max_group_bytes: int = 32 * 1024 * 1024,
        throughput: Throughput | None = None,
    ) -> None:
        self._streams = streams
        self.throughput = throughput or Throughput()
        self._max_records = max_group_records
        self._max_bytes = max_group_bytes
        self._queues: dict[StreamKey, list[_Pending]] = {}
        self._leaders: set[asyncio.Task[None]] = set()

    async def submit(self, key: StreamKey, command: Command) -> Outcome:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        queue = self._queues.get(key)
        pending = (command, future, tracing.current())
        if queue is not None:
            queue.append(pending)
        else:
            self._queues[key] = [pending]
            leader = asyncio.create_task(self._lead(key), name=f"append-leader {key}")
            self._leaders.add(leader)
            leader.add_done_callback(self._leaders.discard)
        # The request waits within its budget (application/waiting.py), not for as long as a
        # silent database holds the group: at the bound it answers 503, and says whether its
        # command could still commit (a leader took it) or never will (still queued: removed).
        loop = asyncio.get_running_loop()
        with spending() as seconds:
            # A timer on the request's own future, not asyncio.timeout: the cheapest bound on
            # the path every append takes (the leader checks `done()` before it answers).
            timer = loop.call_later(seconds, _expire, future)
            try:
                return await future
            except _Expired:
                queued = self._queues.get(key)
                if queued is not None:
                    for i, (_, waiting, _) in enumerate(queued):
                        if waiting is future:
                            del queued[i]
                            raise Unanswered("the database", seconds) from None
                raise Unanswered("the database", seconds, outcome_unknown=True) from None
            finally:
                timer.cancel()

    async def _lead(self, key: StreamKey) -> None:
        queue = self._queues[key]
        try:
            while queue:
                group = self._take(queue)
                commands = [c for c, _, _ in group]
                try:
                    if tracing.on():
                        outcomes = await self._traced_update(key, group)
                    else:
                        outcomes = await self._streams.update(key, commands)
                except BaseException as error:
                    # Nothing of this group was committed (or we cannot know): each request
                    # fails, and an idempotency key makes its retry safe either way.
                    for _, future, _ in group:
                        if not future.done():
                            future.set_exception(error)
                    if not isinstance(error, Exception):
                        raise
                    continue
                self.throughput.committed(commands, outcomes)
                for (_, future, _), outcome in zip(group, outcomes, strict=True):
                    if not future.done():
                        future.set_result(outcome)
        finally:
            for _, future, _ in queue:
                if not future.done():
                    future.set_exception(RuntimeError("the append leader stopped"))
            del self._queues[key]

    async def _traced_update(self, key: StreamKey, group: list[_Pending]) -> list[Outcome]:
        """The group's commit as a span: a child of its first request's, linked to the others'
        (a group commits several requests at once); each append's context is kept for the
        spans of its live delivery and dispatch."""
        contexts = [c for _, _, c in group]
        first = contexts[0]
        with tracing.span(
            "group commit",
            parent=first,
            links=[c for c in contexts[1:] if c is not None],
            attributes={"ductor_streams.commands": len(group)},
        ):
            outcomes = await self._streams.update(key, [c for c, _, _ in group])
        for context, outcome in zip(contexts, outcomes, strict=True):
            if context is not None and type(outcome) is Done:
                for event in outcome.events:
                    if type(event) is RecordsAppended:
                        tracing.APPENDS.appended(
                            key, event.first_sequence, event.last_sequence, context
                        )
        return outcomes

    def _take(self, queue: list[_Pending]) -> list[_Pending]:
        records = size = 0
        taken = 0
        for command, _, _ in queue:
            n = len(command.records)
            b = sum(r.size for r in command.records)
            if taken and (records + n > self._max_records or size + b > self._max_bytes):
                break
            records, size, taken = records + n, size + b, taken + 1
        group = queue[:taken]
        del queue[:taken]
        return group

    async def drain(self) -> None:
        """Wait for every group under way (used at shutdown)."""
        while self._leaders:
            await asyncio.gather(*list(self._leaders), return_exceptions=True)


async def run_one(commits: GroupCommit, key: StreamKey, command: AnsweringCommand[T]) -> T:
    """Submit one command that is never replayed and return its answer (or raise its error)."""
    outcome = await commits.submit(key, command)
    if isinstance(outcome, Failed):
        raise outcome.error
    assert isinstance(outcome, Done)
    answer: T = outcome.answer  # what `command.answer` returned
    return answer
