"""Node.js for the tests and the benchmark: the npm packages of tests/conformance (the Durable
Streams conformance suite, the official TypeScript client, the reference server), vitest runs
with a JSON report, and the reference server as a process."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE_DIR = ROOT / "tests" / "conformance"
NODE_MODULES = CONFORMANCE_DIR / "node_modules"
_STAMP = NODE_MODULES / ".ductor-streams-installed"


class NodeMissing(RuntimeError):
    pass


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise NodeMissing(
            f"`{name}` is not on PATH: the Durable Streams conformance and client tests need "
            "Node.js 20 or newer with npm (they install the npm packages of tests/conformance "
            "with `npm ci`)"
        )
    return path


def node() -> str:
    return _tool("node")


def ensure_node_packages() -> Path:
    """`npm ci` in tests/conformance unless its node_modules matches package-lock.json already;
    returns the node_modules directory. Raises NodeMissing without node or npm."""
    node()
    npm = _tool("npm")
    wanted = hashlib.sha256((CONFORMANCE_DIR / "package-lock.json").read_bytes()).hexdigest()
    lock_path = CONFORMANCE_DIR / ".npm-install.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be installing
        if _STAMP.exists() and _STAMP.read_text().strip() == wanted:
            return NODE_MODULES
        done = subprocess.run(
            [npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=CONFORMANCE_DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"`npm ci` in {CONFORMANCE_DIR} failed ({done.returncode}):\n"
                f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
            )
        _STAMP.write_text(wanted)
    return NODE_MODULES


# --- vitest ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class VitestResult:
    file: str
    path: tuple[str, ...]  # the describe blocks, outermost first
    title: str
    status: str  # passed, failed, skipped, pending, todo
    failure: str

    @property
    def name(self) -> str:
        return " > ".join((*self.path, self.title))


@dataclass
class VitestReport:
    results: list[VitestResult]
    returncode: int
    output: str
    seconds: float

    def of(self, file: str) -> list[VitestResult]:
        return [r for r in self.results if r.file == file]

    @staticmethod
    def counts(results: list[VitestResult]) -> Counter[str]:
        return Counter(
            "skipped" if r.status in {"skipped", "pending", "todo"} else r.status for r in results
        )

    @staticmethod
    def summary(results: list[VitestResult]) -> str:
        counts = VitestReport.counts(results)
        lines = [
            f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
        ]
        lines += [
            f"  FAILED {r.name}: {(r.failure.splitlines() or [''])[0][:300]}"
            for r in results
            if r.status == "failed"
        ]
        return "\n".join(lines)


def run_vitest(
    files: list[str], env: dict[str, str], report_path: Path, timeout: float = 1200
) -> VitestReport:
    """Run the vitest files of tests/conformance (names relative to it) with a JSON report."""
    ensure_node_packages()
    vitest = NODE_MODULES / "vitest" / "vitest.mjs"
    started = time.monotonic()
    done = subprocess.run(
        [
            node(),
            str(vitest),
            "run",
            "--reporter=dot",
            "--reporter=json",
            f"--outputFile.json={report_path}",
            *files,
        ],
        cwd=CONFORMANCE_DIR,
        env={**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    if not report_path.exists():
        raise RuntimeError(f"vitest wrote no report ({done.returncode}):\n{output[-6000:]}")
    raw = json.loads(report_path.read_text())
    results = [
        VitestResult(
            file=Path(suite["name"]).name,
            path=tuple(test.get("ancestorTitles", ())),
            title=test["title"],
            status=test["status"],
            failure="\n".join(test.get("failureMessages") or ()),
        )
        for suite in raw.get("testResults", ())
        for test in suite.get("assertionResults", ())
    ]
    if not results:
        raise RuntimeError(f"vitest reported no tests ({done.returncode}):\n{output[-6000:]}")
    return VitestReport(results, done.returncode, output, seconds)


# --- the reference server -------------------------------------------------------------------


@dataclass
class ReferenceServer:
    """The npm @durable-streams/server reference implementation: in memory, or file-backed (log
    files and LMDB) under `data_dir`. Its protocol base URL is `base_url`."""

    data_dir: Path | None = None
    long_poll_ms: int = 30_000
    log_path: Path | None = None
    webhooks: bool = False  # its webhook subscriptions (off by default in the reference)
    process: subprocess.Popen[str] | None = None
    base_url: str = field(default="", init=False)

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 30.0) -> Self:
        ensure_node_packages()
        command = [node(), "reference-server.mjs", "--long-poll-ms", str(self.long_poll_ms)]
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            command += ["--data-dir", str(self.data_dir)]
        if self.webhooks:
            command.append("--webhooks")
        log = self.log_path.open("a") if self.log_path else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                command,
                cwd=CONFORMANCE_DIR,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        finally:
            if self.log_path:
                log.close()  # type: ignore[union-attr]
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line.startswith("listening on "):
                self.base_url = line.removeprefix("listening on ").strip()
                return self
            if not line and self.process.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"the reference server did not start: {line!r}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
