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
dispatches the subcommands and runs the main benchmarks: `bench/options.py` parses the options,
`bench/orchestrator.py` starts the database and the server and runs each window (the windows are
in `bench/appends.py`, `bench/batches.py` and `bench/live_windows.py`), `bench/reports.py`
prints the table.
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench import reports
from bench.options import NAMES, parse_args
from bench.orchestrator import Bench
from bench.server import raise_fd_limit


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
    reports.print_profiles(bench)
    if args.json:
        reports.write_json(bench, args.json)
    print(f"\ntotal {time.monotonic() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
