"""`python -m bench soak` (or `python3 dev.py bench soak`): the storage soak (docs/benchmarks.md).

    python -m bench soak [--appends 2000000] [--streams 100] [--clients 32] [--window 30]

N single-record appends, each with its own Idempotency-Key, from several wrk connections
through the group commit, spread round-robin over streams with `retention.max_records` 1,000.
It runs twice, each time on a fresh database: (a) with the background workers in the server
process and every cleanup interval shortened, (b) with `serve --no-workers`. At 25/50/75/100% of
N it samples every table of the public schema (row count, `pg_total_relation_size`, dead tuples)
while the load goes on; (a)'s tables must be flat between 50% and 100% (within 20%), and (a)'s
append rate must be at least 90% of (b)'s. (b) grows without bound by design.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import asyncpg

from bench import database
from bench.server import CpuMeter, Server, tree_pids

LUA = Path(__file__).with_name("soak.lua")
RUN_ID = "soak"
PREFIX = f"/api/workflow-streams/runs/{RUN_ID}/streams"
FLAT = 0.20  # tables of (a) may differ by this much between 50% and 100%
RATE_GOAL = 0.90  # (a)'s append rate over (b)'s
POINTS = (25, 50, 75, 100)
STALL_SECONDS = 30.0  # no append for this long ends a phase


def cleanup_settings(args: argparse.Namespace) -> dict[str, str]:
    """DUCTOR_STREAMS_* variables of phase (a), every cleanup shortened. The configuration
    ignores variables it does not declare, so settings that are not (yet) in
    src/entrypoints/config.py are harmless: add new cleanup settings here."""
    return {
        "DUCTOR_STREAMS_IDEMPOTENCY_WINDOW_SECONDS": f"{args.window:g}",
        "DUCTOR_STREAMS_SWEEP_INTERVAL_SECONDS": f"{args.sweep_interval:g}",
        "DUCTOR_STREAMS_PRUNE_INTERVAL_SECONDS": f"{args.prune_interval:g}",
        # journal compaction: a snapshot every this many events, older events dropped
        "DUCTOR_STREAMS_SNAPSHOT_EVERY_EVENTS": str(args.snapshot_every),
        # delivered input rows, done deletion outbox rows, gap evidence
        "DUCTOR_STREAMS_CLEANUP_INTERVAL_SECONDS": f"{args.cleanup_interval:g}",
        "DUCTOR_STREAMS_CLEANUP_AGE_SECONDS": f"{args.cleanup_age:g}",
    }


@dataclass
class Table:
    rows: int
    bytes: int  # pg_total_relation_size: heap, indexes, TOAST
    dead: int  # n_dead_tup (statistics, approximate)
    autovacuums: int
    cold_updates: int = 0  # n_tup_upd - n_tup_hot_upd: updates that needed a new page


@dataclass
class Sample:
    percent: int
    appended: int
    seconds: float  # since the load started
    database_bytes: int
    tables: dict[str, Table]


@dataclass
class Phase:
    name: str
    label: str
    cleanup: bool
    settings: dict[str, str]
    samples: list[Sample] = field(default_factory=list)
    appended: int = 0
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    wrk: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def rate(self) -> float:
        return self.appended / self.seconds if self.seconds else 0.0

    def at(self, percent: int) -> Sample | None:
        return next((s for s in self.samples if s.percent == percent), None)


def within(before: int, after: int, tolerance: float = FLAT) -> bool:
    """`after` within `tolerance` (a fraction) of `before`; two zeros are equal."""
    if before == 0:
        return after == 0
    return abs(after - before) <= tolerance * before


def targets(total: int) -> list[tuple[int, int]]:
    """(percent, appends) of the sampling points."""
    return [(p, total * p // 100) for p in POINTS]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--appends", type=int, default=2_000_000, help="appends per phase")
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--max-records", type=int, default=1_000, help="retention.max_records")
    parser.add_argument("--clients", type=int, default=32, help="wrk connections")
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument(
        "--window", type=float, default=30.0, help="(a): idempotency window, seconds"
    )
    parser.add_argument("--sweep-interval", type=float, default=2.0, help="(a): receipt sweeper")
    parser.add_argument("--prune-interval", type=float, default=5.0, help="(a): retention pruner")
    parser.add_argument("--cleanup-interval", type=float, default=5.0, help="(a): other cleanup")
    parser.add_argument("--cleanup-age", type=float, default=30.0, help="(a): other cleanup")
    parser.add_argument("--snapshot-every", type=int, default=1_000, help="(a): journal events")
    parser.add_argument(
        "--phases",
        default="a,b",
        help="which phases, in this order: a (cleanup on), b (no workers); e.g. a,b,b,a to "
        "even out a drifting host load (the rates are then summed per kind)",
    )
    parser.add_argument(
        "--database-url",
        help="an admin URL of a PostgreSQL to create the two databases in (default: an "
        "embedded PostgreSQL in a temporary directory)",
    )
    parser.add_argument(
        "--serve-arg", action="append", default=[], metavar="ARG", help="for `serve`"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep databases and temporary files")
    args = parser.parse_args(argv)
    args.phase_names = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not args.phase_names or set(args.phase_names) - {"a", "b"}:
        parser.error("--phases takes a and b, comma-separated, each as often as wanted")
    if args.appends < 4 or args.streams < 1 or args.clients < 1 or args.wrk_threads < 1:
        parser.error("--appends, --streams, --clients and --wrk-threads must be positive")
    return args


# --- the database side ----------------------------------------------------------------------

_TABLES = """
SELECT c.relname, pg_total_relation_size(c.oid) AS bytes,
       coalesce(s.n_dead_tup, 0) AS dead, coalesce(s.autovacuum_count, 0) AS autovacuums,
       coalesce(s.n_tup_upd - s.n_tup_hot_upd, 0) AS cold_updates
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
ORDER BY c.relname
"""


async def sample_tables(conn: asyncpg.Connection) -> tuple[int, dict[str, Table]]:
    """(pg_database_size, every public table's rows, size, dead tuples, autovacuum runs)."""
    tables = {}
    for row in await conn.fetch(_TABLES):
        name = row["relname"]
        quoted = '"' + name.replace('"', '""') + '"'
        rows = await conn.fetchval(f"SELECT count(*) FROM public.{quoted}")
        tables[name] = Table(
            rows, row["bytes"], row["dead"], row["autovacuums"], row["cold_updates"]
        )
    return await conn.fetchval("SELECT pg_database_size(current_database())"), tables


async def appended(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(
        "SELECT coalesce(sum(head), 0)::bigint FROM streams WHERE run_id = $1", RUN_ID
    )


class ReapingCpuMeter(CpuMeter):
    """CpuMeter that keeps the CPU of processes that exited in the window: PostgreSQL backends
    come and go with the server's pool over a soak, and their time moves into the
    postmaster's cutime/cstime when it reaps them."""

    def _totals(self) -> dict[str, float]:
        totals = {}
        for name, root in self.roots.items():
            total = 0.0
            for pid in tree_pids(root):
                try:
                    text = Path(f"/proc/{pid}/stat").read_text()
                except OSError:
                    continue
                fields = text[text.rindex(")") + 2 :].split()
                total += sum(int(f) for f in fields[11:15]) / _TICK
            totals[name] = total
        return totals

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._c0 = self._totals()

    def stop(self) -> dict[str, float]:
        c1 = self._totals()
        wall = time.perf_counter() - self._t0
        return {name: 100 * (c1[name] - self._c0.get(name, 0.0)) / wall for name in self.roots}


_TICK = os.sysconf("SC_CLK_TCK")


# --- one phase ------------------------------------------------------------------------------

_FIELD = re.compile(r"(\w+)=([\d.]+)")


def _wrk_argv(args: argparse.Namespace, port: int, token: str, tag: str) -> list[str]:
    threads = min(args.wrk_threads, args.clients)
    quota = -(-args.appends // threads)  # each thread stops after this many 201s
    return [
        shutil.which("wrk") or "wrk",
        f"-t{threads}",
        f"-c{args.clients}",
        "-d86400s",  # ended with SIGINT once the appends are in (wrk then prints its summary)
        "--timeout",
        "30s",
        "-s",
        str(LUA),
        f"http://127.0.0.1:{port}{PREFIX}",
        "--",
        token,
        PREFIX,
        str(args.streams),
        str(quota),
        str(threads),
        tag,
    ]


async def drive(
    args: argparse.Namespace, phase: Phase, url: str, server: Server, meter: CpuMeter
) -> None:
    """Run wrk until N appends are in, sampling the tables at each point as the load goes on."""
    conn = await asyncpg.connect(url)
    process = None
    try:
        todo = targets(args.appends)
        meter.start()
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            *_wrk_argv(args, server.port, server.token, f"{phase.name}{secrets.token_hex(4)}"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        last, last_change = 0, started
        while todo:
            await asyncio.sleep(0.2)
            count = await appended(conn)
            now = time.perf_counter()
            if count != last:
                last, last_change = count, now
            if count >= todo[0][1]:
                percent = todo.pop(0)[0]
                if not todo:  # the last point: the load is over
                    phase.seconds, phase.appended = now - started, count
                    phase.cpu = meter.stop()
                    process.send_signal(signal.SIGINT)
                size, tables = await sample_tables(conn)
                phase.samples.append(Sample(percent, count, now - started, size, tables))
                print(
                    f"  {percent:>3}%: {count:,} appends after {now - started:.1f}s "
                    f"({count / (now - started):,.0f}/s), database {size / 2**20:,.1f} MiB",
                    flush=True,
                )
            elif process.returncode is not None:
                phase.error = f"wrk exited ({process.returncode}) after {count:,} appends"
                break
            elif now - last_change > STALL_SECONDS:
                phase.error = f"no append for {STALL_SECONDS:g}s after {count:,}"
                break
        if phase.error:
            phase.seconds, phase.appended = time.perf_counter() - started, last
            phase.cpu = meter.stop()
            process.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(process.communicate(), 60)
        line = next((ln for ln in out.decode().splitlines() if ln.startswith("SOAK_RESULT")), "")
        phase.wrk = {k: float(v) for k, v in _FIELD.findall(line)}
        if not line or phase.wrk.get("other"):
            detail = err.decode()[-2000:].strip()
            phase.error = "; ".join(
                x for x in (phase.error, f"wrk: {out.decode()[-500:]} {detail}") if x
            )
    finally:
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()
        await conn.close()


def run_phase(
    args: argparse.Namespace, name: str, admin_url: str, pg_pid: int | None, tmp: Path
) -> Phase:
    cleanup = name[0] == "a"
    phase = Phase(
        name,
        f"({name}) workers and cleanup on" if cleanup else f"({name}) serve --no-workers",
        cleanup,
        cleanup_settings(args) if cleanup else {},
    )
    db = f"soak_{name}_{os.getpid()}"
    url = asyncio.run(database.new_database(admin_url, db))
    token = secrets.token_urlsafe(24)
    server = Server(
        url,
        token,
        tmp / f"data-{name}",
        tmp / f"server-{name}.log",
        extra=tuple(args.serve_arg),
        background_workers=cleanup,
        settings=phase.settings,
    )
    print(f"{phase.label}: {args.appends:,} appends over {args.streams} streams ...", flush=True)
    try:
        server.wait_ready()
        for i in range(args.streams):
            status, answer = server.request(
                "POST",
                PREFIX,
                {
                    "stream_id": f"s{i}",
                    "direction": "output",
                    # (b) keeps every record, so the unread limits must not stop it
                    "limits": {"max_unread_items": 100_000_000, "max_unread_bytes": 10**12},
                    "retention": {"max_records": args.max_records},
                },
            )
            if status not in (200, 201):
                raise RuntimeError(f"creating stream s{i}: {status} {answer}")
        asyncio.run(database.checkpoint(url))
        roots = {"server": server.pid}
        if pg_pid is not None:
            roots["postgres"] = pg_pid
        asyncio.run(drive(args, phase, url, server, ReapingCpuMeter(roots)))
    finally:
        server.stop()
        if not args.keep:
            asyncio.run(database.drop_database(admin_url, db))
            asyncio.run(database.checkpoint(admin_url))
    if phase.error:
        phase.error += f" (server log: {tmp / f'server-{name}.log'})"
    return phase


# --- report ---------------------------------------------------------------------------------


def _kib(n: int) -> str:
    return f"{n / 1024:,.0f}"


def report_phase(phase: Phase, args: argparse.Namespace) -> list[str]:
    cpu = "/".join(f"{phase.cpu[k]:.0f}" for k in ("server", "postgres") if k in phase.cpu)
    wrk = phase.wrk
    lines = [
        f"{phase.label}: {phase.appended:,} appends in {phase.seconds:.1f}s = "
        f"{phase.rate:,.0f} appends/s; p50 {wrk.get('p50_us', 0) / 1000:.1f} ms, p99 "
        f"{wrk.get('p99_us', 0) / 1000:.1f} ms, max {wrk.get('max_us', 0) / 1000:.0f} ms; "
        f"CPU% srv/pg {cpu}" + (f"; ERROR {phase.error}" if phase.error else "")
    ]
    if phase.settings:
        lines.append("    " + " ".join(f"{k}={v}" for k, v in phase.settings.items()))
    if not phase.samples:
        return lines
    shown = [s for p in POINTS if (s := phase.at(p)) is not None]
    head = "".join(f"{f'{s.percent}%':>11}" for s in shown)
    lines.append(
        f"    {'at':<20}"
        + "".join(f"{f'{s.appended:,}':>11}" for s in shown)
        + "   appends; seconds: "
        + ", ".join(f"{s.seconds:.0f}" for s in shown)
    )
    previous = (0, 0.0)
    quarters = []
    for s in shown:
        span = s.seconds - previous[1]
        quarters.append(f"{(s.appended - previous[0]) / span:,.0f}" if span > 0 else "-")
        previous = (s.appended, s.seconds)
    lines.append(f"    {'appends/s between':<20}" + "".join(f"{q:>11}" for q in quarters))
    lines.append(
        f"    {'table':<20}{head}  |{head}  | {'dead@100%':>10} {'autovac':>7} {'non-HOT':>8}"
        + ("  rows  size" if phase.cleanup else "")
    )
    lines.append(f"    {'':<20}{'rows':>11}{'':>{11 * (len(shown) - 1)}}  |{'KiB':>11}")
    mid, end = phase.at(50), phase.at(100)
    for name in sorted(shown[-1].tables):
        rows = "".join(f"{s.tables[name].rows if name in s.tables else 0:>11,}" for s in shown)
        sizes = "".join(
            f"{_kib(s.tables[name].bytes if name in s.tables else 0):>11}" for s in shown
        )
        last = shown[-1].tables[name]
        verdict = ""
        if phase.cleanup and mid is not None and end is not None and name in mid.tables:
            a, b = mid.tables[name], end.tables[name]
            verdict = (
                f"  {'PASS' if within(a.rows, b.rows) else 'MISS'}"
                f"  {'PASS' if within(a.bytes, b.bytes) else 'MISS'}"
            )
        lines.append(
            f"    {name:<20}{rows}  |{sizes}  | {last.dead:>10,} {last.autovacuums:>7} "
            f"{last.cold_updates:>8,}{verdict}"
        )
    lines.append(
        f"    {'database':<20}{'':>{11 * len(shown)}}  |"
        + "".join(f"{_kib(s.database_bytes):>11}" for s in shown)
    )
    if phase.cleanup and mid is not None:
        warm = args.window + max(args.sweep_interval, args.prune_interval, args.cleanup_interval)
        if mid.seconds < warm:
            lines.append(
                f"    note: 50% came after {mid.seconds:.0f}s, before the window plus a sweep "
                f"({warm:g}s): receipts were still filling up; use a shorter --window or more "
                "--appends"
            )
    return lines


def _steady(phase: Phase) -> tuple[int, float]:
    """Appends and seconds between the 50% and the 100% samples (after the warm-up)."""
    mid, end = phase.at(50), phase.at(100)
    if mid is None or end is None:
        return 0, 0.0
    return end.appended - mid.appended, end.seconds - mid.seconds


def _rate(phases: list[Phase], steady: bool = False) -> float:
    parts = [_steady(p) if steady else (p.appended, p.seconds) for p in phases]
    seconds = sum(t for _, t in parts)
    return sum(n for n, _ in parts) / seconds if seconds else 0.0


def checks_of(phases: list[Phase]) -> list[str]:
    """The verdicts: each (a) phase's tables flat between 50% and 100%, and the append rate of
    the (a) phases against the (b) phases (all their appends over all their seconds, so that
    `--phases a,b,b,a` evens out a host whose load drifts)."""
    rows: list[tuple[str, str, str, str]] = []
    cleanup = [p for p in phases if p.cleanup]
    bare = [p for p in phases if not p.cleanup]
    for phase in cleanup:
        mid, end = phase.at(50), phase.at(100)
        if mid is None or end is None:
            continue
        for what, value in (("size", lambda t: t.bytes), ("rows", lambda t: t.rows)):
            flat = [
                n
                for n, t in end.tables.items()
                if n in mid.tables and within(value(mid.tables[n]), value(t))
            ]
            growing = ", ".join(sorted(set(end.tables) - set(flat)))
            ok = not growing and not phase.error
            rows.append(
                (
                    f"{phase.label} flat 50%->100%, {what}",
                    f"{len(flat)}/{len(end.tables)}",
                    "all",
                    ("PASS" if ok else "MISS") + (f" (not flat: {growing})" if growing else ""),
                )
            )
    if cleanup and bare and _rate(bare):
        ratio = _rate(cleanup) / _rate(bare)
        ok = ratio >= RATE_GOAL and not any(p.error for p in phases)
        rows.append(
            (
                "(a)/(b) append rate, cleanup on/off",
                f"{ratio:.1%}",
                f">= {RATE_GOAL:.0%}",
                "PASS" if ok else "MISS",
            )
        )
        if _rate(bare, steady=True):
            steady = _rate(cleanup, steady=True) / _rate(bare, steady=True)
            rows.append(("(a)/(b) the same, 50%->100% only", f"{steady:.1%}", "report", "-"))
    if not rows:
        return []
    width = max(38, *(len(r[0]) for r in rows))
    lines = [f"{'soak target':<{width}} {'measured':>9}  {'target':<7} result"]
    lines += [f"{a:<{width}} {b:>9}  {c:<7} {d}" for a, b, c, d in rows]
    return lines


def report(phases: list[Phase], args: argparse.Namespace, facts: dict[str, object]) -> str:
    pg = facts.get("postgres", {})
    assert isinstance(pg, dict)
    lines = [
        f"soak: {args.appends:,} single-record keyed appends per phase, {args.streams} streams "
        f"(retention.max_records {args.max_records:,}), wrk -t{args.wrk_threads} "
        f"-c{args.clients}; {facts.get('cpus')} CPUs; PostgreSQL {pg.get('server_version')} "
        f"{facts.get('database')} (fsync={pg.get('fsync')}, "
        f"synchronous_commit={pg.get('synchronous_commit')}, autovacuum={pg.get('autovacuum')}, "
        f"naptime {pg.get('autovacuum_naptime')}s, vacuum scale factor "
        f"{pg.get('autovacuum_vacuum_scale_factor')}, insert scale factor "
        f"{pg.get('autovacuum_vacuum_insert_scale_factor')})",
        "",
    ]
    for phase in phases:
        lines += [*report_phase(phase, args), ""]
    lines += checks_of(phases)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("the soak needs wrk on PATH (Debian/Ubuntu: apt-get install wrk)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="ductor-soak-"))
    if not args.keep:
        atexit.register(shutil.rmtree, tmp, True)  # runs after the embedded PostgreSQL stops
    facts: dict[str, object] = {"cpus": os.cpu_count()}
    if args.database_url:
        admin_url, pg_pid = args.database_url, None
        facts["database"] = "given"
    else:
        print(f"starting embedded PostgreSQL under {tmp / 'pg'} ...", flush=True)
        admin_url = database.start_embedded(tmp / "pg")
        pg_pid = database.postmaster_pid(tmp / "pg")
        facts["database"] = "embedded"
    facts["postgres"] = asyncio.run(
        database.settings(
            admin_url,
            (
                "server_version",
                "fsync",
                "synchronous_commit",
                "shared_buffers",
                "autovacuum",
                "autovacuum_naptime",
                "autovacuum_vacuum_scale_factor",
                "autovacuum_vacuum_insert_scale_factor",
            ),
        )
    )
    started = time.monotonic()
    names = list(args.phase_names)
    if len(set(names)) < len(names):  # a,b,b,a: a1, b1, b2, a2
        seen: dict[str, int] = {}
        for i, name in enumerate(names):
            seen[name] = seen.get(name, 0) + 1
            names[i] = f"{name}{seen[name]}"
    phases = [run_phase(args, name, admin_url, pg_pid, tmp) for name in names]
    print()
    print(report(phases, args, facts))
    if args.json:
        payload = {"facts": facts, "args": vars(args), "phases": [asdict(p) for p in phases]}
        args.json.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\ntotal {time.monotonic() - started:.0f}s", flush=True)
    return 1 if any(p.error for p in phases) else 0
