"""`python -m bench protocol` (or `python3 dev.py bench protocol`): the Durable Streams surface
measured side by side with the native one and with the protocol's reference server.

    python -m bench protocol [--duration 10] [--rounds 2] [--only appends,fanout]

(a) single-record appends through our protocol surface (`POST /api/durable-streams/v1/stream/
    bench/proto`, a JSON message of 100 bytes); (b) the same record through our native surface
(`POST /api/workflow-streams/runs/bench/streams/native/records`); (c) the reference server
(npm @durable-streams/server) file-backed (log files + LMDB, fsync on append); (d) the reference
server in memory. Each with the same load generator and client count (wrk, 32 keep-alive
connections by default), one after the other, in rounds whose order alternates (a b c d, then
d c b a, ...) so that drift of the shared host falls on all four alike. Then (e): 1,000 followers
of one stream over `live=sse` through our protocol surface while one client appends 10 records a
second: delivery latency (the append's send time, carried in the record, to receipt), and
right after it the same through the native surface, as a yardstick of the host's state.

Targets: (a)/(b) >= 0.90, (a)/(c) >= 3, (e) p99 <= 100 ms. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgspec
from tests.support.node import ReferenceServer, ensure_node_packages

from bench import database, live, load, profile, sse_kit
from bench.server import CpuMeter, Server, raise_fd_limit

RUN_ID = "bench"
NATIVE = f"/api/workflow-streams/runs/{RUN_ID}/streams"
PROTOCOL = f"/api/durable-streams/v1/stream/{RUN_ID}"
NAMES = ("appends", "fanout")
CONFIGS = {
    "a": "(a) our protocol surface",
    "b": "(b) our native surface",
    "c": "(c) reference server, file-backed",
    "d": "(d) reference server, in memory",
}


def _record(size: int = 100) -> dict[str, object]:
    """A JSON message whose compact encoding is exactly `size` bytes (as bench/payloads.py)."""
    head = {"i": 0, "kind": "token", "text": ""}
    head["text"] = "x" * (size - len(json.dumps(head, separators=(",", ":"))))
    return head


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


@dataclass
class Rate:
    config: str
    requests: int = 0
    seconds: float = 0.0
    errors: int = 0
    p50_ms: list[float] = field(default_factory=list)  # one per round
    p99_ms: list[float] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)
    per_round: list[float] = field(default_factory=list)  # requests/s
    tool: str = ""
    detail: str = ""

    @property
    def per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


@dataclass
class FanoutResult:
    followers: int
    connected: int = 0
    appends: int = 0
    expected: int = 0
    received: int = 0
    failed: int = 0
    seconds: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    append_p50_ms: float | None = None
    append_max_ms: float | None = None
    cpu: dict[str, float] = field(default_factory=dict)
    error: str = ""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench protocol", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before each one")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (a)-(d)")
    parser.add_argument("--clients", type=int, default=32, help="HTTP connections for (a)-(d)")
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument("--followers", type=int, default=1_000, help="SSE followers in (e)")
    parser.add_argument("--follower-processes", type=int, default=4)
    parser.add_argument("--fanout-rate", type=float, default=10.0, help="appends/s in (e)")
    parser.add_argument(
        "--only", action="append", default=[], metavar="NAME", help="appends, fanout"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample the server with py-spy during (a)'s first round and print its hot spots",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    only = {n.strip() for item in args.only for n in item.split(",") if n.strip()}
    if unknown := only - set(NAMES):
        parser.error(f"unknown measurement(s) {sorted(unknown)}; choose from {', '.join(NAMES)}")
    args.selected = [n for n in NAMES if not only or n in only]
    return args


class ProtocolBench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.rates: dict[str, Rate] = {k: Rate(k) for k in CONFIGS}
        self.fanout: FanoutResult | None = None
        self.native_fanout: live.Fanout | None = None
        self.facts: dict[str, object] = {}

    def run(self) -> None:
        print(f"starting embedded PostgreSQL under {self.tmp / 'pg'} ...", flush=True)
        self.url, self.pg_pid = database.start_database(self.tmp)
        pg = asyncio.run(database.settings(self.url))
        self.facts["postgres"] = pg
        self.facts["load generator"] = (
            f"wrk ({load.wrk_path()})" if load.wrk_path() else "python asyncio (wrk missing)"
        )
        self.token = secrets.token_urlsafe(24)
        self.server = Server(self.url, self.token, self.tmp / "data", self.tmp / "server.log")
        refs: list[ReferenceServer] = []
        try:
            self.server.wait_ready()
            if "appends" in self.args.selected:
                ensure_node_packages()
                self.file_ref = ReferenceServer(
                    data_dir=self.tmp / "reference-data", log_path=self.tmp / "ref-file.log"
                ).start()
                refs.append(self.file_ref)
                self.memory_ref = ReferenceServer(log_path=self.tmp / "ref-memory.log").start()
                refs.append(self.memory_ref)
                self.prepare_appends()
                self.appends()
            if "fanout" in self.args.selected:
                self.fanout = self.fan_out()
                self.native_fanout = self.fan_out_natively()
        finally:
            for ref in refs:
                ref.stop()
            self.server.stop()

    # -- (a)-(d) ---------------------------------------------------------------------------------

    def prepare_appends(self) -> None:
        # Native creation with the unread ceilings raised (as bench/orchestrator.py does), so that
        # credit never refuses: the protocol has no acknowledgements, and a stream created by
        # PUT has the default ceiling of 10,000 unread records. (a) appends to it through the
        # protocol: a native stream reads and appends as application/json there.
        self.server.create_stream(RUN_ID, "proto")
        self.server.create_stream(RUN_ID, "native")
        for ref in (self.file_ref, self.memory_ref):
            status = _put(ref.port, "/v1/stream/bench-single", "application/json")
            if status not in (200, 201):
                raise RuntimeError(f"creating the reference server's stream: {status}")
        record = _record()
        self.requests = {
            "a": (self.server.port, f"{PROTOCOL}/proto", _compact(record), self.server.pid),
            "b": (
                self.server.port,
                f"{NATIVE}/native/records",
                _compact({"records": [{"data": record}]}),
                self.server.pid,
            ),
            "c": (self.file_ref.port, "/v1/stream/bench-single", _compact(record), None),
            "d": (self.memory_ref.port, "/v1/stream/bench-single", _compact(record), None),
        }

    def _roots(self, config: str) -> dict[str, int]:
        if config in ("a", "b"):
            return {"server": self.server.pid, "postgres": self.pg_pid}
        ref = self.file_ref if config == "c" else self.memory_ref
        return {"server": ref.pid}

    def appends(self) -> None:
        a = self.args
        order = list(CONFIGS)
        for round_ in range(a.rounds):
            for config in order if round_ % 2 == 0 else order[::-1]:
                print(
                    f"round {round_ + 1}: {CONFIGS[config]} ({a.duration:g}s + {a.warmup:g}s "
                    "warm-up) ...",
                    flush=True,
                )
                asyncio.run(database.checkpoint(self.url))
                self._measure(config)

    def _measure(self, config: str) -> None:
        a = self.args
        port, path, body, _ = self.requests[config]

        def go(duration: float) -> load.LoadResult:
            return load.run(
                port,
                "POST",
                path,
                body=body,
                token=self.token,
                connections=a.clients,
                duration=duration,
                threads=a.wrk_threads,
                body_file=self.tmp / f"{config}.json",
            )

        if a.warmup > 0:
            go(a.warmup)
        spy = None
        if a.profile and config == "a" and not self.rates[config].per_round:
            raw = self.tmp / "profile.txt"
            spy = profile.start(self.server.pid, a.duration, raw)
        meter = CpuMeter(self._roots(config))
        meter.start()
        outcome = go(a.duration)
        cpu = meter.stop()
        if spy is not None and (summary := profile.finish(spy, raw)) is not None:
            self.facts["profile of (a)"] = summary
        cpu["client"] = outcome.client_cpu
        rate = self.rates[config]
        rate.requests += outcome.requests
        rate.seconds += outcome.seconds
        rate.errors += outcome.errors
        rate.per_round.append(outcome.requests / outcome.seconds if outcome.seconds else 0.0)
        if outcome.p50_ms is not None:
            rate.p50_ms.append(outcome.p50_ms)
        if outcome.p99_ms is not None:
            rate.p99_ms.append(outcome.p99_ms)
        rate.cpu.append(cpu)
        rate.tool = outcome.tool
        if outcome.errors:
            rate.detail = f"errors {outcome.detail or outcome.errors}"

    # -- (e) fan-out -----------------------------------------------------------------------------

    def fan_out(self) -> FanoutResult:
        a = self.args
        stream = f"{PROTOCOL}/fanout"
        status = _put(self.server.port, stream, "application/json", self.token)
        if status not in (200, 201):
            return FanoutResult(a.followers, error=f"PUT {stream} answered {status}")
        print(f"(e) {a.followers} SSE followers ({a.duration:g}s + {a.warmup:g}s) ...", flush=True)
        result = FanoutResult(a.followers)
        subs = sse_kit.Subscribers(
            self.server.port,
            f"{stream}?offset=-1&live=sse",
            self.token,
            a.followers,
            a.follower_processes,
            hard=a.warmup + a.duration + 120,
            protocol=True,
        )
        try:
            result.connected, result.failed, result.error = subs.wait_ready()
        except Exception as error:
            subs.finish(0, timeout=5)
            result.error = f"followers not ready: {error!r}"
            return result
        meter = CpuMeter({"server": self.server.pid, "postgres": self.pg_pid})

        def last_of(http: sse_kit.Http, answer: bytes) -> int:
            return int(http.headers.get(b"stream-next-offset", b"").rsplit(b"_", 1)[-1])

        return live.append_and_deliver(
            self.server.port, self.token, stream, subs, result,
            body_of=msgspec.json.encode, ok=(200, 204), last_of=last_of,
            rate=a.fanout_rate, duration=a.duration, warmup=a.warmup, meter=meter,
        )  # fmt: skip

    def fan_out_natively(self) -> live.Fanout:
        """(e) through the native surface ((5) of `python -m bench`), right after (e): the
        yardstick of the host's state at the time."""
        a = self.args
        self.server.create_stream(RUN_ID, "fanout-native")
        print(f"(e) natively: {a.followers} SSE subscribers ...", flush=True)
        return live.fanout(
            self.server.port,
            self.token,
            NATIVE,
            "fanout-native",
            subscribers=a.followers,
            processes=a.follower_processes,
            rate=a.fanout_rate,
            duration=a.duration,
            warmup=a.warmup,
            counts=lambda: database.statement_counts(self.url),
            meter=CpuMeter({"server": self.server.pid, "postgres": self.pg_pid}),
        )


def _put(port: int, path: str, content_type: str, token: str | None = None) -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": content_type}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request("PUT", path, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


# --- report ---------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def report(bench: ProtocolBench) -> str:
    a = bench.args
    pg = bench.facts.get("postgres", {})
    lines = [
        f"PostgreSQL {pg.get('server_version')} embedded (fsync={pg.get('fsync')}, "
        f"synchronous_commit={pg.get('synchronous_commit')}); load: "
        f"{bench.facts.get('load generator')}; {a.clients} connections; {a.rounds} round(s) of "
        f"{a.duration:g}s each",
        "",
    ]
    rates = bench.rates
    if any(r.requests for r in rates.values()):
        header = (
            f"{'single-record appends, one stream':<38} {'req/s':>9} {'per round':<19} "
            f"{'p50 ms':>7} {'p99 ms':>7} {'err':>5}  CPU% srv/pg/client"
        )
        lines += [header, "-" * len(header)]
        for config, label in CONFIGS.items():
            r = rates[config]
            cpu = {
                k: _mean([c[k] for c in r.cpu if k in c]) for k in ("server", "postgres", "client")
            }
            cpus = "/".join(_fmt(cpu[k], ".0f") for k in ("server", "postgres", "client"))
            per_round = ", ".join(f"{x:,.0f}" for x in r.per_round)
            lines.append(
                f"{label:<38} {r.per_s:>9,.0f} {per_round:<19} "
                f"{_fmt(_mean(r.p50_ms), '.2f'):>7} {_fmt(_mean(r.p99_ms), '.2f'):>7} "
                f"{r.errors:>5}  {cpus}" + (f"  {r.detail}" if r.detail else "")
            )
        lines.append("")
    checks: list[tuple[str, str, str, bool | None]] = []
    pa, pb, pc, pd = (rates[k].per_s for k in "abcd")
    clean = all(rates[k].errors == 0 for k in "abcd")
    if pa and pb:
        checks.append(
            ("(a)/(b) protocol vs native", f"{pa / pb:.2f}", ">= 0.90", clean and pa / pb >= 0.9)
        )
    if pa and pc:
        checks.append(
            (
                "(a)/(c) vs reference, file-backed",
                f"{pa / pc:.2f}x",
                ">= 3x",
                clean and pa / pc >= 3,
            )
        )
    if pa and pd:
        checks.append(("(a)/(d) vs reference, in memory", f"{pa / pd:.2f}x", "report", None))
    if (f := bench.fanout) is not None:
        lines.append(
            f"(e) fan-out, {f.followers} followers (live=sse through the protocol surface): "
            f"{f.connected} connected, {f.appends} appends in {f.seconds:.1f}s, "
            f"{f.received:,}/{f.expected:,} deliveries, {f.failed} failed connections; "
            f"send->receipt p50 {_fmt(f.p50_ms, '.1f')} ms, p99 {_fmt(f.p99_ms, '.1f')} ms, "
            f"max {_fmt(f.max_ms, '.1f')} ms (the append requests: p50 "
            f"{_fmt(f.append_p50_ms, '.1f')} ms, max {_fmt(f.append_max_ms, '.1f')} ms); "
            "CPU% srv/pg/client "
            + "/".join(_fmt(f.cpu.get(k), ".0f") for k in ("server", "postgres", "client"))
            + (f"; error {f.error}" if f.error else "")
        )
        if (n := bench.native_fanout) is not None:
            lines.append(
                f"    the same natively ((5): …/subscribe), right after: {n.connected} connected, "
                f"{n.received:,}/{n.expected:,} deliveries, {n.failed} failed; p50 "
                f"{_fmt(n.p50_ms, '.1f')} ms, p99 {_fmt(n.p99_ms, '.1f')} ms, max "
                f"{_fmt(n.max_ms, '.1f')} ms (appends: p50 {_fmt(n.append_p50_ms, '.1f')} ms, "
                f"max {_fmt(n.append_max_ms, '.1f')} ms); CPU% srv/pg/client "
                + "/".join(_fmt(n.cpu.get(k), ".0f") for k in ("server", "postgres", "client"))
                + (f"; error {n.error}" if n.error else "")
            )
        lines.append("")
        ok = f.p99_ms is not None and f.p99_ms <= 100 and f.received == f.expected > 0
        checks.append(
            (f"(e) p99, {f.followers} followers", f"{_fmt(f.p99_ms, '.1f')} ms", "<= 100 ms", ok)
        )
    if checks:
        lines.append(f"{'ratio':<38} {'measured':>10}  {'target':<10} result")
        for label, value, target, ok in checks:
            verdict = "-" if ok is None else "PASS" if ok else "MISS"
            lines.append(f"{label:<38} {value:>10}  {target:<10} {verdict}")
    if "profile of (a)" in bench.facts:
        lines += [
            "",
            "py-spy profile of the server during (a):",
            str(bench.facts["profile of (a)"]),
        ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    raise_fd_limit()
    tmp = Path(tempfile.mkdtemp(prefix="ductor-bench-protocol-"))
    if not args.keep:
        atexit.register(shutil.rmtree, tmp, True)  # before PostgreSQL's own stop: runs after it
    bench = ProtocolBench(args, tmp)
    started = time.monotonic()
    bench.run()
    print()
    print(report(bench))
    if args.json:
        payload = {
            "facts": bench.facts,
            "rates": {k: {**asdict(v), "per_s": v.per_s} for k, v in bench.rates.items()},
            "fanout": asdict(bench.fanout) if bench.fanout else None,
            "native_fanout": asdict(bench.native_fanout) if bench.native_fanout else None,
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\ntotal {time.monotonic() - started:.0f}s", flush=True)
    return 0
