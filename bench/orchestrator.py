"""The run of `python -m bench`: the embedded PostgreSQL and the server started once, each
selected benchmark's window in turn (a checkpoint before each), and the server stopped after.

`Bench` holds what the windows share (the options, the database URL and pid, the server, its
token) and what they leave for the report (`results`, `live`, `facts`, the profiles). The windows
themselves are `WINDOWS`: (1)-(3b) in bench/appends.py, (4) and COPY in bench/batches.py,
(5)-(9) in bench/live_windows.py."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.identity_provider import IdentityProvider, Key

from bench import appends, batches, database, live_windows, load
from bench.database import Measurement
from bench.options import LIVE
from bench.payloads import RUN_ID
from bench.server import CpuMeter, Server, tree_memory

WINDOWS: dict[str, Callable[[Bench], Any]] = {
    "floor": appends.floor,
    "append": appends.append,
    "jwt": appends.jwt,
    "reffile": appends.reffile,
    "refmemory": appends.refmemory,
    "noop": appends.noop,
    "bare": appends.bare,
    "batch": batches.batch,
    "copy": batches.copy,
    "idle": live_windows.idle,
    "fanout": live_windows.fanout,
    "catchup": live_windows.catchup,
    "objects": live_windows.objects,
    "dispatch": live_windows.dispatch,
}


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.results: dict[str, Measurement] = {}
        # With --rounds: each round's measurements (`results` holds their totals).
        self.rounds: list[dict[str, Measurement]] = []
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
            windows = [n for n in args.selected if n not in LIVE]
            for round_ in range(args.rounds):
                # Alternating order: a drift of the host over the run falls on each window alike.
                measured: dict[str, Measurement] = {}
                for name in windows if round_ % 2 == 0 else windows[::-1]:
                    measured[name] = self._window(name, round_)
                self.rounds.append(measured)
            for name in windows:
                self.results[name] = database.combined([r[name] for r in self.rounds])
            for name in args.selected:
                if name in LIVE:
                    self.live[name] = self._window(name, 0)
        finally:
            self.server.stop()
            if "jwt" in args.selected:
                self.identity.stop()

    def _window(self, name: str, round_: int) -> Any:
        of = f", round {round_ + 1} of {self.args.rounds}" if self.args.rounds > 1 else ""
        print(
            f"running {name} ({self.args.duration:g}s + {self.args.warmup:g}s warm-up{of}) ...",
            flush=True,
        )
        asyncio.run(database.checkpoint(self.url))
        return WINDOWS[name](self)

    def meter(self, server: Server | None = None) -> CpuMeter:
        """The CPU of the server's process tree and of PostgreSQL's over one window."""
        return CpuMeter({"server": (server or self.server).pid, "postgres": self.pg_pid})
