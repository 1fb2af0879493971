"""Input streams on the memory adapters: delivery rows, ordered dispatch, retries."""

from __future__ import annotations

import asyncio
from datetime import datetime

import msgspec
import pytest

from application.access import Caller
from application.input_delivery import PublishFailed
from application.workers import Worker
from domain.definition import DefinitionRequest
from domain.records import RecordInput
from entrypoints.container import memory_container, start, stop

ALICE = Caller(
    tenant="acme", principal="alice", scopes=frozenset({"streams:read", "streams:write"})
)


def data(*values: object) -> list[RecordInput]:
    return [RecordInput(data=msgspec.Raw(msgspec.json.encode(v))) for v in values]


class Flaky:
    """Refuses every other publish, as a wait service under load might."""

    def __init__(self) -> None:
        self.accepted: list[str] = []
        self.calls = 0

    async def publish(
        self, event_id: str, event: bytes, *, stream_created_at: datetime | None = None
    ) -> None:
        self.calls += 1
        if self.calls % 2:
            raise PublishFailed("busy", retry_in=0.0)
        self.accepted.append(event_id)


@pytest.fixture
async def app():
    container = memory_container()
    services = await start(container)
    yield container, services
    await stop(container)


async def create(services, stream_id: str, direction: str) -> None:
    request = msgspec.convert({"direction": direction, "stream_id": stream_id}, DefinitionRequest)
    await services.create_stream(ALICE, "r", request)


async def drain(worker: Worker, until) -> None:
    stopping = asyncio.Event()
    task = asyncio.ensure_future(worker.run(stopping))
    async with asyncio.timeout(5):
        while not until():
            await asyncio.sleep(0.01)
    stopping.set()
    await task


async def test_every_input_record_is_published_once_in_order_with_its_event_id(app) -> None:
    container, s = app
    await create(s, "in", "input")
    await s.append_records(ALICE, "r", "in", data("a", "b"))
    await s.append_records(ALICE, "r", "in", data("c"))
    service = container.wait_service()
    dispatch = container.dispatch()
    worker = Worker("dispatcher", container.input_deliveries(), dispatch.run_job, 0.01)
    await drain(worker, lambda: len(service.events) == 3)
    assert list(service.events) == [f"wds:acme:r:in:{n}" for n in (1, 2, 3)]
    first = service.events["wds:acme:r:in:1"]
    assert first["record"]["data"] == "a" and first["sequence"] == 1
    status = (await s.get_stream(ALICE, "r", "in")).state.input_delivery
    assert (status.delivered_through, status.pending, status.last_error) == (3, 0, None)


async def test_a_refused_publish_is_retried_and_never_overtaken(app) -> None:
    container, s = app
    await create(s, "in", "input")
    await s.append_records(ALICE, "r", "in", data(1, 2, 3, 4))
    flaky = Flaky()
    container.dispatch().__init__(
        container.streams(), container.streams(), flaky, container.input_deliveries(), 0.0
    )
    worker = Worker("dispatcher", container.input_deliveries(), container.dispatch().run_job, 0.01)
    await drain(worker, lambda: len(flaky.accepted) == 4)
    assert flaky.accepted == [f"wds:acme:r:in:{n}" for n in (1, 2, 3, 4)]
    assert flaky.calls == 8


async def test_output_streams_create_no_delivery_rows(app) -> None:
    container, s = app
    await create(s, "out", "output")
    await s.append_records(ALICE, "r", "out", data(1, 2))
    assert container.streams().deliveries == {}
    document = await s.get_stream(ALICE, "r", "out")
    assert b"input_delivery" not in msgspec.json.encode(document)


async def test_a_claim_takes_turns_across_tenants_and_counts_what_a_tenant_holds(app) -> None:
    """As on PostgreSQL: key order alone would give the tenant whose name sorts first every
    slot while its backlog lasts."""
    container, s = app
    zeta = Caller(tenant="zeta", principal="zed", scopes=ALICE.scopes)
    for n in range(6):
        await create(s, f"in{n}", "input")
        await s.append_records(ALICE, "r", f"in{n}", data(1, 2))
    deliveries = container.input_deliveries()
    held = await deliveries.claim(3)
    assert [job.key.stream_id for job in held] == ["in0", "in1", "in2"]
    request = msgspec.convert({"direction": "input", "stream_id": "in"}, DefinitionRequest)
    await s.create_stream(zeta, "r", request)
    await s.append_records(zeta, "r", "in", data(1))
    jobs = await deliveries.claim(2)
    assert [(job.key.tenant, job.key.stream_id) for job in jobs] == [
        ("zeta", "in"),
        ("acme", "in3"),
    ]


async def test_a_stream_handed_back_after_its_batch_goes_to_the_back_of_its_tenants_turns(
    app,
) -> None:
    container, s = app
    for n in range(3):
        await create(s, f"in{n}", "input")
        await s.append_records(ALICE, "r", f"in{n}", data(1, 2, 3))
    deliveries = container.input_deliveries()
    [first] = await deliveries.claim(1)
    await deliveries.done(first, None)
    assert [job.key.stream_id for job in await deliveries.claim(3)] == ["in1", "in2", "in0"]
