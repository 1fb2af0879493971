"""`python -m bench.client_producer`: records/s through the client's producer against one
append request per record, side by side in one run.

    python -m bench.client_producer [--duration 5] [--rounds 2] [--linger 0.005]
                                    [--url URL --token TOKEN] [--database-url ADMIN_URL]

One writer streams 100-byte JSON records (a token stream) for `--duration` seconds, first with
`await client.append(run, stream, [record])` per record (each a request, each its own
idempotency key), then with `await producer.send(record)` (batched in the background, one
request per batch); the rounds alternate the order (a b, b a, ...) so drift of the host falls on
both alike. Every record of both is read back at the end and checked: in order, none twice.

Without `--url`, it starts an embedded PostgreSQL and a `ductor-streams serve` as the other
benchmarks do (`--database-url` uses that PostgreSQL server instead of an embedded one: a fresh
database is made in it and dropped after). See docs/benchmarks.md.
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

from bench import database
from bench.server import Server
from ductor_streams_client import Limits, StreamsClient

RUN_ID = "bench-client"


def _record(i: int, size: int = 100) -> dict[str, object]:
    head: dict[str, object] = {"i": i, "kind": "token", "text": ""}
    head["text"] = "x" * (size - len(json.dumps(head, separators=(",", ":"))))
    return head


async def per_request(client: StreamsClient, stream: str, duration: float, start: int) -> int:
    sent = 0
    deadline = time.perf_counter() + duration
    while time.perf_counter() < deadline:
        await client.append(RUN_ID, stream, [_record(start + sent)])
        sent += 1
    return sent


async def through_producer(
    client: StreamsClient, stream: str, duration: float, start: int, linger: float
) -> tuple[int, int]:
    sent = 0
    deadline = time.perf_counter() + duration
    async with client.producer(RUN_ID, stream, linger=linger) as producer:
        while time.perf_counter() < deadline:
            for _ in range(100):  # check the clock every 100 sends
                await producer.send(_record(start + sent))
                sent += 1
    # the close above flushed: every record sent is appended within the measured time
    return sent, producer.batches


async def measure(url: str, token: str, args: argparse.Namespace) -> dict[str, object]:
    limits = Limits(max_unread_items=10**12, max_unread_bytes=10**15)
    results: dict[str, list[float]] = {"per request": [], "producer": []}
    batches = 0
    async with StreamsClient(url, token, timeout=60) as client:
        streams = {name: f"s-{secrets.token_hex(4)}" for name in results}
        for stream in streams.values():
            await client.create_stream(RUN_ID, stream, limits=limits)
        counts = dict.fromkeys(results, 0)
        for round_ in range(args.rounds):
            order = list(results) if round_ % 2 == 0 else list(reversed(results))
            for name in order:
                stream = streams[name]
                started = time.perf_counter()
                if name == "per request":
                    sent = await per_request(client, stream, args.duration, counts[name])
                else:
                    sent, made = await through_producer(
                        client, stream, args.duration, counts[name], args.linger
                    )
                    batches += made
                seconds = time.perf_counter() - started
                counts[name] += sent
                results[name].append(sent / seconds)
                print(f"  round {round_ + 1} {name}: {sent / seconds:,.0f} records/s", flush=True)
        for name, stream in streams.items():  # every record in, in order, once
            cursor, expected = 0, 0
            while True:
                page = await client.read(RUN_ID, stream, cursor=cursor, limit=1000)
                for record in page.records:
                    assert record.data["i"] == expected, (name, record.sequence)
                    expected += 1
                if not page.records:
                    break
                cursor = page.next_cursor
            assert expected == counts[name], (name, expected, counts[name])
    mean = {name: sum(rates) / len(rates) for name, rates in results.items()}
    return {
        "records/s": mean,
        "rounds": results,
        "speed-up": mean["producer"] / mean["per request"],
        "records per producer batch": counts["producer"] / max(1, batches),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.client_producer", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both, order alternating")
    parser.add_argument("--linger", type=float, default=0.005, help="the producer's linger, s")
    parser.add_argument("--url", help="a running server (then --token too); else one is started")
    parser.add_argument("--token", help="its bearer token")
    parser.add_argument("--database-url", help="a PostgreSQL admin URL instead of an embedded one")
    args = parser.parse_args(argv)
    if args.url and not args.token:
        parser.error("--url needs --token")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.url:
        result = asyncio.run(measure(args.url, args.token, args))
    else:
        tmp = Path(tempfile.mkdtemp(prefix="ductor-bench-client-"))
        atexit.register(shutil.rmtree, tmp, True)
        name = f"bench_client_{secrets.token_hex(4)}"
        if args.database_url:
            url = asyncio.run(database.new_database(args.database_url, name))
        else:
            print(f"starting embedded PostgreSQL under {tmp / 'pg'} ...", flush=True)
            url, _ = database.start_database(tmp)
        token = secrets.token_urlsafe(24)
        server = Server(url, token, tmp / "data", tmp / "server.log")
        try:
            server.wait_ready()
            result = asyncio.run(measure(f"http://127.0.0.1:{server.port}", token, args))
        finally:
            server.stop()
            if args.database_url:
                asyncio.run(database.drop_database(args.database_url, name))
    rates = result["records/s"]
    assert isinstance(rates, dict)
    print()
    print(f"one request per record   {rates['per request']:>10,.0f} records/s")
    print(f"through the producer     {rates['producer']:>10,.0f} records/s")
    print(f"speed-up                 {result['speed-up']:>10.1f}x")
    print(f"records per batch        {result['records per producer batch']:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
