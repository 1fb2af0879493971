"""What a subscription over many streams costs its own decisions, and the other tenants.

`python3 dev.py run python -m bench.wide_subscription [--streams N] [--seconds S]` starts
`ductor-streams serve` on embedded PostgreSQL in a temporary directory. Tenant A (the bootstrap
token) creates N protocol streams (default 20,000) in one run and a pull-wake subscription whose
pattern links them all (`wide/*`). Then, for S seconds (default 20), A appends one record to a
random one of them and a worker claims the subscription's wake and acks it done, one after the
other. Tenant B (a token of a second tenant) appends one record at a time to its own stream,
2 s before A starts (quiet) and then beside A. It prints the claims' and acks' latencies (p50,
p99, worst), how many streams a claim showed, and B's latencies quiet and beside A
(docs/benchmarks.md, "2026-12-06, sixteenth sitting").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time

import httpx

from bench.large_beside import TOKEN, _latencies, _stream, _tenant_b, _token
from bench.server import embedded_server, raise_fd_limit

ROOT = "/api/durable-streams/v1/stream"
SUBSCRIPTION = "wide"


def _ms(took: list[float]) -> str:
    if not took:
        return "none"
    ms = sorted(t * 1000 for t in took)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"{len(ms)}, p50 {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms, worst {ms[-1]:.1f} ms"


async def _create(base: str, count: int) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits, timeout=60) as c:
        gate = asyncio.Semaphore(32)

        async def one(path: str) -> None:
            async with gate:
                made = await c.put(f"{ROOT}/{path}")
                assert made.status_code in (200, 201), made.text

        await asyncio.gather(*(one(f"wide/s{i}") for i in range(count)), one("wakes/pool"))
        made = await c.put(
            f"{ROOT}/__ds/subscriptions/{SUBSCRIPTION}",
            json={"type": "pull-wake", "pattern": "wide/*", "wake_stream": "wakes/pool"},
        )
        assert made.status_code == 201, made.text


def _tenant_a(base: str, count: int, stop: threading.Event) -> dict[str, list[float]]:
    """Appends, claims and acks one after the other until `stop`: each claim's and ack's
    latency, and how many streams each claim showed."""
    out: dict[str, list[float]] = {"claim": [], "ack": [], "shown": [], "other": []}
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    sub = f"{ROOT}/__ds/subscriptions/{SUBSCRIPTION}"
    n = 0
    with httpx.Client(base_url=base, headers=headers, timeout=120) as a:
        while not stop.is_set():
            n += 1
            path = f"wide/s{(n * 7919) % count}"
            appended = a.post(f"{ROOT}/{path}", content=json.dumps({"n": n}))
            assert appended.status_code in (200, 204), appended.text
            for _ in range(200):  # 409 while the scheduler's wake of the append is decided
                started = time.perf_counter()
                claimed = a.post(f"{sub}/claim", json={"worker": "w"})
                took = time.perf_counter() - started
                if claimed.status_code == 200:
                    break
                time.sleep(0.005)
            else:
                out["other"].append(claimed.status_code)
                if len(out["other"]) == 1:
                    print("a claim refused 200 times over; the last answer:", claimed.text[:300])
                continue
            out["claim"].append(took)
            body = claimed.json()
            out["shown"].append(len(body["streams"]))
            acks = [
                {"stream": s["path"], "offset": s["tail_offset"]}
                for s in body["streams"]
                if s["has_pending"]
            ]
            started = time.perf_counter()
            acked = a.post(
                f"{sub}/ack",
                headers={"Authorization": f"Bearer {body['token']}"},
                json={
                    "wake_id": body["wake_id"],
                    "generation": body["generation"],
                    "acks": acks,
                    "done": True,
                },
            )
            out["ack"].append(time.perf_counter() - started)
            if acked.status_code != 200:
                out["other"].append(acked.status_code)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    arguments = parser.parse_args()
    raise_fd_limit()
    with embedded_server({"DUCTOR_STREAMS_BOOTSTRAP_TOKEN": TOKEN}) as (base, _, data):
        started = time.perf_counter()
        asyncio.run(_create(base, arguments.streams))
        print(
            f"tenant A: {arguments.streams:,} streams and a pattern subscription linking them "
            f"in {time.perf_counter() - started:.1f} s"
        )
        b_token = _token(data, "bench-b")
        with httpx.Client(
            base_url=base,
            headers={"Authorization": f"Bearer {b_token}", "Content-Type": "application/json"},
            timeout=60,
        ) as b:
            small = _stream(b, "wide-b", "b")
            quiet = _tenant_b(b, small, 2.0)
            stop = threading.Event()
            result: dict[str, list[float]] = {}
            thread = threading.Thread(
                target=lambda: result.update(_tenant_a(base, arguments.streams, stop))
            )
            thread.start()
            beside = _tenant_b(b, small, arguments.seconds)
            stop.set()
            thread.join()
    print(f"A's claims: {_ms(result['claim'])}")
    print(f"A's acks:   {_ms(result['ack'])}")
    shown = result["shown"]
    if shown:
        print(f"streams a claim showed: {min(shown):.0f}-{max(shown):.0f}")
    if result["other"]:
        print(f"A's other answers: {result['other'][:10]}")
    print(f"B quiet:    {_latencies(*quiet)}")
    print(f"B beside A: {_latencies(*beside)}")


if __name__ == "__main__":
    main()
