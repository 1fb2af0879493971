"""The changes of one subscription in this process (adapters/postgres/subscriptions.py): one
at a time, each waiting for the others within its request's allowance, and a change given up
on as it commits said to have an unknown outcome."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from adapters.postgres.subscriptions import PostgresSubscriptions
from application import waiting
from application.subscriptions import Change


class Holding(PostgresSubscriptions):
    """Each change holds the subscription for as long as `hold` says (by its answer)."""

    def __init__(self, hold: dict[int, float]) -> None:
        super().__init__(pool=object())  # type: ignore[arg-type]
        self.hold = hold

    async def _update(self, tenant: str, subscription_id: str, decide: Any, *_: Any) -> Any:
        _, n = decide(None, {})
        await asyncio.sleep(self.hold.get(n, 0.0))
        return n


def answering(n: int) -> Any:
    return lambda sub, heads: (None, n)


async def test_a_change_arriving_as_the_subscription_is_handed_over_waits_within_its_bound() -> (
    None
):
    """A change made as the one before it ends, the next waiting one woken but not yet run (the
    lock is not `locked()` then), still waits within its allowance: it queued unbounded behind
    every waiting change, and then had its whole allowance for its transaction."""
    store = Holding({0: 0.1, 1: 2.0})

    async def second() -> int:
        with waiting.request_budget(5.0):
            return int(await store.update("t", "s", answering(1)))

    async def first_then_third() -> float:
        with waiting.request_budget(5.0):
            await store.update("t", "s", answering(0))
        with waiting.request_budget(0.3):  # made in the same turn of the loop
            started = time.monotonic()
            with pytest.raises(waiting.Unanswered):
                await store.update("t", "s", answering(2))
            return time.monotonic() - started

    first = asyncio.ensure_future(first_then_third())
    await asyncio.sleep(0.01)
    waiting_one = asyncio.ensure_future(second())
    took, answered = await asyncio.gather(first, waiting_one)
    assert took < 0.6, f"waited {took:.2f} s on an allowance of 0.3 s"
    assert answered == 1


class _Connection:
    async def fetchrow(self, *_: object) -> None:
        return None

    async def execute(self, *_: object) -> str:
        return "DELETE 1"

    @contextlib.asynccontextmanager
    async def transaction(self) -> Any:
        yield
        await asyncio.sleep(1.0)  # COMMIT sent; its answer slow to come


class _Pool:
    @contextlib.asynccontextmanager
    async def acquire(self) -> Any:
        yield _Connection()


async def test_a_change_given_up_on_as_it_commits_may_have_been_made() -> None:
    """Bounded, a change whose COMMIT went unanswered within the allowance says its outcome is
    unknown: a claim, a done or a release answered as a plain 503 is sent again by the client
    (nothing done), and finds itself made (409)."""
    store = PostgresSubscriptions(_Pool())  # type: ignore[arg-type]
    with waiting.request_budget(0.2), pytest.raises(waiting.Unanswered) as given_up:
        await store.update("t", "s", lambda sub, heads: (Change(None), True))
    assert given_up.value.outcome_unknown
