"""Counted once, where records commit: both surfaces and every way in (application/throughput.py),
and the database figures /metrics reports, read through the application's query at most once
per interval (application/figures.py)."""

from __future__ import annotations

import pytest

from application.figures import ReadFigures
from application.ports import Backlog, StoredFigures
from application.throughput import DURABLE_STREAMS, WORKFLOW_STREAMS
from entrypoints.container import memory_container, start, stop
from tests.unit.test_produce_use_cases import ALICE, resolved, text
from tests.unit.test_use_cases import data, request


@pytest.fixture
async def app():
    container = memory_container()
    services = await start(container)
    yield container, services
    await stop(container)


async def test_every_surface_and_way_in_is_counted_once(app) -> None:
    container, s = app
    throughput = container.throughput()
    await s.create_stream(ALICE, "r", request(b'{"direction":"output","stream_id":"n"}'))
    await s.append_records(ALICE, "r", "n", data(1, 2, 3))
    await s.append_records(ALICE, "r", "n", data(4), idempotency_key="k")
    await s.append_records(ALICE, "r", "n", data(4), idempotency_key="k")  # a replay: not again
    await s.create_stream.create_resolved(ALICE, "r", resolved("d"), initial=text(b"a", b"b"))
    await s.append_records.produce(ALICE, "r", "d", text(b"c"))
    await s.append_records.produce(ALICE, "r", "d", [], close=True)  # appends nothing
    assert throughput.counts == {
        (WORKFLOW_STREAMS, "append"): [2, 4],
        (DURABLE_STREAMS, "create"): [1, 2],
        (DURABLE_STREAMS, "append"): [1, 1],
    }
    assert throughput.records() == 7 and throughput.records(DURABLE_STREAMS) == 3


class Source:
    def __init__(self) -> None:
        self.reads = 0

    async def figures(self) -> StoredFigures:
        self.reads += 1
        return StoredFigures([Backlog("deletion", self.reads, 0.0)], {})


async def test_the_stored_figures_are_read_at_most_once_per_interval() -> None:
    now = [100.0]
    source = Source()
    figures = ReadFigures(source, every_seconds=5.0, monotonic=lambda: now[0])
    assert (await figures()).backlogs[0].pending == 1
    now[0] += 4.9
    assert (await figures()).backlogs[0].pending == 1 and source.reads == 1
    now[0] += 0.1
    assert (await figures()).backlogs[0].pending == 2


class Failing:
    def __init__(self) -> None:
        self.down = True

    async def figures(self) -> StoredFigures:
        if self.down:
            raise ConnectionRefusedError("the database is out of reach")
        return StoredFigures([], {"committed": 1})


async def test_figures_that_cannot_be_read_are_none_said_once_and_read_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    source = Failing()
    figures = ReadFigures(source, every_seconds=5.0, monotonic=lambda: now[0])
    caplog.set_level("WARNING", logger="ductor_streams.metrics")
    assert await figures() is None
    now[0] += 5
    assert await figures() is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "ConnectionRefusedError" in said[0]
    source.down = False
    now[0] += 5
    assert (await figures()).objects == {"committed": 1}  # type: ignore[union-attr]
    assert caplog.records[-1].getMessage() == "/metrics reads its database figures again"


async def test_the_memory_store_reports_its_figures(app) -> None:
    container, _ = app
    figures = await container.figures()()
    assert {b.outbox: b.pending for b in figures.backlogs} == {"input_delivery": 0, "deletion": 0}
    assert figures.objects == {}
