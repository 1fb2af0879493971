"""Requests of one kind waiting at once, done together: one leader per commit group takes every
one waiting and hands them to one function (one transaction), and each request gets its own
answer. What arrives meanwhile waits for the next turn, so turns grow exactly as fast as load
does, and a lone request waits for nobody. Stream creations (adapters/postgres/creations.py)
and run deletions (adapters/postgres/streams.py) are done so.

- **One item per key in a turn.** A second request for a key already taken (the same stream
  created twice, the same run deleted twice) waits for the next turn, where it meets the first
  one's result.
- **Bounded.** A request waits within its allowance (application/waiting.py): still queued at
  the bound, it is withdrawn (503, nothing done); taken into a turn, it answers 503 "may have
  been done". The turn itself runs within the default bound, as the append leader's does. A
  request whose caller gave up (cancelled) is not taken.
- **Answers, not raises.** The function answers each item's result or error; if it raises, that
  error is every item's of the turn. The leader itself never raises but for its cancellation
  (the process stopping), which answers its items 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

from application.waiting import Expired, Unanswered, expire, spending

T = TypeVar("T")
R = TypeVar("R")


class Together(Generic[T, R]):
    """The items waiting per commit group, and each group's leader while it has any."""

    def __init__(
        self,
        do: Callable[[list[T]], Awaitable[Sequence[R | BaseException]]],
        key_of: Callable[[T], Hashable],
        group_of: Callable[[T], Hashable],
        name: str,
        most: int = 256,
        weigh: Callable[[T], int] | None = None,
        most_weight: int = 0,
    ) -> None:
        # `do(items)`: one result or error per item, in their order. A turn takes at most `most`
        # items and, with `weigh`, at most `most_weight` of their weights (at least one item).
        self._do = do
        self._key_of = key_of
        self._group_of = group_of
        self._name = name
        self._most = most
        self._weigh = weigh
        self._most_weight = most_weight
        self._waiting: dict[Hashable, list[tuple[T, asyncio.Future[R]]]] = {}
        self._leaders: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> R:
        """`item`'s result from the turn that took it (or its error, raised)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        group = self._group_of(item)
        waiting = self._waiting.get(group)
        entry = (item, future)
        if waiting is not None:
            waiting.append(entry)
        else:
            self._waiting[group] = [entry]
            leader = asyncio.create_task(self._lead(group), name=f"{self._name} {group}")
            self._leaders.add(leader)
            leader.add_done_callback(self._leaders.discard)
        with spending() as seconds:
            timer = loop.call_later(seconds, expire, future)
            try:
                return await future
            except Expired:
                queued = self._waiting.get(group, [])
                if entry in queued:
                    queued.remove(entry)
                    raise Unanswered("the database", seconds) from None
                raise Unanswered("the database", seconds, outcome_unknown=True) from None
            finally:
                timer.cancel()

    async def _lead(self, group: Hashable) -> None:
        waiting = self._waiting[group]
        try:
            while waiting:
                taken: list[tuple[T, asyncio.Future[R]]] = []
                left: list[tuple[T, asyncio.Future[R]]] = []
                keys: set[Hashable] = set()
                weight = 0
                for entry in waiting:
                    if entry[1].done():  # its request gave up (cancelled): nothing to do
                        continue
                    key = self._key_of(entry[0])
                    more = 0 if self._weigh is None else self._weigh(entry[0])
                    full = len(taken) == self._most or (taken and weight + more > self._most_weight)
                    if full or key in keys:
                        left.append(entry)  # the next turn's
                    else:
                        keys.add(key)
                        weight += more
                        taken.append(entry)
                waiting[:] = left  # the same list: `submit` appends to it meanwhile
                if taken:
                    await self._turn(taken)
        finally:
            del self._waiting[group]
            # Only if the leader itself was cancelled (the process stopping): nothing of these
            # was tried.
            _fail(waiting, Unanswered("the database", 0.0))

    async def _turn(self, taken: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._do([item for item, _ in taken])
        except asyncio.CancelledError:
            _fail(taken, Unanswered("the database", 0.0, outcome_unknown=True))
            raise
        except Exception as error:
            _fail(taken, error)
            return
        for (_, future), result in zip(taken, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)


def _fail(taken: Sequence[tuple[object, asyncio.Future[R]]], error: BaseException) -> None:
    for _, future in taken:
        if not future.done():
            future.set_exception(error)
