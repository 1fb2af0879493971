"""The contract every workflow wait service adapter is held to, with the real dispatcher.

A subclass provides the fixture `harness` (a `WaitServiceHarness`): the adapter under test, what
the other side really holds (counted there, duplicates included, in the order it took them),
a way to make it refuse for a while as an outage would, and an adapter whose every event is
refused as a misconfiguration would be. The records come from the memory stream adapter; the
dispatch, its ordering and its retries are the application's own (`Dispatch`, `Worker`)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import msgspec

from application.access import Caller
from application.input_delivery import Dispatch, WaitService, event_id
from application.workers import Worker
from domain.definition import DefinitionRequest
from domain.records import RecordInput
from domain.stream import StreamKey
from entrypoints.container import memory_container, provided, start, stop

TENANT = "acme"
CALLER = Caller(tenant=TENANT, principal="p", scopes=frozenset({"streams:read", "streams:write"}))


class WaitServiceHarness(Protocol):
    service: WaitService  # the adapter under test, working
    refusing: WaitService  # the same adapter, configured so that every event is refused

    async def prepare(self, run_id: str, stream_ids: list[str]) -> None:
        """Whatever the other side needs before events for the run arrive (a workflow)."""

    async def received(self, run_id: str, stream_id: str) -> list[int]:
        """The sequences the other side holds for the stream, in the order it took them."""

    def outage(self) -> contextlib.AbstractAsyncContextManager[None]:
        """While inside, every publish of `service` fails as when the other side is down."""


class Pipeline:
    def __init__(self, container, services, service: WaitService, deliveries, streams) -> None:
        self.container, self.services = container, services
        self.deliveries = deliveries
        self.dispatch = Dispatch(streams, streams, service, self.deliveries, 0.02)

    @classmethod
    async def of(cls, container, services, service: WaitService) -> Pipeline:
        deliveries = await provided(container.input_deliveries)
        return cls(container, services, service, deliveries, await provided(container.streams))

    async def input(self, run_id: str, stream_id: str) -> None:
        request = msgspec.convert({"direction": "input", "stream_id": stream_id}, DefinitionRequest)
        await self.services.create_stream(CALLER, run_id, request)

    async def append(self, run_id: str, stream_id: str, *values: object) -> None:
        records = [RecordInput(data=msgspec.Raw(msgspec.json.encode(v))) for v in values]
        await self.services.append_records(CALLER, run_id, stream_id, records)

    async def status(self, run_id: str, stream_id: str):
        return await self.deliveries.status(StreamKey(TENANT, run_id, stream_id))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Worker]:
        worker = Worker(
            "dispatcher",
            self.deliveries,
            self.dispatch.run_job,
            0.01,
            retry_base_seconds=0.02,
            concurrency=4,
        )
        stopping = asyncio.Event()
        task = asyncio.ensure_future(worker.run(stopping))
        try:
            yield worker
        finally:
            stopping.set()
            await task


async def eventually(check: Callable[[], object], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():  # type: ignore[misc]
            await asyncio.sleep(0.05)


class WaitServiceContract:
    @contextlib.asynccontextmanager
    async def pipeline(self, service: WaitService, harness: Any = None) -> AsyncIterator[Pipeline]:
        """The streams on the memory adapters, or where the harness keeps them (a wait service
        in the service's own database hands over the records of the streams it finds there)."""
        make = getattr(harness, "container", None)
        container = make() if make is not None else memory_container()
        services = await start(container)
        try:
            yield await Pipeline.of(container, services, service)
        finally:
            await stop(container)

    async def test_each_streams_records_arrive_once_in_sequence_order(self, harness) -> None:
        run_id = "run-" + secrets.token_hex(4)
        await harness.prepare(run_id, ["a", "b"])
        async with self.pipeline(harness.service, harness) as p:
            await p.input(run_id, "a")
            await p.input(run_id, "b")
            for i in range(4):
                await p.append(run_id, "a", *range(i * 5, i * 5 + 5))
                await p.append(run_id, "b", i)
            async with p.running():

                async def delivered() -> bool:
                    a = await harness.received(run_id, "a")
                    b = await harness.received(run_id, "b")
                    return len(a) >= 20 and len(b) >= 4

                await eventually(delivered)
            assert await harness.received(run_id, "a") == list(range(1, 21))
            assert await harness.received(run_id, "b") == [1, 2, 3, 4]
            status = await p.status(run_id, "a")
            assert (status.delivered_through, status.pending, status.last_error) == (20, 0, None)

    async def test_an_event_published_again_is_accepted_and_held_once(self, harness) -> None:
        run_id = "run-" + secrets.token_hex(4)
        await harness.prepare(run_id, ["a"])
        key = StreamKey(TENANT, run_id, "a")
        event = msgspec.json.encode(
            {
                "id": event_id(key, 1),
                "tenant": TENANT,
                "run_id": run_id,
                "stream_id": "a",
                "sequence": 1,
                "content_type": "application/json",
                "record": {"sequence": 1, "data": "x"},
            }
        )
        for _ in range(3):  # a lost answer, a second worker: the same id each time
            await harness.service.publish(event_id(key, 1), event)
        await asyncio.sleep(0.3)
        assert await harness.received(run_id, "a") == [1]

    async def test_an_outage_is_retried_with_backoff_and_loses_nothing(self, harness) -> None:
        run_id = "run-" + secrets.token_hex(4)
        await harness.prepare(run_id, ["a"])
        async with self.pipeline(harness.service, harness) as p:
            await p.input(run_id, "a")
            await p.append(run_id, "a", 1, 2, 3)
            outage = harness.outage()
            await outage.__aenter__()  # down before the dispatcher starts
            async with p.running() as worker:
                try:

                    async def failing() -> bool:
                        return (await p.status(run_id, "a")).last_error is not None

                    await eventually(failing)
                    status = await p.status(run_id, "a")
                    assert status.pending == 3 and status.delivered_through == 0
                    await asyncio.sleep(0.3)
                    assert worker.failures >= 2  # retried, not given up on
                finally:
                    await outage.__aexit__(None, None, None)
                await p.append(run_id, "a", 4)

                async def resumed() -> bool:
                    return len(await harness.received(run_id, "a")) >= 4

                await eventually(resumed)
            assert await harness.received(run_id, "a") == [1, 2, 3, 4]
            status = await p.status(run_id, "a")
            assert (status.delivered_through, status.pending, status.last_error) == (4, 0, None)

    async def test_a_refusal_is_the_deliverys_last_error_and_never_dropped(self, harness) -> None:
        run_id = "run-" + secrets.token_hex(4)
        await harness.prepare(run_id, ["a"])
        async with self.pipeline(harness.refusing, harness) as p:
            await p.input(run_id, "a")
            await p.append(run_id, "a", 1, 2)
            async with p.running():

                async def refused() -> bool:
                    return (await p.status(run_id, "a")).last_error is not None

                await eventually(refused)
            status = await p.status(run_id, "a")
            assert status.pending == 2 and status.delivered_through == 0
            assert status.last_error
            assert await harness.received(run_id, "a") == []
