"""Bounded waits (application/waiting.py, adapters/postgres/bounded.py): a silent backing
service costs a request its budget, never more, and a write given up after its COMMIT was sent
is reported as of unknown outcome, never as failed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from adapters.memory.streams import MemoryStreams
from adapters.postgres.bounded import bounded
from application import waiting
from application.group_commit import GroupCommit
from application.ports import Command, Outcome
from application.waiting import CommitOutcomeUnknown, Unanswered, committing, request_budget
from domain.stream import StreamKey
from tests.support.builders import NOW, append, definition, new_key


async def silent() -> None:
    await asyncio.sleep(3600)


async def test_an_operation_that_never_answers_costs_the_bound_and_is_left_to_clean_up() -> None:
    cleaned = asyncio.Event()

    async def hangs_then_cleans_up() -> None:
        try:
            await silent()
        finally:
            cleaned.set()

    started = time.monotonic()
    with request_budget(0.2), pytest.raises(Unanswered) as raised:
        await bounded(hangs_then_cleans_up())
    assert 0.15 < time.monotonic() - started < 0.5
    assert not raised.value.outcome_unknown
    await asyncio.wait_for(cleaned.wait(), 1)


async def test_a_requests_waits_together_spend_one_budget() -> None:
    async def takes(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "answered"

    with request_budget(0.5) as budget:
        assert await bounded(takes(0.3)) == "answered"
        assert budget.left < 0.25
        started = time.monotonic()
        with pytest.raises(Unanswered):
            await bounded(takes(0.3))  # fits the bound, not what is left of the budget
        assert time.monotonic() - started < 0.3


async def test_a_task_the_request_starts_waits_the_bound_not_the_requests_budget() -> None:
    async def later() -> float:
        await asyncio.sleep(0.2)  # the request's budget is spent by now
        return waiting.allowance()

    with request_budget(0.1):
        background = asyncio.create_task(later())
        assert await background == waiting.bound()


async def test_a_write_that_hangs_after_commit_was_sent_is_of_unknown_outcome() -> None:
    async def commit_unanswered() -> None:
        committing()
        await silent()

    with request_budget(0.2), pytest.raises(Unanswered) as raised:
        await bounded(commit_unanswered())
    assert raised.value.outcome_unknown
    assert "may have been committed" in str(raised.value)


async def test_a_connection_lost_during_commit_is_of_unknown_outcome_and_before_it_is_not() -> None:
    async def lost(after_commit: bool) -> None:
        if after_commit:
            committing()
        raise ConnectionResetError("the server closed the connection")

    with pytest.raises(CommitOutcomeUnknown):
        await bounded(lost(after_commit=True))
    with pytest.raises(ConnectionResetError) as raised:
        await bounded(lost(after_commit=False))
    assert not isinstance(raised.value, CommitOutcomeUnknown)


async def test_a_lost_connection_raised_as_a_server_error_during_commit_is_of_unknown_outcome() -> (
    None
):
    """asyncpg raises a connection closed under a statement, and the server's shutdown, as
    PostgresErrors: during COMMIT they say nothing of whether it committed (a batch taken for
    refused would be committed again stream by stream: its appends twice)."""
    import asyncpg

    lost = (
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator"),
    )
    for error in lost:

        async def failing(after_commit: bool, error: Exception = error) -> None:
            if after_commit:
                committing()
            raise error

        with pytest.raises(CommitOutcomeUnknown):
            await bounded(failing(after_commit=True))
        with pytest.raises(type(error)):
            await bounded(failing(after_commit=False))

    async def refused() -> None:  # the server's answer to COMMIT: nothing was committed
        committing()
        raise asyncpg.SerializationError("could not serialize access")

    with pytest.raises(asyncpg.SerializationError):
        await bounded(refused())


class StuckStreams(MemoryStreams):
    """The first transaction hangs (its connection went silent) until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.groups: list[int] = []

    async def update(self, key: StreamKey, commands: Sequence[Command]) -> list[Outcome]:
        self.groups.append(len(commands))
        if len(self.groups) == 1:
            await self.release.wait()
        return await super().update(key, commands)


async def test_an_append_queued_behind_a_stuck_group_is_withdrawn_at_its_bound() -> None:
    streams = StuckStreams()
    key = new_key()
    await streams.create(key, definition(), NOW)
    commits = GroupCommit(streams)

    async def submit() -> BaseException | Outcome:
        with request_budget(0.2):
            try:
                return await commits.submit(key, append())
            except Unanswered as error:
                return error

    committing_one = asyncio.create_task(submit())
    await asyncio.sleep(0.01)  # the leader has taken it: its transaction is under way
    queued = asyncio.create_task(submit())
    first, second = await asyncio.gather(committing_one, queued)
    assert isinstance(first, Unanswered) and first.outcome_unknown  # it may still commit
    assert isinstance(second, Unanswered) and not second.outcome_unknown  # it never will
    streams.release.set()
    await commits.drain()
    assert streams.groups == [1]  # the withdrawn append was never part of a group
    stream = await streams.load(key)
    assert stream is not None and stream.state.head == 1


async def test_a_run_deletion_ended_as_a_deadlock_is_tried_again_then_unanswered() -> None:
    """PostgreSQL ends one side of a deadlock by rolling it back: nothing of the deletion
    happened, so it is tried again (a 500 before), and after its tries it is an outage (503)."""
    import asyncpg

    from adapters.postgres.streams import DEADLOCK_TRIES, PostgresStreams
    from domain.stream import StreamKey

    tries = 0

    async def deadlocked_once(tenant, run_id, now, check):
        nonlocal tries
        tries += 1
        if tries == 1:
            raise asyncpg.DeadlockDetectedError("deadlock detected")
        return [StreamKey(tenant, run_id, "s")]

    streams = PostgresStreams.__new__(PostgresStreams)
    streams._delete_run = deadlocked_once  # type: ignore[method-assign]
    assert await streams.delete_run("t", "r", None) == [StreamKey("t", "r", "s")]  # type: ignore[arg-type]
    assert tries == 2

    async def always(tenant, run_id, now, check):
        raise asyncpg.DeadlockDetectedError("deadlock detected")

    streams._delete_run = always  # type: ignore[method-assign]
    with pytest.raises(Unanswered):
        await streams.delete_run("t", "r", None)  # type: ignore[arg-type]
    assert DEADLOCK_TRIES >= 2
