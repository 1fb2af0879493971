"""What a herd of one tenant's native long-polls costs another tenant.

`python3 dev.py run python -m bench.longpoll_herd [--waiters N] [--seconds S]` starts
`ductor-streams serve` on embedded PostgreSQL in a temporary directory. Tenant A (ten
principals, the per-principal cap of live connections being 1,000) keeps N native reads waiting
(`GET …/records?cursor=C&wait=30`) on one stream, each polling again as soon as it is answered,
while A appends one record to that stream every 0.2 s: every append wakes the whole herd. Tenant
B meanwhile appends to and reads from a stream of its own, one request at a time. It prints B's
latencies (p50, p99, worst), B's failed requests, and how many answers the herd had
(docs/benchmarks.md, "2026-12-06, eleventh sitting").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import secrets
import statistics
import subprocess
import sys
import time

import httpx

from bench.server import embedded_server, raise_fd_limit

TOKEN = "bench-" + secrets.token_hex(8)
API = "/api/workflow-streams"
PRINCIPALS = 10
CLI = [sys.executable, "-m", "entrypoints.cli"]
SCOPES = ["--scope", "streams:read", "--scope", "streams:write"]


def _quiet_token(data: str) -> str:
    """A token of another tenant, made in the database as an operator would."""
    made = subprocess.run(
        [*CLI, "token", "create", "--tenant", "quiet", *SCOPES],
        env={**os.environ, "DUCTOR_STREAMS_DATA_DIR": data},
        capture_output=True,
        text=True,
        check=True,
    )
    return made.stdout.strip()


def _herd_tokens(base: str) -> list[str]:
    tokens = []
    for n in range(PRINCIPALS):
        minted = httpx.post(
            f"{base}{API}/tokens",
            json={
                "principal": f"herd-{n}",
                "scopes": ["streams:read", "streams:write"],
                "expires_in_seconds": 3600,
            },
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        minted.raise_for_status()
        tokens.append(minted.json()["token"])
    return tokens


# What the herd's requests that were not answered 200 got, by status or error.
refusals: dict[object, int] = {}


async def _waiter(host: str, port: int, path: str, token: str, answers: list[int]) -> None:
    """One client of the herd: a keep-alive connection that waits, is answered, waits again
    (connecting again, after a pause, when its connection fails)."""
    cursor = 0
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as error:
            answers[1] += 1
            refusals[type(error).__name__] = refusals.get(type(error).__name__, 0) + 1
            await asyncio.sleep(1)
            continue
        try:
            while True:
                writer.write(
                    f"GET {path}?cursor={cursor}&wait=30 HTTP/1.1\r\nHost: x\r\n"
                    f"Authorization: Bearer {token}\r\n\r\n".encode()
                )
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                if status == 200:
                    cursor = json.loads(body)["next_cursor"]
                    answers[0] += 1
                else:
                    answers[1] += 1
                    said = f"{status} {json.loads(body).get('code') if body else ''}"
                    refusals[said] = refusals.get(said, 0) + 1
                    await asyncio.sleep(1)
                if b"connection: close" in head.lower():
                    break
        except (OSError, asyncio.IncompleteReadError) as error:
            answers[1] += 1
            refusals[type(error).__name__] = refusals.get(type(error).__name__, 0) + 1
            await asyncio.sleep(1)
        finally:
            writer.close()


async def _herd(base: str, path: str, tokens: list[str], waiters: int, seconds: float, out) -> None:
    host, port = base.removeprefix("http://").split(":")
    answers = [0, 0]  # answered; refused or failed
    tasks = []
    for n in range(waiters):
        tasks.append(
            asyncio.create_task(_waiter(host, int(port), path, tokens[n % len(tokens)], answers))
        )
        if n % 200 == 199:
            await asyncio.sleep(0.1)  # within the listen backlog
    await asyncio.sleep(2)  # the herd is waiting
    out.send("waiting")

    async def appender() -> None:
        """Wakes the herd: an append every 0.2 s (its own connection)."""
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            while True:
                await client.post(path, json={"records": [{"data": 1}]}, headers=headers)
                await asyncio.sleep(0.2)

    loud = asyncio.create_task(appender())
    await asyncio.sleep(seconds)
    loud.cancel()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    out.send((answers, refusals))


def _run_herd(*arguments) -> None:
    asyncio.run(_herd(*arguments))


def _measure(base: str, data: str, waiters: int, seconds: float) -> None:
    herd_tokens = _herd_tokens(base)
    quiet = _quiet_token(data)
    run = "herd-" + secrets.token_hex(3)
    loud_headers = {"Authorization": f"Bearer {TOKEN}"}
    quiet_headers = {"Authorization": f"Bearer {quiet}"}
    path = f"{API}/runs/{run}/streams/s/records"
    with httpx.Client(base_url=base, timeout=60) as client:
        for headers in (loud_headers, quiet_headers):
            made = client.post(
                f"{API}/runs/{run}/streams",
                json={"stream_id": "s", "direction": "output"},
                headers=headers,
            )
            made.raise_for_status()
        # The herd in a process of its own: its client work does not delay the measurement.
        receive, send = multiprocessing.Pipe(duplex=False)
        herd = multiprocessing.Process(
            target=_run_herd, args=(base, path, herd_tokens, waiters, seconds + 1, send)
        )
        herd.start()
        assert receive.recv() == "waiting"
        stop = time.monotonic() + seconds
        latencies: list[float] = []
        failed = 0
        cursor = 0
        while time.monotonic() < stop:
            started = time.monotonic()
            appended = client.post(path, json={"records": [{"data": 1}]}, headers=quiet_headers)
            read = client.get(path, params={"cursor": cursor}, headers=quiet_headers)
            latencies.append(time.monotonic() - started)
            if appended.status_code != 201 or read.status_code != 200:
                failed += 1
            else:
                cursor = read.json()["next_cursor"]
        answers, refusals = receive.recv()
        herd.join()
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(
        f"{waiters} waiting reads woken every 0.2 s: the other tenant's append+read "
        f"p50 {statistics.median(latencies) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
        f"worst {latencies[-1] * 1000:.0f} ms over {len(latencies)} pairs, {failed} failed; "
        f"the herd was answered {answers[0]:,} times ({answers[1]} refused or failed: "
        f"{refusals or 'none'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waiters", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=20)
    arguments = parser.parse_args()
    raise_fd_limit()
    with embedded_server({"DUCTOR_STREAMS_BOOTSTRAP_TOKEN": TOKEN}) as (base, _, data):
        _measure(base, data, arguments.waiters, arguments.seconds)


if __name__ == "__main__":
    main()
