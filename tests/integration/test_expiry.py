"""Stream expiry end to end: server processes, the expiry sweep in a worker process, PostgreSQL.

Short settings: accesses are flushed every half second, the sweep runs every 0.2 s with a grace
of one second (twice the flush interval), so a stream with idle_seconds=2 answers 404 from 3 s
after its last access (idle_seconds and twice the flush interval) and is erased from then too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest

from adapters.postgres.erasure import ERASED_TABLES
from tests.conftest import SERVER_ENV, api_client
from tests.integration.test_sse import Subscriber, wide_client
from tests.support.postgres import create_test_database, drop_test_database
from tests.support.server import ServerProcess, WorkerProcess

FLUSH_SECONDS = 0.5
EXPIRY_ENV = {
    **SERVER_ENV,
    "DUCTOR_STREAMS_ACCESS_FLUSH_SECONDS": str(FLUSH_SECONDS),
    "DUCTOR_STREAMS_EXPIRY_GRACE_SECONDS": str(2 * FLUSH_SECONDS),
    "DUCTOR_STREAMS_EXPIRY_INTERVAL_SECONDS": "0.2",
}


class Deployment:
    def __init__(self, url: str, servers: list[ServerProcess], worker: WorkerProcess) -> None:
        self.url = url
        self.servers = servers
        self.worker = worker


def deployment(
    postgres_admin_url: str, tmp_path: Path, env: dict[str, str], replicas: int
) -> Iterator[Deployment]:
    """Its own database: two replicas (or one) and a worker process running the sweep."""
    url, name = asyncio.run(create_test_database(postgres_admin_url))
    servers = [
        ServerProcess(database_url=url, data_dir=tmp_path / f"server-{n}", env=env)
        for n in range(replicas)
    ]
    worker = WorkerProcess(database_url=url, data_dir=tmp_path / "worker", env=env)
    try:
        for server in servers:
            server.start()
        worker.start()
        yield Deployment(url, servers, worker)
    finally:
        worker.stop()
        for server in servers:
            server.stop()
        asyncio.run(drop_test_database(postgres_admin_url, name))


@pytest.fixture(scope="module")
def expiring(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    yield from deployment(postgres_admin_url, tmp_path_factory.mktemp("expiry"), EXPIRY_ENV, 2)


async def create(api: httpx.AsyncClient, run_id: str, stream_id: str, **fields) -> dict:
    answer = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "output", **fields}
    )
    assert answer.status_code == 201, answer.text
    return answer.json()


async def subscribe_status(api: httpx.AsyncClient, path: str) -> int:
    async with api.stream("GET", path + "/subscribe?cursor=0") as response:
        return response.status_code


async def statuses(api: httpx.AsyncClient, run_id: str, stream_id: str) -> dict[str, int]:
    """The answer of every route that resolves the stream."""
    path = f"/runs/{run_id}/streams/{stream_id}"
    return {
        "get": (await api.get(path)).status_code,
        "records": (await api.get(path + "/records")).status_code,
        "append": (await api.post(path + "/records", json={"records": [{"data": 1}]})).status_code,
        "subscribe": await subscribe_status(api, path),
        "ack": (await api.post(path + "/consumers/c/ack", json={"sequence": 0})).status_code,
        "close": (await api.post(path + "/close")).status_code,
        "hold": (await api.put(path + "/legal-hold", json={"enabled": True})).status_code,
        "object": (await api.get(path + "/objects/obj-1")).status_code,
    }


ALL_404 = dict.fromkeys(
    ("get", "records", "append", "subscribe", "ack", "close", "hold", "object"), 404
)


async def listed_runs(api, run_id: str) -> dict[str, int]:
    """What GET /runs shows of this run (the page right after the run ID's prefix)."""
    page = await api.get("/runs", params={"after": run_id[:-1], "limit": 1000})
    assert page.status_code == 200, page.text
    return {r["run_id"]: r["stream_count"] for r in page.json()["runs"] if r["run_id"] == run_id}


async def test_reads_on_any_replica_keep_an_idle_stream_alive_then_it_is_404_everywhere(
    expiring: Deployment, run_id: str
) -> None:
    a, b = expiring.servers
    async with api_client(a) as api_a, api_client(b) as api_b:
        document = await create(api_a, run_id, "s", expiry={"idle_seconds": 2})
        assert document["expiry"] == {"idle_seconds": 2, "expires_at": None}
        await create(api_a, run_id, "forever")
        path = f"/runs/{run_id}/streams/s"
        # Reads only, 0.4 s apart, for three times idle_seconds, all on replica B...
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < 6:
            read = await (api_b.get(path) if n % 2 else api_b.get(path + "/records"))
            assert read.status_code == 200, (n, read.text)
            n += 1
            await asyncio.sleep(0.4)
        # ...and replica A, which saw nothing since it created the stream, hears of them
        # through the flushed accesses.
        assert (await api_a.get(path + "/records")).status_code == 200
        # Idle: 404 from idle_seconds plus the grace (twice the flush interval) after the last
        # access. Watched with HEAD (no access, and it changes nothing) until then and a little
        # after, a busy host's flush may come late; then every route answers 404.
        await asyncio.sleep(2 + 2 * FLUSH_SECONDS)
        deadline = time.monotonic() + FLUSH_SECONDS + 3
        while (await api_a.head(path)).status_code != 404:
            assert time.monotonic() < deadline, "an idle stream did not expire"
            await asyncio.sleep(0.1)
        assert await statuses(api_a, run_id, "s") == ALL_404
        # Replica B decides from what it knows of the accesses too: watched the same way.
        deadline = time.monotonic() + FLUSH_SECONDS + 3
        while (await api_b.head(path)).status_code != 404:
            assert time.monotonic() < deadline, "an idle stream did not expire on replica B"
            await asyncio.sleep(0.1)
        assert (await api_b.get(path)).status_code == 404
        listed = await api_b.get(f"/runs/{run_id}/streams")
        assert [d["stream_id"] for d in listed.json()["streams"]] == ["forever"]
        assert await listed_runs(api_b, run_id) == {run_id: 1}  # the expired one is not counted
        assert (await api_a.get(f"/runs/{run_id}/streams/forever")).status_code == 200
        await erased_by_the_workers(expiring.url, run_id, "s")


async def test_head_is_no_access_an_idle_stream_headed_on_every_route_still_expires(
    expiring: Deployment, run_id: str
) -> None:
    a, b = expiring.servers
    async with api_client(a) as api_a, api_client(b) as api_b:
        for stream_id in ("headed", "read"):
            await create(api_a, run_id, stream_id, expiry={"idle_seconds": 2})
        routes = ("", "/records", "/subscribe?cursor=0", "/objects/obj-1")
        started = time.monotonic()
        headed = []
        # For twice idle_seconds, 0.4 s apart: HEAD on every GET route of one stream, GET on
        # the other's document.
        while time.monotonic() - started < 4:
            for route in routes:
                answer = await api_b.head(f"/runs/{run_id}/streams/headed{route}")
                headed.append(answer.status_code)
            read = await api_b.get(f"/runs/{run_id}/streams/read")
            assert read.status_code == 200, read.text
            await asyncio.sleep(0.4)
        # Found while alive (the missing object aside), 404 once idle_seconds and twice the
        # flush interval had passed since the create, HEADs notwithstanding.
        assert headed[0] == 200 and headed[-4:] == [404] * 4, headed
        assert (await api_a.get(f"/runs/{run_id}/streams/headed")).status_code == 404
        assert (await api_a.get(f"/runs/{run_id}/streams/read")).status_code == 200
        await erased_by_the_workers(expiring.url, run_id, "headed")


async def test_an_open_subscription_keeps_the_stream_alive(
    expiring: Deployment, run_id: str
) -> None:
    a, b = expiring.servers
    async with api_client(a) as api_a, api_client(b) as api_b:
        await create(api_a, run_id, "s", expiry={"idle_seconds": 2})
        path = f"/runs/{run_id}/streams/s"
        async with api_b.stream("GET", path + "/subscribe?cursor=0") as subscription:
            assert subscription.status_code == 200
            await asyncio.sleep(5)  # heartbeats only, every second
            assert (await api_a.get(path)).status_code == 200


async def test_expires_at_is_404_once_passed(expiring: Deployment, run_id: str) -> None:
    async with api_client(expiring.servers[0]) as api:
        at = datetime.now(UTC) + timedelta(seconds=2)
        document = await create(api, run_id, "s", expiry={"expires_at": at.isoformat()})
        assert document["expiry"]["expires_at"] == at.isoformat().replace("+00:00", "Z")
        path = f"/runs/{run_id}/streams/s"
        appended = await api.post(path + "/records", json={"records": [{"data": 1}]})
        assert appended.status_code == 201
        assert (await api.get(path + "/records")).status_code == 200
        async with wide_client(api) as client:
            # A subscription does not keep an absolute expiry: erased, it hears event: deleted.
            subscriber = Subscriber(client, path + "/subscribe?cursor=0")
            assert await subscriber.status() == 200
            await asyncio.sleep(max(0.0, (at - datetime.now(UTC)).total_seconds()) + 0.1)
            assert await statuses(api, run_id, "s") == ALL_404
            assert (await api.get(f"/runs/{run_id}/streams")).status_code == 404  # its only one
            assert await listed_runs(api, run_id) == {}  # nor is the run listed
            await subscriber.until_ended()
            assert subscriber.ids == [1] and subscriber.events[-1].event == "deleted"


async def test_a_legal_hold_suspends_expiry_and_lifting_it_lets_it_expire(
    expiring: Deployment, run_id: str
) -> None:
    async with api_client(expiring.servers[0]) as api:
        at = datetime.now(UTC) + timedelta(seconds=1.5)
        await create(api, run_id, "dated", expiry={"expires_at": at.isoformat()})
        await create(api, run_id, "idle", expiry={"idle_seconds": 1})
        for stream_id in ("dated", "idle"):
            path = f"/runs/{run_id}/streams/{stream_id}"
            appended = await api.post(path + "/records", json={"records": [{"data": stream_id}]})
            assert appended.status_code == 201
            held = await api.put(path + "/legal-hold", json={"enabled": True, "reason": "audit"})
            assert held.status_code == 200, held.text
        await asyncio.sleep(3.5)  # past both expiries, and many sweeps
        for stream_id in ("dated", "idle"):
            assert "streams" in await rows_left(expiring.url, run_id, stream_id)
        for stream_id in ("dated", "idle"):  # whole and readable
            path = f"/runs/{run_id}/streams/{stream_id}"
            page = await api.get(path + "/records")
            assert page.status_code == 200
            assert [r["data"] for r in page.json()["records"]] == [stream_id]
            lifted = await api.put(path + "/legal-hold", json={"enabled": False})
            assert lifted.status_code == 200
        assert (await api.get(f"/runs/{run_id}/streams/dated")).status_code == 404
        # Lifting the hold is a write: the idle one has its idle second again, then goes.
        assert (await api.get(f"/runs/{run_id}/streams/idle")).status_code == 200
        await asyncio.sleep(1 + 2 * FLUSH_SECONDS + 0.2)
        assert (await api.get(f"/runs/{run_id}/streams/idle")).status_code == 404
        for stream_id in ("dated", "idle"):
            await erased_by_the_workers(expiring.url, run_id, stream_id)


async def rows_left(url: str, run_id: str, stream_id: str) -> dict[str, int]:
    """Rows of the stream still in any table an erasure empties (the streams row included)."""
    connection = await asyncpg.connect(url)
    try:
        counts = {}
        for table in (*ERASED_TABLES, "streams"):
            counts[table] = await connection.fetchval(
                f"SELECT count(*) FROM {table} WHERE run_id = $1 AND stream_id = $2",
                run_id,
                stream_id,
            )
        return {table: n for table, n in counts.items() if n}
    finally:
        await connection.close()


async def erased_by_the_workers(url: str, run_id: str, stream_id: str) -> None:
    """Wait (no request reaches the stream meanwhile) until nothing of it is left."""
    async with asyncio.timeout(15):
        while await rows_left(url, run_id, stream_id):
            await asyncio.sleep(0.2)


@pytest.mark.parametrize(
    "expiry", [{"idle_seconds": 1}, {"expires_at": "in 1.5 s"}], ids=["idle", "expires_at"]
)
async def test_an_expired_stream_is_erased_by_the_workers_and_can_be_created_again(
    expiring: Deployment, run_id: str, expiry: dict
) -> None:
    if "expires_at" in expiry:
        expiry = {"expires_at": (datetime.now(UTC) + timedelta(seconds=1.5)).isoformat()}
    async with api_client(expiring.servers[0]) as api:
        await create(api, run_id, "s", expiry=expiry)
        await create(api, run_id, "kept")
        path = f"/runs/{run_id}/streams/s"
        appended = await api.post(path + "/records", json={"records": [{"data": n} for n in "abc"]})
        assert appended.status_code == 201
        acked = await api.post(path + "/consumers/c/ack", json={"sequence": 2})
        assert acked.status_code == 200
        assert await rows_left(expiring.url, run_id, "s")  # records, journal, consumer, access
        await erased_by_the_workers(expiring.url, run_id, "s")
        assert (await api.get(path)).status_code == 404
        again = await create(api, run_id, "s", expiry={"idle_seconds": 3600})
        assert again["state"]["head"] == 0 and again["state"]["consumers"] == []
        first = await api.post(path + "/records", json={"records": [{"data": "new"}]})
        assert first.status_code == 201 and first.json()["first_sequence"] == 1
        page = await api.get(path + "/records")
        assert [r["data"] for r in page.json()["records"]] == ["new"]
        assert (await api.get(f"/runs/{run_id}/streams/kept")).status_code == 200


@pytest.mark.parametrize(
    ("expiry", "says"),
    [
        ({"idle_seconds": 5, "expires_at": "2099-01-01T00:00:00Z"}, "not both"),
        ({"idle_seconds": 5, "forever": True}, "forever"),
        ({"idle_seconds": 0}, "idle_seconds"),
        ({"idle_seconds": 100 * 365 * 86_400 + 1}, "idle_seconds"),
        ({"expires_at": "2099-01-01T00:00:00"}, "expires_at"),  # no timezone
        ({"expires_at": "2001-01-01T00:00:00Z"}, "already passed"),
    ],
)
async def test_bad_expiry_is_invalid_input_and_creates_nothing(
    api: httpx.AsyncClient, run_id: str, expiry: dict, says: str
) -> None:
    answer = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output", "expiry": expiry}
    )
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["code"] == "invalid-input" and says in answer.json()["detail"]
    assert (await api.get(f"/runs/{run_id}/streams/s")).status_code == 404


async def test_expiry_is_part_of_the_idempotent_create(api: httpx.AsyncClient, run_id: str) -> None:
    body = {"stream_id": "s", "direction": "output", "expiry": {"idle_seconds": 3600}}
    first = await api.post(f"/runs/{run_id}/streams", json=body)
    assert first.status_code == 201
    again = await api.post(f"/runs/{run_id}/streams", json=body)
    assert again.status_code == 200 and again.json() == first.json()
    for other in ({"idle_seconds": 3601}, {}, {"expires_at": "2099-01-01T00:00:00Z"}):
        conflict = await api.post(f"/runs/{run_id}/streams", json={**body, "expiry": other})
        assert conflict.status_code == 409 and conflict.json()["code"] == "definition-conflict"
    without = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "t", "direction": "output"}
    )
    assert without.json()["expiry"] == {"idle_seconds": None, "expires_at": None}


# -- a crash loses at most the last flush interval of accesses, which the margins cover ---------

CRASH_FLUSH_SECONDS = 2.0
CRASH_IDLE_SECONDS = 8
CRASH_ENV = {
    **SERVER_ENV,
    "DUCTOR_STREAMS_ACCESS_FLUSH_SECONDS": str(CRASH_FLUSH_SECONDS),
    "DUCTOR_STREAMS_EXPIRY_GRACE_SECONDS": str(2 * CRASH_FLUSH_SECONDS),
    "DUCTOR_STREAMS_EXPIRY_INTERVAL_SECONDS": "0.2",
}


@pytest.fixture
def crashable(postgres_admin_url: str, tmp_path: Path) -> Iterator[Deployment]:
    yield from deployment(postgres_admin_url, tmp_path, CRASH_ENV, 1)


async def recorded_access(url: str, run_id: str, stream_id: str) -> datetime | None:
    connection = await asyncpg.connect(url)
    try:
        return await connection.fetchval(
            "SELECT last_access_at FROM stream_access WHERE run_id = $1 AND stream_id = $2",
            run_id,
            stream_id,
        )
    finally:
        await connection.close()


async def stream_rows(url: str, run_id: str, stream_id: str) -> int:
    connection = await asyncpg.connect(url)
    try:
        return await connection.fetchval(
            "SELECT count(*) FROM streams WHERE run_id = $1 AND stream_id = $2", run_id, stream_id
        )
    finally:
        await connection.close()


@pytest.mark.slow
async def test_a_kill_9_right_after_reads_does_not_expire_the_streams_early(
    crashable: Deployment, run_id: str
) -> None:
    """Two streams: "busy" is read all the time, so its accesses go in the batches every two
    seconds; "rare" is read once, long after its creation, so that read is written at once.
    The server is killed right after a read of each, before the next flush."""
    [server] = crashable.servers
    busy, rare = (f"/runs/{run_id}/streams/{name}" for name in ("busy", "rare"))
    async with api_client(server) as api:
        await create(api, run_id, "rare", expiry={"idle_seconds": CRASH_IDLE_SECONDS})
        await create(api, run_id, "busy", expiry={"idle_seconds": CRASH_IDLE_SECONDS})
        started = time.monotonic()
        recorded = await recorded_access(crashable.url, run_id, "busy")
        # Read "busy" until a flush, at least twice the flush interval after "rare" was created,
        # has recorded one of the reads...
        async with asyncio.timeout(5 * CRASH_FLUSH_SECONDS):
            while True:
                assert (await api.get(busy + "/records")).status_code == 200
                await asyncio.sleep(0.2)
                now = await recorded_access(crashable.url, run_id, "busy")
                if now != recorded and time.monotonic() - started > 2 * CRASH_FLUSH_SECONDS + 0.5:
                    break
                recorded = now
        # ...then read each once more, well inside the flush interval, and crash before the next
        # flush: the read of "busy" is lost, and its last recorded access is older by more than
        # 0.8 s; the read of "rare" was written before it was answered.
        await asyncio.sleep(0.8)
        assert (await api.get(rare)).status_code == 200
        rare_read = time.monotonic()
        assert (await api.get(busy)).status_code == 200
        busy_read = time.monotonic()
        server.kill()
    lost = await recorded_access(crashable.url, run_id, "busy")
    server.start()
    # Both were used: nothing may take either before idle_seconds after its last read, though
    # the database knows of no read of "busy" in the last 0.8 s before the crash.
    check_at = min(rare_read, busy_read) + CRASH_IDLE_SECONDS - 0.5
    assert time.monotonic() < check_at, "the restart took too long for this test to say anything"
    await asyncio.sleep(check_at - time.monotonic())
    assert await recorded_access(crashable.url, run_id, "busy") == lost
    for stream_id in ("rare", "busy"):
        assert await stream_rows(crashable.url, run_id, stream_id) == 1  # not erased
    async with api_client(server) as api:
        for path in (rare, busy):
            answer = await api.get(path)
            assert answer.status_code == 200, (path, answer.text)
    assert time.monotonic() < busy_read + CRASH_IDLE_SECONDS  # still inside idle_seconds
