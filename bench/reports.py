"""The report of `python -m bench`: the table of measurements, the ratios with their targets,
and the live-delivery, objects and dispatch lines with their PASS / MISS verdicts; then the
py-spy summaries and the JSON file of the results."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from bench import dispatch, live, objects

if TYPE_CHECKING:
    from bench.orchestrator import Bench


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(bench: Bench, names: tuple[str, ...]) -> str:
    """The table of `python -m bench`: one row per benchmark run, in the order of `names`,
    then the ratios and the live targets with their PASS / MISS."""
    r = bench.results
    lines = []
    pg = bench.facts.get("postgres", {})
    lines.append(
        f"machine: {bench.facts.get('cpus')} CPUs; PostgreSQL {pg.get('server_version')} embedded "
        f"(fsync={pg.get('fsync')}, synchronous_commit={pg.get('synchronous_commit')}); "
        f"load: {bench.facts.get('load generator')}; {bench.args.duration:g}s each"
        + (f", {bench.args.rounds} rounds" if bench.args.rounds > 1 else "")
    )
    lines.append("")
    header = (
        f"{'benchmark':<40} {'ops/s':>9} {'records/s':>10} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'err':>4}  {'CPU% srv/pg/client':<19} notes"
    )
    lines += [header, "-" * len(header)]
    for name in names:
        m = r.get(name)
        if m is None:
            continue
        cpu = "/".join(
            "-" if k not in m.cpu else f"{m.cpu[k]:.0f}" for k in ("server", "postgres", "client")
        )
        records = "-" if name in ("noop", "bare") else f"{m.records_per_s:,.0f}"
        if name in ("reffile", "refmemory"):
            cpu = f"{m.cpu.get('server', 0):.0f}/-/{m.cpu.get('client', 0):.0f}"
        lines.append(
            f"{m.label:<40} {m.ops_per_s:>9,.0f} {records:>10} "
            f"{_fmt(m.p50_ms, '.2f'):>7} {_fmt(m.p99_ms, '.2f'):>7} {m.errors:>4}  "
            f"{cpu:<19} {m.note}"
        )
    lines.append("")
    checks = []
    if "append" in r and "floor" in r and r["floor"].ops_per_s:
        ratio = r["append"].ops_per_s / r["floor"].ops_per_s
        # Reported, not a target: the naive floor is bound by fsync, (2) by the CPU, and the two
        # scale differently from machine to machine (docs/benchmarks.md).
        checks.append(("(2)/(1) HTTP append vs naive floor", f"{ratio:.2f}x", "report", None))
    if "append" in r and "noop" in r and r["noop"].ops_per_s:
        ratio = r["append"].ops_per_s / r["noop"].ops_per_s
        checks.append(("(2)/(3) HTTP append vs no-op", f"{ratio:.1%}", ">= 60%", ratio >= 0.6))
        if len(bench.rounds) > 1:
            each = ", ".join(
                f"{m['append'].ops_per_s / m['noop'].ops_per_s:.1%}"
                for m in bench.rounds
                if m["noop"].ops_per_s
            )
            checks.append(("(2)/(3) in each round", each, "report", None))
    if "append" in r and "jwt" in r and r["append"].ops_per_s:
        ratio = r["jwt"].ops_per_s / r["append"].ops_per_s
        checks.append(
            ("(2j)/(2) JWT vs opaque token append", f"{ratio:.1%}", ">= 95%", ratio >= 0.95)
        )
    if "append" in r and r["append"].p99_ms is not None:
        p99 = r["append"].p99_ms
        checks.append(("(2) p99 latency", f"{p99:.1f} ms", "<= 25 ms", p99 <= 25))
    if "append" in r and "reffile" in r and r["reffile"].ops_per_s:
        ratio = r["append"].ops_per_s / r["reffile"].ops_per_s
        checks.append(("(2)/(2f) vs reference, file-backed", f"{ratio:.2f}x", ">= 4x", ratio >= 4))
    if "append" in r and "refmemory" in r and r["refmemory"].ops_per_s:
        ratio = r["append"].ops_per_s / r["refmemory"].ops_per_s
        checks.append(("(2)/(2m) vs reference, in memory", f"{ratio:.1%}", ">= 25%", ratio >= 0.25))
    if "bare" in r and "noop" in r and r["noop"].ops_per_s:
        ratio = r["bare"].ops_per_s / r["noop"].ops_per_s
        checks.append(("(3b)/(3) POST floor vs no-op", f"{ratio:.1%}", "report", None))
    if "append" in r and "bare" in r and r["bare"].ops_per_s:
        ratio = r["append"].ops_per_s / r["bare"].ops_per_s
        checks.append(("(2)/(3b) HTTP append vs POST floor", f"{ratio:.1%}", "report", None))
    if "batch" in r:
        rate = r["batch"].records_per_s
        checks.append(("(4) batched records/s", f"{rate:,.0f}", ">= 100,000", rate >= 100_000))
    if "batch" in r and "copy" in r and r["copy"].records_per_s:
        ratio = r["batch"].records_per_s / r["copy"].records_per_s
        checks.append(("(4)/COPY batched vs raw COPY", f"{ratio:.1%}", ">= 50%", ratio >= 0.5))
    if checks:
        lines.append(f"{'ratio':<40} {'measured':>10}  {'target':<11} result")
        for label, value, target, ok in checks:
            verdict = "-" if ok is None else "PASS" if ok else "MISS"
            lines.append(f"{label:<40} {value:>10}  {target:<11} {verdict}")
    if bench.live:
        lines += ["", *report_live(bench)]
    return "\n".join(lines)


def _cpu(cpu: dict[str, float]) -> str:
    # "?" when negative: a process of the tree (e.g. an autovacuum worker) exited in the window
    # and took its CPU time with it.
    return "/".join(
        "-" if k not in cpu else "?" if cpu[k] < 0 else f"{cpu[k]:.0f}"
        for k in ("server", "postgres", "client")
    )


def report_live(bench: Bench) -> list[str]:
    lines = ["live delivery (SSE), objects, input dispatch"]
    checks = []
    fan: list[live.Fanout] = bench.live.get("fanout", [])  # type: ignore[assignment]
    for f in fan:
        stmts = f.statements_per_append
        counted = (
            f"{stmts:.2f} statements per append (pg_stat_statements)"
            if stmts is not None
            else f"{f.transactions_per_append:.2f} transactions per append (pg_stat_database)"
        )
        lines.append(
            f"(5) fan-out {f.subscribers:>5} subscribers: {f.appends} appends in {f.seconds:.1f}s, "
            f"{f.received:,}/{f.expected:,} deliveries, {f.failed} failed connections; "
            f"commit->receipt p50 {_fmt(f.p50_ms, '.1f')} ms, p99 {_fmt(f.p99_ms, '.1f')} ms, "
            f"max {_fmt(f.max_ms, '.1f')} ms (the append requests: p50 "
            f"{_fmt(f.append_p50_ms, '.1f')} ms, max {_fmt(f.append_max_ms, '.1f')} ms); "
            f"{counted}; "
            f"CPU% srv/pg/client {_cpu(f.cpu)}" + (f"; error {f.error}" if f.error else "")
        )
        for per, text in f.top:
            lines.append(f"      {per:5.2f}/append  {text}")
    if fan:
        big = fan[-1]
        ok = big.p99_ms is not None and big.p99_ms <= 100 and big.received == big.expected > 0
        checks.append(
            (
                f"(5) p99 latency, {big.subscribers} subscribers",
                f"{_fmt(big.p99_ms, '.1f')} ms",
                "<= 100 ms",
                ok,
            )
        )
        few, many = fan[0].statements_per_append, big.statements_per_append
        if few is None or many is None:
            few, many = fan[0].transactions_per_append, big.transactions_per_append
        if len(fan) > 1:
            ok = many <= few * 1.1 + 0.2  # equal within noise (head checks, token refresh)
            checks.append(
                (
                    f"(5) stmts/append {fan[0].subscribers} vs {big.subscribers} subs",
                    f"{few:.2f} / {many:.2f}",
                    "equal",
                    ok,
                )
            )
    if (i := bench.live.get("idle")) is not None:
        mb = 1024 * 1024
        lines.append(
            f"(6) idle: {i.connected:,} of {i.connections:,} SSE connections open "
            f"({i.failed} failed); server RSS (tree) {i.before.get('rss', 0) / mb:.1f} MB before, "
            f"{i.holding.get('rss', 0) / mb:.1f} MB with them, {i.after.get('rss', 0) / mb:.1f} MB "
            f"after closing; PSS {i.before.get('pss', 0) / mb:.1f} / "
            f"{i.holding.get('pss', 0) / mb:.1f} / {i.after.get('pss', 0) / mb:.1f} MB; "
            f"{(i.holding.get('rss', 0) - i.before.get('rss', 0)) / max(1, i.connected) / 1024:.1f}"
            " KB per connection" + (f"; error {i.error}" if i.error else "")
        )
        fresh = bench.facts.get("server memory at start", {})
        lines.append(
            f"    RSS with them: supervisor {i.holding.get('root_rss', 0) / mb:.1f} MB + "
            f"worker(s) {(i.holding.get('rss', 0) - i.holding.get('root_rss', 0)) / mb:.1f} MB "
            f"({i.holding.get('processes', 0)} processes); the whole tree had "
            f"{fresh.get('rss', 0) / mb:.1f} MB RSS just after start-up"
        )
        rss = i.holding.get("rss", 0) / mb
        ok = 0 < rss <= 100 and i.connected == i.connections
        checks.append((f"(6) RSS with {i.connections} idle SSE", f"{rss:.1f} MB", "<= 100 MB", ok))
    if (c := bench.live.get("catchup")) is not None:
        lines.append(
            f"(7) catch-up of {c.records:,} records (filled in {c.fill_seconds:.1f}s, "
            f"{c.fill_rate:,.0f} rec/s): SSE from cursor 0 {c.sse_records:,} records "
            f"(last id {c.sse_last:,}) in {c.sse_seconds:.1f}s = {c.sse_rate:,.0f} rec/s, CPU% "
            f"srv/pg/client {_cpu(c.sse_cpu)}; pages of 1,000 {c.page_records:,} records in "
            f"{c.page_requests:,} GETs, {c.page_seconds:.1f}s = {c.page_rate:,.0f} rec/s, CPU% "
            f"{_cpu(c.page_cpu)}" + (f"; error {c.error}" if c.error else "")
        )
        if c.floor_records:
            lines.append(
                f"(7f) floor (raw asyncpg, 1 connection, keyset pages of 1,000 encoded as the "
                f"answer's JSON by msgspec): {c.floor_records:,} records in {c.floor_seconds:.1f}s"
                f" = {c.floor_rate:,.0f} rec/s ({c.floor_bytes / max(1, c.floor_records):.0f} "
                f"B/record), CPU% srv/pg/floor {_cpu(c.floor_cpu)}; its first page "
                + (
                    "is byte for byte (7b)'s first answer"
                    if c.floor_matches
                    else "DIFFERS from (7b)'s first answer"
                )
            )
        per = [
            f"{label} {us:.1f} us"
            for label, us in (
                ("(7a)", c.cpu_per_record_us("sse")),
                ("(7b)", c.cpu_per_record_us("page")),
                ("(7f)", c.cpu_per_record_us("floor", "client")),
            )
            if us is not None
        ]
        if per:
            lines.append("    CPU per record (server; the floor's own process): " + ", ".join(per))
        for label, rate, count in (
            ("(7a) SSE catch-up records/s", c.sse_rate, c.sse_records),
            ("(7b) paginated GET records/s", c.page_rate, c.page_records),
        ):
            ok = rate >= 200_000 and count == c.records
            checks.append((label, f"{rate:,.0f}", ">= 200,000", ok))
        for label, rate, count in (
            ("(7a)/(7f) SSE catch-up vs floor", c.sse_rate, c.sse_records),
            ("(7b)/(7f) paginated GET vs floor", c.page_rate, c.page_records),
        ):
            if c.floor_rate:
                ratio = rate / c.floor_rate
                ok = ratio >= 0.5 and count == c.records == c.floor_records
                checks.append((label, f"{ratio:.1%}", ">= 50%", ok))
    if (o := bench.live.get("objects")) is not None:
        lines += report_objects(o, checks)
    for d in bench.live.get("dispatch", []):
        lines += report_dispatch(d)
    lines.append("")
    lines.append(f"{'live target':<40} {'measured':>14}  {'target':<11} result")
    for label, value, target, ok in checks:
        lines.append(f"{label:<40} {value:>14}  {target:<11} {'PASS' if ok else 'MISS'}")
    return lines


def report_objects(o: objects.Objects, checks: list) -> list[str]:
    mib = 1024 * 1024
    rates = ", ".join(f"{o.rate(s):.0f}" for s in o.seconds)
    put = sorted(o.put_seconds)[len(o.put_seconds) // 2] if o.put_seconds else 0
    commit = sorted(o.commit_seconds)[len(o.commit_seconds) // 2] if o.commit_seconds else 0
    hwm = ", ".join(f"{g / mib:.1f}" for g in o.hwm_growth) or "-"
    lines = [
        f"(8) objects: {len(o.seconds)} x {o.size / mib:g} MiB upload + commit (filesystem "
        f"store): {rates} MB/s (median {o.median_mb_s:.0f} MB/s; median PUT {put * 1000:.0f} ms "
        f"+ commit {commit * 1000:.0f} ms); CPU% srv/pg/client {_cpu(o.cpu)} in the uploads"
        + (f"; error {o.error}" if o.error else ""),
        f"    server tree RSS {o.before / mib:.1f} MiB before; growth per upload (peak of "
        f"{o.samples} samples every 20 ms - just before) "
        + ", ".join(f"{g / mib:.1f}" for g in o.growth)
        + f" MiB; kernel VmHWM growth {hwm} MiB; peak over all {o.peak / mib:.1f} MiB "
        f"(+{(o.peak - o.before) / mib:.1f})",
    ]
    done = len(o.seconds) == o.uploads and not o.error
    checks.append(
        (
            "(8) 32 MiB upload+commit MB/s",
            f"{o.median_mb_s:.0f}",
            ">= 200",
            done and o.median_mb_s >= 200,
        )
    )
    growth = o.peak_growth / mib
    checks.append(
        ("(8) server peak RSS growth", f"{growth:.1f} MiB", "<= 16 MiB", done and growth <= 16)
    )
    return lines


def report_dispatch(d: dispatch.Dispatch) -> list[str]:
    b, s = d.burst, d.steady
    label = f"(9) dispatch, wait service {d.service}"
    if d.error:
        return [f"{label}: error {d.error}"]
    lines = [
        f"{label}: burst of {b.records:,} records (appended in {b.append_seconds:.2f}s): "
        f"{b.accepted:,} accepted in {b.seconds:.1f}s = {b.rate:,.0f} events/s; commit->accept "
        f"p50 {_fmt(b.p50_ms, ',.0f')} ms, p99 {_fmt(b.p99_ms, ',.0f')} ms; CPU% "
        f"worker/pg/srv{'/stub' if 'stub' in b.cpu else ''} "
        + "/".join(
            f"{b.cpu[k]:.0f}" for k in ("worker", "postgres", "server", "stub") if k in b.cpu
        )
        + (f"; {b.statements:.1f} statements/event" if b.statements is not None else "")
        + (f"; {d.duplicates} duplicate POSTs" if d.duplicates else "")
        + (f"; {b.error}" if b.error else ""),
    ]
    for per, ms, text in b.top:
        lines.append(f"      {per:5.2f}/event {ms:7.2f} ms/call  {text}")
    lines.append(
        f"    steady {s.records / max(s.append_seconds, 1e-9):,.0f} records/s for "
        f"{s.append_seconds:.0f}s ({s.records:,} records, {s.accepted:,} accepted): commit->accept "
        f"p50 {_fmt(s.p50_ms, '.1f')} ms, p99 {_fmt(s.p99_ms, '.1f')} ms, max "
        f"{_fmt(s.max_ms, '.1f')} ms; CPU% "
        + "/".join(
            f"{s.cpu[k]:.0f}" for k in ("worker", "postgres", "server", "stub") if k in s.cpu
        )
        + " (report; no target)"
        + (f"; {s.error}" if s.error else "")
    )
    return lines


def print_profiles(bench: Bench) -> None:
    """The py-spy summaries the run sampled: (2) or (4) under --profile / --profile-batch, (7a)
    and (7b) under --profile-catchup."""
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


def write_json(bench: Bench, path: Path) -> None:
    """--json: the facts, the table's measurements and the live results."""
    payload = {
        "facts": bench.facts,
        "duration": bench.args.duration,
        "results": {k: asdict(v) for k, v in bench.results.items()},
        "live": {
            k: [asdict(x) for x in v] if isinstance(v, list) else asdict(v)
            for k, v in bench.live.items()
        },
    }
    path.write_text(json.dumps(payload, indent=2, default=str))
