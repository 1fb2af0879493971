"""The options of `python -m bench`: the benchmarks by name, in the order they run, and the
command line."""

from __future__ import annotations

import argparse
from pathlib import Path

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
DESCRIPTION = (
    "`python -m bench` (or `python3 dev.py bench`): run the benchmarks and print the table."
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=DESCRIPTION)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before each one")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only these (repeatable or comma-separated): {', '.join(NAMES)}",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the selected windows of (1)-(4) this many times, in alternating order "
        "(a b c, then c b a, ...), and report each one's totals over its rounds and each "
        "round's (2)/(3): drift of a shared host then falls on every window alike",
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
    if args.rounds < 1:
        parser.error("--rounds is at least 1")
    args.wait_services = [s.strip() for s in args.dispatch_services.split(",") if s.strip()]
    if bad := set(args.wait_services) - {"postgres", "http"}:
        parser.error(f"unknown wait service(s) {sorted(bad)}; choose postgres, http")
    return args
