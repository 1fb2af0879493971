"""HTTP load: wrk (C, static request from a Lua script) or, where wrk is not installed, a lean
multi-process asyncio raw-socket HTTP/1.1 keep-alive client."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

LUA = Path(__file__).with_name("wrk.lua")


@dataclass
class LoadResult:
    requests: int
    seconds: float
    errors: int  # non-2xx answers, socket errors and timeouts
    p50_ms: float | None
    p99_ms: float | None
    client_cpu: float  # % of one core used by the load generator
    tool: str
    detail: dict[str, int] = field(default_factory=dict)
    commits: int | None = None  # transactions the database committed meanwhile, where counted


def wrk_path() -> str | None:
    return shutil.which("wrk")


def run(
    port: int,
    method: str,
    path: str,
    *,
    body: bytes | None,
    token: str,
    connections: int,
    duration: float,
    threads: int,
    body_file: Path,
) -> LoadResult:
    if wrk_path():
        return _run_wrk(port, method, path, body, token, connections, duration, threads, body_file)
    return _run_python(port, method, path, body, token, connections, duration, threads)


# --- wrk ------------------------------------------------------------------------------------

_FIELD = re.compile(r"(\w+)=([\d.]+)")


def _run_wrk(
    port: int,
    method: str,
    path: str,
    body: bytes | None,
    token: str,
    connections: int,
    duration: float,
    threads: int,
    body_file: Path,
) -> LoadResult:
    if body is not None:
        body_file.write_bytes(body)
    argv = [
        wrk_path() or "wrk",
        f"-t{min(threads, connections)}",
        f"-c{connections}",
        f"-d{max(1, round(duration))}s",
        "--timeout",
        "30s",
        "-s",
        str(LUA),
        f"http://127.0.0.1:{port}{path}",
        "--",
        method,
        str(body_file) if body is not None else "-",
        token,
    ]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    out = process.stdout.read().decode()
    err = process.stderr.read().decode()
    result = result_of(
        process.returncode, out, err, f"wrk -t{min(threads, connections)} -c{connections}"
    )
    result.client_cpu = 100 * (usage.ru_utime + usage.ru_stime) / result.seconds
    return result


_ERRORS = ("connect", "read", "write", "status", "timeout")


def result_of(returncode: int, out: str, err: str, tool: str) -> LoadResult:
    """What a wrk run whose script prints bench/wrk_result.lua's line measured."""
    line = next((ln for ln in out.splitlines() if ln.startswith("BENCH_RESULT")), None)
    if returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({returncode}):\n{out}\n{err}")
    values = {k: float(v) for k, v in _FIELD.findall(line)}
    return LoadResult(
        requests=int(values["requests"]),
        seconds=values["duration_us"] / 1e6,
        errors=sum(int(values[k]) for k in _ERRORS),
        p50_ms=values["p50_us"] / 1000,
        p99_ms=values["p99_us"] / 1000,
        client_cpu=0.0,
        tool=tool,
        detail={k: int(values[k]) for k in _ERRORS},
    )


# --- fallback: asyncio raw sockets in several processes -------------------------------------


def _request_bytes(port: int, method: str, path: str, body: bytes | None, token: str) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Authorization: Bearer {token}",
    ]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


async def _client_loop(
    port: int, request: bytes, connections: int, duration: float
) -> tuple[int, int, list[float]]:
    done = errors = 0
    latencies: list[float] = []
    deadline = time.perf_counter() + duration

    async def one() -> None:
        nonlocal done, errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while (started := time.perf_counter()) < deadline:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                ended = time.perf_counter()
                if ended > deadline:
                    break
                done += 1
                if not 200 <= status < 300:
                    errors += 1
                latencies.append((ended - started) * 1000)
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return done, errors, latencies


def _client_process(
    port: int, request: bytes, connections: int, duration: float, out: multiprocessing.Queue
) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    cpu0 = time.process_time()
    done, errors, latencies = asyncio.run(_client_loop(port, request, connections, duration))
    out.put((done, errors, latencies, time.process_time() - cpu0))


def _run_python(
    port: int,
    method: str,
    path: str,
    body: bytes | None,
    token: str,
    connections: int,
    duration: float,
    processes: int,
) -> LoadResult:
    processes = max(1, min(processes, connections))
    request = _request_bytes(port, method, path, body, token)
    out: multiprocessing.Queue = multiprocessing.Queue()
    shares = [connections // processes + (i < connections % processes) for i in range(processes)]
    workers = [
        multiprocessing.Process(target=_client_process, args=(port, request, n, duration, out))
        for n in shares
    ]
    started = time.perf_counter()
    for w in workers:
        w.start()
    results = [out.get() for _ in workers]
    for w in workers:
        w.join()
    seconds = time.perf_counter() - started
    latencies = sorted(lat for r in results for lat in r[2])

    def pct(p: float) -> float | None:
        if not latencies:
            return None
        return latencies[min(len(latencies) - 1, max(0, round(p / 100 * len(latencies)) - 1))]

    return LoadResult(
        requests=sum(r[0] for r in results),
        seconds=min(seconds, duration) if seconds else duration,
        errors=sum(r[1] for r in results),
        p50_ms=pct(50),
        p99_ms=pct(99),
        client_cpu=100 * sum(r[3] for r in results) / duration,
        tool=f"python asyncio client ({processes} proc, {connections} connections; "
        "wrk not installed)",
    )
