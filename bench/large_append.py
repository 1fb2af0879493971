"""What one very large append costs everyone else.

`python3 dev.py run python -m bench.large_append [--messages N] [--rounds R]` starts
`ductor-streams serve` on embedded PostgreSQL in a temporary directory. Two probes run all along:
`GET /healthz` and a one-message Durable Streams append to a stream of its own, each every
10 ms. For a second they measure the quiet server; then R appends of N JSON messages in one
request go to another stream, one after the other. It prints the worst latency of each probe,
quiet and during the large appends, and each large append's time: their ratio is what the
large request costs the others (docs/benchmarks.md, "2026-12-06, ninth sitting").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time

import httpx

from bench.server import embedded_server

TOKEN = "bench-" + secrets.token_hex(8)
JSON = {"Content-Type": "application/json"}


async def _measure(base: str, messages: int, rounds: int) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as client:
        root = f"/api/durable-streams/v1/stream/large-{secrets.token_hex(3)}"
        for name in ("big", "small"):
            created = await client.put(f"{root}/{name}", headers=JSON)
            assert created.status_code == 201, created.text
        body = json.dumps([{"n": n, "m": "x" * 20} for n in range(messages)]).encode()
        worst = {"healthz": 0.0, "small append": 0.0}
        stop = asyncio.Event()

        async def probe(name: str, call: object) -> None:
            while not stop.is_set():
                started = time.perf_counter()
                answer = await call()  # type: ignore[operator]
                assert answer.status_code in (200, 204), answer.text
                worst[name] = max(worst[name], time.perf_counter() - started)
                await asyncio.sleep(0.01)

        probes = [
            asyncio.create_task(probe("healthz", lambda: client.get("/healthz"))),
            asyncio.create_task(
                probe(
                    "small append",
                    lambda: client.post(f"{root}/small", content=b'{"a":1}', headers=JSON),
                )
            ),
        ]
        await asyncio.sleep(1.0)
        quiet = dict(worst)
        worst.update({name: 0.0 for name in worst})
        took = []
        for _ in range(rounds):
            started = time.perf_counter()
            answer = await client.post(f"{root}/big", content=body, headers=JSON)
            assert answer.status_code == 204, answer.text
            took.append(time.perf_counter() - started)
            await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*probes)
    print(f"{messages} messages in one request ({len(body):,} bytes), {rounds} rounds")
    print("large append: " + ", ".join(f"{t:.2f} s" for t in took))
    for name in worst:
        print(
            f"{name}: worst {quiet[name] * 1000:.0f} ms quiet, "
            f"{worst[name] * 1000:.0f} ms during the large appends"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    with embedded_server({"DUCTOR_STREAMS_BOOTSTRAP_TOKEN": TOKEN}) as (base, _, _):
        asyncio.run(_measure(base, arguments.messages, arguments.rounds))


if __name__ == "__main__":
    main()
