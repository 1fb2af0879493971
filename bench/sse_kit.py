"""A small SSE client kit for the benchmarks: raw-socket asyncio HTTP/1.1 (`Http`, one
keep-alive connection), and `Subscribers`, many SSE subscriptions spread over client
processes (uvloop if installed), each holding a few hundred connections parsed as the bytes
arrive, so the clients are not the bottleneck. Used by `bench/live.py`, `bench/protocol.py`
and `bench/dispatch.py`."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import re
import time

from bench.server import raise_fd_limit

# --- raw HTTP/1.1 -----------------------------------------------------------------------------


def _request(port: int, method: str, path: str, token: str, body: bytes | None = None) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Authorization: Bearer {token}",
    ]
    if "/subscribe" in path or "live=sse" in path:
        lines.append("Accept: text/event-stream")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


class Http:
    """One keep-alive connection: send a request, read the status line, headers and body
    (Content-Length or chunked), or, for a streaming answer, its body chunk by chunk."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.chunked = False
        self.headers: dict[bytes, bytes] = {}  # of the last answer, names in lower case

    @classmethod
    async def open(cls, port: int) -> Http:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        return cls(reader, writer)

    async def start(self, request: bytes) -> tuple[int, int | None]:
        """Send `request`; return the status and the Content-Length (None if chunked)."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0 if status in (204, 304) else None  # no body, whatever the headers say
        self.chunked = False
        self.headers: dict[bytes, bytes] = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            self.headers[name] = value.strip()
            if name == b"content-length" and length is None:
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
        return status, length

    async def chunk(self) -> bytes:
        """The next piece of a streaming body; b"" at its end."""
        if not self.chunked:
            return await self.reader.read(1 << 18)
        line = await self.reader.readline()
        size = int(line.split(b";")[0], 16)
        if size == 0:
            await self.reader.readline()
            return b""
        data = await self.reader.readexactly(size + 2)
        return data[:-2]

    async def call(self, request: bytes) -> tuple[int, bytes]:
        status, length = await self.start(request)
        if length is not None:
            return status, await self.reader.readexactly(length)
        parts = []
        while piece := await self.chunk():
            parts.append(piece)
        return status, b"".join(parts)

    def close(self) -> None:
        self.writer.close()


async def _subscribe(port: int, path: str, token: str) -> tuple[Http, bytes]:
    """Open an SSE subscription and read up to its `: subscribed` comment; return the rest."""
    http = await Http.open(port)
    status, _ = await http.start(_request(port, "GET", path, token))
    if status != 200:
        raise RuntimeError(f"subscribe answered {status}")
    buf = b""
    while (at := buf.find(b": subscribed\n\n")) < 0:
        piece = await http.chunk()
        if not piece:
            raise RuntimeError("subscription ended before `: subscribed`")
        buf += piece
    return http, buf[at + len(b": subscribed\n\n") :]


# --- subscriber processes -----------------------------------------------------------------------


def _subscriber_process(
    port: int,
    path: str,
    token: str,
    connections: int,
    ready: multiprocessing.Queue,
    stop: multiprocessing.synchronize.Event,
    last: multiprocessing.sharedctypes.Synchronized,
    out: multiprocessing.Queue,
    hard_seconds: float,
    protocol: bool = False,
) -> None:
    raise_fd_limit()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    cpu0 = time.process_time()
    result = asyncio.run(
        _subscribers(
            port, path, token, connections, ready, stop, last, hard_seconds, protocol=protocol
        )
    )
    out.put((*result, time.process_time() - cpu0))


_SEND_TIME = re.compile(rb'"t":([0-9.]+),"w":1')  # the appender's data: {"t":…,"w":1,…}


class _Sse(asyncio.Protocol):
    """One subscription, parsed in `data_received` (no StreamReader, no task per connection):
    the receipt time is taken as the bytes arrive. Chunked framing is left in the buffer: the
    server writes whole events per chunk, and only complete events (up to the last blank line)
    are scanned, for the send times of window records and the last `id:`."""

    def __init__(self, request: bytes, latencies: list[float]) -> None:
        self.request = request
        self.latencies = latencies
        self.buf = b""
        self.head_done = False
        self.status = 0
        self.subscribed = asyncio.get_running_loop().create_future()
        self.closed = asyncio.get_running_loop().create_future()
        self.received = 0
        self.seen = 0

    SUBSCRIBED = b": subscribed"  # the native subscription's first comment

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.time()
        buf = self.buf + data
        if not self.head_done:
            at = buf.find(b"\r\n\r\n")
            if at < 0:
                self.buf = buf
                return
            self.status, self.head_done = int(buf[9:12]), True
            if self.status != 200 and not self.subscribed.done():
                self.subscribed.set_exception(RuntimeError(f"subscribe answered {self.status}"))
            buf = buf[at + 4 :]
        end = buf.rfind(b"\n\n")
        if end < 0:
            self.buf = buf
            return
        complete, self.buf = buf[:end], buf[end + 2 :]
        if not self.subscribed.done() and self.SUBSCRIBED in complete:
            self.subscribed.set_result(None)
        for sent in _SEND_TIME.findall(complete):
            self.latencies.append((now - float(sent)) * 1000)
            self.received += 1
        self.note_seen(complete)

    def note_seen(self, complete: bytes) -> None:
        """`seen`: the sequence of the last event id in these complete events."""
        if (at := complete.rfind(b"\nid: ")) >= 0 or complete.startswith(b"id: "):
            at = at + 1 if at >= 0 else 0
            self.seen = int(complete[at + 4 : complete.index(b"\n", at)])

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.subscribed.done():
            self.subscribed.set_exception(exc or RuntimeError("closed before `: subscribed`"))
        if not self.closed.done():
            self.closed.set_result(None)


_NEXT_OFFSET = re.compile(rb'"streamNextOffset":"\d+_(\d+)"')


class _ProtocolSse(_Sse):
    """A Durable Streams `live=sse` read of our protocol surface: live from its first `event:
    control` (the catch-up is done), `seen` the native sequence in the last control event's
    `streamNextOffset` (`0000000000000000_` + the sequence)."""

    SUBSCRIBED = b"event: control"

    def note_seen(self, complete: bytes) -> None:
        if found := _NEXT_OFFSET.findall(complete):
            self.seen = int(found[-1])


async def _subscribers(
    port: int,
    path: str,
    token: str,
    connections: int,
    ready: multiprocessing.Queue,
    stop: multiprocessing.synchronize.Event,
    last: multiprocessing.sharedctypes.Synchronized,
    hard_seconds: float,
    protocol: bool = False,
) -> tuple[list[float], int, int]:
    """Hold `connections` subscriptions; for each record whose data has `"w":1` (appended inside
    the measured window), note receipt time - the send time in the data. Returns (latencies in
    ms, window records received, failed connections)."""
    loop = asyncio.get_running_loop()
    hard = time.monotonic() + hard_seconds
    latencies: list[float] = []
    request = _request(port, "GET", path, token)
    gate = asyncio.Semaphore(50)  # connect in waves, not 500 SYNs at once

    kind = _ProtocolSse if protocol else _Sse

    async def connect() -> _Sse:
        async with gate:
            _, sse = await loop.create_connection(
                lambda: kind(request, latencies), "127.0.0.1", port
            )
            await asyncio.wait_for(asyncio.shield(sse.subscribed), 30)
            return sse

    opened = await asyncio.gather(*(connect() for _ in range(connections)), return_exceptions=True)
    subs = [o for o in opened if isinstance(o, _Sse)]
    failed = len(opened) - len(subs)
    error = next((repr(o) for o in opened if isinstance(o, BaseException)), "")
    ready.put((len(subs), failed, error))
    # A multiprocessing Event cannot be awaited: poll it (and then the deliveries) every 50 ms.
    while True:
        if stop.is_set() or time.monotonic() >= hard:
            break
        await asyncio.sleep(0.05)
    target = last.value
    grace = min(hard, time.monotonic() + 10)
    while True:
        if time.monotonic() >= grace or min((s.seen for s in subs), default=target) >= target:
            break
        await asyncio.sleep(0.05)
    for sub in subs:
        sub.transport.close()
    failed += sum(1 for s in subs if s.seen < target)
    return latencies, sum(s.received for s in subs), failed


class Subscribers:
    """`connections` SSE subscriptions to `path`, spread over `processes` client processes."""

    def __init__(
        self,
        port: int,
        path: str,
        token: str,
        connections: int,
        processes: int,
        hard: float,
        *,
        protocol: bool = False,
    ) -> None:
        """`protocol`: `path` is a Durable Streams `live=sse` read, not a native subscribe."""
        processes = max(1, min(processes, connections))
        self.ready: multiprocessing.Queue = multiprocessing.Queue()
        self.out: multiprocessing.Queue = multiprocessing.Queue()
        self.stop_event = multiprocessing.Event()
        self.last = multiprocessing.Value("q", 0)
        shares = [
            connections // processes + (i < connections % processes) for i in range(processes)
        ]
        self.workers = [
            multiprocessing.Process(
                target=_subscriber_process,
                args=(
                    port,
                    path,
                    token,
                    n,
                    self.ready,
                    self.stop_event,
                    self.last,
                    self.out,
                    hard,
                    protocol,
                ),
                daemon=True,
            )
            for n in shares
        ]
        for w in self.workers:
            w.start()

    def wait_ready(self, timeout: float = 90) -> tuple[int, int, str]:
        deadline = time.monotonic() + timeout
        opened = failed = 0
        error = ""
        for _ in self.workers:
            n, bad, why = self.ready.get(timeout=max(0.1, deadline - time.monotonic()))
            opened, failed, error = opened + n, failed + bad, error or why
        return opened, failed, error

    def finish(
        self, last_sequence: int, timeout: float = 60
    ) -> tuple[list[float], int, int, float]:
        """Tell the processes the last sequence to wait for; gather (latencies, received,
        failed, client CPU seconds)."""
        self.last.value = last_sequence
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        latencies: list[float] = []
        received = failed = 0
        cpu = 0.0
        for _ in self.workers:
            try:
                lat, got, bad, used = self.out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                failed += 1
                continue
            latencies += lat
            received, failed, cpu = received + got, failed + bad, cpu + used
        for w in self.workers:
            w.join(5)
            if w.is_alive():
                w.kill()
        return latencies, received, failed, cpu
