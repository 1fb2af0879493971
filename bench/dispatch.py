"""(9) Input-stream delivery: how fast `ductor-streams worker` hands appended records to the
workflow wait service, and the lag from a record's commit to its acceptance.

The dispatcher runs as its own subprocess against the bench database (the server runs with
`--no-workers`), once with the default `postgres` wait service (events land in
`workflow_wait_events`, `accepted_at` = the INSERT's `now()`), once with `http` pointed at a lean
raw-socket asyncio HTTP/1.1 stub in its own process that answers 202 at once and notes the
receipt time of each event id. Lag = acceptance - the record's `appended_at` (stream_records)."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import queue
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import msgspec

from bench.database import TENANT
from bench.live import _pct
from bench.server import BIN, CpuMeter, free_port, stop_group
from bench.sse_kit import Http, _request

_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"

# --- the HTTP wait-service stub ---------------------------------------------------------------

_ACCEPTED = b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n"


class _Stub(asyncio.Protocol):
    """Parses requests in `data_received` (keep-alive, Content-Length bodies), notes the first
    receipt time of each Idempotency-Key and answers 202 with no body."""

    def __init__(self, received: dict[str, float], counter: object, posts: object) -> None:
        self.received = received
        self.counter, self.posts = counter, posts
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.time()
        buf = self.buf + data
        answers = 0
        while (end := buf.find(b"\r\n\r\n")) >= 0:
            length, key = 0, ""
            for line in buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"idempotency-key":
                    key = value.strip().decode()
            if len(buf) < end + 4 + length:
                break
            buf = buf[end + 4 + length :]
            answers += 1
            if key and key not in self.received:
                self.received[key] = now
                self.counter.value += 1  # type: ignore[attr-defined]
        self.buf = buf
        if answers:
            self.posts.value += answers  # type: ignore[attr-defined]
            self.transport.write(_ACCEPTED * answers)  # type: ignore[attr-defined]


def _stub_process(
    port: int,
    ready: multiprocessing.Queue,
    stop: multiprocessing.synchronize.Event,
    counter: object,
    posts: object,
    out: multiprocessing.Queue,
    hard_seconds: float,
) -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()

    async def serve() -> dict[str, float]:
        received: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Stub(received, counter, posts), "127.0.0.1", port
        )
        ready.put(port)
        hard = time.monotonic() + hard_seconds
        while not stop.is_set() and time.monotonic() < hard:
            await asyncio.sleep(0.05)
        server.close()
        return received

    out.put(asyncio.run(serve()))


class Stub:
    """The stub's process; `accepted` counts distinct event ids received so far."""

    def __init__(self, hard_seconds: float) -> None:
        self.port = free_port()
        self.counter = multiprocessing.RawValue("q", 0)  # one writer: the stub
        self.posts = multiprocessing.RawValue("q", 0)
        self._ready: multiprocessing.Queue = multiprocessing.Queue()
        self._out: multiprocessing.Queue = multiprocessing.Queue()
        self._stop = multiprocessing.Event()
        self.process = multiprocessing.Process(
            target=_stub_process,
            args=(
                self.port,
                self._ready,
                self._stop,
                self.counter,
                self.posts,
                self._out,
                hard_seconds,
            ),
            daemon=True,
        )
        self.process.start()
        self._ready.get(timeout=30)

    @property
    def accepted(self) -> int:
        return self.counter.value

    def finish(self) -> dict[str, float]:
        """Stop it; event id -> first receipt (epoch seconds)."""
        self._stop.set()
        try:
            received = self._out.get(timeout=30)
        except queue.Empty:
            received = {}
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
        return received


# --- the worker subprocess --------------------------------------------------------------------


class WorkerProcess:
    """`ductor-streams worker` (pruner, deleter, dispatcher, sweeper) on the bench database."""

    def __init__(self, url: str, data_dir: Path, log: Path, env: dict[str, str]) -> None:
        self._log = log.open("ab")
        full = dict(os.environ)
        full.update(
            DUCTOR_STREAMS_DATABASE_URL=url,
            DUCTOR_STREAMS_DATA_DIR=str(data_dir),
            DUCTOR_STREAMS_LOG_LEVEL="WARNING",
            **env,
        )
        self.process = subprocess.Popen(
            [str(BIN / "ductor-streams"), "worker"],
            env=full,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        stop_group(self.process)
        self._log.close()


# --- measurements -----------------------------------------------------------------------------


@dataclass
class Run:
    """One stream's records and their acceptance."""

    kind: str  # "burst" or "steady"
    records: int = 0  # appended (steady: inside the window)
    accepted: int = 0  # of those, accepted by the wait service
    append_seconds: float = 0.0  # burst: all batches appended; steady: the window
    seconds: float = 0.0  # burst: first append sent -> last acceptance
    p50_ms: float | None = None  # acceptance - appended_at
    p99_ms: float | None = None
    max_ms: float | None = None
    statements: float | None = None  # per event (pg_stat_statements), burst only
    top: list[tuple[float, float, str]] = field(default_factory=list)  # per event, ms, text
    cpu: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def rate(self) -> float:
        return self.accepted / self.seconds if self.seconds else 0.0


@dataclass
class Dispatch:
    service: str  # "postgres" or "http"
    burst: Run = field(default_factory=lambda: Run("burst"))
    steady: Run = field(default_factory=lambda: Run("steady"))
    duplicates: int = 0  # http: POSTs of an event id already received (retries)
    error: str = ""


class _Record(msgspec.Struct):
    last_sequence: int


def _body(first: int, count: int) -> bytes:
    return msgspec.json.encode(
        {
            "records": [
                {"data": {"i": first + i, "kind": "signal", "text": "x" * 60}} for i in range(count)
            ]
        }
    )


async def _append(http: Http, port: int, token: str, path: str, body: bytes) -> int:
    status, answer = await http.call(_request(port, "POST", path, token, body))
    if status != 201:
        raise RuntimeError(f"append answered {status}: {answer[:200]!r}")
    return msgspec.json.decode(answer, type=_Record).last_sequence


class Service:
    """What differs between the two wait services: how acceptance is counted and timed."""

    def __init__(self, url: str, run_id: str, stub: Stub | None) -> None:
        self.url, self.run_id, self.stub = url, run_id, stub
        self._base = 0  # the stub's count before the current stream

    async def accepted(self, conn: asyncpg.Connection, stream: str) -> int:
        if self.stub is not None:
            return self.stub.accepted - self._base
        return await conn.fetchval(
            f"SELECT count(*) AS bench_poll FROM workflow_wait_events WHERE {_KEY}",
            TENANT,
            self.run_id,
            stream,
        )

    def next_stream(self) -> None:
        if self.stub is not None:
            self._base = self.stub.accepted


async def _wait_accepted(
    service: Service, conn: asyncpg.Connection, stream: str, expected: int, deadline: float
) -> int:
    got = 0
    while time.monotonic() < deadline:
        got = await service.accepted(conn, stream)
        if got >= expected:
            break
        await asyncio.sleep(0.05)
    return got


async def _lags(
    conn: asyncpg.Connection,
    run_id: str,
    stream: str,
    first: int,
    last: int,
    received: dict[str, float] | None,
) -> tuple[list[float], float | None]:
    """Acceptance - appended_at in ms for sequences first..last, and the last acceptance time
    (epoch seconds). `received`: the stub's receipts (None: the postgres table's accepted_at)."""
    if received is None:
        rows = await conn.fetch(
            "SELECT extract(epoch FROM w.accepted_at - r.appended_at)::float8 * 1000, "
            "extract(epoch FROM w.accepted_at)::float8 "
            "FROM workflow_wait_events w JOIN stream_records r USING "
            "(tenant, run_id, stream_id, sequence) "
            "WHERE w.tenant = $1 AND w.run_id = $2 AND w.stream_id = $3 "
            "AND w.sequence BETWEEN $4 AND $5",
            TENANT,
            run_id,
            stream,
            first,
            last,
        )
        return [r[0] for r in rows], max((r[1] for r in rows), default=None)
    rows = await conn.fetch(
        "SELECT sequence, extract(epoch FROM appended_at)::float8 FROM stream_records "
        f"WHERE {_KEY} AND sequence BETWEEN $4 AND $5",
        TENANT,
        run_id,
        stream,
        first,
        last,
    )
    prefix = f"wds:{TENANT}:{run_id}:{stream}:"
    lags, latest = [], None
    for sequence, appended in rows:
        at = received.get(prefix + str(sequence))
        if at is not None:
            lags.append((at - appended) * 1000)
            latest = at if latest is None else max(latest, at)
    return lags, latest


def _finish(run: Run, lags: list[float]) -> None:
    lags.sort()
    run.p50_ms, run.p99_ms = _pct(lags, 50), _pct(lags, 99)
    run.max_ms = lags[-1] if lags else None


async def _statement_stats(url: str) -> dict[int, tuple[str, int, float]] | None:
    """pg_stat_statements of this database: queryid -> (text, calls, total ms); None without
    the extension. The bench's own polling and pg_stat queries are left out."""
    conn = await asyncpg.connect(url)
    try:
        if not await conn.fetchval(
            "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
        ):
            return None
        rows = await conn.fetch(
            "SELECT queryid, query, calls, total_exec_time FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND query NOT ILIKE '%pg_stat%' AND query NOT ILIKE '%pg_extension%' "
            "AND query NOT ILIKE '%bench_poll%'"
        )
        return {r[0]: (r[1], r[2], r[3]) for r in rows}
    finally:
        await conn.close()


def _statements(before: dict | None, after: dict | None, events: int) -> tuple[float | None, list]:
    """Statements per event in the window and the top ones: (per event, ms per call, text)."""
    if before is None or after is None or not events:
        return None, []
    deltas = []
    for queryid, (text, calls, total) in after.items():
        _, calls0, total0 = before.get(queryid, ("", 0, 0.0))
        if calls > calls0:
            n = calls - calls0
            deltas.append((n, (total - total0) / n, " ".join(text.split())[:72]))
    deltas.sort(key=lambda d: -d[0] * d[1])  # by database time in the window
    top = [(n / events, ms, t) for n, ms, t in deltas[:5] if n / events >= 0.01]
    return sum(n for n, _, _ in deltas) / events, top


def measure(
    service_name: str,
    *,
    url: str,
    port: int,
    token: str,
    prefix: str,
    run_id: str,
    create_stream: Callable[[str], None],
    data_dir: Path,
    log: Path,
    pids: dict[str, int],
    records: int,
    batch: int,
    rate: float,
    duration: float,
    warmup: float,
    poll_seconds: float,
    timeout: float,
) -> Dispatch:
    """Burst: `records` in batches of `batch` as fast as one connection posts them, then wait
    until all are accepted. Steady: one record per POST at `rate`/s for `warmup` + `duration`
    seconds; the lag of the records of the window."""
    result = Dispatch(service_name)
    env = {"DUCTOR_STREAMS_DISPATCH_POLL_SECONDS": f"{poll_seconds:g}"}
    stub = None
    if service_name == "http":
        stub = Stub(hard_seconds=2 * timeout + warmup + duration + 120)
        env.update(
            DUCTOR_STREAMS_WAIT_SERVICE="http",
            DUCTOR_STREAMS_WAIT_SERVICE_URL=f"http://127.0.0.1:{stub.port}/wait-events",
        )
    worker = WorkerProcess(url, data_dir, log, env)
    roots = {**pids, "worker": worker.pid}
    if stub is not None and stub.process.pid is not None:
        roots["stub"] = stub.process.pid
    service = Service(url, run_id, stub)
    streams = {k: f"dispatch-{service_name}-{k}" for k in ("warm", "burst", "steady")}
    for stream in streams.values():
        create_stream(stream)

    async def drive() -> tuple[tuple[int, int], tuple[int, int], float]:
        conn = await asyncpg.connect(url)
        http = await Http.open(port)
        try:
            # The worker is up once it has delivered a record of the warm-up stream.
            path = f"{prefix}/{streams['warm']}/records"
            await _append(http, port, token, path, _body(0, 10))
            if await _wait_accepted(service, conn, streams["warm"], 10, time.monotonic() + 60) < 10:
                raise RuntimeError(f"the worker delivered nothing in 60 s; see {log}")

            # Burst.
            run, stream = result.burst, streams["burst"]
            service.next_stream()
            path = f"{prefix}/{stream}/records"
            bodies = [_body(i, min(batch, records - i)) for i in range(0, records, batch)]
            before = await _statement_stats(url)
            meter = CpuMeter(roots)
            meter.start()
            started = time.time()
            t0 = time.monotonic()
            for body in bodies:
                run.records = await _append(http, port, token, path, body)
            run.append_seconds = time.monotonic() - t0
            run.accepted = await _wait_accepted(service, conn, stream, run.records, t0 + timeout)
            run.cpu = meter.stop()
            after = await _statement_stats(url)
            run.statements, run.top = _statements(before, after, run.accepted)
            if run.accepted < run.records:
                run.error = f"{run.accepted:,} of {run.records:,} accepted after {timeout:g}s"
            burst = (1, run.records)

            # Steady, on a fresh connection (the server drops one idle for long).
            http.close()
            http = await Http.open(port)
            run, stream = result.steady, streams["steady"]
            service.next_stream()
            path = f"{prefix}/{stream}/records"
            window = [0, 0]

            async def paced(seconds: float, measured: bool) -> None:
                started, n = time.monotonic(), 0
                while (due := started + n / rate) < started + seconds:
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    sequence = await _append(http, port, token, path, _body(n, 1))
                    if measured:
                        window[0] = window[0] or sequence
                        window[1] = sequence
                    n += 1

            await paced(warmup, False)
            meter = CpuMeter(roots)
            meter.start()
            t1 = time.monotonic()
            await paced(duration, True)
            run.append_seconds = time.monotonic() - t1
            run.cpu = meter.stop()
            run.records = window[1] - window[0] + 1 if window[1] else 0
            got = await _wait_accepted(service, conn, stream, window[1], time.monotonic() + timeout)
            run.accepted = max(0, got - window[0] + 1) if window[1] else 0
            run.seconds = run.append_seconds
            if got < window[1]:
                run.error = f"{got:,} of {window[1]:,} accepted after {timeout:g}s"
            return burst, (window[0], window[1]), started
        finally:
            http.close()
            await conn.close()

    async def lags(
        burst: tuple[int, int], steady: tuple[int, int], started: float, received
    ) -> None:
        conn = await asyncpg.connect(url)
        try:
            found, latest = await _lags(conn, run_id, streams["burst"], *burst, received)
            _finish(result.burst, found)
            if latest is not None:
                result.burst.seconds = latest - started
            found, _ = await _lags(conn, run_id, streams["steady"], *steady, received)
            _finish(result.steady, found)
        finally:
            await conn.close()

    received = None
    try:
        burst, steady, started = asyncio.run(drive())
    except Exception as error:
        result.error = repr(error)
        return result
    finally:
        worker.stop()
        if stub is not None:
            received = stub.finish()
            result.duplicates = stub.posts.value - stub.counter.value  # retried publishes
    try:
        asyncio.run(lags(burst, steady, started, received))
    except Exception as error:
        result.error = repr(error)
    return result
