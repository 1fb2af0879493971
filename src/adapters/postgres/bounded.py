"""Every wait on PostgreSQL bounded where it is made (application/waiting.py says why).

`BoundedPool` stands in for the asyncpg pool: its statements (`fetch`, `execute`, …) each run as
a task of their own, awaited for at most the caller's allowance. At the bound the caller gets
`Unanswered` (503) at once; the task is cancelled and asyncpg cleans up behind it (its
cancellation request, and the connection terminated if that cannot be sent either), which on
a silent network takes as long again and is nobody's wait. `run` bounds a whole transaction
the same way, and tells a failure after COMMIT was sent (outcome unknown) from one before it.
Everything else (`acquire`, `close`, sizes) is the pool's own."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

import asyncpg

from application.waiting import CommitOutcomeUnknown, Unanswered, spending, watching_commit

T = TypeVar("T")

# A server's answer that the commit failed: then nothing was committed, and saying so is safe.
_REFUSED = asyncpg.PostgresError


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # given up on: its error (if any) was already answered as a timeout


async def bounded(
    operation: Coroutine[Any, Any, T], what: str = "the database", seconds: float | None = None
) -> T:
    """Run `operation`, waiting at most the current allowance (and `seconds`); at the bound stop
    waiting (the operation is cancelled and cleans up in the background), raise Unanswered."""
    context = contextvars.copy_context()
    commit = watching_commit(context)
    loop = asyncio.get_running_loop()
    task = loop.create_task(operation, context=context)
    # One future woken by whichever comes first, the task's end or the bound: lighter than
    # asyncio.wait's sets and callbacks on a path every read takes.
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    task.add_done_callback(wake)
    with spending() as allowed:
        if seconds is None or allowed < seconds:
            seconds = allowed
        timer = loop.call_later(seconds, wake)
        try:
            await waiter
        except asyncio.CancelledError:
            task.cancel()
            task.add_done_callback(_retrieve)
            raise
        finally:
            timer.cancel()
    if not task.done():
        task.cancel()
        task.add_done_callback(_retrieve)
        raise Unanswered(what, seconds, outcome_unknown=commit.sent)
    error = task.exception()
    if error is None:
        return task.result()
    if commit.sent and not isinstance(error, _REFUSED):
        raise CommitOutcomeUnknown(f"the connection failed during COMMIT ({error})") from error
    raise error


class BoundedPool:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)

    async def run(self, operation: Coroutine[Any, Any, T]) -> T:
        return await bounded(operation)

    async def execute(self, query: str, *args: object, **kwargs: Any) -> str:
        return await bounded(self.pool.execute(query, *args, **kwargs))

    async def executemany(self, query: str, args: Any, **kwargs: Any) -> None:
        return await bounded(self.pool.executemany(query, args, **kwargs))

    async def fetch(self, query: str, *args: object, **kwargs: Any) -> list[asyncpg.Record]:
        return await bounded(self.pool.fetch(query, *args, **kwargs))

    async def fetchrow(self, query: str, *args: object, **kwargs: Any) -> asyncpg.Record | None:
        return await bounded(self.pool.fetchrow(query, *args, **kwargs))

    async def fetchval(self, query: str, *args: object, **kwargs: Any) -> Any:
        return await bounded(self.pool.fetchval(query, *args, **kwargs))
