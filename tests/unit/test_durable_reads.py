"""Durable Streams reads on the memory adapters: long-polls wait on the shared tail, so the
records an append adds are read from storage the same number of times however many wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest

from application.tokens import make_caller
from domain.definition import DefinitionRequest, resolve_definition
from domain.records import NewRecord, RecordKind
from entrypoints.container import Services, memory_container, start, stop

CALLER = make_caller("t", "p", ["streams:read", "streams:write", "streams:admin"])


@pytest.fixture
async def services() -> AsyncIterator[Services]:
    container = memory_container()
    built = await start(container)
    yield built
    await stop(container)


def text(value: bytes) -> NewRecord:
    return NewRecord(RecordKind.BINARY, "text/plain", value, len(value))


async def create(services: Services, stream_id: str) -> None:
    base = resolve_definition(
        DefinitionRequest(direction="output", stream_id=stream_id),
        region="local",
        egress_region="local",
    )
    definition = msgspec.structs.replace(base, content_type="text/plain")
    await services.create_stream.create_resolved(CALLER, "r", definition)


class CountingPages:
    """Counts the pages read from storage (by anyone: tails, waits, catch-up)."""

    def __init__(self, streams: object) -> None:
        self.calls = 0
        page = streams.page  # type: ignore[attr-defined]

        async def counted(*args: object):  # type: ignore[no-untyped-def]
            self.calls += 1
            return await page(*args)

        streams.page = counted  # type: ignore[attr-defined]


async def pages_read_for_one_append(services: Services, stream_id: str, waiters: int) -> int:
    await create(services, stream_id)
    key, definition = await services.durable_reads.open(CALLER, "r", stream_id)
    counter = CountingPages(services.durable_reads._reader)  # type: ignore[attr-defined]
    waits = [
        asyncio.create_task(
            services.durable_reads.wait(key, 0, 10, caller=CALLER, definition=definition)
        )
        for _ in range(waiters)
    ]
    while (tail := services.durable_reads._tails.tail(key)) is None or tail.subscribers < waiters:  # type: ignore[attr-defined]
        await asyncio.sleep(0.01)
    await tail.ready.wait()
    before = counter.calls
    await services.append_records.produce(CALLER, "r", stream_id, [text(b"x")])
    results = await asyncio.gather(*waits)
    assert all([r.payload for r in w.records] == [b"x"] for w in results)
    return counter.calls - before


async def test_waiting_readers_share_one_read_per_append(services: Services) -> None:
    one = await pages_read_for_one_append(services, "one", 1)
    many = await pages_read_for_one_append(services, "many", 50)
    assert many == one >= 1


async def test_a_wait_ends_at_once_when_the_stream_closes(services: Services) -> None:
    await create(services, "closing")
    key, definition = await services.durable_reads.open(CALLER, "r", "closing")
    waiting = asyncio.create_task(
        services.durable_reads.wait(key, 0, 10, caller=CALLER, definition=definition)
    )
    await asyncio.sleep(0.05)
    await services.append_records.produce(CALLER, "r", "closing", [], close=True)
    waited = await asyncio.wait_for(waiting, 5)
    assert (waited.records, waited.closed, waited.head) == ([], True, 0)


async def test_a_wait_times_out_empty(services: Services) -> None:
    await create(services, "quiet")
    key, definition = await services.durable_reads.open(CALLER, "r", "quiet")
    waited = await services.durable_reads.wait(key, 0, 0.05, caller=CALLER, definition=definition)
    assert (waited.records, waited.closed) == ([], False)


async def test_a_long_poll_whose_database_does_not_answer_is_an_outage_not_up_to_date(
    services: Services,
) -> None:
    """`Unanswered` is a TimeoutError: the long-poll's own deadline must not take it for its
    own, and answer "nothing new" (204, up to date) while PostgreSQL was out of reach."""
    from application.waiting import Unanswered

    await create(services, "silent")
    key, definition = await services.durable_reads.open(CALLER, "r", "silent")
    tails = services.durable_reads._tails  # type: ignore[attr-defined]

    async def silent(*_: object, **__: object):  # type: ignore[no-untyped-def]
        raise Unanswered("the database", 5.0)
        yield  # an async generator

    tails.follow = silent
    with pytest.raises(Unanswered):
        await services.durable_reads.wait(key, 0, 10.0, caller=CALLER, definition=definition)


async def test_a_long_poll_checked_against_a_stream_since_replaced_is_not_found(
    services: Services,
) -> None:
    """The offset was checked against one incarnation of the stream; the tail follows another
    (deleted and created again meanwhile): the wait answers 404, never the other's records."""
    from datetime import UTC, datetime

    from application.errors import NotFound
    from domain.stream import StreamKey

    await create(services, "replaced")
    key, definition = await services.durable_reads.open(CALLER, "r", "replaced")
    assert isinstance(key, StreamKey)
    await services.append_records.produce(CALLER, "r", "replaced", [text(b"new")])
    long_ago = datetime(2000, 1, 1, tzinfo=UTC)
    with pytest.raises(NotFound):
        await services.durable_reads.wait(
            key, 0, 2.0, caller=CALLER, definition=definition, created_at=long_ago
        )
