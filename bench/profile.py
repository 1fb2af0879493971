"""Sample the server with py-spy while a load runs, and summarise the hot spots."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*)\)$")


def py_spy() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


def start(
    pid: int, duration: float, out: Path, *, native: bool = False, rate: int = 200
) -> subprocess.Popen[bytes]:
    """py-spy on the server and its worker processes. Without `native` it samples without
    pausing the server (--nonblocking); `native` (C/Cython/Rust frames) has to pause it."""
    exe = py_spy()
    if exe is None:
        raise RuntimeError("py-spy is not installed: .venv/bin/pip install py-spy")
    return subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--subprocesses",
            "--native" if native else "--nonblocking",
            "--nolineno",
            "--rate",
            str(rate),
            "--duration",
            str(max(1, round(duration))),
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def finish(spy: subprocess.Popen[bytes], raw: Path, keep_as: str | None = None) -> str | None:
    """Wait for py-spy (started by `start`), then summarise what it sampled into `raw`; None,
    with py-spy's words on stderr, when it sampled nothing. With `keep_as`, the raw stacks are
    also copied to that name in the temporary directory."""
    _, err = spy.communicate(timeout=60)
    if not raw.exists() or not raw.stat().st_size:
        print(f"py-spy failed: {err.decode()[-2000:]}", file=sys.stderr)
        return None
    if keep_as is not None:
        shutil.copy(raw, Path(tempfile.gettempdir()) / keep_as)
    return summarise(raw)


def _short(frame: str) -> str:
    match = _FRAME.match(frame)
    if not match:
        return frame
    file = match["file"]
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{match['func']} ({file})"


# Frames up to the granian worker's entry are process bootstrap; a sample whose stack ends there
# is time spent in native code under it (granian's Rust HTTP runtime, uvloop's C event loop).
_WORKER_ENTRY = "_spawn_asgi_lifespan_worker"
_NATIVE = "[native: granian runtime / uvloop, below the worker entry]"
_GROUPS = (
    ("litestar/", "litestar"),
    ("asyncpg/", "asyncpg"),
    ("anyio/", "anyio"),
    ("msgspec/", "msgspec"),
    ("asyncio/", "asyncio (stdlib)"),
    ("granian/", "granian (Python side)"),
    ("application/", "ductor-streams application/"),
    ("domain/", "ductor-streams domain/"),
    ("adapters/", "ductor-streams adapters/"),
    ("entrypoints/", "ductor-streams entrypoints/"),
)


def _group(frame: str) -> str:
    if frame == _NATIVE:
        return "native (granian / uvloop / C extensions)"
    match = _FRAME.match(frame)
    file = match["file"] if match else frame
    for prefix, name in _GROUPS:
        if file.startswith(prefix) or f"/{prefix}" in file:
            return name
    if not file.endswith(".py"):
        return "native (granian / uvloop / C extensions)"
    return "other Python"


def summarise(raw: Path, top: int = 15) -> str:
    """Top functions by own (leaf) samples and by inclusive samples, and own samples by package,
    as % of all samples (py-spy leaves idle threads out: this is the server's busy time)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    groups: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [
            _short(f)
            for f in stack.split(";")
            if not f.startswith(("process ", "thread ")) and "(" in f
        ]
        entry = next((i for i, f in enumerate(frames) if _WORKER_ENTRY in f), None)
        if entry is not None:
            frames = frames[entry + 1 :] or [_NATIVE]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        groups[_group(frames[-1])] += n
        for frame in set(frames):
            inclusive[frame] += n
    if not total:
        return "no samples"
    lines = [f"{total} samples", "", "own time by package:"]
    lines += [f"  {100 * n / total:5.1f}%  {g}" for g, n in groups.most_common()]
    lines += ["", f"top {top} functions by own time (leaf frame):"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines += ["", f"top {top} functions by inclusive time (lower bounds: sampling without pausing"]
    lines += ["the server can cut a coroutine stack short):"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(top)]
    return "\n".join(lines)
