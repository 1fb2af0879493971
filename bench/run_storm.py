"""Runs starting and ending at once: what one tenant's creations and deletions cost, and what
they cost another tenant's appends.

`python3 dev.py run python -m bench.run_storm [--loops N] [--seconds S] [--kind K]` starts
`ductor-streams serve` on embedded PostgreSQL in a temporary directory. Tenant A (the bootstrap
token) runs N loops (default 32) from a process of its own, one request after the other, for
S seconds (default 15). By `--kind`:

- `create`: each request creates a stream of a new run (`POST …/runs/{run}/streams`);
- `create-delete`: each stream created is deleted again (`DELETE …/streams/{stream}`);
- `lifecycle` (default): each loop plays runs of a workflow platform: a new run's three
  streams created, one record appended to each, the run deleted (`DELETE …/runs/{run}`).

Tenant B (a token of a second tenant, made by `ductor-streams token create`) appends one record
at a time to its own stream, 2 s before A starts (quiet) and then beside A. It prints A's
requests a second by kind and B's latencies (p50, p99, worst), quiet and beside A
(docs/benchmarks.md, "2026-12-06, fourteenth sitting").
"""

from __future__ import annotations

import argparse
import concurrent.futures
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench import load
from bench.large_beside import JSON, TOKEN, _latencies, _stream, _tenant_b, _token
from bench.server import embedded_server

LUA = Path(__file__).with_name("storm.lua")
KINDS = ("append", "create", "create-delete", "lifecycle")
APPENDED = 1_000  # streams of the `append` window's run


def _wrk(port: int, kind: str, prefix: str, args: argparse.Namespace) -> load.LoadResult:
    """A's load of `kind` for `args.seconds` (storm.lua says what each request does)."""
    threads = 2
    argv = [
        *(load.wrk_path() or "wrk", f"-t{threads}", f"-c{args.loops}", f"-d{args.seconds}s"),
        *("--timeout", "30s", "-s", str(LUA), f"http://127.0.0.1:{port}"),
        *("--", TOKEN, kind, prefix, str(args.loops // threads)),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return load.result_of(done.returncode, done.stdout, done.stderr, "wrk")


def _window(
    base: str, b: httpx.Client, small: str, kind: str, prefix: str, args: argparse.Namespace
) -> tuple[load.LoadResult, tuple[list[float], int]]:
    """A's load of `kind`, and B's appends beside it from 1 s after it starts."""
    port = int(base.rsplit(":", 1)[1])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        a = pool.submit(_wrk, port, kind, prefix, args)
        time.sleep(1.0)
        beside = _tenant_b(b, small, args.seconds - 2.0)
        return a.result(), beside


def _measure(base: str, data: str, args: argparse.Namespace) -> None:
    b_token = _token(data, "bench-b-" + secrets.token_hex(3))
    prefix = "storm" + secrets.token_hex(3)
    with (
        httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}) as a,
        httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {b_token}", **JSON}, timeout=60
        ) as b,
    ):
        for n in range(APPENDED):
            _stream(a, f"{prefix}-appends", f"a{n}")
        small = _stream(b, "storm-b-" + secrets.token_hex(3), "b")
        quiet = _tenant_b(b, small, 2.0)
        print(
            f"tenant A: wrk at {args.loops} connections; tenant B: one-record appends, "
            "one after the other"
        )
        print(f"B quiet: {_latencies(*quiet)}")
        rates = {}
        for kind in args.kinds:
            result, beside = _window(base, b, small, kind, prefix, args)
            rates[kind] = result.requests / result.seconds
            errors = f", {result.errors} errors" if result.errors else ""
            print(
                f"A {kind}: {rates[kind]:,.0f} requests/s, p99 {result.p99_ms:.1f} ms{errors}; "
                f"B beside: {_latencies(*beside)}"
            )
        if "append" in rates:
            for kind, rate in rates.items():
                if kind != "append":
                    print(f"{kind} / append: {rate / rates['append']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loops", type=int, default=64, help="A's connections")
    parser.add_argument("--seconds", type=int, default=10, help="each window")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"of {', '.join(KINDS)}")
    arguments = parser.parse_args()
    arguments.kinds = arguments.kinds.split(",")
    if not load.wrk_path() or not set(arguments.kinds) <= set(KINDS):
        sys.exit(f"needs wrk on the PATH, and --kinds of {', '.join(KINDS)}")
    with embedded_server({"DUCTOR_STREAMS_BOOTSTRAP_TOKEN": TOKEN}) as (base, _, data):
        _measure(base, data, arguments)


if __name__ == "__main__":
    main()
