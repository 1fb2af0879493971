"""What one tenant's large appends cost another tenant's small ones.

`python3 dev.py run python -m bench.large_beside [--loops N] [--seconds S] [--mb M]` starts
`ductor-streams serve` on embedded PostgreSQL in a temporary directory. Tenant A (the bootstrap
token) runs N loops (default 16), each appending native requests of about M MB (default 8:
records of 60 KB of base64 text, the hostile tester's body) to a stream of its own, one request
after the other, from a process of its own. Tenant B (a token of a second tenant, made by
`ductor-streams token create`) appends one record at a time to its own stream, 2 s before A
starts (quiet) and then for S seconds (default 20) beside A. It prints B's latencies (p50, p99,
worst), quiet and beside A, and what A appended, in MB/s (docs/benchmarks.md, "2026-12-06,
eleventh sitting").
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import secrets
import statistics
import subprocess
import sys
import time
from multiprocessing.synchronize import Event
from typing import Any

import httpx

from bench.server import embedded_server

TOKEN = "bench-" + secrets.token_hex(8)
API = "/api/workflow-streams"
JSON = {"Content-Type": "application/json"}
RECORD = 45_000  # random bytes, 60 KB as base64
# The streams take what is appended without a consumer: no unread ceiling in the way.
LIMITS = {"max_unread_items": 2**50, "max_unread_bytes": 2**50}


def _token(data: str, tenant: str) -> str:
    """A token of `tenant`, made on the server's embedded database by the CLI."""
    made = subprocess.run(
        [
            *(sys.executable, "-m", "entrypoints.cli", "token", "create", "--tenant", tenant),
            *("--scope", "streams:read", "--scope", "streams:write"),
        ],
        env={**os.environ, "DUCTOR_STREAMS_DATA_DIR": data},
        capture_output=True,
        text=True,
        check=True,
    )
    return made.stdout.strip().splitlines()[-1]


def _stream(client: httpx.Client, run: str, stream: str) -> str:
    made = client.post(
        f"{API}/runs/{run}/streams",
        json={"stream_id": stream, "direction": "output", "limits": LIMITS},
    )
    assert made.status_code == 201, made.text
    return f"{API}/runs/{run}/streams/{stream}/records"


def _tenant_a(base: str, token: str, paths: list[str], body: bytes, stop: Event, out: Any) -> None:
    """A's loops, until `stop`: the bodies acknowledged, their bytes, the other answers and
    the time from the first request to the last answer."""

    async def loops() -> tuple[int, int, dict[int, int], float]:
        done, sent = 0, 0
        other: dict[int, int] = {}
        headers = {"Authorization": f"Bearer {token}", **JSON}
        limits = httpx.Limits(max_connections=len(paths))
        async with httpx.AsyncClient(
            base_url=base, headers=headers, timeout=300, limits=limits
        ) as client:

            async def loop(path: str) -> None:
                nonlocal done, sent
                while not stop.is_set():
                    answer = await client.post(path, content=body)
                    if answer.status_code == 201:
                        done += 1
                        sent += len(body)
                    else:
                        other[answer.status_code] = other.get(answer.status_code, 0) + 1

            started = time.perf_counter()
            await asyncio.gather(*(loop(p) for p in paths))
        return done, sent, other, time.perf_counter() - started

    out.put(asyncio.run(loops()))


def _tenant_b(client: httpx.Client, path: str, seconds: float) -> tuple[list[float], int]:
    """One-record appends one after the other for `seconds`: each one's latency, and how many
    were not 201."""
    took, failed = [], 0
    body = json.dumps({"records": [{"data": {"n": 1}}]}).encode()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        answer = client.post(path, content=body)
        took.append(time.perf_counter() - started)
        if answer.status_code != 201:
            failed += 1
    return took, failed


def _latencies(took: list[float], failed: int) -> str:
    ms = sorted(t * 1000 for t in took)
    p50 = statistics.median(ms)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"{len(ms)} appends, p50 {p50:.1f} ms, p99 {p99:.1f} ms, worst {ms[-1]:.1f} ms" + (
        f", {failed} not 201" if failed else ""
    )


def _measure(base: str, data: str, loops: int, seconds: float, mb: float) -> None:
    b_token = _token(data, "bench-b-" + secrets.token_hex(3))
    chunk = base64.b64encode(os.urandom(RECORD)).decode()
    per = len(json.dumps({"data": chunk})) + 1
    body = json.dumps({"records": [{"data": chunk}] * int(mb * 1_000_000 // per)}).encode()
    with (
        httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}) as a,
        httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {b_token}", **JSON}, timeout=60
        ) as b,
    ):
        run = "beside-" + secrets.token_hex(3)
        paths = [_stream(a, run, f"a{n}") for n in range(loops)]
        small = _stream(b, "beside-b-" + secrets.token_hex(3), "b")
        quiet = _tenant_b(b, small, 2.0)
        context = multiprocessing.get_context("spawn")
        stop, out = context.Event(), context.Queue()
        process = context.Process(target=_tenant_a, args=(base, TOKEN, paths, body, stop, out))
        process.start()
        time.sleep(1.0)  # A's first bodies under way
        beside = _tenant_b(b, small, seconds)
        stop.set()
        done, sent, other, elapsed = out.get()
        process.join()
    print(
        f"tenant A: {loops} loops of {len(body) / 1e6:.2f} MB native appends; "
        f"tenant B: one-record appends, one after the other"
    )
    print(f"B quiet:    {_latencies(*quiet)}")
    print(f"B beside A: {_latencies(*beside)}")
    rate = sent / 1e6 / elapsed
    print(
        f"A: {done} appends, {sent / 1e6:,.0f} MB in {elapsed:.1f} s, {rate:.1f} MB/s"
        + (f"; other answers {other}" if other else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loops", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--mb", type=float, default=8.0, help="each of A's requests, in MB")
    arguments = parser.parse_args()
    with embedded_server({"DUCTOR_STREAMS_BOOTSTRAP_TOKEN": TOKEN}) as (base, _, data):
        _measure(base, data, arguments.loops, arguments.seconds, arguments.mb)


if __name__ == "__main__":
    main()
