"""`python -m bench` (or `python3 dev.py bench`): run the benchmarks and print the table.

    python -m bench [--duration 10]
                    [--only floor,append,jwt,noop,bare,batch,copy,fanout,idle,catchup,objects,
                            dispatch]
                    [--profile]
    python -m bench soak [--appends 2000000] [--streams 100] [--clients 32]   (bench/soak.py)
    python -m bench protocol [--duration 10] [--rounds 2] [--only appends,fanout]
                                          (bench/protocol.py: the Durable Streams surface)
    python -m bench subscriptions [--duration 10] [--writers 16]
                                          (bench/subscriptions.py: commit to webhook)
    python -m bench spread [--duration 10] [--workers 1,2] [--only hot,spread100,...]
                                          (bench/spread.py: appends spread over many streams)

See docs/benchmarks.md for what each measurement is and the figures measured. This module
registers the benchmarks, parses the options and runs them; `bench/reports.py` prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import http.client
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from tests.support.identity_provider import IdentityProvider, Key, claims
from tests.support.node import ReferenceServer, ensure_node_packages

from bench import database, dispatch, live, load, objects, profile, reports
from bench.database import Measurement
from bench.server import BareServer, CpuMeter, Server, raise_fd_limit, tree_cpu, tree_memory

NAMES = (
    "floor",
    "append",
    "jwt",  # (2j): (2) with a JWT from an identity provider as the Bearer token
    "reffile",  # the Durable Streams reference server (npm), file-backed, then in memory
    "refmemory",
    "noop",
    "bare",  # (3b): the framework alone, the floor (2) and (3) stand on
    "batch",
    "copy",
    "idle",  # before fanout: (5) leaves the process with the heap its bursts grew
    "fanout",
    "catchup",
    "objects",
    "dispatch",
)
LIVE = ("fanout", "idle", "catchup", "objects", "dispatch")
RUN_ID = "bench"
BATCH = 1_000
PREFIX = f"/api/workflow-streams/runs/{RUN_ID}/streams"


def _record(i: int, size: int = 100) -> dict[str, object]:
    """A JSON record whose compact encoding is exactly `size` bytes."""
    head = {"i": i, "kind": "token", "text": ""}
    pad = size - len(json.dumps(head, separators=(",", ":")))
    head["text"] = "x" * pad
    return head


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class _Reference:
    """What `Bench._http` needs of a server: its port and pid."""

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


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before each one")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only these (repeatable or comma-separated): {', '.join(NAMES)}",
    )
    parser.add_argument("--clients", type=int, default=32, help="HTTP clients for (2) and (3)")
    parser.add_argument("--floor-connections", type=int, default=16, help="asyncpg for (1)")
    parser.add_argument("--batch-clients", type=int, default=8, help="clients/conns for (4)")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (2 cores here)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample the server with py-spy during (2) and print its hot spots "
        "(the figures of that run are perturbed)",
    )
    parser.add_argument(
        "--profile-batch",
        action="store_true",
        help="sample the server with py-spy during (4) instead (the figures of that run are "
        "perturbed)",
    )
    parser.add_argument(
        "--profile-native",
        action="store_true",
        help="with --profile: include native (C, Cython, Rust) frames; pauses the server "
        "per sample",
    )
    parser.add_argument(
        "--profile-catchup",
        action="store_true",
        help="sample the server with py-spy during (7a) and (7b) and print their hot spots "
        "(with --profile-native: native frames too; the figures of that run are perturbed)",
    )
    parser.add_argument(
        "--server-workers", type=int, default=1, help="server processes (serve --workers)"
    )
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra argument for `ductor-streams serve` (repeatable), "
        "e.g. --serve-arg=--server=uvicorn",
    )
    parser.add_argument(
        "--subscribers", type=int, default=1_000, help="SSE connections for (5) and (6)"
    )
    parser.add_argument(
        "--subscriber-processes", type=int, default=4, help="client processes holding them"
    )
    parser.add_argument("--fanout-rate", type=float, default=10.0, help="appends/s for (5)")
    parser.add_argument(
        "--catchup-records", type=int, default=1_000_000, help="records retained for (7)"
    )
    parser.add_argument(
        "--object-size", type=int, default=32 * 1024 * 1024, help="bytes per object for (8)"
    )
    parser.add_argument("--object-uploads", type=int, default=5, help="uploads in (8)")
    parser.add_argument(
        "--dispatch-records", type=int, default=20_000, help="records of the burst in (9)"
    )
    parser.add_argument(
        "--dispatch-rate", type=float, default=200.0, help="records/s of the steady case in (9)"
    )
    parser.add_argument(
        "--dispatch-services",
        default="postgres,http",
        help="wait services for (9): postgres, http or both (comma-separated)",
    )
    parser.add_argument(
        "--dispatch-timeout", type=float, default=300.0, help="bound of each wait in (9), s"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    only = {n.strip() for item in args.only for n in item.split(",") if n.strip()}
    if unknown := only - set(NAMES):
        parser.error(f"unknown benchmark(s) {sorted(unknown)}; choose from {', '.join(NAMES)}")
    args.selected = [n for n in NAMES if not only or n in only]
    args.wait_services = [s.strip() for s in args.dispatch_services.split(",") if s.strip()]
    if bad := set(args.wait_services) - {"postgres", "http"}:
        parser.error(f"unknown wait service(s) {sorted(bad)}; choose postgres, http")
    return args


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.results: dict[str, Measurement] = {}
        self.facts: dict[str, object] = {}
        self.profile_summary: str | None = None
        self.catchup_profiles: dict[str, str] = {}
        self.live: dict[str, object] = {}

    def run(self) -> None:
        args = self.args
        print(f"starting embedded PostgreSQL under {self.tmp / 'pg'} ...", flush=True)
        self.url, self.pg_pid = database.start_database(self.tmp)
        self.facts["postgres"] = asyncio.run(database.settings(self.url))
        self.facts["cpus"] = os.cpu_count()
        self.facts["load generator"] = (
            f"wrk ({load.wrk_path()})" if load.wrk_path() else "python asyncio (wrk missing)"
        )
        self.token = secrets.token_urlsafe(24)
        settings = {}
        if "jwt" in args.selected:
            # (2j): a JWKS on loopback, served from this process, and the server trusting it.
            self.identity = IdentityProvider().start()
            self.identity.published = [Key("ES256")]
            settings = self.identity.env()
        self.server = Server(
            self.url,
            self.token,
            self.tmp / "data",
            self.tmp / "server.log",
            workers=args.server_workers,
            extra=tuple(args.serve_arg),
            settings=settings,
        )
        try:
            self.server.wait_ready()
            self.facts["server memory at start"] = tree_memory(self.server.pid)
            self.server.create_stream(RUN_ID, "single")
            self.server.create_stream(RUN_ID, "batch")
            _, state_size = asyncio.run(database.stream_row(self.url, RUN_ID, "single"))
            self.state_size = state_size
            for name in args.selected:
                print(
                    f"running {name} ({args.duration:g}s + {args.warmup:g}s warm-up) ...",
                    flush=True,
                )
                asyncio.run(database.checkpoint(self.url))
                if name in LIVE:
                    self.live[name] = getattr(self, name)()
                else:
                    self.results[name] = getattr(self, name)()
        finally:
            self.server.stop()
            if "jwt" in args.selected:
                self.identity.stop()

    # -- measurements ------------------------------------------------------------------------

    def _meter(self, server: Server | None = None) -> CpuMeter:
        return CpuMeter({"server": (server or self.server).pid, "postgres": self.pg_pid})

    def floor(self) -> Measurement:
        meter = CpuMeter({"postgres": self.pg_pid})
        result = asyncio.run(
            database.floor(
                self.url,
                run_id=RUN_ID,
                payload=_compact(_record(0)),
                state_size=self.state_size,
                connections=self.args.floor_connections,
                duration=self.args.duration,
                warmup=self.args.warmup,
                meter=meter,
            )
        )
        return result

    def _http(
        self,
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
        a = self.args
        server = server or self.server

        def go(duration: float) -> load.LoadResult:
            return load.run(
                server.port,
                method,
                path,
                body=body,
                token=token or self.token,
                connections=clients,
                duration=duration,
                threads=a.wrk_threads,
                body_file=self.tmp / f"{name}.json",
            )

        if a.warmup > 0:
            go(a.warmup)
        spy = None
        if profile_it:
            raw = self.tmp / "profile.txt"
            spy = profile.start(self.server.pid, a.duration, raw, native=a.profile_native)
        meter = CpuMeter(roots) if roots is not None else self._meter(server)
        meter.start()
        outcome = go(a.duration)
        cpu = meter.stop()
        if spy is not None:
            self.profile_summary = profile.finish(spy, raw, "ductor-bench-profile.txt")
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

    def _group_note(self, result: Measurement, stream_id: str, per_request: int) -> None:
        rows, commits = asyncio.run(database.commits(self.url, RUN_ID, stream_id))
        if commits:
            result.note += f"; {rows / commits / per_request:.1f} requests/commit"

    def append(self) -> Measurement:
        body = _compact({"records": [{"data": _record(0)}]})
        result = self._http(
            "append",
            "(2) HTTP append, 1 record/request",
            "POST",
            f"{PREFIX}/single/records",
            body,
            self.args.clients,
            1,
            profile_it=self.args.profile,
        )
        self._group_note(result, "single", 1)
        return result

    def jwt(self) -> Measurement:
        """(2)'s request with a JWT (ES256, tenant default, all scopes) instead of the opaque
        token: verified once, then remembered until it expires."""
        key = self.identity.published[0]
        token = key.sign(claims(tenant="default", lifetime=3600))
        body = _compact({"records": [{"data": _record(0)}]})
        return self._http(
            "jwt",
            "(2j) HTTP append with a JWT",
            "POST",
            f"{PREFIX}/single/records",
            body,
            self.args.clients,
            1,
            token=token,
        )

    def _reference(self, name: str, label: str, data_dir: Path | None) -> Measurement:
        """(2)'s record, one per request, to the protocol's reference server (npm
        @durable-streams/server), started here for this window and stopped after it."""
        ensure_node_packages()
        ref = ReferenceServer(data_dir=data_dir, log_path=self.tmp / f"{name}.log").start()
        try:
            status = _put_stream(ref.port, "/v1/stream/single")
            if status not in (200, 201):
                raise RuntimeError(f"creating the reference server's stream: {status}")
            reference = _Reference(ref.port, ref.pid)
            return self._http(
                name,
                label,
                "POST",
                "/v1/stream/single",
                _compact(_record(0)),
                self.args.clients,
                1,
                server=reference,  # type: ignore[arg-type]
                roots={"server": ref.pid},
            )
        finally:
            ref.stop()

    def reffile(self) -> Measurement:
        return self._reference(
            "reffile", "(2f) reference server, file-backed", self.tmp / "reference-data"
        )

    def refmemory(self) -> Measurement:
        return self._reference("refmemory", "(2m) reference server, in memory", None)

    def noop(self) -> Measurement:
        return self._http(
            "noop", "(3) HTTP no-op GET /healthz", "GET", "/healthz", None, self.args.clients, 0
        )

    def bare(self) -> Measurement:
        """(3b): (2)'s request against bench/bare_app.py, a process with the same route, body
        decoding, answer, middleware, ASGI server and loop, and nothing behind them."""
        bare = BareServer(self.tmp / "bare.log")
        try:
            bare.wait_ready()
            return self._http(
                "bare",
                "(3b) HTTP POST floor (bare route)",
                "POST",
                f"{PREFIX}/single/records",
                _compact({"records": [{"data": _record(0)}]}),
                self.args.clients,
                1,
                server=bare,
            )
        finally:
            bare.stop()

    def batch(self) -> Measurement:
        body = _compact({"records": [{"data": _record(i)} for i in range(BATCH)]})
        result = self._http(
            "batch",
            f"(4) HTTP append, {BATCH} x 100 B/request",
            "POST",
            f"{PREFIX}/batch/records",
            body,
            self.args.batch_clients,
            BATCH,
            profile_it=self.args.profile_batch,
        )
        self._group_note(result, "batch", BATCH)
        return result

    def copy(self) -> Measurement:
        meter = CpuMeter({"postgres": self.pg_pid})
        result = asyncio.run(
            database.copy(
                self.url,
                run_id=RUN_ID,
                payloads=[_compact(_record(i)) for i in range(BATCH)],
                connections=self.args.batch_clients,
                duration=self.args.duration,
                warmup=self.args.warmup,
                meter=meter,
            )
        )
        return result

    # -- live delivery (5-7) ---------------------------------------------------------------------

    def _counts(self):  # an awaitable for live.fanout
        return database.statement_counts(self.url)

    def fanout(self) -> list[live.Fanout]:
        a = self.args
        runs = []
        for n in sorted({min(10, a.subscribers), a.subscribers}):
            stream = f"fanout-{n}"
            self.server.create_stream(RUN_ID, stream)
            print(f"  {n} subscribers ...", flush=True)
            runs.append(
                live.fanout(
                    self.server.port,
                    self.token,
                    PREFIX,
                    stream,
                    subscribers=n,
                    processes=1 if n <= 10 else a.subscriber_processes,
                    rate=a.fanout_rate,
                    duration=a.duration,
                    warmup=a.warmup,
                    counts=self._counts,
                    meter=self._meter(),
                )
            )
        return runs

    def idle(self) -> live.Idle:
        self.server.create_stream(RUN_ID, "idle")
        return live.idle(
            self.server.port,
            self.token,
            PREFIX,
            "idle",
            connections=self.args.subscribers,
            processes=self.args.subscriber_processes,
            hold=min(self.args.duration, 5.0),
            memory=lambda: tree_memory(self.server.pid),
        )

    def catchup(self) -> live.Catchup:
        self.server.create_stream(RUN_ID, "catchup")
        body = _compact({"records": [{"data": _record(i)} for i in range(BATCH)]})
        print(f"  filling {self.args.catchup_records:,} records ...", flush=True)
        return live.catchup(
            self.server.port,
            self.token,
            PREFIX,
            "catchup",
            records=self.args.catchup_records // BATCH * BATCH,
            batch_body=body,
            batch=BATCH,
            fill_clients=self.args.batch_clients,
            timeout=300,
            meter=self._meter(),
            floor=lambda result, meter: live.read_floor(
                self.url, database.TENANT, RUN_ID, "catchup", result.records, 300, result, meter
            ),
            spy=self._catchup_spy if self.args.profile_catchup else None,
        )

    def _catchup_spy(self, name: str):
        """py-spy on the server while catch-up reader `name` runs; the stop function ends it
        (SIGINT: py-spy writes what it sampled) and keeps its summary."""
        raw = self.tmp / f"profile-{name}.txt"
        spy = profile.start(self.server.pid, 600, raw, native=self.args.profile_native)
        time.sleep(1)  # py-spy attaches before the reader starts

        def stop() -> None:
            spy.send_signal(signal.SIGINT)
            summary = profile.finish(spy, raw, f"ductor-bench-profile-{name}.txt")
            if summary is not None:
                self.catchup_profiles[name] = summary

        return stop

    # -- objects (8) and input dispatch (9) ------------------------------------------------------

    def objects(self) -> objects.Objects:
        self.server.create_stream(RUN_ID, "objects")
        roots = {"server": self.server.pid, "postgres": self.pg_pid}
        return objects.run(
            self.server.port,
            self.token,
            PREFIX,
            "objects",
            server_pid=self.server.pid,
            size=self.args.object_size,
            uploads=self.args.object_uploads,
            cpu=lambda: {**tree_cpu(roots), "client": time.process_time()},
        )

    def dispatch(self) -> list[dispatch.Dispatch]:
        a = self.args
        runs = []
        for service in a.wait_services:
            print(f"  wait service {service} ...", flush=True)
            runs.append(
                dispatch.measure(
                    service,
                    url=self.url,
                    port=self.server.port,
                    token=self.token,
                    prefix=PREFIX,
                    run_id=RUN_ID,
                    create_stream=lambda s: self.server.create_stream(RUN_ID, s, "input"),
                    data_dir=self.tmp / "data",
                    log=self.tmp / "worker.log",
                    pids={"server": self.server.pid, "postgres": self.pg_pid},
                    records=a.dispatch_records,
                    batch=BATCH,
                    rate=a.dispatch_rate,
                    duration=a.duration,
                    warmup=a.warmup,
                    poll_seconds=0.05,
                    timeout=a.dispatch_timeout,
                )
            )
        return runs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["soak"]:
        from bench import soak

        return soak.main(argv[1:])
    if argv[:1] == ["subscriptions"]:
        from bench import subscriptions

        return subscriptions.main(argv[1:])
    if argv[:1] == ["protocol"]:
        from bench import protocol

        return protocol.main(argv[1:])
    if argv[:1] == ["spread"]:
        from bench import spread

        return spread.main(argv[1:])
    args = parse_args(argv)
    if args.profile and "append" not in args.selected:
        print("--profile samples the server during `append`; add it to --only", file=sys.stderr)
        return 2
    if args.profile_batch and (args.profile or "batch" not in args.selected):
        print("--profile-batch samples the server during `batch` alone", file=sys.stderr)
        return 2
    raise_fd_limit()  # the SSE client processes inherit it
    tmp = Path(tempfile.mkdtemp(prefix="ductor-bench-"))
    if not args.keep:
        # Registered before the embedded PostgreSQL registers its own stop, so (atexit runs
        # last-in first-out) the directory goes only after PostgreSQL has stopped.
        atexit.register(shutil.rmtree, tmp, True)
    bench = Bench(args, tmp)
    started = time.monotonic()
    bench.run()
    print()
    print(reports.report(bench, NAMES))
    if bench.profile_summary:
        which = "(4)" if bench.args.profile_batch else "(2)"
        print(f"\npy-spy profile of the server during {which} (% of sampled server CPU):")
        print(bench.profile_summary)
        print(f"(raw collapsed stacks: {Path(tempfile.gettempdir()) / 'ductor-bench-profile.txt'})")
    for name, summary in bench.catchup_profiles.items():
        label = {"sse": "(7a) SSE catch-up", "page": "(7b) pages of 1,000"}[name]
        print(f"\npy-spy profile of the server during {label} (% of sampled server CPU):")
        print(summary)
        raw = Path(tempfile.gettempdir()) / f"ductor-bench-profile-{name}.txt"
        print(f"(raw collapsed stacks: {raw})")
    if args.json:
        payload = {
            "facts": bench.facts,
            "duration": args.duration,
            "results": {k: asdict(v) for k, v in bench.results.items()},
            "live": {
                k: [asdict(x) for x in v] if isinstance(v, list) else asdict(v)
                for k, v in bench.live.items()
            },
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\ntotal {time.monotonic() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
