"""`python -m bench.engines`: input records delivered into DBOS and into Restate.

    python -m bench.engines [--records 1000] [--paced 100] [--interval 0.1]
                            [--engines dbos,restate] [--keep]

For each engine: an embedded PostgreSQL, `ductor-streams serve --no-workers`, one
`ductor-streams worker` with `WAIT_SERVICE=dbos` (DBOS's system database a second database of
the same PostgreSQL) or `restate` (a local Restate node and the Python service of
tests/engines/restate_app.py), and a workflow that waits for the records (tests/engines).

(a) throughput: `--records` records are appended (100 per request) while the worker is
    stopped, then the worker starts. Accepted/s = (N - 1) / (the engine's record of taking the
    last - the first: DBOS's insert time of the message, Restate's creation time of the
    invocation), what the dispatcher delivers; received/s = the same over the workflow's
    receipts, what the engine's workflow then gets through. The worker's start-up is not
    counted in either.
(b) latency: with the worker running, `--paced` single-record appends, one every `--interval`
    seconds; delay = the wall time the workflow took the record (DBOS: after `DBOS.recv`
    returned it; Restate: the journaled clock step after its promise resolved) - the wall time
    just before the append request was sent. p50 and p99, and the same to the engine's
    acceptance (the dispatcher's share).

Every record is checked: the workflow got 1..N, in order, once each. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
from tests.support.engines import RestateServer, dbos_app, restate_service
from tests.support.server import free_port

from adapters.postgres.embedded import start_embedded
from bench.database import new_database
from bench.server import BIN, Server, stop_group

WORKER_SETTINGS = {
    "DUCTOR_STREAMS_DISPATCH_POLL_SECONDS": "0.02",
    "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.05",
    "DUCTOR_STREAMS_LOG_LEVEL": "WARNING",
}


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class Worker:
    def __init__(self, url: str, tmp: Path, settings: dict[str, str]) -> None:
        import os
        import subprocess

        env = {**os.environ, "DUCTOR_STREAMS_DATABASE_URL": url, **WORKER_SETTINGS, **settings}
        env["DUCTOR_STREAMS_DATA_DIR"] = str(tmp / "worker")
        self._log = (tmp / f"worker-{secrets.token_hex(3)}.log").open("wb")
        self.process = subprocess.Popen(
            [str(BIN / "ductor-streams"), "worker"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        stop_group(self.process)
        self._log.close()


async def append(http: httpx.AsyncClient, run_id: str, stream_id: str, values: list) -> None:
    answer = await http.post(
        f"/runs/{run_id}/streams/{stream_id}/records",
        json={"records": [{"data": v} for v in values]},
    )
    answer.raise_for_status()


async def create_input(http: httpx.AsyncClient, run_id: str, stream_id: str) -> None:
    answer = await http.post(
        f"/runs/{run_id}/streams",
        json={
            "stream_id": stream_id,
            "direction": "input",
            "limits": {"max_unread_items": 10_000_000, "max_unread_bytes": 10_000_000_000},
        },
    )
    answer.raise_for_status()


class Dbos:
    name = "dbos"

    def __init__(self, admin_url: str, server: Server, tmp: Path) -> None:
        self.admin_url, self.server, self.tmp = admin_url, server, tmp
        name = f"bench_dbos_{secrets.token_hex(3)}"
        asyncio.run(_execute(admin_url, f'CREATE DATABASE "{name}"'))
        self.url = urlunsplit(urlsplit(admin_url)._replace(path="/" + name))
        self.app = None

    def settings(self) -> dict[str, str]:
        return {
            "DUCTOR_STREAMS_WAIT_SERVICE": "dbos",
            "DUCTOR_STREAMS_DBOS_SYSTEM_DATABASE_URL": self.url,
        }

    def start(self, workflows: list[tuple[str, str, int]]) -> None:
        groups = [[run, stream, str(n), "-"] for run, stream, n in workflows]
        env = {
            "DBOS_SYSTEM_DATABASE_URL": self.url,
            "STREAMS_URL": f"http://127.0.0.1:{self.server.port}",
            "STREAMS_TOKEN": self.server.token,
        }
        if self.app is not None:
            self.app.stop()
        self.app = dbos_app(groups, env, self.tmp / "dbos-app.log").start()

    async def result(self, run_id: str, timeout: float) -> list[list[float]]:
        from dbos import DBOSClient

        client = DBOSClient(system_database_url=self.url)
        try:
            handle = await client.retrieve_workflow_async(run_id)
            async with asyncio.timeout(timeout):
                return await handle.get_result()
        finally:
            await asyncio.to_thread(client.destroy)

    async def accepted(self, run_id: str) -> list[float]:
        """When DBOS took each message (its insert's `now()`), in sequence order."""
        connection = await asyncpg.connect(self.url)
        try:
            rows = await connection.fetch(
                "SELECT message_uuid, created_at_epoch_ms FROM dbos.notifications "
                "WHERE destination_uuid = $1",
                run_id,
            )
        finally:
            await connection.close()
        by_sequence = {
            int(r["message_uuid"].split("::")[0].rsplit(":", 1)[1]): r["created_at_epoch_ms"] / 1000
            for r in rows
        }
        return [by_sequence[s] for s in sorted(by_sequence)]

    def stop(self) -> None:
        if self.app is not None:
            self.app.stop()


class Restate:
    name = "restate"

    def __init__(self, admin_url: str, server: Server, tmp: Path) -> None:
        self.restate = RestateServer(tmp / "restate").start()
        port = free_port()
        env = {"STREAMS_URL": f"http://127.0.0.1:{server.port}", "STREAMS_TOKEN": server.token}
        self.service = restate_service(port, env, tmp / "restate-app.log").start()
        self.restate.register(f"http://127.0.0.1:{port}")

    def settings(self) -> dict[str, str]:
        return {
            "DUCTOR_STREAMS_WAIT_SERVICE": "restate",
            "DUCTOR_STREAMS_RESTATE_INGRESS_URL": self.restate.ingress_url,
            "DUCTOR_STREAMS_RESTATE_TARGET": "Waiter/on_record",
        }

    def start(self, workflows: list[tuple[str, str, int]]) -> None:
        for run_id, stream_id, n in workflows:
            answer = httpx.post(
                f"{self.restate.ingress_url}/Waiter/{run_id}/run/send",
                json={"stream_id": stream_id, "n": n},
                timeout=10,
            )
            answer.raise_for_status()

    async def result(self, run_id: str, timeout: float) -> list[list[float]]:
        async with httpx.AsyncClient(timeout=timeout) as http:
            answer = await http.get(
                f"{self.restate.ingress_url}/restate/workflow/Waiter/{run_id}/attach"
            )
        answer.raise_for_status()
        return answer.json()

    async def accepted(self, run_id: str) -> list[float]:
        """When Restate created each on_record invocation, in sequence order."""
        from datetime import datetime

        rows = await asyncio.to_thread(
            self.restate.query,
            "SELECT idempotency_key, created_at FROM sys_invocation WHERE "
            f"target_service_key = '{run_id}' AND target_handler_name = 'on_record'",
        )
        by_sequence = {
            int(r["idempotency_key"].rsplit(":", 1)[1]): datetime.fromisoformat(
                r["created_at"].replace("Z", "+00:00")
            ).timestamp()
            for r in rows
        }
        return [by_sequence[s] for s in sorted(by_sequence)]

    def stop(self) -> None:
        self.service.stop()
        self.restate.stop()


async def _execute(url: str, sql: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


def _check(got: list[list[float]], n: int, what: str) -> list[float]:
    sequences = [int(s) for s, _ in got]
    if sequences != list(range(1, n + 1)):
        raise AssertionError(f"{what}: the workflow got {sequences[:20]}... not 1..{n} in order")
    return [t for _, t in got]


async def measure(engine, url: str, server: Server, tmp: Path, args) -> dict[str, object]:
    base = f"http://127.0.0.1:{server.port}/api/workflow-streams"
    headers = {"Authorization": f"Bearer {server.token}"}
    bulk, paced = f"bench-{engine.name}-bulk-{secrets.token_hex(3)}", f"bench-{engine.name}-paced"
    paced += "-" + secrets.token_hex(3)
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
        await create_input(http, bulk, "in")
        await create_input(http, paced, "in")
        engine.start([(bulk, "in", args.records), (paced, "in", args.paced)])
        # (a) a backlog, then the worker
        for start in range(0, args.records, 100):
            await append(http, bulk, "in", list(range(start, min(args.records, start + 100))))
        worker = Worker(url, tmp, engine.settings())
        try:
            times = _check(await engine.result(bulk, 600), args.records, "throughput")
            rate = (len(times) - 1) / (times[-1] - times[0])
            taken = await engine.accepted(bulk)
            accept_rate = (len(taken) - 1) / (taken[-1] - taken[0])
            # (b) paced single appends
            sent: list[float] = []
            for i in range(args.paced):
                sent.append(time.time())
                await append(http, paced, "in", [i])
                await asyncio.sleep(max(0.0, sent[-1] + args.interval - time.time()))
            took = _check(await engine.result(paced, 120), args.paced, "latency")
            accepted = await engine.accepted(paced)
        finally:
            worker.stop()
    delays = [(t - s) * 1000 for s, t in zip(sent, took, strict=True)]
    handed = [(a - s) * 1000 for s, a in zip(sent, accepted, strict=True)]
    return {
        "engine": engine.name,
        "records": args.records,
        "accepted_per_second": round(accept_rate, 1),  # the engine took them (the dispatcher)
        "received_per_second": round(rate, 1),  # the workflow received them
        "paced": args.paced,
        "delay_ms_p50": round(_pct(delays, 50), 1),
        "delay_ms_p99": round(_pct(delays, 99), 1),
        "delay_ms_max": round(max(delays), 1),
        "accepted_ms_p50": round(_pct(handed, 50), 1),  # append sent -> the engine took it
        "accepted_ms_p99": round(_pct(handed, 99), 1),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engines", description=__doc__)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--paced", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--engines", default="dbos,restate")
    parser.add_argument("--keep", action="store_true", help="keep the logs and data; print where")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ductor-bench-engines-"))
    if args.keep:
        print(f"logs and data in {tmp}", flush=True)
    else:
        atexit.register(shutil.rmtree, tmp, True)
    admin_url = start_embedded(tmp / "pg")
    url = asyncio.run(new_database(admin_url, f"bench_{secrets.token_hex(3)}"))
    token = secrets.token_urlsafe(24)
    server = Server(url, token, tmp / "data", tmp / "server.log")
    results = []
    try:
        server.wait_ready()
        for name in args.engines.split(","):
            kind = {"dbos": Dbos, "restate": Restate}[name.strip()]
            engine = kind(admin_url, server, tmp)
            try:
                results.append(asyncio.run(measure(engine, url, server, tmp, args)))
            finally:
                engine.stop()
            print(json.dumps(results[-1]), flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
