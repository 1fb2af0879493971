"""Input streams into real workflow engines, end to end: DBOS and Restate.

Real `ductor-streams serve` and `worker` processes, real PostgreSQL, a real DBOS application
(tests/engines/dbos_app.py, its system database on the tests' PostgreSQL) and a real Restate
server with a Python service (tests/engines/restate_app.py). Each workflow waits for N records
of an input stream appended over HTTP and must receive exactly 1..N, in order, once each —
counted at the engine (DBOS's notifications table, Restate's invocation table), not only in our
tables — through crashes of the dispatcher, of the engine and of the workflow's own steps."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV, api_client
from tests.support.engines import RestateServer, dbos_app, restate_service, restate_time
from tests.support.postgres import with_database
from tests.support.server import ROOT, ServerProcess, WorkerProcess, free_port

FAST = {
    "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.05",
    "DUCTOR_STREAMS_DISPATCH_POLL_SECONDS": "0.05",
    "DUCTOR_STREAMS_WORKER_LEASE_SECONDS": "2",
    "DUCTOR_STREAMS_RETRY_BASE_SECONDS": "0.05",
}


# -- the service, its workers and the engines ----------------------------------------------------


@pytest.fixture(scope="module")
def engines_server(
    own_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server of this module's own database: only this module's workers deliver its input."""
    process = ServerProcess(
        database_url=own_database,
        data_dir=tmp_path_factory.mktemp("engines-server"),
        env=SERVER_ENV,
    ).start()
    yield process
    process.stop()


@pytest.fixture
async def api(engines_server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(engines_server) as client:
        yield client


@pytest.fixture(scope="module")
def dbos_database(postgres_admin_url: str) -> Iterator[str]:
    """An empty database for DBOS's system tables (the DBOS application creates them)."""
    name = "dbos_" + secrets.token_hex(4)

    async def run(sql: str) -> None:
        connection = await asyncpg.connect(postgres_admin_url)
        try:
            await connection.execute(sql)
        finally:
            await connection.close()

    asyncio.run(run(f"CREATE DATABASE {name}"))
    yield with_database(postgres_admin_url, name)
    asyncio.run(run(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture(scope="module")
def restate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestateServer]:
    server = RestateServer(tmp_path_factory.mktemp("restate")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def restate_app(
    restate: RestateServer, engines_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict]:
    """The Restate service, registered; `restart(env)` starts it again on the same port."""
    port = free_port()
    log = tmp_path_factory.mktemp("restate-app") / "service.log"
    base_env = {"STREAMS_URL": engines_server.base_url, "STREAMS_TOKEN": BOOTSTRAP_TOKEN}
    holder: dict = {"process": restate_service(port, base_env, log).start()}
    restate.register(f"http://127.0.0.1:{port}")

    def restart(env: dict[str, str] | None = None) -> None:
        holder["process"].stop()
        holder["process"] = restate_service(port, {**base_env, **(env or {})}, log).start()

    holder["restart"] = restart
    yield holder
    holder["process"].stop()


def worker(database_url: str, tmp_path: Path, env: dict[str, str]) -> WorkerProcess:
    return WorkerProcess(
        database_url=database_url,
        data_dir=tmp_path / f"worker-{secrets.token_hex(3)}",
        env={**FAST, **env},
    ).start()


def dbos_env(url: str) -> dict[str, str]:
    return {"DUCTOR_STREAMS_WAIT_SERVICE": "dbos", "DUCTOR_STREAMS_DBOS_SYSTEM_DATABASE_URL": url}


def restate_env(restate: RestateServer, target: str = "Waiter/on_record") -> dict[str, str]:
    return {
        "DUCTOR_STREAMS_WAIT_SERVICE": "restate",
        "DUCTOR_STREAMS_RESTATE_INGRESS_URL": restate.ingress_url,
        "DUCTOR_STREAMS_RESTATE_TARGET": target,
    }


def start_dbos_app(
    dbos_database: str,
    server: ServerProcess,
    tmp_path: Path,
    groups: list[list[str]],
    env: dict[str, str] | None = None,
):
    app_env = {
        "DBOS_SYSTEM_DATABASE_URL": dbos_database,
        "STREAMS_URL": server.base_url,
        "STREAMS_TOKEN": BOOTSTRAP_TOKEN,
        **(env or {}),
    }
    return dbos_app(groups, app_env, tmp_path / "dbos-app.log").start()


# -- helpers -------------------------------------------------------------------------------------


async def create(api: httpx.AsyncClient, run_id: str, stream_id: str, direction: str) -> str:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": direction}
    )
    assert created.status_code == 201, created.text
    return f"/runs/{run_id}/streams/{stream_id}"


async def append(api: httpx.AsyncClient, path: str, values: list[object]) -> None:
    answer = await api.post(f"{path}/records", json={"records": [{"data": v} for v in values]})
    assert answer.status_code == 201, answer.text


async def delivery(api: httpx.AsyncClient, path: str) -> dict:
    return (await api.get(path)).json()["state"]["input_delivery"]


async def until(check, timeout: float, what: str, *logs) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.1)
    except TimeoutError:
        tails = "\n".join(f"--- {log.log()[-2500:]}" for log in logs)
        raise AssertionError(f"{what} not within {timeout} s\n{tails}") from None


async def echoed(api: httpx.AsyncClient, path: str) -> list[int]:
    page = (await api.get(f"{path}/records", params={"cursor": 0, "limit": 1000})).json()
    return [r["data"]["echo"] for r in page["records"]]


async def dbos_result(dbos_database: str, run_id: str, timeout: float = 60) -> list[int]:
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=dbos_database)
    try:
        handle = await client.retrieve_workflow_async(run_id)
        async with asyncio.timeout(timeout):
            got = await handle.get_result()
    finally:
        await asyncio.to_thread(client.destroy)
    return [int(sequence) for sequence, _ in got]


async def dbos_messages(dbos_database: str, run_id: str) -> list[tuple[str, bool]]:
    """What DBOS holds for the workflow: each message's key and whether it was consumed."""
    connection = await asyncpg.connect(dbos_database)
    try:
        rows = await connection.fetch(
            "SELECT message_uuid, consumed FROM dbos.notifications WHERE destination_uuid = $1",
            run_id,
        )
    finally:
        await connection.close()
    return sorted((r["message_uuid"], r["consumed"]) for r in rows)


def expected_dbos_messages(run_id: str, stream_id: str, n: int) -> list[tuple[str, bool]]:
    return sorted(
        (f"wds:default:{run_id}:{stream_id}:{s}::{run_id}", True) for s in range(1, n + 1)
    )


async def start_restate_workflow(restate: RestateServer, run_id: str, body: dict) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.post(f"{restate.ingress_url}/Waiter/{run_id}/run/send", json=body)
    assert answer.status_code == 202, answer.text


async def restate_result(restate: RestateServer, run_id: str, timeout: float = 60) -> list[int]:
    async with httpx.AsyncClient(timeout=timeout) as http:
        answer = await http.get(f"{restate.ingress_url}/restate/workflow/Waiter/{run_id}/attach")
    assert answer.status_code == 200, answer.text
    return [int(sequence) for sequence, _ in answer.json()]


def restate_calls(restate: RestateServer, run_id: str) -> list[str]:
    """The idempotency keys of the on_record invocations Restate holds for the run, in the
    order Restate created them (ties of its millisecond clock by sequence): one per record, in
    sequence order, or the test fails."""
    rows = restate.query(
        "SELECT idempotency_key, created_at FROM sys_invocation "
        f"WHERE target_service_name = 'Waiter' AND target_service_key = '{run_id}' "
        "AND target_handler_name = 'on_record'"
    )
    ordered = sorted(
        rows,
        key=lambda r: (restate_time(r["created_at"]), int(r["idempotency_key"].rsplit(":", 1)[1])),
    )
    return [row["idempotency_key"] for row in ordered]


def keys(run_id: str, stream_id: str, n: int) -> list[str]:
    return [f"wds:default:{run_id}:{stream_id}:{s}" for s in range(1, n + 1)]


# -- DBOS ----------------------------------------------------------------------------------------


async def test_a_dbos_workflow_receives_each_input_record_once_in_order(
    api: httpx.AsyncClient,
    own_database: str,
    dbos_database: str,
    engines_server: ServerProcess,
    tmp_path: Path,
    run_id: str,
) -> None:
    n = 30
    inbox = await create(api, run_id, "answers", "input")
    outbox = await create(api, run_id, "echo", "output")
    app = start_dbos_app(
        dbos_database, engines_server, tmp_path, [[run_id, "answers", str(n), "echo"]]
    )
    dispatcher = worker(own_database, tmp_path, dbos_env(dbos_database))
    try:
        for start in range(1, n + 1, 10):
            await append(api, inbox, [{"q": i} for i in range(start, start + 10)])
        assert await dbos_result(dbos_database, run_id) == list(range(1, n + 1))
        assert await dbos_messages(dbos_database, run_id) == expected_dbos_messages(
            run_id, "answers", n
        )
        assert await echoed(api, outbox) == list(range(1, n + 1))
        assert await delivery(api, inbox) == {
            "delivered_through": n,
            "pending": 0,
            "last_error": None,
        }
    finally:
        dispatcher.stop()
        app.stop()


async def test_a_dbos_step_killed_after_its_append_and_replayed_appends_once(
    api: httpx.AsyncClient,
    own_database: str,
    dbos_database: str,
    engines_server: ServerProcess,
    tmp_path: Path,
    run_id: str,
) -> None:
    n = 5
    inbox = await create(api, run_id, "answers", "input")
    outbox = await create(api, run_id, "echo", "output")
    flag = tmp_path / "crash-once"
    flag.touch()
    crash = {"CRASH_FLAG": str(flag), "CRASH_AFTER_APPEND": "3"}
    group = [run_id, "answers", str(n), "echo"]
    app = start_dbos_app(dbos_database, engines_server, tmp_path, [group], crash)
    dispatcher = worker(own_database, tmp_path, dbos_env(dbos_database))
    try:
        await append(api, inbox, [{"q": i} for i in range(1, n + 1)])
        async with asyncio.timeout(30):
            while app.alive():
                await asyncio.sleep(0.05)
        assert not flag.exists() and await echoed(api, outbox) == [1, 2, 3]  # 3 not recorded
        app = start_dbos_app(dbos_database, engines_server, tmp_path, [], crash)  # recovers
        assert await dbos_result(dbos_database, run_id) == list(range(1, n + 1))
        assert await echoed(api, outbox) == list(range(1, n + 1))  # 3 once, from its receipt
    finally:
        dispatcher.stop()
        app.stop()


@pytest.mark.slow
async def test_dbos_delivery_survives_a_killed_dispatcher_a_restarted_app_and_a_takeover(
    api: httpx.AsyncClient,
    own_database: str,
    dbos_database: str,
    engines_server: ServerProcess,
    tmp_path: Path,
    run_id: str,
) -> None:
    n, streams = 60, ("a", "b")
    paths = {s: await create(api, run_id + s, s, "input") for s in streams}
    groups = [[run_id + s, s, str(n), "-"] for s in streams]
    app = start_dbos_app(dbos_database, engines_server, tmp_path, groups)
    workers = [worker(own_database, tmp_path, dbos_env(dbos_database)) for _ in range(2)]
    try:
        for batch in range(6):
            for s in streams:
                await append(api, paths[s], list(range(batch * 10, batch * 10 + 10)))
            if batch == 1:
                workers[0].kill()  # kill -9 mid-delivery: the other takes over its claims
            if batch == 3:
                app.kill()  # the DBOS application dies while records are pending ...
                await asyncio.sleep(0.5)
                app = start_dbos_app(
                    dbos_database, engines_server, tmp_path, []
                )  # ... and recovers
        for s in streams:
            assert await dbos_result(dbos_database, run_id + s, timeout=90) == list(range(1, n + 1))
            assert await dbos_messages(dbos_database, run_id + s) == expected_dbos_messages(
                run_id + s, s, n
            )
    finally:
        for w in workers:
            w.stop()
        app.stop()


async def test_a_dbos_workflow_that_does_not_exist_is_the_deliverys_last_error(
    api: httpx.AsyncClient, own_database: str, dbos_database: str, tmp_path: Path, run_id: str
) -> None:
    inbox = await create(api, run_id, "answers", "input")
    dispatcher = worker(own_database, tmp_path, dbos_env(dbos_database))
    try:
        await append(api, inbox, [1, 2])

        async def recorded() -> bool:
            return (await delivery(api, inbox))["last_error"] is not None

        await until(recorded, 20, "the missing workflow's error", dispatcher)
        state = await delivery(api, inbox)
        assert state["pending"] == 2 and state["delivered_through"] == 0
        assert f"DBOS has no workflow '{run_id}'" in state["last_error"]
        assert dispatcher.process is not None and dispatcher.process.poll() is None
    finally:
        dispatcher.stop()


async def test_an_unreachable_dbos_database_is_the_deliverys_last_error_not_a_crash(
    api: httpx.AsyncClient, own_database: str, tmp_path: Path, run_id: str
) -> None:
    inbox = await create(api, run_id, "answers", "input")
    unreachable = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    dispatcher = worker(own_database, tmp_path, dbos_env(unreachable))
    try:
        await append(api, inbox, [1])

        async def recorded() -> bool:
            return (await delivery(api, inbox))["last_error"] is not None

        await until(recorded, 20, "the unreachable database's error", dispatcher)
        state = await delivery(api, inbox)
        assert state["pending"] == 1 and "DBOS system database unreachable" in state["last_error"]
        assert "not reachable yet" in dispatcher.log()  # said once at start-up, then retried
        assert dispatcher.process is not None and dispatcher.process.poll() is None
    finally:
        dispatcher.stop()


# -- Restate -------------------------------------------------------------------------------------


async def test_a_restate_workflow_receives_each_input_record_once_in_order(
    api: httpx.AsyncClient,
    own_database: str,
    restate: RestateServer,
    restate_app: dict,
    tmp_path: Path,
    run_id: str,
) -> None:
    n = 30
    inbox = await create(api, run_id, "answers", "input")
    outbox = await create(api, run_id, "echo", "output")
    await start_restate_workflow(
        restate, run_id, {"stream_id": "answers", "n": n, "output": "echo"}
    )
    dispatcher = worker(own_database, tmp_path, restate_env(restate))
    try:
        for start in range(1, n + 1, 10):
            await append(api, inbox, [{"q": i} for i in range(start, start + 10)])
        assert await restate_result(restate, run_id) == list(range(1, n + 1))
        assert restate_calls(restate, run_id) == keys(run_id, "answers", n)
        assert await echoed(api, outbox) == list(range(1, n + 1))
        assert await delivery(api, inbox) == {
            "delivered_through": n,
            "pending": 0,
            "last_error": None,
        }
    finally:
        dispatcher.stop()


async def test_a_restate_step_killed_after_its_append_and_retried_appends_once(
    api: httpx.AsyncClient,
    own_database: str,
    restate: RestateServer,
    restate_app: dict,
    tmp_path: Path,
    run_id: str,
) -> None:
    n = 5
    inbox = await create(api, run_id, "answers", "input")
    outbox = await create(api, run_id, "echo", "output")
    flag = tmp_path / "crash-once"
    flag.touch()
    restate_app["restart"]({"CRASH_FLAG": str(flag), "CRASH_AFTER_APPEND": "3"})
    await start_restate_workflow(
        restate, run_id, {"stream_id": "answers", "n": n, "output": "echo"}
    )
    dispatcher = worker(own_database, tmp_path, restate_env(restate))
    try:
        await append(api, inbox, [{"q": i} for i in range(1, n + 1)])
        async with asyncio.timeout(30):
            while restate_app["process"].alive():
                await asyncio.sleep(0.05)
        assert not flag.exists() and await echoed(api, outbox) == [1, 2, 3]  # 3 not journaled
        restate_app["restart"]()  # Restate retries the invocation; the step runs again
        assert await restate_result(restate, run_id) == list(range(1, n + 1))
        assert await echoed(api, outbox) == list(range(1, n + 1))  # 3 once, from its receipt
    finally:
        dispatcher.stop()


@pytest.mark.slow
async def test_restate_delivery_survives_a_killed_dispatcher_a_restarted_server_and_a_takeover(
    api: httpx.AsyncClient,
    own_database: str,
    restate: RestateServer,
    restate_app: dict,
    tmp_path: Path,
    run_id: str,
) -> None:
    n, streams = 60, ("a", "b")
    paths = {s: await create(api, run_id + s, s, "input") for s in streams}
    for s in streams:
        await start_restate_workflow(restate, run_id + s, {"stream_id": s, "n": n})
    workers = [worker(own_database, tmp_path, restate_env(restate)) for _ in range(2)]
    try:
        for batch in range(6):
            if batch == 3:
                restate.kill()  # Restate dies while records are pending: delivery waits ...
            for s in streams:
                await append(api, paths[s], list(range(batch * 10, batch * 10 + 10)))
            if batch == 1:
                workers[0].kill()  # kill -9 mid-delivery: the other takes over its claims
            if batch == 3:

                async def lagging() -> bool:
                    state = await delivery(api, paths["a"])
                    return state["pending"] > 0 and "unreachable" in (state["last_error"] or "")

                await until(lagging, 20, "the lag and error while Restate is down", workers[1])
                restate.start()  # ... and resumes once it is back, on the same state
        for s in streams:
            assert await restate_result(restate, run_id + s, timeout=90) == list(range(1, n + 1))
            assert restate_calls(restate, run_id + s) == keys(run_id + s, s, n)
    finally:
        for w in workers:
            w.stop()


async def test_an_unknown_restate_service_is_the_deliverys_last_error(
    api: httpx.AsyncClient, own_database: str, restate: RestateServer, tmp_path: Path, run_id: str
) -> None:
    inbox = await create(api, run_id, "answers", "input")
    dispatcher = worker(own_database, tmp_path, restate_env(restate, "Nowhere/on_record"))
    try:
        await append(api, inbox, [1])

        async def recorded() -> bool:
            return (await delivery(api, inbox))["last_error"] is not None

        await until(recorded, 20, "the refusal", dispatcher)
        state = await delivery(api, inbox)
        assert state["pending"] == 1
        assert "Restate refused the call with 404" in state["last_error"]
        assert "Nowhere" in state["last_error"]
        assert dispatcher.process is not None and dispatcher.process.poll() is None
    finally:
        dispatcher.stop()


async def test_an_unreachable_restate_ingress_is_the_deliverys_last_error_not_a_crash(
    api: httpx.AsyncClient, own_database: str, tmp_path: Path, run_id: str
) -> None:
    inbox = await create(api, run_id, "answers", "input")
    env = {
        "DUCTOR_STREAMS_WAIT_SERVICE": "restate",
        "DUCTOR_STREAMS_RESTATE_INGRESS_URL": f"http://127.0.0.1:{free_port()}",
        "DUCTOR_STREAMS_RESTATE_TARGET": "Waiter/on_record",
    }
    dispatcher = worker(own_database, tmp_path, env)
    try:
        await append(api, inbox, [1])

        async def recorded() -> bool:
            return (await delivery(api, inbox))["last_error"] is not None

        await until(recorded, 20, "the unreachable ingress's error", dispatcher)
        state = await delivery(api, inbox)
        assert state["pending"] == 1 and "Restate ingress unreachable" in state["last_error"]
        assert dispatcher.process is not None and dispatcher.process.poll() is None
    finally:
        dispatcher.stop()


# -- configuration that cannot work --------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {
                "DUCTOR_STREAMS_WAIT_SERVICE": "restate",
                "DUCTOR_STREAMS_RESTATE_INGRESS_URL": "http://127.0.0.1:1",
            },
            "DUCTOR_STREAMS_RESTATE_TARGET",
        ),
        (
            {
                "DUCTOR_STREAMS_WAIT_SERVICE": "restate",
                "DUCTOR_STREAMS_RESTATE_INGRESS_URL": "http://127.0.0.1:1",
                "DUCTOR_STREAMS_RESTATE_TARGET": "Waiter",
            },
            "expected `Name/handler`",
        ),
        ({"DUCTOR_STREAMS_WAIT_SERVICE": "dbos"}, "DUCTOR_STREAMS_DBOS_SYSTEM_DATABASE_URL"),
        (
            {
                "DUCTOR_STREAMS_WAIT_SERVICE": "dbos",
                "DUCTOR_STREAMS_DBOS_SYSTEM_DATABASE_URL": "postgresql://127.0.0.1:1/x",
                "DUCTOR_STREAMS_DBOS_WORKFLOW_ID": "{run}",
            },
            "DUCTOR_STREAMS_DBOS_WORKFLOW_ID",
        ),
    ],
)
def test_a_wait_service_that_cannot_work_stops_the_worker_at_start_up_with_one_line(
    own_database: str, env: dict[str, str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "entrypoints.cli", "worker"],
        cwd=ROOT,
        env={**os.environ, "DUCTOR_STREAMS_DATABASE_URL": own_database, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ductor-streams: error: ")
    assert message in lines[0]
