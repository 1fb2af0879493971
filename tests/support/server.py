"""Real `ductor-streams serve` and `ductor-streams worker` processes for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class _Process:
    database_url: str
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> Self:
        env = {
            **os.environ,
            "DUCTOR_STREAMS_DATABASE_URL": self.database_url,
            "DUCTOR_STREAMS_DATA_DIR": str(self.data_dir),
            # The tests' webhook receivers listen on this machine, as a developer's do.
            "DUCTOR_STREAMS_WEBHOOK_LOOPBACK": "true",
            **self.env,
        }
        self.data_dir.mkdir(parents=True, exist_ok=True)
        name = type(self).__name__.lower()
        self.log_path = self.data_dir / f"{name}-{time.monotonic_ns()}.log"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "entrypoints.cli", *self._command()],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: its children stop with it
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited early:\n{self.log()}")
            if self._ready():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{name} did not become ready:\n{self.log()}")

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
class ServerProcess(_Process):
    args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        return ["serve", "--port", str(self.port), "--no-workers", *self.args]

    def _ready(self) -> bool:
        try:
            return httpx.get(self.base_url + "/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False


@dataclass
class WorkerProcess(_Process):
    def _command(self) -> list[str]:
        return ["worker"]

    def _ready(self) -> bool:
        return "workers running" in self.log()
