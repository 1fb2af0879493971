"""A real `ductor-streams serve` process for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    database_url: str
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        env = {
            **os.environ,
            "DUCTOR_STREAMS_DATABASE_URL": self.database_url,
            "DUCTOR_STREAMS_DATA_DIR": str(self.data_dir),
            **self.env,
        }
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / f"server-{self.port}.log"
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "entrypoints.cli",
                "serve",
                "--port",
                str(self.port),
                "--no-workers",
                *self.args,
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not become ready:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


@dataclass
class WorkerProcess:
    """A real `ductor-streams worker` process."""

    database_url: str
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def start(self, timeout: float = 30.0) -> WorkerProcess:
        env = {
            **os.environ,
            "DUCTOR_STREAMS_DATABASE_URL": self.database_url,
            "DUCTOR_STREAMS_DATA_DIR": str(self.data_dir),
            **self.env,
        }
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / f"worker-{time.monotonic_ns()}.log"
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "entrypoints.cli", "worker"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.log()}")
            if "workers running" in self.log():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"worker did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        ServerProcess.stop(self, sig)  # type: ignore[arg-type]

    def kill(self) -> None:
        self.stop(signal.SIGKILL)
