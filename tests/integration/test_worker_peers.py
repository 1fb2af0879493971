"""`serve --workers 2`: each stream's appends committed by one of the processes, whichever took
them (adapters/peers.py), through the real server against real PostgreSQL; a worker killed
under idempotent writers loses and duplicates nothing they retry."""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import time
from collections import defaultdict
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV, api_client
from tests.integration.test_cross_stream_commit import records_of
from tests.integration.test_http_records import create
from tests.support.server import ServerProcess

_COUNTER = re.compile(r"^ductor_streams_appends_(forwarded|received)_total (\S+)$", re.M)


def pair_of_workers(database_url: str, tmp_path: Path) -> ServerProcess:
    return ServerProcess(
        database_url=database_url, data_dir=tmp_path, env=SERVER_ENV, args=["--workers", "2"]
    ).start()


async def counters_of_each_process(server: ServerProcess) -> set[tuple[float, float]]:
    """(forwarded, received) of each worker: /metrics answers for the process its connection
    reached, so it is asked on fresh connections until both have answered."""
    seen: set[tuple[float, float]] = set()
    for _ in range(60):
        async with httpx.AsyncClient(base_url=server.base_url) as fresh:
            text = (await fresh.get("/metrics")).text
        found = dict(_COUNTER.findall(text))
        seen.add((float(found["forwarded"]), float(found["received"])))
        if len(seen) == 2:
            break
    return seen


async def test_each_streams_appends_are_committed_by_one_process_whichever_took_them(
    database_url: str, tmp_path: Path, run_id: str
) -> None:
    server = pair_of_workers(database_url, tmp_path)
    try:
        names = ["hot", *(f"s{i:02d}" for i in range(12))]
        async with api_client(server) as api:
            for name in names:
                await create(api, run_id, name)
        acked: dict[str, list[tuple[int, int]]] = defaultdict(list)

        def writing(deadline: float) -> bool:
            # 2.5 s, and on a busy machine until 400 are acknowledged (at most 30 s).
            now = time.monotonic()
            total = sum(len(pairs) for pairs in acked.values())
            return now < deadline or (total < 400 and now < deadline + 27.5)

        async def writer(number: int, deadline: float) -> None:
            # A client of its own: its connection lands on either process.
            rng = random.Random(number)
            n = 0
            async with api_client(server) as client:
                while writing(deadline):
                    name = "hot" if n % 2 == 0 else rng.choice(names)
                    response = await client.post(
                        f"/runs/{run_id}/streams/{name}/records",
                        json={"records": [{"data": [number, n]}]},
                    )
                    assert response.status_code == 201, response.text
                    acked[name].append((number, n))
                    n += 1

        deadline = time.monotonic() + 2.5
        await asyncio.gather(*(writer(i, deadline) for i in range(24)))
        counters = await counters_of_each_process(server)
        assert len(counters) == 2, counters  # both processes answered
        forwarded = sum(f for f, _ in counters)
        received = sum(r for _, r in counters)
        assert forwarded == received > 50  # each sent append was committed by the other
        async with api_client(server) as api:
            for name in names:
                found = await records_of(api, run_id, name)
                assert [r["sequence"] for r in found] == list(range(1, len(found) + 1))
                pairs = [tuple(r["data"]) for r in found]
                assert sorted(pairs) == sorted(acked[name])  # every acknowledged one, once
                by_writer: dict[int, list[int]] = defaultdict(list)
                for number, n in pairs:
                    by_writer[number].append(n)
                assert all(ns == sorted(ns) for ns in by_writer.values())
    finally:
        server.stop()


@pytest.mark.slow
async def test_a_worker_killed_under_idempotent_writers_loses_and_duplicates_nothing(
    database_url: str, tmp_path: Path, run_id: str
) -> None:
    """One of the two processes is killed (-9) while writers on 20 streams append through
    both: the appends it had taken, and those the other had sent it to commit, are answered
    503 (or their connection drops) and retried with their key until they are answered."""
    server = pair_of_workers(database_url, tmp_path)
    try:
        names = [f"s{i:02d}" for i in range(20)]
        async with api_client(server) as api:
            for name in names:
                await create(api, run_id, name)
        workers = psutil.Process(server.process.pid).children(recursive=True)
        assert len(workers) == 2, workers
        attempted: dict[str, str] = {}
        retried: list[int] = []  # the status of each failed attempt (0: no answer)
        stop = asyncio.Event()

        async def writer(number: int) -> None:
            rng = random.Random(number)
            n = 0
            client = api_client(server)
            while not stop.is_set():
                key = f"w{number}-{n}"
                name = rng.choice(names)
                attempted[key] = name
                while True:  # until answered, on a fresh connection after a failure
                    try:
                        response = await client.post(
                            f"/runs/{run_id}/streams/{name}/records",
                            json={"records": [{"data": key}]},
                            headers={"Idempotency-Key": key},
                        )
                    except httpx.HTTPError:
                        retried.append(0)
                        await client.aclose()
                        client = api_client(server)
                        await asyncio.sleep(0.1)
                        continue
                    if response.status_code in (200, 201):
                        break
                    retried.append(response.status_code)
                    assert response.status_code == 503, response.text
                    await asyncio.sleep(0.1)
                n += 1
            await client.aclose()

        writers = [asyncio.create_task(writer(i)) for i in range(24)]
        await asyncio.sleep(1.5)
        workers[-1].send_signal(signal.SIGKILL)  # mid-commit, mid-forward
        await asyncio.sleep(3.0)  # the supervisor starts another; writers go on meanwhile
        stop.set()
        print(f"attempted {len(attempted)}, retried {len(retried)}: {sorted(set(retried))}")
        await asyncio.wait_for(asyncio.gather(*writers), 60)
        seen: list[str] = []
        async with api_client(server) as api:
            for name in names:
                found = await records_of(api, run_id, name)
                assert [r["sequence"] for r in found] == list(range(1, len(found) + 1))
                assert all(attempted[r["data"]] == name for r in found)
                seen += [r["data"] for r in found]
        assert len(seen) == len(set(seen))  # 0 duplicates
        assert set(seen) == set(attempted)  # 0 lost
        assert len(attempted) > 200
        assert retried  # the kill cut requests short
    finally:
        server.stop()


async def test_a_stopped_process_leaves_its_streams_to_the_other_after_one_budget(
    database_url: str, tmp_path: Path, run_id: str
) -> None:
    """One of the two processes is stopped (SIGSTOP: its connections stay open, it answers
    nothing). Appends through the other to the streams the stopped one commits wait for one
    request's budget once, answer 503 (outcome unknown), and from then on are committed by the
    process that took them; before, every one of them answered 503 for as long as it was
    stopped."""
    import http.client

    server = pair_of_workers(database_url, tmp_path)
    names = [f"s{i:02d}" for i in range(16)]  # (some owned by each: but for 2 in 65,536)
    stopped: psutil.Process | None = None
    try:
        async with api_client(server) as api:
            for name in names:
                await create(api, run_id, name)
        workers = psutil.Process(server.process.pid).children(recursive=True)
        assert len(workers) == 2, workers
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        headers = {"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}

        def append(name: str, key: str) -> int:
            connection.request(
                "POST",
                f"/api/workflow-streams/runs/{run_id}/streams/{name}/records",
                body=json.dumps({"records": [{"data": key}]}),
                headers={**headers, "Idempotency-Key": key, "Content-Type": "application/json"},
            )
            answer = connection.getresponse()
            answer.read()
            return answer.status

        assert await asyncio.to_thread(append, names[0], "warm") == 201
        mine = connection.sock.getsockname()
        serving = next(
            w for w in workers if any(c.raddr == mine for c in w.net_connections(kind="tcp"))
        )
        stopped = next(w for w in workers if w.pid != serving.pid)
        stopped.send_signal(signal.SIGSTOP)
        answers: list[tuple[str, int]] = []
        for attempt in range(2):
            for name in names:
                key = f"{name}-{attempt}"
                answers.append((key, await asyncio.to_thread(append, name, key)))
        refused = [key for key, status in answers if status != 201]
        assert all(status in (201, 503) for _, status in answers), answers
        assert len(refused) == 1, answers  # one budget, once
        stopped.send_signal(signal.SIGCONT)
        stopped = None
        for key in refused:  # of unknown outcome: retried with its key, applied once
            assert await asyncio.to_thread(append, key.split("-")[0], key) in (200, 201)
        connection.close()
        async with api_client(server) as api:
            for name in names:
                found = await records_of(api, run_id, name)
                data = [r["data"] for r in found if r["data"] != "warm"]
                # Once each (one refused, of unknown outcome, may come after its retry).
                assert sorted(data) == [f"{name}-0", f"{name}-1"], data
    finally:
        if stopped is not None:
            stopped.send_signal(signal.SIGCONT)
        server.stop()
