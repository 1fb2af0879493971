"""What one tenant's requests sent and abandoned cost another tenant.

`python3 dev.py run python -m bench.abort_flood [--loops N] [--seconds S] [--kind K]` starts
`ductor-streams serve` on embedded PostgreSQL in a temporary directory. Tenant A (the bootstrap
token) runs N loops (default 100) from a process of its own. Each loop opens a connection,
sends one whole request and resets the connection at once (SO_LINGER 0), without reading the
answer, then does it again: a client bound by no concurrency of its own. `--kind` says which
requests: `post` (one-record appends, the default), `get` (reads of a 1,000-record page), `mix`
(half each), `ack` (acks of a claimed pull-wake subscription over A's run, by the claim's
token). Tenant B appends one record at a time to a stream of its own, 2 s before A starts
(quiet) and then for S seconds (default 15) beside A. It prints B's latencies (p50, p99,
worst), what the server answered A by status (its /metrics), and the warnings and errors it
logged (docs/benchmarks.md, "2026-12-06, twelfth sitting").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import re
import secrets
import socket
import struct
import time
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import httpx

from bench.large_beside import API, JSON, TOKEN, _latencies, _stream, _tenant_b, _token
from bench.server import embedded_server

_STATUS = re.compile(
    r'^ductor_streams_request_duration_seconds_count\{method="(\w+)",route="([^"]+)",'
    r'status="(\d+)"\} (\S+)$'
)


def _flood(host: str, port: int, requests: list[bytes], loops: int, stop: Event, out: Any) -> None:
    """A's loops, until `stop`: how many requests they sent. Loop n sends `requests[n % len]`."""
    reset = struct.pack("ii", 1, 0)

    async def loops_() -> int:
        sent = 0

        async def loop(n: int) -> None:
            nonlocal sent
            request = requests[n % len(requests)]
            while not stop.is_set():
                try:
                    _, writer = await asyncio.open_connection(host, port)
                    writer.write(request)
                    await writer.drain()
                    writer.get_extra_info("socket").setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, reset
                    )
                    writer.close()
                    sent += 1
                except OSError:
                    await asyncio.sleep(0.01)

        await asyncio.gather(*(loop(n) for n in range(loops)))
        return sent

    out.put(asyncio.run(loops_()))


def _requests(a: httpx.Client, path: str, kind: str) -> list[bytes]:
    """What A's loops send: whole requests, as bytes."""
    auth = f"Authorization: Bearer {TOKEN}\r\n"
    body = json.dumps({"records": [{"data": {"n": 1}}]}).encode()
    post = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    get = f"GET {path}?cursor=0&limit=1000 HTTP/1.1\r\nHost: bench\r\n{auth}\r\n".encode()
    if kind == "post":
        return [post]
    if kind == "get":
        return [get]
    if kind == "mix":
        return [post, get]
    # A pull-wake subscription over A's run, claimed: its acks, by the claim's token.
    run = path.split("/runs/")[1].split("/")[0]
    name = "flood-" + secrets.token_hex(3)
    made = a.post(f"{API}/runs/{run}/streams", json={"stream_id": "wake", "direction": "output"})
    assert made.status_code == 201, made.text
    put = a.put(
        f"{API}/subscriptions/{name}",
        json={
            "type": "pull-wake",
            "pattern": {"run_id": run, "stream_id": "a"},
            "wake_stream": {"run_id": run, "stream_id": "wake"},
        },
    )
    assert put.status_code == 201, put.text
    assert a.post(path, json={"records": [{"data": 1}]}).status_code == 201
    claim = a.post(f"{API}/subscriptions/{name}/claim", json={"worker": "w1"})
    assert claim.status_code == 200, claim.text
    claimed = claim.json()
    ack = json.dumps({"wake_id": claimed["wake_id"], "generation": claimed["generation"]})
    return [
        (
            f"POST {API}/subscriptions/{name}/ack HTTP/1.1\r\nHost: bench\r\n"
            f"Authorization: Bearer {claimed['token']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(ack)}\r\n\r\n{ack}"
        ).encode()
    ]


def _answered(base: str) -> dict[str, int]:
    """A's answers on the records route, and the gate's (unrouted) refusals, by status."""
    counts: dict[str, int] = {}
    for line in httpx.get(base + "/metrics", timeout=60).text.splitlines():
        if (match := _STATUS.match(line)) is None:
            continue
        method, route, status, value = match.groups()
        if route.endswith(("/records", "/ack")) or route == "unmatched":
            what = route.rsplit("/", 1)[-1] if route != "unmatched" else "refused at the gate"
            name = f"{method} {what}"
            counts[f"{name} {status}"] = counts.get(f"{name} {status}", 0) + int(float(value))
    return counts


def _measure(base: str, data: str, loops: int, seconds: float, kind: str) -> None:
    b_token = _token(data, "bench-b-" + secrets.token_hex(3))
    with (
        httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}) as a,
        httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {b_token}", **JSON}, timeout=60
        ) as b,
    ):
        path = _stream(a, "flood-" + secrets.token_hex(3), "a")
        for start in range(0, 1_000, 100):
            page = {"records": [{"data": {"n": n}} for n in range(start, start + 100)]}
            assert a.post(path, json=page).status_code == 201
        small = _stream(b, "flood-b-" + secrets.token_hex(3), "b")
        quiet = _tenant_b(b, small, 2.0)
        host, port = base.removeprefix("http://").split(":")
        context = multiprocessing.get_context("spawn")
        stop, out = context.Event(), context.Queue()
        process = context.Process(
            target=_flood, args=(host, int(port), _requests(a, path, kind), loops, stop, out)
        )
        process.start()
        time.sleep(1.0)  # the flood under way
        beside = _tenant_b(b, small, seconds)
        stop.set()
        sent = out.get()
        process.join()
        time.sleep(1.0)
        answered = _answered(base)
    log = (Path(data) / "serve.log").read_text(errors="replace").splitlines()
    warned = sum('"level":"warning"' in line or '"level":"error"' in line for line in log)
    print(
        f"tenant A: {loops} loops of {kind} requests sent and reset at once; "
        "tenant B: one-record appends, one after the other"
    )
    print(f"B quiet:    {_latencies(*quiet)}")
    print(f"B beside A: {_latencies(*beside)}")
    print(f"A sent {sent:,} requests; the server answered: " + json.dumps(answered))
    print(f"the server's log: {len(log):,} lines, {warned:,} warnings or errors")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loops", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--kind", choices=("post", "get", "mix", "ack"), default="post")
    arguments = parser.parse_args()
    with embedded_server({"DUCTOR_STREAMS_BOOTSTRAP_TOKEN": TOKEN}) as (base, _, data):
        _measure(base, data, arguments.loops, arguments.seconds, arguments.kind)


if __name__ == "__main__":
    main()
