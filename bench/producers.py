"""Does a stream's number of idempotent producers change what one append costs?

`python -m bench.producers [PRODUCERS ...]`: for each count, a stream on an embedded PostgreSQL
that that many producers (Durable Streams `Producer-Id`) have written to once; then 300 appends
to each, of one record by one producer (the next `Producer-Seq` each time), the streams taken
in turn, through the PostgreSQL adapter's `update` (the stream-row lock, the decision, the
write, the commit): the p50 and mean time of one."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from adapters.postgres.embedded import start_embedded
from adapters.postgres.streams import PostgresStreams
from application.append_records import ProduceCommand
from application.tokens import make_caller
from bench.database import new_database
from domain.definition import DefinitionRequest, resolve_definition
from domain.producers import ProducerClaim
from domain.records import NewRecord, RecordKind
from domain.stream import StreamKey

CALLER = make_caller("bench", "writer", ["streams:read", "streams:write"])
RECORD = NewRecord(RecordKind.BINARY, "application/octet-stream", b"x" * 64, 64)
APPENDS = 300


def produce(producer: str, seq: int) -> ProduceCommand:
    now = datetime.now(UTC)
    return ProduceCommand(CALLER, [RECORD], now, producer=ProducerClaim(producer, 0, seq))


async def prepared(streams: PostgresStreams, producers: int) -> StreamKey:
    """A stream that `producers` producers have written to once, and "hot" too."""
    key = StreamKey("bench", "run", f"s-{producers}-{time.monotonic_ns()}")
    request = DefinitionRequest(direction="output", stream_id=key.stream_id)
    definition = resolve_definition(request, region="local", egress_region="local")
    await streams.create(key, definition, datetime.now(UTC))
    for n in range(0, producers, 100):  # each producer writes once, 100 a transaction
        batch = [produce(f"producer-{p:06d}", 0) for p in range(n, min(n + 100, producers))]
        await streams.update(key, batch)
    await streams.update(key, [produce("hot", 0)])
    return key


async def measure(pool: asyncpg.Pool, counts: list[int]) -> list[list[float]]:
    """The streams' appends taken in turn, one after another, so that whatever else the
    machine does weighs on each count alike."""
    streams = PostgresStreams(pool)
    keys = [await prepared(streams, count) for count in counts]
    times: list[list[float]] = [[] for _ in counts]
    for seq in range(1, APPENDS + 1):
        for key, taken in zip(keys, times, strict=True):
            started = time.perf_counter()
            [outcome] = await streams.update(key, [produce("hot", seq)])
            taken.append((time.perf_counter() - started) * 1000)
            assert not outcome.answer.duplicate
    return times


async def main(counts: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        admin = start_embedded(Path(tmp) / "pg")
        url = await new_database(admin, "bench_producers")
        pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
        try:
            for count, times in zip(counts, await measure(pool, counts), strict=True):
                p50, mean = statistics.median(times), statistics.fmean(times)
                print(f"{count:>6} producers: append p50 {p50:.2f} ms, mean {mean:.2f} ms")
        finally:
            await pool.close()


if __name__ == "__main__":
    asyncio.run(main([int(a) for a in sys.argv[1:]] or [0, 1000]))
