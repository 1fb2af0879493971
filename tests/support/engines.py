"""Workflow engines for the tests and bench/engines.py, on loopback only.

- Restate: the `restate-server` binary of the npm package `@restatedev/restate-server`
  (tests/engines/package.json, installed with `npm ci` like the conformance packages), one node
  bound to 127.0.0.1 on free ports, telemetry off. Its one-off check for a newer release (a
  request to GitHub that no setting turns off) is pointed at 127.0.0.1 where the system allows
  a private mount namespace (`unshare`), so the server never reaches past this machine.
- The Restate Python service of tests/engines/restate_app.py, served by hypercorn and
  registered with the server's admin API.
- DBOS: the application of tests/engines/dbos_app.py, its system database a database of the
  tests' own PostgreSQL.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx

from tests.support.node import NodeMissing, _tool
from tests.support.server import free_port

ROOT = Path(__file__).resolve().parents[2]
ENGINES_DIR = ROOT / "tests" / "engines"
_STAMP = ENGINES_DIR / "node_modules" / ".ductor-streams-installed"


def restate_binary() -> Path:
    """`npm ci` in tests/engines unless done for this lock file; the restate-server binary."""
    npm = _tool("npm")
    wanted = hashlib.sha256((ENGINES_DIR / "package-lock.json").read_bytes()).hexdigest()
    with (ENGINES_DIR / ".npm-install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (_STAMP.exists() and _STAMP.read_text().strip() == wanted):
            done = subprocess.run(
                [npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=ENGINES_DIR,
                capture_output=True,
                text=True,
                timeout=600,
                env={**os.environ, "SCARF_ANALYTICS": "false", "DO_NOT_TRACK": "1"},
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"`npm ci` in {ENGINES_DIR} failed ({done.returncode}):\n"
                    f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
                )
            _STAMP.write_text(wanted)
    found = list(
        (ENGINES_DIR / "node_modules" / "@restatedev").glob("restate-server-*/bin/restate-server")
    )
    if not found:
        raise NodeMissing(
            "the npm package @restatedev/restate-server has no binary for this platform"
        )
    return found[0]


def _can_unshare() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run([unshare, "-Urm", "true"], capture_output=True, timeout=10, check=False)
    return probe.returncode == 0


_CONFIG = """\
cluster-name = "ductor-streams-test"
node-name = "n1"
disable-telemetry = true
default-num-partitions = 2
rocksdb-total-memory-size = "192 MiB"
listen-mode = "tcp"
bind-address = "127.0.0.1:{node}"
advertised-address = "http://127.0.0.1:{node}/"
log-format = "compact"
log-disable-ansi-codes = true
shutdown-timeout = "5s"

[default-retry-policy]
initial-interval = "100ms"
exponentiation-factor = 2.0
max-interval = "1s"
max-attempts = 300
on-max-attempts = "pause"

[admin]
bind-address = "127.0.0.1:{admin}"
advertised-admin-endpoint = "http://127.0.0.1:{admin}/"
disable-web-ui = true

[admin.query-engine]
memory-size = "64 MiB"

[ingress]
bind-address = "127.0.0.1:{ingress}"
advertised-ingress-endpoint = "http://127.0.0.1:{ingress}/"
"""


@dataclass
class RestateServer:
    """One Restate node. `stop()` then `start()` restarts it on the same ports and state."""

    data_dir: Path
    ingress_port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    node_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def ingress_url(self) -> str:
        return f"http://127.0.0.1:{self.ingress_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, timeout: float = 60.0) -> Self:
        binary = restate_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "restate.toml"
        config.write_text(
            _CONFIG.format(node=self.node_port, admin=self.admin_port, ingress=self.ingress_port)
        )
        command = [
            str(binary),
            "--config-file",
            str(config),
            "--base-dir",
            str(self.data_dir / "data"),
            "--no-logo",
        ]
        if _can_unshare():
            hosts = self.data_dir / "hosts"
            hosts.write_text("127.0.0.1 localhost\n::1 localhost\n127.0.0.1 api.github.com\n")
            script = 'mount --bind "$0" /etc/hosts && exec "$@"'
            command = ["unshare", "-Urm", "sh", "-c", script, str(hosts), *command]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RESTATE_", "OTEL_"))}
        env["DO_NOT_TRACK"] = "1"
        with (self.data_dir / "restate.log").open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"restate-server exited early:\n{self.log()[-4000:]}")
            if self._healthy():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"restate-server did not become ready:\n{self.log()[-4000:]}")

    def _healthy(self) -> bool:
        try:
            admin = httpx.get(self.admin_url + "/health", timeout=1)
            ingress = httpx.get(self.ingress_url + "/restate/health", timeout=1)
        except httpx.HTTPError:
            return False
        return admin.status_code == 200 and ingress.status_code == 200

    def log(self) -> str:
        path = self.data_dir / "restate.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        _stop(self.process, sig)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def register(self, service_url: str, timeout: float = 30.0) -> None:
        """Register (or re-register) the deployment at `service_url`."""
        deadline = time.monotonic() + timeout
        while True:
            answer = httpx.post(
                self.admin_url + "/deployments",
                json={"uri": service_url, "force": True},
                timeout=10,
            )
            if answer.status_code in (200, 201):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"registering {service_url}: {answer.status_code} {answer.text}")
            time.sleep(0.3)

    def query(self, sql: str) -> list[dict]:
        """Rows of Restate's SQL introspection (sys_invocation, sys_journal, ...)."""
        answer = httpx.post(
            self.admin_url + "/query",
            json={"query": sql},
            headers={"Accept": "application/json"},
            timeout=20,
        )
        answer.raise_for_status()
        return answer.json()["rows"]


def restate_time(value: str) -> float:
    """A timestamp of Restate's SQL introspection (`2026-12-02T17:55:02.648Z`) in seconds."""
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass
class _PythonProcess:
    """A Python process of tests/engines, ready when it prints its ready line."""

    module: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    ready_line: str
    stop_signal: int = signal.SIGTERM
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"--- start {time.time()}\n".encode())
            offset = log.tell()
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}", **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.module} exited early:\n{self.log()[-4000:]}")
            if self.ready_line in self.log_path.read_text(errors="replace")[offset:]:
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.module} did not become ready:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int | None = None) -> None:
        _stop(self.process, self.stop_signal if sig is None else sig)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def restate_service(port: int, env: dict[str, str], log_path: Path) -> _PythonProcess:
    """The Restate service. Stopped with SIGKILL: it keeps no state (Restate does), and
    hypercorn's graceful stop waits on the HTTP/2 connections Restate holds open."""
    return _PythonProcess(
        "tests.engines.restate_app",
        [str(port)],
        env,
        log_path,
        "restate app ready",
        stop_signal=signal.SIGKILL,
    )


def dbos_app(groups: list[list[str]], env: dict[str, str], log_path: Path) -> _PythonProcess:
    """The DBOS application, starting one workflow per `[run_id, stream_id, n, output|-]`."""
    args = [part for group in groups for part in group]
    return _PythonProcess("tests.engines.dbos_app", args, env, log_path, "dbos app ready")


def _stop(process: subprocess.Popen[bytes] | None, sig: int) -> None:
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        return
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def main() -> None:
    """`python -m tests.support.engines [DIR]`: a local Restate node on loopback for a try-out,
    until Ctrl-C (its state in DIR, default ./.restate-try)."""
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".restate-try").resolve()
    server = RestateServer(root).start()
    print(f"Restate ingress {server.ingress_url}  admin {server.admin_url}  state {root}")
    print('register a service: POST {admin}/deployments {"uri": "http://127.0.0.1:PORT"}')
    try:
        while server.process is not None and server.process.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
