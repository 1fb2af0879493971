"""The server under test: one `ductor-streams serve` subprocess, its HTTP set-up calls, and CPU
accounting of process trees from /proc."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def embedded_server(env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[bytes], str]]:
    """`ductor-streams serve` on its embedded defaults in a temporary directory, with `env`
    added to the environment: its base URL, process and data directory once `/readyz` answers
    200; stopped after (the benchmarks of one process: bench.consumers, bench.large_append)."""
    import httpx

    with tempfile.TemporaryDirectory() as data:
        port = free_port()
        log = Path(data) / "serve.log"
        with log.open("wb") as out:
            server = subprocess.Popen(
                [sys.executable, "-m", "entrypoints.cli", "serve", "--port", str(port)],
                env={**os.environ, "DUCTOR_STREAMS_DATA_DIR": data, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(base + "/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit("the server did not start:\n" + log.read_text(errors="replace"))
                time.sleep(0.2)
            yield base, server, data
        finally:
            server.terminate()
            server.wait(30)


def raise_fd_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit (for this process and its children)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(
            resource.RLIMIT_NOFILE,
            (hard if hard != resource.RLIM_INFINITY else max(soft, 65536), hard),
        )


class Server:
    def __init__(
        self,
        url: str,
        token: str,
        data_dir: Path,
        log: Path,
        workers: int = 1,
        extra: tuple[str, ...] = (),
        *,
        background_workers: bool = False,
        settings: dict[str, str] | None = None,
    ) -> None:
        """`serve --no-workers` unless `background_workers` (the soak runs the pruner and the
        sweepers in the server process); `settings` are extra DUCTOR_STREAMS_* variables."""
        env = dict(os.environ)
        env.update(
            DUCTOR_STREAMS_DATABASE_URL=url,
            DUCTOR_STREAMS_BOOTSTRAP_TOKEN=token,
            DUCTOR_STREAMS_DATA_DIR=str(data_dir),
            DUCTOR_STREAMS_LOG_LEVEL="WARNING",
            # The live benchmarks hold 1,000 subscriptions of one principal (default cap 1,000).
            DUCTOR_STREAMS_MAX_SUBSCRIPTIONS_PER_PRINCIPAL="100000",
            DUCTOR_STREAMS_MAX_SUBSCRIPTIONS_PER_TENANT="100000",
            # The subscriptions bench's webhook receiver listens on loopback.
            DUCTOR_STREAMS_WEBHOOK_LOOPBACK="true",
        )
        env.update(settings or {})
        self._spawn(
            log,
            token,
            lambda port: [
                str(BIN / "ductor-streams"),
                "serve",
                "--port",
                str(port),
                "--workers",
                str(workers),
                *(() if background_workers else ("--no-workers",)),
                *extra,
            ],
            env=env,
            preexec_fn=raise_fd_limit,  # 1,000+ SSE connections
        )

    def _spawn(self, log: Path, token: str, argv: Callable[[int], list[str]], **popen: Any) -> None:
        """Start `argv(port)` on a free port, its output in `log`, in a process group of its
        own (granian's workers stop with it)."""
        self.port = free_port()
        self.token = token
        self.log_path = log
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            argv(self.port),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **popen,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited; see {self.log_path}")
            try:
                status, _ = self.request("GET", "/readyz")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout}s; see {self.log_path}")

    def request(self, method: str, path: str, body: object = None) -> tuple[int, object]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Authorization": f"Bearer {self.token}"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
        finally:
            conn.close()

    def create_stream(self, run_id: str, stream_id: str, direction: str = "output") -> None:
        status, answer = self.request(
            "POST",
            f"/api/workflow-streams/runs/{run_id}/streams",
            {
                "stream_id": stream_id,
                "direction": direction,
                "limits": {"max_unread_items": 100_000_000, "max_unread_bytes": 100_000_000_000},
            },
        )
        if status not in (200, 201):
            raise RuntimeError(f"creating stream {stream_id}: {status} {answer}")

    def stop(self) -> None:
        stop_group(self.process)
        self._log.close()


class BareServer(Server):
    """bench/bare_app.py: the append route with nothing behind it, for (3b)."""

    def __init__(self, log: Path) -> None:
        self._spawn(
            log,
            "unused",
            lambda port: [sys.executable, "-m", "bench.bare_app", str(port)],
            cwd=Path(__file__).resolve().parents[1],
        )


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to a process started with `start_new_session`, and its children; SIGKILL if it is
    still there after 15 s."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
        except ProcessLookupError:
            pass


# --- memory and CPU of process trees ---


def tree_pids(root: int) -> list[int]:
    """`root` and its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (s := _stat(int(entry))) is not None:
            children.setdefault(s[0], []).append(int(entry))
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, ()))
    return pids


def tree_memory(root: int) -> dict[str, int]:
    """Bytes of resident memory of a process tree: `rss` (the sum of each process's RSS, as `ps`
    shows it; shared pages count once per process), `pss` (proportional set size: shared pages
    split between the processes sharing them), `root_rss` (the root's own) and `processes`."""
    total = {"rss": 0, "pss": 0, "root_rss": 0, "processes": 0}
    for pid in tree_pids(root):
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                total[key.lower()] += int(rest.split()[0]) * 1024
            if key == "Rss" and pid == root:
                total["root_rss"] = int(rest.split()[0]) * 1024
        total["processes"] += 1
    return total


# --- CPU of process trees -------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, utime + stime in seconds) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def tree_cpu(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named root process and all its descendants (live ones)."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (s := _stat(int(entry))) is not None:
            stats[int(entry)] = s
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    totals: dict[str, float] = {}
    for name, root in roots.items():
        total, todo = 0.0, [root]
        while todo:
            pid = todo.pop()
            if pid in stats:
                total += stats[pid][1]
            todo.extend(children.get(pid, ()))
        totals[name] = total
    return totals


class CpuMeter:
    """% of one core used by each named process tree between `start` and `stop`."""

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = roots

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._c0 = tree_cpu(self.roots)

    def stop(self) -> dict[str, float]:
        c1 = tree_cpu(self.roots)
        wall = time.perf_counter() - self._t0
        return {name: 100 * (c1[name] - self._c0.get(name, 0.0)) / wall for name in self.roots}
