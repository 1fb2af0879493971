"""PostgreSQL or the object store out of reach under a real server: 503 `unavailable`, never 500,
nothing acknowledged lost, and live delivery back within a second of PostgreSQL.

These tests stop and restart a PostgreSQL of their own (tests/support/restartable_postgres.py),
never the one the rest of the suite shares."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import secrets
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV, api_client
from tests.integration.test_operations import metric
from tests.support.postgres import create_test_database
from tests.support.restartable_postgres import RestartablePostgres, restartable_postgres
from tests.support.server import ServerProcess, free_port


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[RestartablePostgres]:
    with restartable_postgres() as server:
        yield server


@pytest.fixture(scope="module")
def own_database(own_postgres: RestartablePostgres) -> str:
    url, _ = asyncio.run(create_test_database(own_postgres.url))
    return url


@pytest.fixture(scope="module")
def own_server(
    own_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=own_database, data_dir=tmp_path_factory.mktemp("outage"), env=SERVER_ENV
    ).start()
    yield process
    process.stop()


@pytest.fixture
async def own_api(own_server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(own_server) as client:
        yield client


async def until_answered(request, *, deadline: float = 20.0) -> httpx.Response:
    """Retry a request while the service answers 503 (as a client following Retry-After would,
    but faster)."""
    async with asyncio.timeout(deadline):
        while True:
            answer = await request()
            if answer.status_code != 503:
                return answer
            await asyncio.sleep(0.05)


def assert_unavailable(answer: httpx.Response) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["code"] == "unavailable"
    assert int(answer.headers["retry-after"]) >= 1


@pytest.mark.slow
async def test_restarting_postgresql_under_load_answers_no_500_and_loses_nothing_acknowledged(
    own_postgres: RestartablePostgres, own_api: httpx.AsyncClient, own_server: ServerProcess
) -> None:
    run_id = "run-" + secrets.token_hex(4)
    streams = [f"s{i}" for i in range(4)]
    for stream_id in streams:
        created = await own_api.post(
            f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "output"}
        )
        assert created.status_code == 201, created.text

    statuses: collections.Counter[tuple[str, int]] = collections.Counter()
    failures: list[str] = []
    acknowledged: dict[str, dict[int, str]] = {s: {} for s in streams}
    stop = asyncio.Event()

    def seen(what: str, answer: httpx.Response) -> None:
        statuses[(what, answer.status_code)] += 1
        if answer.status_code >= 500 and answer.status_code != 503:
            failures.append(f"{what}: {answer.status_code} {answer.text}")
        if answer.status_code == 503:
            assert_unavailable(answer)

    async def appender(stream_id: str, writer: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            value = f"w{writer}-{n}"
            answer = await own_api.post(
                f"/runs/{run_id}/streams/{stream_id}/records",
                json={"records": [{"data": value}, {"data": value + "b"}]},
            )
            seen("append", answer)
            if answer.status_code == 201:
                first = answer.json()["first_sequence"]
                acknowledged[stream_id][first] = value
                acknowledged[stream_id][first + 1] = value + "b"
            await asyncio.sleep(0.01)

    async def reader(stream_id: str) -> None:
        while not stop.is_set():
            seen("read", await own_api.get(f"/runs/{run_id}/streams/{stream_id}/records"))
            seen("get", await own_api.get(f"/runs/{run_id}/streams/{stream_id}"))
            await asyncio.sleep(0.02)

    async def creator() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            answer = await own_api.post(
                f"/runs/{run_id}-c/streams", json={"stream_id": f"c{n}", "direction": "output"}
            )
            seen("create", answer)
            await asyncio.sleep(0.05)

    async def subscriber() -> None:
        while not stop.is_set():
            path = f"/runs/{run_id}/streams/{streams[0]}/subscribe"
            async with own_api.stream("GET", path) as answer:
                if answer.status_code != 200:
                    await answer.aread()
                seen("subscribe", answer)
            await asyncio.sleep(0.05)

    tasks = [
        *(asyncio.create_task(appender(s, w)) for s in streams for w in range(2)),
        *(asyncio.create_task(reader(s)) for s in streams[:2]),
        asyncio.create_task(creator()),
        asyncio.create_task(subscriber()),
    ]
    restarts = own_postgres.restart_in_background(times=3, pause=2.5)
    await asyncio.to_thread(restarts.join)
    await asyncio.sleep(2)  # and a while after the last one
    stop.set()
    await asyncio.gather(*tasks)

    errors = [line for line in own_server.log().splitlines() if '"level":"error"' in line]
    assert failures == [], (failures[:5], errors[:3])
    assert sum(n for (what, code), n in statuses.items() if code == 503) > 0, statuses
    assert sum(n for (what, code), n in statuses.items() if code == 201) > 0, statuses
    for stream_id in streams:
        records: list[dict] = []
        cursor = 0
        while True:
            page = await until_answered(
                lambda stream_id=stream_id, cursor=cursor: own_api.get(
                    f"/runs/{run_id}/streams/{stream_id}/records",
                    params={"cursor": cursor, "limit": 1000},
                )
            )
            assert page.status_code == 200, page.text
            body = page.json()
            records += body["records"]
            if not body["records"]:
                break
            cursor = body["next_cursor"]
        sequences = [r["sequence"] for r in records]
        assert sequences == list(range(1, len(records) + 1))  # contiguous, no gap
        assert sequences[-1] == body["head"]
        stored = {r["sequence"]: r["data"] for r in records}
        for sequence, value in acknowledged[stream_id].items():
            assert stored.get(sequence) == value, (stream_id, sequence)


async def test_a_follower_hears_an_append_within_a_second_or_so_after_a_seven_second_outage(
    own_postgres: RestartablePostgres, own_api: httpx.AsyncClient, own_server: ServerProcess
) -> None:
    """And its tail, which could not read meanwhile, said so once, counted it (on a /metrics
    that answers through the outage), and said once that it reads again (application/live.py)."""
    run_id = "run-" + secrets.token_hex(4)
    path = f"/runs/{run_id}/streams/live"
    created = await own_api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "live", "direction": "output"}
    )
    assert created.status_code == 201, created.text
    received: asyncio.Queue[tuple[float, str]] = asyncio.Queue()

    async def follow() -> None:
        async with own_api.stream("GET", f"{path}/subscribe", timeout=None) as answer:
            assert answer.status_code == 200
            async for line in answer.aiter_lines():
                await received.put((time.monotonic(), line))

    follower = asyncio.create_task(follow())
    async with asyncio.timeout(10):
        while (await received.get())[1] != ": subscribed":
            pass
    # A record delivered first: the tail has read. An outage an earlier test left open (one is
    # over only once a tail reads again) is closed, so this one is counted as its own.
    before = await own_api.post(f"{path}/records", json={"records": [{"data": "before"}]})
    assert before.status_code == 201, before.text
    async with asyncio.timeout(10):
        while (await received.get())[1] != "id: 1":
            pass
    async with httpx.AsyncClient(base_url=own_server.base_url) as plain:
        outages_before = metric((await plain.get("/metrics")).text, OUTAGES)
    scraped = time.monotonic()
    log_before = len(own_server.log())

    await asyncio.to_thread(own_postgres.stop)
    stopped = time.monotonic()
    try:
        await asyncio.sleep(max(0.0, 5.5 - (stopped - scraped)))  # past the figures' 5 s
        # /metrics answers meanwhile, without its database figures, with the tail's outage.
        async with httpx.AsyncClient(base_url=own_server.base_url, timeout=10) as plain:
            during = await plain.get("/metrics")
        assert during.status_code == 200, during.text
        assert metric(during.text, OUTAGES) == outages_before + 1
        assert metric(during.text, "ductor_streams_live_tails_failing") >= 1
        assert "ductor_streams_outbox_pending{" not in during.text
        # A reconnect backoff doubling from 0.1 s would next try at 11.3 s.
        await asyncio.sleep(max(0.0, 7 - (time.monotonic() - stopped)))
    finally:  # back for the module's other tests whatever happened
        await asyncio.to_thread(own_postgres.start)  # returns once it accepts connections
    back = time.monotonic()

    appended = await until_answered(
        lambda: own_api.post(f"{path}/records", json={"records": [{"data": "after"}]})
    )
    assert appended.status_code == 201, appended.text
    try:
        async with asyncio.timeout(10):
            while True:
                at, line = await received.get()
                if line == "id: 2":
                    break
        assert at - back < 1.5, f"delivered {at - back:.2f}s after PostgreSQL was back"
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
    said = own_server.log()[log_before:]
    assert said.count("live delivery cannot read") == 1, said
    assert said.count("live delivery reads again after") == 1, said
    async with httpx.AsyncClient(base_url=own_server.base_url) as plain:
        assert metric((await plain.get("/metrics")).text, OUTAGES) == outages_before + 1


OUTAGES = "ductor_streams_live_tail_outages_total"


STATEMENT_TIMEOUT_SECONDS = 2


@pytest.fixture
def hasty_server(own_database: str, tmp_path: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that gives a database statement STATEMENT_TIMEOUT_SECONDS (the default is 10)."""
    env = {**SERVER_ENV, "DUCTOR_STREAMS_STATEMENT_TIMEOUT_SECONDS": str(STATEMENT_TIMEOUT_SECONDS)}
    process = ServerProcess(database_url=own_database, data_dir=tmp_path, env=env).start()
    yield process
    process.stop()


async def test_a_hung_postgresql_answers_503_within_bounds_and_the_service_recovers(
    own_postgres: RestartablePostgres, hasty_server: ServerProcess
) -> None:
    run_id = "run-" + secrets.token_hex(4)
    path = f"/runs/{run_id}/streams/s/records"
    async with (
        api_client(hasty_server) as api,
        httpx.AsyncClient(base_url=hasty_server.base_url, timeout=60) as plain,
    ):
        created = await api.post(
            f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
        )
        assert created.status_code == 201, created.text
        assert (await api.post(path, json={"records": [{"data": 1}]})).status_code == 201

        await asyncio.to_thread(own_postgres.hang)
        try:
            started = time.monotonic()
            ready = await plain.get("/readyz")
            took = time.monotonic() - started
            assert ready.status_code == 503, ready.text
            assert ready.headers["content-type"].startswith("application/problem+json")
            assert ready.headers["retry-after"] == "1"
            assert ready.json()["code"] == "unavailable"
            assert took < 3.5, f"/readyz answered after {took:.1f} s"

            # A statement times out, then its connection is given up (the cancellation it
            # sends cannot be answered either): within two statement timeouts, plus slack.
            retried = {"Idempotency-Key": "hung-" + run_id}
            started = time.monotonic()
            append = await api.post(path, json={"records": [{"data": 2}]}, headers=retried)
            took = time.monotonic() - started
            assert_unavailable(append)
            assert took < 2 * STATEMENT_TIMEOUT_SECONDS + 3, f"append answered after {took:.1f} s"

            started = time.monotonic()
            read = await api.get(path, params={"cursor": 0})
            took = time.monotonic() - started
            assert_unavailable(read)
            assert took < 2 * STATEMENT_TIMEOUT_SECONDS + 3, f"read answered after {took:.1f} s"
        finally:
            await asyncio.to_thread(own_postgres.resume)

        # Back: no connection left broken in the pool; the append retried with its key lands
        # once (it may have committed after all, when the server woke: then it is replayed).
        again = await until_answered(
            lambda: api.post(path, json={"records": [{"data": 2}]}, headers=retried)
        )
        assert again.status_code in (200, 201), again.text
        assert again.json()["first_sequence"] == 2
        for _ in range(5):  # more requests than the connections the outage could have spoilt
            assert (await plain.get("/readyz")).status_code == 200
            page = await api.get(path, params={"cursor": 0})
            assert page.status_code == 200, page.text
        assert [r["data"] for r in page.json()["records"]] == [1, 2]


# --- the object store out of reach ---------------------------------------------------------


def _s3_env(endpoint: str) -> dict[str, str]:
    """A server whose objects go to the S3 API at `endpoint`, bucket `objects`."""
    return {
        **SERVER_ENV,
        "DUCTOR_STREAMS_OBJECT_STORE": "s3",
        "DUCTOR_STREAMS_S3_ENDPOINT_URL": endpoint,
        "DUCTOR_STREAMS_S3_BUCKET": "objects",
        "DUCTOR_STREAMS_S3_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_MAX_ATTEMPTS": "2",  # botocore would otherwise retry a refused connection 4 times
    }


async def _prepare_object(api: httpx.AsyncClient, body: bytes) -> str:
    """A new run's output stream `o` and an object intent for `body` on it; its path."""
    run_id = "run-" + secrets.token_hex(4)
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "o", "direction": "output"}
    )
    assert created.status_code == 201, created.text
    prepared = await api.post(
        f"/runs/{run_id}/streams/o/objects",
        json={
            "idempotency_key": "k",
            "size": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "content_type": "application/octet-stream",
        },
    )
    assert prepared.status_code == 201, prepared.text
    return f"/runs/{run_id}/streams/o/objects/{prepared.json()['object_id']}"


def _closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # bound and released: nothing listens there


@pytest.fixture(scope="module")
def unreachable_s3_server(
    own_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=own_database,
        data_dir=tmp_path_factory.mktemp("no-s3"),
        env=_s3_env(_closed_port_url()),
    ).start()
    yield process
    process.stop()


async def test_an_upload_to_an_unreachable_object_store_answers_503(
    unreachable_s3_server: ServerProcess,
) -> None:
    body = b"a body for nowhere"
    async with api_client(unreachable_s3_server, BOOTSTRAP_TOKEN) as api:
        object_path = await _prepare_object(api, body)
        uploaded = await api.put(f"{object_path}/body", content=body)
        assert_unavailable(uploaded)
        # Nothing changed: the intent is still waiting for its body.
        assert (await api.get(object_path)).json()["state"] == "prepared"
    assert "Traceback" not in unreachable_s3_server.log()


async def test_a_download_from_an_object_store_gone_away_answers_503(
    own_database: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import aioboto3
    from moto.server import ThreadedMotoServer

    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    s3.start()
    host, port = s3.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    session = aioboto3.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )
    async with session.client("s3", endpoint_url=endpoint) as client:
        await client.create_bucket(Bucket="objects")
    server = ServerProcess(
        database_url=own_database,
        data_dir=tmp_path_factory.mktemp("s3-gone"),
        env=_s3_env(endpoint),
    ).start()
    body = b"a body the store will lose sight of"
    try:
        async with api_client(server, BOOTSTRAP_TOKEN) as api:
            object_path = await _prepare_object(api, body)
            assert (await api.put(f"{object_path}/body", content=body)).status_code == 200
            assert (await api.post(f"{object_path}/commit")).status_code == 201
            assert (await api.get(f"{object_path}/body")).content == body

            s3.stop()  # the store is out of reach from now on
            assert_unavailable(await api.get(f"{object_path}/body"))
    finally:
        server.stop()
        with contextlib.suppress(Exception):
            s3.stop()
