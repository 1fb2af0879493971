"""Every wait on PostgreSQL bounded where it is made (application/waiting.py says why).

`BoundedPool` stands in for the asyncpg pool: its statements (`fetch`, `execute`, …) each run as
a task of their own, awaited for at most the caller's allowance. At the bound the caller gets
`Unanswered` (503) at once; the task is cancelled and asyncpg cleans up behind it (its
cancellation request, and the connection terminated if that cannot be sent either), which on
a silent network takes as long again and is nobody's wait. `run` bounds a whole transaction
the same way, and tells a failure after COMMIT was sent (outcome unknown) from one before it.
Everything else (`acquire`, `close`, sizes) is the pool's own.

It also keeps each tenant to its share of the pool's connections (`TenantShares`): a statement
of a task acting for a tenant (application/waiting.py) first takes one of that tenant's
places, waiting for it within the same allowance. A thousand long-polls of one tenant woken at
once, or a burst of subscriptions, then queue behind each other on their tenant's places while
the rest of the pool serves the other tenants, the append leaders and the workers (which act
for none)."""

from __future__ import annotations

import asyncio
import contextvars
import traceback
from collections.abc import Coroutine
from typing import Any, TypeVar

import asyncpg

from application.waiting import (
    CommitOutcomeUnknown,
    Unanswered,
    acting_for,
    spending,
    watching_commit,
    within_allowance,
)

T = TypeVar("T")

# Marks an OSError the driver raised (while connecting: a refused TCP port, or the Unix socket
# file a stopped server removed), for `raised_by_driver`.
DRIVER_NOTE = "ductor-streams: raised by the PostgreSQL driver"


def raised_by_driver(error: BaseException) -> bool:
    """Whether the error was raised inside the PostgreSQL driver, not by code of ours: marked
    so by `bounded`, or with the driver's frames in its traceback. The mark is what holds when
    one lookup's failure is awaited by many requests: a failed future awaited again hands the
    later ones a traceback without the frames it was raised in (a token's lookup shared by the
    requests it came for answered them 500 while PostgreSQL restarted)."""
    if DRIVER_NOTE in getattr(error, "__notes__", ()):
        return True
    return any(
        frame.f_globals.get("__name__", "").startswith("asyncpg.")
        for frame, _ in traceback.walk_tb(error.__traceback__)
    )


# A server's answer that the commit failed: then nothing was committed, and saying so is safe.
_REFUSED = asyncpg.PostgresError
# ... but not these, though asyncpg raises them as PostgresErrors: the connection was lost
# (class 08: asyncpg's ConnectionDoesNotExistError when it closes under a statement) or the
# server was shut down (57P01, 57P02), which may have happened after the commit was flushed.
_LOST = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
)


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
    if commit.sent and (not isinstance(error, _REFUSED) or isinstance(error, _LOST)):
        raise CommitOutcomeUnknown(f"the connection failed during COMMIT ({error})") from error
    marked = DRIVER_NOTE in getattr(error, "__notes__", ())
    if isinstance(error, OSError) and not marked and raised_by_driver(error):
        error.add_note(DRIVER_NOTE)  # (kept however the error is awaited from here on)
    raise error


class TenantShares:
    """Per tenant, how many of its statements may be on the pool's connections at once (its
    places); the tenants with none taken or awaited are not kept."""

    def __init__(self, places: int) -> None:
        self.places = places
        self._gates: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}
        self.waited = 0  # statements that waited for their tenant's place (/metrics)

    async def take(self) -> tuple[str, asyncio.Semaphore, list[int]] | None:
        tenant = acting_for()
        if tenant is None:
            return None
        gate = self._gates.get(tenant)
        if gate is None:
            gate = self._gates[tenant] = (asyncio.Semaphore(self.places), [0])
        semaphore, users = gate
        users[0] += 1
        try:
            if semaphore.locked():
                self.waited += 1
                await within_allowance(
                    semaphore.acquire(), "the database (this tenant's share of its connections)"
                )
            else:
                await semaphore.acquire()  # at once
        except BaseException:
            self._left(tenant, users)
            raise
        return tenant, semaphore, users

    def give_back(self, taken: tuple[str, asyncio.Semaphore, list[int]] | None) -> None:
        if taken is not None:
            tenant, semaphore, users = taken
            semaphore.release()
            self._left(tenant, users)

    def _left(self, tenant: str, users: list[int]) -> None:
        users[0] -= 1
        if not users[0]:
            del self._gates[tenant]


class BoundedPool:
    def __init__(self, pool: asyncpg.Pool, shares: TenantShares | None = None) -> None:
        self.pool = pool
        self.shares = shares

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)

    async def _bounded(self, operation: Coroutine[Any, Any, T]) -> T:
        if self.shares is None:
            return await bounded(operation)
        try:
            taken = await self.shares.take()
        except BaseException:
            operation.close()  # never started
            raise
        try:
            return await bounded(operation)
        finally:
            self.shares.give_back(taken)

    async def run(self, operation: Coroutine[Any, Any, T]) -> T:
        return await self._bounded(operation)

    async def execute(self, query: str, *args: object, **kwargs: Any) -> str:
        return await self._bounded(self.pool.execute(query, *args, **kwargs))

    async def executemany(self, query: str, args: Any, **kwargs: Any) -> None:
        return await self._bounded(self.pool.executemany(query, args, **kwargs))

    async def fetch(self, query: str, *args: object, **kwargs: Any) -> list[asyncpg.Record]:
        return await self._bounded(self.pool.fetch(query, *args, **kwargs))

    async def fetchrow(self, query: str, *args: object, **kwargs: Any) -> asyncpg.Record | None:
        return await self._bounded(self.pool.fetchrow(query, *args, **kwargs))

    async def fetchval(self, query: str, *args: object, **kwargs: Any) -> Any:
        return await self._bounded(self.pool.fetchval(query, *args, **kwargs))


async def bounded_on(pool: object, operation: Coroutine[Any, Any, T]) -> T:
    """`operation`, a whole transaction on a connection it takes from `pool`, bounded as the
    pool's statements are: within the current allowance, and within the acting tenant's share
    of the connections where `pool` keeps shares (a `BoundedPool`; a bare asyncpg pool, as
    some tests make, keeps none). Without it, a transaction on a silent network waited for
    the driver's statement timeout at each of its statements: a stream's document took 20 s
    to answer 503."""
    if isinstance(pool, BoundedPool):
        return await pool.run(operation)
    return await bounded(operation)
