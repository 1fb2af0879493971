"""Live delivery: SSE fan-out latency, the memory of idle SSE connections, and catch-up reads.

The SSE clients are the kit of `bench/sse_kit.py`: lean raw-socket asyncio HTTP/1.1 clients
spread over several processes, so they are not the bottleneck.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from bench.sse_kit import Http, Subscribers, _request, _subscribe

# --- (5) fan-out --------------------------------------------------------------------------------


@dataclass
class Fanout:
    subscribers: int
    connected: int = 0
    appends: int = 0  # inside the window
    seconds: float = 0.0
    expected: int = 0  # appends x connected subscribers
    received: int = 0
    failed: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    # The append requests themselves (send -> 201) inside the window: a stall here (a WAL flush
    # behind a checkpoint) delays every delivery of that append.
    append_p50_ms: float | None = None
    append_max_ms: float | None = None
    statements: int | None = None  # pg_stat_statements calls in the window
    transactions: int = 0  # xact_commit delta
    top: list[tuple[float, str]] = field(default_factory=list)  # (per append, statement)
    cpu: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def statements_per_append(self) -> float | None:
        if self.statements is None or not self.appends:
            return None
        return self.statements / self.appends

    @property
    def transactions_per_append(self) -> float:
        return self.transactions / self.appends if self.appends else 0.0


def _pct(ordered: list[float], p: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def fanout(
    port: int,
    token: str,
    prefix: str,
    stream: str,
    *,
    subscribers: int,
    processes: int,
    rate: float,
    duration: float,
    warmup: float,
    counts: Callable[[], Awaitable[tuple[dict | None, int]]],
    meter: object,
) -> Fanout:
    """`subscribers` SSE subscriptions to one stream, one appender posting one record `rate`
    times a second; latency is receipt time - the send time in the record."""
    result = Fanout(subscribers)
    subs = Subscribers(
        port,
        f"{prefix}/{stream}/subscribe?cursor=0",
        token,
        subscribers,
        processes,
        hard=warmup + duration + 120,
    )
    try:
        result.connected, result.failed, result.error = subs.wait_ready()
    except queue.Empty:
        subs.finish(0, timeout=5)
        result.error = "subscribers not ready after 90 s"
        return result
    path = f"{prefix}/{stream}/records"

    def body_of(data: dict) -> bytes:
        return msgspec.json.encode({"records": [{"data": data}]})

    def last_of(http: Http, answer: bytes) -> int:
        return msgspec.json.decode(answer)["last_sequence"]

    return append_and_deliver(
        port, token, path, subs, result,
        body_of=body_of, ok=(201,), last_of=last_of,
        rate=rate, duration=duration, warmup=warmup, meter=meter, counts=counts,
    )  # fmt: skip


def append_and_deliver(
    port: int,
    token: str,
    path: str,
    subs: Subscribers,
    result: Any,
    *,
    body_of: Callable[[dict], bytes],
    ok: tuple[int, ...],
    last_of: Callable[[Http, bytes], int],
    rate: float,
    duration: float,
    warmup: float,
    meter: Any,
    counts: Callable[[], Awaitable[tuple[dict | None, int]]] | None = None,
) -> Any:
    """The appender of a fan-out, and its figures: one record `rate` times a second to `path`
    (`body_of` makes the request from the record, `ok` are its good statuses and `last_of`
    reads the position after it), for `warmup`, then `duration` seconds measured; then the
    `subs` (ready) report what they received. Fills and answers `result` (a `Fanout`, or one
    with its delivery fields); with `counts`, the statements of the window too."""
    pad = "x" * 40
    append_ms: list[float] = []

    async def drive() -> int:
        http = await Http.open(port)
        last = 0
        try:

            async def post(window: int) -> None:
                nonlocal last
                sent = time.time()
                body = body_of({"t": sent, "w": window, "pad": pad})
                status, answer = await http.call(_request(port, "POST", path, token, body))
                if status not in ok:
                    raise RuntimeError(f"append answered {status}: {answer[:200]!r}")
                if window:
                    append_ms.append((time.time() - sent) * 1000)
                last = last_of(http, answer)

            async def paced(seconds: float, window: int) -> int:
                started, n = time.monotonic(), 0
                while (due := started + n / rate) < started + seconds:
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    await post(window)
                    n += 1
                return n

            await paced(warmup, 0)
            await asyncio.sleep(0.5)
            before = await counts() if counts is not None else None
            meter.start()
            t0 = time.monotonic()
            result.appends = await paced(duration, 1)
            result.seconds = time.monotonic() - t0
            result.cpu = meter.stop()
            if counts is not None:
                await asyncio.sleep(1.5)  # deliveries done, backends' statistics flushed
                after = await counts()
        finally:
            http.close()
        if counts is not None:
            _count_statements(result, before, after)
        return last

    try:
        last = asyncio.run(drive())
    except Exception as error:
        subs.finish(0, timeout=15)
        result.error = repr(error)
        return result
    latencies, result.received, failed, client_cpu = subs.finish(last)
    result.failed += failed
    result.cpu["client"] = 100 * client_cpu / max(result.seconds, 1e-9) if result.seconds else 0
    result.expected = result.appends * result.connected
    latencies.sort()
    result.p50_ms, result.p99_ms = _pct(latencies, 50), _pct(latencies, 99)
    result.max_ms = latencies[-1] if latencies else None
    append_ms.sort()
    result.append_p50_ms = _pct(append_ms, 50)
    result.append_max_ms = append_ms[-1] if append_ms else None
    return result


def _count_statements(result: Fanout, before: tuple, after: tuple) -> None:
    (calls0, commits0), (calls1, commits1) = before, after
    result.transactions = commits1 - commits0
    if calls0 is None or calls1 is None:
        return
    deltas = []
    for queryid, (text, calls) in calls1.items():
        delta = calls - calls0.get(queryid, ("", 0))[1]
        if delta > 0:
            deltas.append((delta, " ".join(text.split())[:70]))
    result.statements = sum(d for d, _ in deltas)
    deltas.sort(reverse=True)
    appends = max(1, result.appends)
    result.top = [(d / appends, text) for d, text in deltas[:10]]


# --- (6) idle connections -----------------------------------------------------------------------


@dataclass
class Idle:
    connections: int
    connected: int = 0
    failed: int = 0
    before: dict[str, int] = field(default_factory=dict)  # rss/pss bytes
    holding: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)  # once they closed again
    error: str = ""


def idle(
    port: int,
    token: str,
    prefix: str,
    stream: str,
    *,
    connections: int,
    processes: int,
    hold: float,
    memory: Callable[[], dict[str, int]],
) -> Idle:
    result = Idle(connections)
    result.before = memory()
    subs = Subscribers(
        port,
        f"{prefix}/{stream}/subscribe?cursor=0",
        token,
        connections,
        processes,
        hard=hold + 120,
    )
    try:
        result.connected, result.failed, result.error = subs.wait_ready()
    except queue.Empty:
        result.error = "subscribers not ready after 90 s"
    time.sleep(hold)
    result.holding = memory()
    _, _, failed, _ = subs.finish(0, timeout=30)
    result.failed += failed
    time.sleep(1)
    result.after = memory()
    return result


# --- (7) catch-up -------------------------------------------------------------------------------


@dataclass
class Catchup:
    records: int
    fill_seconds: float = 0.0
    sse_records: int = 0
    sse_seconds: float = 0.0
    sse_last: int = 0
    sse_cpu: dict[str, float] = field(default_factory=dict)
    page_records: int = 0
    page_seconds: float = 0.0
    page_requests: int = 0
    page_cpu: dict[str, float] = field(default_factory=dict)
    # (7f) the floor: raw asyncpg reading the same records by keyset pages and encoding each
    # page as the GET answer's JSON (its CPU is the bench process's, as "client").
    floor_records: int = 0
    floor_seconds: float = 0.0
    floor_bytes: int = 0
    floor_cpu: dict[str, float] = field(default_factory=dict)
    # The first page's bytes, from the server's GET and from the floor: they must be equal.
    first_page: bytes = b""
    first_floor_page: bytes = b""
    floor_matches: bool | None = None
    error: str = ""

    @property
    def fill_rate(self) -> float:
        return self.records / self.fill_seconds if self.fill_seconds else 0.0

    @property
    def sse_rate(self) -> float:
        return self.sse_records / self.sse_seconds if self.sse_seconds else 0.0

    @property
    def page_rate(self) -> float:
        return self.page_records / self.page_seconds if self.page_seconds else 0.0

    @property
    def floor_rate(self) -> float:
        return self.floor_records / self.floor_seconds if self.floor_seconds else 0.0

    def cpu_per_record_us(self, name: str, process: str = "server") -> float | None:
        """CPU microseconds per record of `process` in reader `name` (sse, page, floor)."""
        count = getattr(self, f"{name}_records")
        cpu = getattr(self, f"{name}_cpu").get(process)
        if not count or cpu is None:
            return None
        return cpu / 100 * getattr(self, f"{name}_seconds") / count * 1e6


class _Page(msgspec.Struct):
    records: list[msgspec.Raw]
    next_cursor: int
    head: int


# --- (7f) the floor: raw asyncpg and msgspec, no server ------------------------------------------

_FLOOR_PAGE = """
SELECT sequence, appended_at, content_type, size, payload FROM stream_records
WHERE tenant = $1 AND run_id = $2 AND stream_id = $3 AND sequence > $4
ORDER BY sequence LIMIT $5
"""


class _FloorRecord(msgspec.Struct):
    """A JSON record as the GET records answer has it (application.views.RecordView)."""

    sequence: int
    appended_at: datetime
    size: int
    content_type: str
    data: msgspec.Raw


class _FloorPage(msgspec.Struct):
    records: list[_FloorRecord]
    next_cursor: int
    head: int
    earliest: int
    closed: bool


async def read_floor(
    url: str,
    tenant: str,
    run_id: str,
    stream: str,
    records: int,
    timeout: float,
    result: Catchup,
    meter: object,
) -> None:
    """The cheapest honest Python way to produce the bytes of (7b)'s answers: one asyncpg
    connection reading keyset pages of 1,000 from the same table, each page encoded as the
    GET answer's JSON by msgspec into a reused buffer. Measured from the first read to the
    last, with the connection open (its backend's CPU is counted before it exits)."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        head, earliest, closed = await conn.fetchrow(
            "SELECT head, earliest, closed FROM streams "
            "WHERE tenant = $1 AND run_id = $2 AND stream_id = $3",
            tenant,
            run_id,
            stream,
        )
        statement = await conn.prepare(_FLOOR_PAGE)
        encoder = msgspec.json.Encoder()
        buffer = bytearray()
        Raw, Record = msgspec.Raw, _FloorRecord
        cursor = 0
        deadline = time.monotonic() + timeout
        meter.start()  # type: ignore[attr-defined]
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        while cursor < records and time.monotonic() < deadline:
            rows = await statement.fetch(tenant, run_id, stream, cursor, 1000)
            if not rows:
                break
            page = [Record(r[0], r[1], r[3], r[2], Raw(r[4])) for r in rows]
            cursor = page[-1].sequence
            encoder.encode_into(_FloorPage(page, cursor, head, earliest, closed), buffer)
            if not result.first_floor_page:
                result.first_floor_page = bytes(buffer)
            result.floor_records += len(page)
            result.floor_bytes += len(buffer)
        result.floor_seconds = time.perf_counter() - t0
        result.floor_cpu = meter.stop()  # type: ignore[attr-defined]
        result.floor_cpu["client"] = 100 * (time.process_time() - cpu0) / result.floor_seconds
    finally:
        await conn.close()


async def fill(port: int, token: str, path: str, body: bytes, batches: int, clients: int) -> None:
    """POST `batches` copies of `body` (a batch of records) over `clients` connections."""
    left = batches

    async def client() -> None:
        nonlocal left
        http = await Http.open(port)
        request = _request(port, "POST", path, token, body)
        try:
            while left > 0:
                left -= 1
                status, answer = await http.call(request)
                if status != 201:
                    raise RuntimeError(f"append answered {status}: {answer[:200]!r}")
        finally:
            http.close()

    await asyncio.gather(*(client() for _ in range(clients)))


def catchup(
    port: int,
    token: str,
    prefix: str,
    stream: str,
    *,
    records: int,
    batch_body: bytes,
    batch: int,
    fill_clients: int,
    timeout: float,
    meter: object,
    floor: Callable[[Catchup, object], Awaitable[None]] | None = None,
    spy: Callable[[str], Callable[[], None]] | None = None,
) -> Catchup:
    """`floor(result, meter)`: reads the same records without the server, for (7f), and
    measures itself (`floor_seconds`, `floor_cpu`). `spy(name)`:
    starts sampling the server for reader `name` (sse, page) and answers how to stop it."""
    result = Catchup(records)
    started = time.monotonic()
    try:
        asyncio.run(
            asyncio.wait_for(
                fill(
                    port,
                    token,
                    f"{prefix}/{stream}/records",
                    batch_body,
                    records // batch,
                    fill_clients,
                ),
                timeout,
            )
        )
    except Exception as error:
        result.error = f"fill: {error!r}"
        return result
    result.fill_seconds = time.monotonic() - started

    async def sse() -> None:
        http, buf = await _subscribe(port, f"{prefix}/{stream}/subscribe?cursor=0", token)
        deadline = time.monotonic() + timeout
        try:
            while result.sse_records < records and time.monotonic() < deadline:
                piece = await asyncio.wait_for(http.chunk(), max(0.1, deadline - time.monotonic()))
                if not piece:
                    break
                buf += piece
                end = buf.rfind(b"\n\n")
                if end < 0:
                    continue
                complete, buf = buf[: end + 2], buf[end + 2 :]
                result.sse_records += complete.count(b"\nevent: record\n")
                if (at := complete.rfind(b"id: ")) >= 0:
                    result.sse_last = int(complete[at + 4 : complete.index(b"\n", at)])
        finally:
            http.close()

    async def pages() -> None:
        http = await Http.open(port)
        cursor = 0
        deadline = time.monotonic() + timeout
        decode = msgspec.json.Decoder(_Page).decode
        try:
            while cursor < records and time.monotonic() < deadline:
                path = f"{prefix}/{stream}/records?cursor={cursor}&limit=1000"
                status, answer = await http.call(_request(port, "GET", path, token))
                if status != 200:
                    raise RuntimeError(f"read answered {status}: {answer[:200]!r}")
                page = decode(answer)
                if not result.first_page:
                    result.first_page = answer
                if not page.records:
                    break
                result.page_records += len(page.records)
                result.page_requests += 1
                cursor = page.next_cursor
        finally:
            http.close()

    for name, reader in (("sse", sse), ("page", pages)):
        stop_spy = spy(name) if spy is not None else None
        meter.start()
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        try:
            asyncio.run(reader())
        except Exception as error:
            result.error += f"{name}: {error!r} "
        seconds = time.perf_counter() - t0
        cpu = meter.stop()
        if stop_spy is not None:
            stop_spy()
        cpu["client"] = 100 * (time.process_time() - cpu0) / seconds
        setattr(result, f"{name}_seconds", seconds)
        setattr(result, f"{name}_cpu", cpu)
    if floor is not None:
        try:
            asyncio.run(floor(result, meter))
        except Exception as error:
            result.error += f"floor: {error!r} "
        result.floor_matches = result.first_page == result.first_floor_page
        result.first_page = result.first_floor_page = b""  # not for the JSON report
    return result
