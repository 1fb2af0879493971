"""Silent networks: a connection to PostgreSQL that stops forwarding without closing (no RST, no
FIN), made by a proxy between real server and worker processes and PostgreSQL
(tests/support/partition_proxy.py). A dead connection nobody closed must cost seconds: live
delivery degrades to polling and the wake connection is replaced, requests answer 503 within
their bound, and a partitioned worker stops acting on its claims before another takes them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from adapters.postgres.tokens import PostgresTokens
from application.tokens import token_hash, token_id
from application.workers import HELD_FOR_LEASES
from tests.conftest import SERVER_ENV, Tokens, api_client
from tests.support.partition_proxy import PartitionProxy
from tests.support.pull_wake import claimed_pull_wake
from tests.support.server import ServerProcess, WorkerProcess
from tests.support.wait_stub import WaitServiceStub


@pytest.fixture
def proxy(database_url: str) -> Iterator[PartitionProxy]:
    with PartitionProxy(database_url) as proxy:
        try:
            yield proxy
        finally:
            proxy.heal()


@pytest.fixture
def proxied_server(
    proxy: PartitionProxy, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server whose every connection to PostgreSQL goes through `proxy`, with the service's
    default liveness settings (heartbeat 0.5 s, replaced after 5 s) and request bound (5 s)."""
    process = ServerProcess(
        database_url=proxy.url(database_url),
        data_dir=tmp_path_factory.mktemp("partitioned"),
        env=SERVER_ENV,
    ).start()
    yield process
    process.stop()


class Follower:
    """An SSE subscriber that notes when each record's id arrived."""

    def __init__(self, api: httpx.AsyncClient, path: str) -> None:
        self.arrived: dict[int, float] = {}
        self.ids: list[int] = []
        self.subscribed = asyncio.Event()
        self._task = asyncio.create_task(self._follow(api, path))

    async def _follow(self, api: httpx.AsyncClient, path: str) -> None:
        async with api.stream("GET", f"{path}/subscribe", timeout=None) as answer:
            assert answer.status_code == 200
            async for line in answer.aiter_lines():
                if line == ": subscribed":
                    self.subscribed.set()
                elif line.startswith("id: "):
                    sequence = int(line[4:])
                    self.ids.append(sequence)
                    self.arrived.setdefault(sequence, time.monotonic())

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@contextlib.asynccontextmanager
async def cancelled_at_exit(coroutine) -> AsyncIterator[asyncio.Task]:  # type: ignore[no-untyped-def]
    task = asyncio.create_task(coroutine)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def following(api: httpx.AsyncClient, path: str) -> AsyncIterator[Follower]:
    follower = Follower(api, path)
    try:
        async with asyncio.timeout(10):
            await follower.subscribed.wait()
        await asyncio.sleep(0.3)  # its tail has read the head and waits for a wake
        yield follower
    finally:
        await follower.close()


def log_messages(process: ServerProcess) -> list[str]:
    messages = []
    for line in process.log().splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            messages.append(json.loads(line)["msg"])
    return messages


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


@pytest.mark.slow
async def test_a_silent_listen_connection_costs_at_most_a_poll_and_is_replaced_within_seconds(
    proxy: PartitionProxy, proxied_server: ServerProcess, tokens: Tokens, pool
) -> None:
    run_id = "run-" + secrets.token_hex(4)
    path = f"/runs/{run_id}/streams/live"
    revoked = await tokens.create()
    async with (
        api_client(proxied_server) as api,
        api_client(proxied_server, revoked) as doomed,
        httpx.AsyncClient(base_url=proxied_server.base_url, timeout=10) as plain,
    ):
        created = await api.post(
            f"/runs/{run_id}/streams", json={"stream_id": "live", "direction": "output"}
        )
        assert created.status_code == 201, created.text
        assert (await doomed.get(path)).status_code == 200  # known, and cached

        acknowledged: dict[int, float] = {}  # sequence -> when its 201 arrived
        stop = asyncio.Event()

        async def appender() -> None:  # 20 appends a second
            n = 0
            while not stop.is_set():
                n += 1
                answer = await api.post(f"{path}/records", json={"records": [{"data": n}]})
                assert answer.status_code == 201, answer.text
                acknowledged[answer.json()["first_sequence"]] = time.monotonic()
                await asyncio.sleep(0.05)

        async with following(api, path) as follower, cancelled_at_exit(appender()) as writing:
            await asyncio.sleep(2)
            [silenced] = proxy.freeze_listen()  # the server's wake bus, and nothing else
            assert "listen" in silenced.application_name
            frozen_at = time.monotonic()

            await asyncio.sleep(0.1)
            # Revoked as soon as the bus hears nothing, before it can know it is not live (and
            # its notification is held): refused all the same within 2 s.
            await PostgresTokens(pool).revoke(token_id(token_hash(revoked)))
            revoked_at = time.monotonic()
            async with asyncio.timeout(5):
                while (await doomed.get(path)).status_code != 401:
                    await asyncio.sleep(0.05)
            refused_after = time.monotonic() - revoked_at

            await asyncio.sleep(frozen_at + 11 - time.monotonic())
            stop.set()
            await writing
            head = max(acknowledged)
            async with asyncio.timeout(5):
                while len(follower.arrived) < head:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            ids = follower.ids

        metrics = (await plain.get("/metrics")).text

    assert ids == list(range(1, head + 1)), "lost, reordered or duplicated"
    delay = {s: max(0.0, follower.arrived[s] - at) for s, at in acknowledged.items()}
    worst = max(delay.values())
    after = sorted((acknowledged[s] - frozen_at, d) for s, d in delay.items())
    silent = [d for t, d in after if t > 0]
    # Back to live delivery: from some point within 10 s of the silence, every delay <= 100 ms.
    slow = [t for t, d in after if d > 0.1]
    back_at = max(slow) if slow else 0.0
    before = sorted(d for t, d in after if t <= 0)
    print(
        f"delays: before p50 {before[len(before) // 2]:.3f} s; "
        f"while silent max {max(silent):.3f} s, back to <= 100 ms at {back_at:.1f} s; "
        f"revocation refused after {refused_after:.2f} s"
    )
    assert worst <= 1.5, f"a record took {worst:.2f} s to reach the follower"
    assert back_at <= 10, f"delivery was still slow {back_at:.1f} s after the silence began"
    assert refused_after <= 2.0, f"a revoked token was still accepted {refused_after:.2f} s later"
    assert metric(metrics, "ductor_streams_wake_connection_replacements_total") >= 1
    assert metric(metrics, "ductor_streams_wake_bus_not_live_total") >= 1
    assert metric(metrics, "ductor_streams_wake_bus_live") == 1
    listening = [c for c in proxy.open_connections() if c.listening and not c.frozen]
    assert listening, "no new LISTEN connection was opened"
    lines = log_messages(proxied_server)
    assert any(m.startswith("wake bus not live: polling") for m in lines)
    assert any(m.startswith("wake connection replaced") for m in lines)


REQUEST_BOUND = 5.0  # DUCTOR_STREAMS_REQUEST_TIMEOUT_SECONDS's default
PARTITION_SECONDS = 15


@pytest.mark.slow
async def test_a_partitioned_replica_answers_503_within_its_bound_while_the_other_serves(
    proxy: PartitionProxy,
    proxied_server: ServerProcess,
    server_b: ServerProcess,
) -> None:
    """Replica A loses every connection to PostgreSQL (open ones and new ones) for 15 s; replica
    B, over the same database, does not. Writers retry with their Idempotency-Key."""
    run_id = "run-" + secrets.token_hex(4)
    stream = {"a": f"/runs/{run_id}/streams/a", "b": f"/runs/{run_id}/streams/b"}
    statuses: dict[str, list[tuple[float, float, int]]] = {"a": [], "b": []}  # (sent, took, status)
    acknowledged: dict[str, dict[str, int]] = {"a": {}, "b": {}}  # key -> first_sequence
    stop = asyncio.Event()

    async def writer(api: httpx.AsyncClient, replica: str, number: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            key = f"{replica}{number}-{n}"
            while True:  # the same key until answered: retrying is always safe
                sent = time.monotonic()
                answer = await api.post(
                    f"{stream[replica]}/records",
                    json={"records": [{"data": key}]},
                    headers={"Idempotency-Key": key},
                )
                statuses[replica].append((sent, time.monotonic() - sent, answer.status_code))
                if answer.status_code in (200, 201):
                    acknowledged[replica][key] = answer.json()["first_sequence"]
                    break
                assert answer.status_code == 503, answer.text
                assert answer.headers["retry-after"] == "1"
                await asyncio.sleep(0.2)
            await asyncio.sleep(0.05)

    async with (
        api_client(proxied_server) as api_a,
        api_client(server_b) as api_b,
        httpx.AsyncClient(base_url=proxied_server.base_url, timeout=30) as plain_a,
    ):
        for stream_id in stream:
            created = await api_b.post(
                f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "output"}
            )
            assert created.status_code == 201, created.text
        async with contextlib.AsyncExitStack() as stack:
            followers = {
                ("a", "a"): await stack.enter_async_context(following(api_a, stream["a"])),
                ("b", "a"): await stack.enter_async_context(following(api_b, stream["a"])),
                ("b", "b"): await stack.enter_async_context(following(api_b, stream["b"])),
            }
            writers = [
                await stack.enter_async_context(cancelled_at_exit(writer(api, replica, number)))
                for api, replica, number in [
                    (api_a, "a", 0),
                    (api_a, "a", 1),
                    (api_a, "a", 2),
                    (api_b, "b", 0),
                ]
            ]
            await asyncio.sleep(2)

            proxy.freeze_all()
            partitioned = time.monotonic()
            while (await plain_a.get("/readyz")).status_code != 503:
                pass
            unready_after = time.monotonic() - partitioned
            await asyncio.sleep(partitioned + PARTITION_SECONDS - time.monotonic())
            proxy.heal()
            healed = time.monotonic()
            await asyncio.sleep(4)
            stop.set()
            await asyncio.wait(writers, timeout=REQUEST_BOUND + 5)  # each one's last request
            for task in writers:
                task.result()  # no writer failed
            heads = {}
            for stream_id, path in stream.items():
                heads[stream_id] = (await api_b.get(path)).json()["state"]["head"]
            async with asyncio.timeout(5):
                while any(
                    len(f.arrived) < heads[stream_id] for (_, stream_id), f in followers.items()
                ):
                    await asyncio.sleep(0.05)
            ids = {where: list(f.ids) for where, f in followers.items()}
            records = {}
            for stream_id, path in stream.items():
                page = await api_b.get(f"{path}/records", params={"cursor": 0, "limit": 1000})
                records[stream_id] = page.json()["records"]

    during = [(s, t, c) for s, t, c in statuses["a"] if partitioned <= s < healed]
    slowest = max(t for _, t, _ in statuses["a"])
    back = min(s + t for s, t, c in statuses["a"] if c in (200, 201) and s >= healed) - healed
    b_slowest = max(t for s, t, _ in statuses["b"] if partitioned <= s < healed)
    print(
        f"A: {len(during)} requests while partitioned, slowest answer {slowest:.2f} s, "
        f"/readyz 503 after {unready_after:.2f} s, first append after healing {back:.2f} s; "
        f"B: slowest append while A was partitioned {b_slowest:.3f} s"
    )
    assert all(c != 500 for _, _, c in statuses["a"] + statuses["b"])
    assert any(c == 503 for _, _, c in during)
    assert slowest <= REQUEST_BOUND + 0.5, f"a request was answered after {slowest:.2f} s"
    assert unready_after <= 2.0
    assert back <= 2.0, f"appends resumed {back:.2f} s after healing"
    assert all(c in (200, 201) for _, _, c in statuses["b"]), "replica B stopped serving"
    assert b_slowest < 1.0
    for stream_id, stored in records.items():
        sequences = [r["sequence"] for r in stored]
        assert sequences == list(range(1, heads[stream_id] + 1))
        data = [r["data"] for r in stored]
        assert len(data) == len(set(data)), "an append was applied twice"
        for key, first in acknowledged[stream_id].items():
            assert stored[first - 1]["data"] == key, "an acknowledged append was lost"
    for (_, stream_id), seen in ids.items():
        assert seen == list(range(1, heads[stream_id] + 1)), "a follower missed or repeated"


# --- a worker partitioned mid-dispatch ---------------------------------------------------------

WORKER_ENV = {
    "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.05",
    "DUCTOR_STREAMS_DISPATCH_POLL_SECONDS": "0.05",
    "DUCTOR_STREAMS_RETRY_BASE_SECONDS": "0.02",
    # The lease is the service's default, 6 s (DUCTOR_STREAMS_WORKER_LEASE_SECONDS is not set).
}
LEASE_SECONDS = 6.0


@pytest.mark.slow
async def test_a_partitioned_dispatcher_stops_before_its_lease_ends_and_never_publishes_after(
    own_database: str, own_pool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run_id = "run-" + secrets.token_hex(4)
    records = 150
    with (
        PartitionProxy(own_database) as proxy,
        WaitServiceStub(fail_every=10**9, lose_answer_every=10**9, delay=0.03) as stub,
    ):

        def worker(name: str, url: str) -> WorkerProcess:
            env = {
                **WORKER_ENV,
                "DUCTOR_STREAMS_WAIT_SERVICE": "http",
                "DUCTOR_STREAMS_WAIT_SERVICE_URL": f"{stub.url}/{name}",  # who published
            }
            return WorkerProcess(database_url=url, data_dir=tmp_path_factory.mktemp(name), env=env)

        server = ServerProcess(
            database_url=own_database, data_dir=tmp_path_factory.mktemp("s"), env=SERVER_ENV
        ).start()
        first = worker("first", proxy.url(own_database))
        second = worker("second", own_database)
        try:
            async with api_client(server) as api:
                created = await api.post(
                    f"/runs/{run_id}/streams", json={"stream_id": "in", "direction": "input"}
                )
                assert created.status_code == 201, created.text
                answer = await api.post(
                    f"/runs/{run_id}/streams/in/records",
                    json={"records": [{"data": n} for n in range(records)]},
                )
                assert answer.status_code == 201, answer.text
            first.start()
            async with asyncio.timeout(20):  # the first worker is under way
                while len(stub.sequences("in")) < 10:
                    await asyncio.sleep(0.05)
            second.start()
            async with asyncio.timeout(20):
                while len(stub.sequences("in")) < 40:
                    await asyncio.sleep(0.05)

            proxy.freeze_all()
            partitioned = time.monotonic()
            async with asyncio.timeout(60):  # the second takes over and finishes
                while len(stub.sequences("in")) < records:
                    await asyncio.sleep(0.1)
            taken_over = min(
                at for at, where, _ in stub.log if where.endswith("/second") and at > partitioned
            )
            await asyncio.sleep(max(0.0, partitioned + LEASE_SECONDS + 2 - time.monotonic()))
            proxy.heal()
            healed = time.monotonic()
            await asyncio.sleep(4)  # the first worker, back, finds its claims gone
            first_log = first.log()
        finally:
            for process in (first, second, server):
                process.stop()

    by_first = [at for at, where, _ in stub.log if where.endswith("/first")]
    last_by_first = max(by_first) - partitioned
    print(
        f"first worker's last publish {last_by_first:.2f} s into the partition; the second's "
        f"first {taken_over - partitioned:.2f} s in; duplicates {stub.duplicates}"
    )
    # In order, each once (by event id), whoever published it.
    assert stub.sequences("in") == list(range(1, records + 1))
    # The first worker acted on nothing once its claim could have been taken over (3/4 of a
    # lease after its last renewal: at most that into the partition), nor after healing.
    assert last_by_first < LEASE_SECONDS * HELD_FOR_LEASES + 0.5
    assert not [at for at in by_first if at >= healed]
    assert taken_over - partitioned >= LEASE_SECONDS * HELD_FOR_LEASES
    # A repeat is only the takeover's republish of what the first worker published and could
    # not record (its delivery mark went silent): by the second worker, at its first events.
    # (Two such repeats were seen once, on a loaded machine, before renewals got half a lease
    # to get through; one is what the design allows, two is the tolerance kept here.)
    requests: dict[str, list[tuple[float, str]]] = {}
    for at, where, key in stub.log:
        requests.setdefault(key, []).append((round(at - partitioned, 2), where.rsplit("/", 1)[-1]))
    repeated = {k: v for k, v in requests.items() if len(v) > 1}
    by_second = sorted(
        (min(at for at, w in v if w == "second"), k)
        for k, v in requests.items()
        if any(w == "second" for _, w in v)
    )
    republished = {k for _, k in by_second[:2]}
    assert set(repeated) <= republished, repeated
    assert all(len(v) == 2 and v[-1][1] == "second" for v in repeated.values()), repeated
    assert "stops acting on" in first_log


# --- every request kind answers within its bound ------------------------------------------------


async def test_reads_of_a_stream_and_subscription_requests_answer_503_within_their_bound(
    proxy: PartitionProxy, proxied_server: ServerProcess
) -> None:
    """Not only appends: a stream's document, a subscription's document, a claim, a pull-wake
    ack and the webhook signing keys each answer 503 within the request bound on a silent
    network (they took a pooled connection unbounded, and waited for the driver's statement
    timeout at each statement: 20 s for a stream's document)."""
    run_id = "run-" + secrets.token_hex(4)
    name = "sub-" + secrets.token_hex(4)
    async with api_client(proxied_server) as api:
        claimed = await claimed_pull_wake(api, "", run_id, name)
        ack = {"wake_id": claimed["wake_id"], "generation": claimed["generation"]}
        wake_auth = {"Authorization": f"Bearer {claimed['token']}"}
        requests = {
            "stream": lambda: api.get(f"/runs/{run_id}/streams/e1"),
            "subscription": lambda: api.get(f"/subscriptions/{name}"),
            "claim": lambda: api.post(f"/subscriptions/{name}/claim", json={"worker": "w2"}),
            "ack": lambda: api.post(f"/subscriptions/{name}/ack", json=ack, headers=wake_auth),
            "jwks": lambda: api.get(
                proxied_server.base_url + "/api/durable-streams/v1/stream/__ds/jwks.json"
            ),
        }

        async def timed(request):  # type: ignore[no-untyped-def]
            started = time.monotonic()
            answer = await request()
            return answer, time.monotonic() - started

        proxy.freeze_all()
        try:
            # Twice: the first finds the pooled connections open (now silent), the second
            # finds them given up on and must open new ones.
            for _ in range(2):
                answers = await asyncio.gather(*(timed(r) for r in requests.values()))
                late = {
                    what: (answer.status_code, round(took, 2))
                    for what, (answer, took) in zip(requests, answers, strict=True)
                    if answer.status_code != 503 or took > REQUEST_BOUND + 0.5
                }
                assert not late, f"answered late or not 503: {late}"
        finally:
            proxy.heal()
