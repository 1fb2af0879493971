"""The append windows of `python -m bench`, one request per record: (1) the naive floor (raw
asyncpg), (2) HTTP append, (2j) the same with a JWT, (2f)/(2m) the protocol's reference server,
(3) the no-op GET, (3b) the bare route; and `http_window`, the wrk window (2)-(4) all run."""

from __future__ import annotations

import asyncio
import http.client
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support.identity_provider import claims
from tests.support.node import ReferenceServer, ensure_node_packages

from bench import database, load, profile
from bench.database import Measurement
from bench.payloads import PREFIX, RUN_ID, compact, record
from bench.server import BareServer, CpuMeter, Server

if TYPE_CHECKING:
    from bench.orchestrator import Bench


class _Reference:
    """What `http_window` needs of a server: its port and pid."""

    def __init__(self, port: int, pid: int) -> None:
        self.port = port
        self.pid = pid


def _put_stream(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("PUT", path, headers={"Content-Type": "application/json"})
        return connection.getresponse().status
    finally:
        connection.close()


def floor(bench: Bench) -> Measurement:
    meter = CpuMeter({"postgres": bench.pg_pid})
    result = asyncio.run(
        database.floor(
            bench.url,
            run_id=RUN_ID,
            payload=compact(record(0)),
            state_size=bench.state_size,
            connections=bench.args.floor_connections,
            duration=bench.args.duration,
            warmup=bench.args.warmup,
            meter=meter,
        )
    )
    return result


def http_window(
    bench: Bench,
    name: str,
    label: str,
    method: str,
    path: str,
    body: bytes | None,
    clients: int,
    records_per_request: int,
    profile_it: bool = False,
    server: Server | None = None,
    roots: dict[str, int] | None = None,
    token: str | None = None,
) -> Measurement:
    a = bench.args
    server = server or bench.server

    def go(duration: float) -> load.LoadResult:
        return load.run(
            server.port,
            method,
            path,
            body=body,
            token=token or bench.token,
            connections=clients,
            duration=duration,
            threads=a.wrk_threads,
            body_file=bench.tmp / f"{name}.json",
        )

    if a.warmup > 0:
        go(a.warmup)
    spy = None
    if profile_it:
        raw = bench.tmp / "profile.txt"
        spy = profile.start(bench.server.pid, a.duration, raw, native=a.profile_native)
    meter = CpuMeter(roots) if roots is not None else bench.meter(server)
    meter.start()
    outcome = go(a.duration)
    cpu = meter.stop()
    if spy is not None:
        bench.profile_summary = profile.finish(spy, raw, "ductor-bench-profile.txt")
    cpu["client"] = outcome.client_cpu
    result = Measurement(
        name,
        label,
        ops=outcome.requests,
        records=outcome.requests * records_per_request,
        seconds=outcome.seconds,
        p50_ms=outcome.p50_ms,
        p99_ms=outcome.p99_ms,
        errors=outcome.errors,
        cpu=cpu,
        note=outcome.tool,
    )
    if outcome.errors:
        result.note += f"; errors {outcome.detail or outcome.errors}"
    return result


def group_note(bench: Bench, result: Measurement, stream_id: str, per_request: int) -> None:
    rows, commits = asyncio.run(database.commits(bench.url, RUN_ID, stream_id))
    if commits:
        result.note += f"; {rows / commits / per_request:.1f} requests/commit"


def append(bench: Bench) -> Measurement:
    body = compact({"records": [{"data": record(0)}]})
    result = http_window(
        bench,
        "append",
        "(2) HTTP append, 1 record/request",
        "POST",
        f"{PREFIX}/single/records",
        body,
        bench.args.clients,
        1,
        profile_it=bench.args.profile,
    )
    group_note(bench, result, "single", 1)
    return result


def jwt(bench: Bench) -> Measurement:
    """(2)'s request with a JWT (ES256, tenant default, all scopes) instead of the opaque
    token: verified once, then remembered until it expires."""
    key = bench.identity.published[0]
    token = key.sign(claims(tenant="default", lifetime=3600))
    body = compact({"records": [{"data": record(0)}]})
    return http_window(
        bench,
        "jwt",
        "(2j) HTTP append with a JWT",
        "POST",
        f"{PREFIX}/single/records",
        body,
        bench.args.clients,
        1,
        token=token,
    )


def _reference(bench: Bench, name: str, label: str, data_dir: Path | None) -> Measurement:
    """(2)'s record, one per request, to the protocol's reference server (npm
    @durable-streams/server), started here for this window and stopped after it."""
    ensure_node_packages()
    ref = ReferenceServer(data_dir=data_dir, log_path=bench.tmp / f"{name}.log").start()
    try:
        status = _put_stream(ref.port, "/v1/stream/single")
        if status not in (200, 201):
            raise RuntimeError(f"creating the reference server's stream: {status}")
        reference = _Reference(ref.port, ref.pid)
        return http_window(
            bench,
            name,
            label,
            "POST",
            "/v1/stream/single",
            compact(record(0)),
            bench.args.clients,
            1,
            server=reference,  # type: ignore[arg-type]
            roots={"server": ref.pid},
        )
    finally:
        ref.stop()


def reffile(bench: Bench) -> Measurement:
    return _reference(
        bench, "reffile", "(2f) reference server, file-backed", bench.tmp / "reference-data"
    )


def refmemory(bench: Bench) -> Measurement:
    return _reference(bench, "refmemory", "(2m) reference server, in memory", None)


def noop(bench: Bench) -> Measurement:
    return http_window(
        bench, "noop", "(3) HTTP no-op GET /healthz", "GET", "/healthz", None, bench.args.clients, 0
    )


def bare(bench: Bench) -> Measurement:
    """(3b): (2)'s request against bench/bare_app.py, a process with the same route, body
    decoding, answer, middleware, ASGI server and loop, and nothing behind them."""
    bare = BareServer(bench.tmp / "bare.log")
    try:
        bare.wait_ready()
        return http_window(
            bench,
            "bare",
            "(3b) HTTP POST floor (bare route)",
            "POST",
            f"{PREFIX}/single/records",
            compact({"records": [{"data": record(0)}]}),
            bench.args.clients,
            1,
            server=bare,
        )
    finally:
        bare.stop()
