"""Every wait service adapter against the one contract: PostgreSQL, HTTP, DBOS, Restate.

What each side holds is read there: the events table, the HTTP stub's first acceptances,
DBOS's notifications (with the millisecond DBOS orders them by, which must never tie within a
stream), Restate's invocation table."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest

from adapters.wait_service.dbos import DbosWaitService
from adapters.wait_service.http import HttpWaitService
from adapters.wait_service.postgres import PostgresWaitService
from adapters.wait_service.restate import RestateWaitService
from adapters.wait_service.templates import Names
from application.input_delivery import event_id
from domain.stream import StreamKey
from entrypoints.config import Settings
from entrypoints.container import Container
from tests.support.engines import RestateServer, dbos_app, restate_service, restate_time
from tests.support.postgres import with_database
from tests.support.server import free_port
from tests.support.wait_service_contract import TENANT, WaitServiceContract
from tests.support.wait_stub import WaitServiceStub


class PostgresHarness:
    def __init__(self, pool: asyncpg.Pool, bare: asyncpg.Pool, url: str) -> None:
        self._url = url
        self.service = PostgresWaitService(pool)
        self.refusing = PostgresWaitService(bare)  # a database without the events table
        self._pool = pool

    async def prepare(self, run_id: str, stream_ids: list[str]) -> None:
        pass

    def container(self) -> Container:
        """The streams in the same database: the events land while their streams are there."""
        return Container(settings=Settings(database_url=self._url, pool_min_size=1))

    async def received(self, run_id: str, stream_id: str) -> list[int]:
        rows = await self._pool.fetch(
            "SELECT sequence FROM workflow_wait_events WHERE tenant = $1 AND run_id = $2 "
            "AND stream_id = $3 ORDER BY accepted_at, sequence",
            TENANT,
            run_id,
            stream_id,
        )
        return [r["sequence"] for r in rows]

    @contextlib.asynccontextmanager
    async def outage(self) -> AsyncIterator[None]:
        closed = await asyncpg.create_pool(self._url, min_size=0, max_size=1)
        await closed.close()
        self.service._pool = closed  # every statement: "pool is closed"
        try:
            yield
        finally:
            self.service._pool = self._pool


class TestPostgresWaitService(WaitServiceContract):
    @pytest.fixture
    async def harness(self, own_pool: asyncpg.Pool, own_database: str, postgres_admin_url: str):
        bare = await asyncpg.create_pool(postgres_admin_url, min_size=0, max_size=2)
        yield PostgresHarness(own_pool, bare, own_database)
        await bare.close()

    async def test_a_record_python_cannot_decode_is_held_as_it_is(self, harness) -> None:
        """The table's columns come from the event's own fields; its record is never decoded
        in Python, which refuses an integer of over 4,300 digits (one stored before input
        streams refused them would have stopped the stream's delivery for good)."""
        run_id = "run-" + secrets.token_hex(4)
        digits = "9" * 5000
        fields = {"id": f"wds:{TENANT}:{run_id}:in:1", "tenant": TENANT, "run_id": run_id}
        head = json.dumps({**fields, "stream_id": "in", "sequence": 1})
        event = (head[:-1] + ', "record": {"data": {"n": ' + digits + "}}}").encode()
        await harness.service.publish(f"wds:{TENANT}:{run_id}:in:1", event)
        assert await harness.received(run_id, "in") == [1]
        payload = await harness._pool.fetchval(
            "SELECT payload #>> '{record,data,n}' FROM workflow_wait_events WHERE run_id = $1",
            run_id,
        )
        assert payload == digits


async def test_an_event_lands_only_while_its_streams_incarnation_is_there(
    own_pool: asyncpg.Pool, own_database: str
) -> None:
    """A record read before its stream was erased (or deleted while forks read it), or created
    again under its ID, is handed over to nobody: the erasure would not have seen its event, and
    the new incarnation's record of that sequence would have found its id taken."""
    from datetime import timedelta

    from application.access import SCOPES, Caller
    from domain.definition import DefinitionRequest
    from entrypoints.container import start, stop

    service = PostgresWaitService(own_pool)
    container = Container(settings=Settings(database_url=own_database, pool_min_size=1))
    services = await start(container)
    caller = Caller(tenant=TENANT, principal="p", scopes=frozenset(SCOPES))
    try:
        run_id = "run-" + secrets.token_hex(4)
        request = msgspec.convert({"direction": "input", "stream_id": "in"}, DefinitionRequest)
        await services.create_stream(caller, run_id, request)
        created = await own_pool.fetchval(
            "SELECT created_at FROM streams WHERE tenant = $1 AND run_id = $2", TENANT, run_id
        )

        async def publish(sequence: int, incarnation: Any) -> list[int]:
            key = StreamKey(TENANT, run_id, "in")
            fields = {"tenant": TENANT, "run_id": run_id, "stream_id": "in", "sequence": sequence}
            event = json.dumps({"id": event_id(key, sequence), **fields, "record": {}}).encode()
            await service.publish(event_id(key, sequence), event, stream_created_at=incarnation)
            rows = await own_pool.fetch(
                "SELECT sequence FROM workflow_wait_events WHERE run_id = $1 ORDER BY 1", run_id
            )
            return [r[0] for r in rows]

        assert await publish(1, created - timedelta(seconds=1)) == []  # another incarnation
        assert await publish(1, created) == [1]
        await services.delete_stream(caller, run_id, "in")
        assert await publish(2, created) == []  # erased: nothing lands, nothing stays
        await services.create_stream(caller, run_id, request)
        assert await publish(1, created) == []  # the old incarnation's record 1: not the new
    finally:
        await stop(container)


class HttpHarness:
    def __init__(self, stub: WaitServiceStub, refusing: WaitServiceStub) -> None:
        self.stub = stub
        self.service = HttpWaitService(stub.url)
        self.refusing = HttpWaitService(refusing.url)

    async def prepare(self, run_id: str, stream_ids: list[str]) -> None:
        pass

    async def received(self, run_id: str, stream_id: str) -> list[int]:
        with self.stub._lock:
            events = list(self.stub.accepted.values())
        return [
            e["sequence"] for e in events if (e["run_id"], e["stream_id"]) == (run_id, stream_id)
        ]

    @contextlib.asynccontextmanager
    async def outage(self) -> AsyncIterator[None]:
        self.stub.refuse_with = 503
        try:
            yield
        finally:
            self.stub.refuse_with = None


class TestHttpWaitService(WaitServiceContract):
    @pytest.fixture
    def harness(self) -> Iterator[HttpHarness]:
        never = 10**9
        with (
            WaitServiceStub(fail_every=never, lose_answer_every=never, delay=0) as stub,
            WaitServiceStub(fail_every=never, lose_answer_every=never, delay=0) as refusing,
        ):
            refusing.refuse_with = 422
            yield HttpHarness(stub, refusing)


@pytest.fixture(scope="module")
def dbos_database(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A DBOS system database, created by a DBOS application's first launch."""
    name = "dbos_" + secrets.token_hex(4)

    async def run(sql: str) -> None:
        connection = await asyncpg.connect(postgres_admin_url)
        try:
            await connection.execute(sql)
        finally:
            await connection.close()

    asyncio.run(run(f"CREATE DATABASE {name}"))
    url = with_database(postgres_admin_url, name)
    env = {
        "DBOS_SYSTEM_DATABASE_URL": url,
        "STREAMS_URL": "http://127.0.0.1:9",
        "STREAMS_TOKEN": "-",
    }
    dbos_app([], env, tmp_path_factory.mktemp("dbos") / "app.log").start().stop()
    yield url
    asyncio.run(run(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


class DbosHarness:
    def __init__(self, url: str) -> None:
        from dbos import DBOSClient

        self.url = url
        self.service = DbosWaitService(url)
        self.refusing = DbosWaitService(url, workflow_id="missing-{run_id}")
        self._admin = DBOSClient(system_database_url=url)

    async def prepare(self, run_id: str, stream_ids: list[str]) -> None:
        # A workflow of that id, queued where no application dequeues it: it takes messages.
        options = {
            "queue_name": "contract",
            "workflow_name": "wait_for_records",
            "workflow_id": run_id,
        }
        await self._admin.enqueue_async(options, "a", 1, None)

    async def received(self, run_id: str, stream_id: str) -> list[int]:
        connection = await asyncpg.connect(self.url)
        try:
            rows = await connection.fetch(
                "SELECT message_uuid, created_at_epoch_ms FROM dbos.notifications "
                "WHERE destination_uuid = $1 AND topic = $2 ORDER BY created_at_epoch_ms",
                run_id,
                stream_id,
            )
        finally:
            await connection.close()
        stamps = [r["created_at_epoch_ms"] for r in rows]
        assert len(set(stamps)) == len(stamps), f"messages share a millisecond: {stamps}"
        return [int(r["message_uuid"].split("::")[0].rsplit(":", 1)[1]) for r in rows]

    @contextlib.asynccontextmanager
    async def outage(self) -> AsyncIterator[None]:
        from dbos import DBOSClient

        working = self.service._client
        self.service._client = DBOSClient(
            system_database_url=f"postgresql://postgres@127.0.0.1:{free_port()}/down",
            lazy=True,
            retry_connection_errors=False,
        )
        try:
            yield
        finally:
            self.service._client = working

    async def close(self) -> None:
        await self.service.close()
        await self.refusing.close()
        await asyncio.to_thread(self._admin.destroy)


class TestDbosWaitService(WaitServiceContract):
    @pytest.fixture
    async def harness(self, dbos_database: str):
        harness = DbosHarness(dbos_database)
        yield harness
        await harness.close()


@pytest.fixture(scope="module")
def restate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestateServer]:
    """A Restate server with the Waiter workflow (tests/engines/restate_app.py) registered."""
    root = tmp_path_factory.mktemp("restate")
    server = RestateServer(root).start()
    port = free_port()
    env = {"STREAMS_URL": "http://127.0.0.1:9", "STREAMS_TOKEN": "-"}
    service = restate_service(port, env, Path(root) / "service.log").start()
    try:
        server.register(f"http://127.0.0.1:{port}")
        yield server
    finally:
        service.stop()
        server.stop()


class RestateHarness:
    def __init__(self, server: RestateServer) -> None:
        self.server = server
        self.service = RestateWaitService(server.ingress_url, "Waiter/on_record")
        self.refusing = RestateWaitService(server.ingress_url, "Nowhere/on_record")

    async def prepare(self, run_id: str, stream_ids: list[str]) -> None:
        pass

    async def received(self, run_id: str, stream_id: str) -> list[int]:
        rows = await asyncio.to_thread(
            self.server.query,
            "SELECT idempotency_key, created_at FROM sys_invocation "
            f"WHERE target_service_name = 'Waiter' AND target_service_key = '{run_id}' "
            "AND target_handler_name = 'on_record'",
        )
        prefix = f"wds:{TENANT}:{run_id}:{stream_id}:"
        taken = [
            (restate_time(r["created_at"]), int(r["idempotency_key"].removeprefix(prefix)))
            for r in rows
            if r["idempotency_key"].startswith(prefix)
        ]
        return [sequence for _, sequence in sorted(taken)]  # ties of its ms clock by sequence

    @contextlib.asynccontextmanager
    async def outage(self) -> AsyncIterator[None]:
        working = self.service._ingress
        self.service._ingress = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        try:
            yield
        finally:
            self.service._ingress = working

    async def close(self) -> None:
        await self.service.close()
        await self.refusing.close()


class TestRestateWaitService(WaitServiceContract):
    @pytest.fixture
    async def harness(self, restate: RestateServer):
        harness = RestateHarness(restate)
        yield harness
        await harness.close()


async def test_restate_keyed_by_tenant_keeps_two_tenants_runs_of_one_id_apart(
    restate: RestateServer,
) -> None:
    """Keyed by the run ID alone (the contract's default), another tenant's run of the same ID
    is the same Restate object: its events reach that workflow. `RESTATE_KEY={tenant}/{run_id}`
    sends each tenant's to its own."""
    run_id = "run-" + secrets.token_hex(4)
    service = RestateWaitService(restate.ingress_url, "Waiter/on_record", "{tenant}/{run_id}")
    try:
        for tenant in ("acme", "evil"):
            fields = {"tenant": tenant, "run_id": run_id, "stream_id": "in", "sequence": 1}
            event_id = f"wds:{tenant}:{run_id}:in:1"
            event = json.dumps({"id": event_id, **fields, "record": {"data": tenant}}).encode()
            await service.publish(event_id, event)
    finally:
        await service.close()
    rows = await asyncio.to_thread(
        restate.query,
        "SELECT target_service_key, idempotency_key FROM sys_invocation "
        f"WHERE target_service_name = 'Waiter' AND idempotency_key LIKE 'wds:%:{run_id}:in:1'",
    )
    keys = {r["idempotency_key"]: r["target_service_key"] for r in rows}
    assert keys == {
        f"wds:acme:{run_id}:in:1": f"acme/{run_id}",
        f"wds:evil:{run_id}:in:1": f"evil/{run_id}",
    }
    assert (
        RestateWaitService(restate.ingress_url, "Waiter/on_record")
        .url(Names("acme", run_id, "in"))
        .endswith(f"/Waiter/{run_id}/on_record/send")
    )  # (the default: the run ID alone)
