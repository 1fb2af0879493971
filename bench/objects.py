"""(8) Large objects: 32 MiB uploads + commits through HTTP on the server's filesystem store; the
rate from the PUT's first byte to the commit's answer, and the server's peak RSS growth meanwhile.

The client streams the body from one pre-built buffer in 1 MiB `send`s over a keep-alive
http.client connection (no copy, no HTTP library), so it is not the bottleneck."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

CHUNK = 1024 * 1024


class RssSampler:
    """Sums the RSS of a process tree (root + descendants, as `ps` shows it) every `interval`
    seconds in a thread; `peak(t0, t1)` is the largest sample taken in that span."""

    def __init__(self, root: int, interval: float = 0.02) -> None:
        self.interval = interval
        root_process = psutil.Process(root)
        self.processes = [root_process, *root_process.children(recursive=True)]
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def now(self) -> int:
        total = 0
        for process in self.processes:
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), self.now()))
            self._stop.wait(self.interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def peak(self, t0: float, t1: float) -> int:
        return max((rss for t, rss in self.samples if t0 <= t <= t1), default=0)

    def high_water_marks(self, reset: bool) -> int | None:
        """Sum of the tree's VmHWM (the kernel's exact peak RSS); with `reset`, first set each
        process's peak back to its current RSS (`clear_refs` 5). None if /proc refuses."""
        total = 0
        for process in self.processes:
            try:
                if reset:
                    Path(f"/proc/{process.pid}/clear_refs").write_text("5")
                for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                return None
        return total


@dataclass
class Objects:
    size: int
    uploads: int
    seconds: list[float] = field(default_factory=list)  # PUT's first byte -> commit's answer
    put_seconds: list[float] = field(default_factory=list)
    commit_seconds: list[float] = field(default_factory=list)
    growth: list[int] = field(default_factory=list)  # per upload: sampled peak - just before
    hwm_growth: list[int] = field(default_factory=list)  # per upload: VmHWM - just before
    before: int = 0  # tree RSS just before the first upload
    peak: int = 0  # largest sample over all uploads
    samples: int = 0
    cpu: dict[str, float] = field(default_factory=dict)
    error: str = ""

    def rate(self, seconds: float) -> float:
        return self.size / seconds / 1e6 if seconds else 0.0

    @property
    def median_mb_s(self) -> float:
        return self.rate(statistics.median(self.seconds)) if self.seconds else 0.0

    @property
    def peak_growth(self) -> int:
        """The largest per-upload growth (peak during it minus the tree's RSS just before)."""
        return max(self.growth, default=0)


class _Client:
    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.auth = f"Bearer {token}"

    def json(self, method: str, path: str, body: object = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": self.auth}
        if data is not None:
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        response = self.conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else {}

    def put(self, path: str, body: memoryview) -> tuple[int, bytes]:
        """Stream `body` in CHUNK-sized sends (slices of one buffer: no copies)."""
        self.conn.putrequest("PUT", path, skip_accept_encoding=True)
        self.conn.putheader("Authorization", self.auth)
        self.conn.putheader("Content-Type", "application/octet-stream")
        self.conn.putheader("Content-Length", str(len(body)))
        self.conn.endheaders()
        for offset in range(0, len(body), CHUNK):
            self.conn.send(body[offset : offset + CHUNK])
        response = self.conn.getresponse()
        return response.status, response.read()

    def close(self) -> None:
        self.conn.close()


def run(
    port: int,
    token: str,
    prefix: str,
    stream: str,
    *,
    server_pid: int,
    size: int,
    uploads: int,
    cpu: Callable[[], dict[str, float]],
    timeout: float = 120,
) -> Objects:
    """`uploads` times: prepare an object (fresh idempotency key), PUT its body, commit it.
    `cpu()` gives CPU seconds used so far per process tree; `Objects.cpu` is % of one core
    inside the timed spans only."""
    result = Objects(size, uploads)
    body = memoryview(os.urandom(size))
    sha256 = hashlib.sha256(body).hexdigest()
    run_tag = os.urandom(4).hex()
    client = _Client(port, token)
    sampler = RssSampler(server_pid)
    sampler.start()
    deadline = time.monotonic() + timeout
    try:
        time.sleep(0.2)
        result.before = sampler.now()
        used: dict[str, float] = {}
        for n in range(uploads):
            if time.monotonic() > deadline:
                result.error = f"stopped after {n} uploads ({timeout:g}s)"
                break
            status, intent = client.json(
                "POST",
                f"{prefix}/{stream}/objects",
                {
                    "idempotency_key": f"bench-{run_tag}-{n}",
                    "size": size,
                    "sha256": sha256,
                    "content_type": "application/octet-stream",
                },
            )
            if status != 201:
                raise RuntimeError(f"prepare answered {status}: {intent}")
            time.sleep(0.1)  # a quiet sample just before
            before = sampler.now()
            sampler.high_water_marks(reset=True)
            cpu0 = cpu()
            t0 = time.perf_counter()
            status, answer = client.put(intent["upload"]["url"], body)
            t1 = time.perf_counter()
            if status != 200:
                raise RuntimeError(f"upload answered {status}: {answer[:300]!r}")
            status, committed = client.json(
                "POST", f"{prefix}/{stream}/objects/{intent['object_id']}/commit"
            )
            t2 = time.perf_counter()
            for name, seconds in cpu().items():
                used[name] = used.get(name, 0.0) + seconds - cpu0.get(name, 0.0)
            if status != 201 or "sequence" not in committed:
                raise RuntimeError(f"commit answered {status}: {committed}")
            hwm = sampler.high_water_marks(reset=False)
            time.sleep(0.05)  # let the sampler take one more sample inside the span
            result.seconds.append(t2 - t0)
            result.put_seconds.append(t1 - t0)
            result.commit_seconds.append(t2 - t1)
            result.growth.append(max(0, sampler.peak(t0, t2 + 0.05) - before))
            if hwm is not None:
                result.hwm_growth.append(max(0, hwm - before))
        spans = sum(result.seconds)
        result.cpu = {name: 100 * seconds / spans for name, seconds in used.items() if spans}
    except Exception as error:
        result.error = repr(error)
    finally:
        sampler.stop()
        client.close()
    result.peak = max((rss for _, rss in sampler.samples), default=0)
    result.samples = len(sampler.samples)
    return result
