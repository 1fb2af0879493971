#!/usr/bin/env python3
"""Set-up a newcomer can trust: `python3 dev.py serve` and `python3 dev.py test`.

Needs only Python 3.11+. Each command creates `.venv/` beside this file on first use and
installs the project into it (again whenever `pyproject.toml` changes): `serve` installs the
project alone, the other commands add its test tools (the `test` extra). Then it runs:

  serve [ARGS...]   `ductor-streams serve` on the embedded defaults (embedded PostgreSQL and a
                    filesystem object store under ./.ductor-streams), webhooks allowed to this
                    machine's own receivers (DUCTOR_STREAMS_WEBHOOK_LOOPBACK, unless set);
                    extra ARGS are passed on.
  test [ARGS...]    ruff (lint and format check), the import-linter layer contract, mypy
                    (over src/, as [tool.mypy] in pyproject.toml says), then the whole pytest
                    suite, three test files at a time (pytest-xdist); extra ARGS go to
                    pytest (e.g. `-m "not slow"`; `-n 0` runs it in one process).
  bench [ARGS...]   the benchmarks in bench/ (docs/benchmarks.md).
  run CMD...        a command inside the environment: `python3 dev.py run ductor-streams -h`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".installed"


def _bin(name: str) -> str:
    return str(VENV / ("Scripts" if os.name == "nt" else "bin") / name)


def _stamped(stamp: str) -> tuple[str, set[str]]:
    """What a stamp says is installed: the hash of the pyproject.toml it was installed from, and
    its extras. A stamp of the older format (the hash alone) was written after installing the
    test extra, which was then always installed."""
    wanted, marker, extras = stamp.strip().partition(" extras=")
    return wanted, set(extras.split(",")) - {""} if marker else {"test"}


def _plan(stamp: str, wanted: str, extras: set[str]) -> tuple[set[str], str] | None:
    """What to install for a command that needs `extras` (empty: the project alone), given the
    stamp of what is installed and the hash of pyproject.toml now: None when it is all in place,
    else the extras to install and the stamp to write once they are."""
    stamped, installed = _stamped(stamp)
    if stamped != wanted:
        installed = set()  # installed from another pyproject.toml: none of it counts
    elif extras <= installed:
        return None
    return extras, f"{wanted} extras={','.join(sorted(installed | extras))}\n"


def _ensure_environment(extras: set[str]) -> None:
    """`serve` needs only the project (`extras` empty); `test`, `bench` and `run` need its test
    tools too (`{"test"}`). One .venv holds both: the stamp says what was installed from which
    pyproject.toml, so `test` after `serve` adds the extra and `serve` after `test` installs
    nothing. pip's own output shows the progress (a fresh `serve` takes about a minute)."""
    if sys.version_info < (3, 11):  # noqa: UP036 - this file must run on any python3
        sys.exit("ductor-streams needs Python 3.11 or newer")
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    plan = _plan(STAMP.read_text() if STAMP.exists() else "", wanted, extras)
    if plan is None:
        return
    extras, stamp = plan
    if not VENV.exists():
        print("dev.py: creating .venv ...", file=sys.stderr, flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    what = "ductor-streams and its test tools" if extras else "ductor-streams"
    print(f"dev.py: installing {what} into .venv ...", file=sys.stderr, flush=True)
    target = f"{ROOT}[{','.join(sorted(extras))}]" if extras else str(ROOT)
    pip = [_bin("python"), "-m", "pip", "--disable-pip-version-check"]
    # pip's progress goes to stderr: stdout stays the command's own (serve's token and URL).
    subprocess.run([*pip, "install", "-e", target], check=True, cwd=ROOT, stdout=sys.stderr)
    STAMP.write_text(stamp)
    print("dev.py: .venv is ready", file=sys.stderr, flush=True)


# Test files run this many at a time, each file whole in one process (its module fixtures, a
# server or a database of its own, start once). Most of the suite waits on real time (leases,
# backoffs, servers starting, processes killed), so three processes finish a full run in about
# half the time of one on two cores. `-n 0` (or any `-n`/`-p no:xdist`) among the arguments
# overrides it, and `--pdb`, `--trace` or `-s` (which need the terminal) run in one process.
TEST_PROCESSES = 3


def _parallel(pytest_args: list[str]) -> list[str]:
    """pytest-xdist's arguments for `test`, unless the caller chose how to run."""
    chosen = any(
        a in {"-n", "--numprocesses", "no:xdist", "-pno:xdist", "--pdb", "--trace", "-s"}
        or a.startswith(("-n", "--numprocesses=", "--dist", "--capture=no"))
        for a in pytest_args
    )
    return [] if chosen else ["-n", str(TEST_PROCESSES), "--dist", "loadfile"]


CHROMIUM = Path("/usr/bin/chromium")
BROWSER_TESTS = ROOT / "tests" / "browser"


def _ensure_chromium(pytest_args: list[str]) -> None:
    """The browser tests drive Debian's Chromium (playwright never downloads a browser): when
    it is missing, install it as root through apt; otherwise stop with what to do. Skipped when
    the pytest arguments name only paths outside tests/browser."""
    named = [(ROOT / a.split("::")[0]).resolve() for a in pytest_args if not a.startswith("-")]
    paths = [p for p in named if p.exists()]
    related = {BROWSER_TESTS, *BROWSER_TESTS.parents}  # the folder, or one that holds it
    if paths and not any(p in related or BROWSER_TESTS in p.parents for p in paths):
        return
    if CHROMIUM.exists():
        return
    if os.name == "posix" and os.geteuid() == 0 and shutil.which("apt-get"):
        print(
            "installing chromium for the browser tests (apt-get) ...", file=sys.stderr, flush=True
        )
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "chromium"], check=True, env=env)
        if CHROMIUM.exists():
            return
    sys.exit(
        f"the browser tests need Chromium at {CHROMIUM}; install it as root: "
        "apt-get update && apt-get install -y chromium"
    )


def _ensure_wrk() -> None:
    """The benchmarks' load generator is wrk (C; its fallback, a Python client, spends more of
    the 2 cores it shares with the server): when it is missing, install it as root through apt;
    otherwise the bench says it fell back."""
    if shutil.which("wrk") or not (os.name == "posix" and os.geteuid() == 0):
        return
    if shutil.which("apt-get"):
        print("installing wrk for the benchmarks (apt-get) ...", file=sys.stderr, flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update"], check=False, env=env)
        subprocess.run(["apt-get", "install", "-y", "wrk"], check=False, env=env)


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(_bin("python")).parent) + os.pathsep + env.get("PATH", "")
    return env


def _exec(argv: list[str]) -> int:
    return subprocess.run(argv, cwd=ROOT, env=_environment()).returncode


def _become(argv: list[str]) -> int:
    """Run `argv` as this very process on POSIX, so that a signal sent to `python3 dev.py …`
    (SIGTERM, or Ctrl-C) reaches the server, which then stops all it started. Elsewhere the
    child shares the console, which delivers Ctrl-C to both."""
    if os.name != "posix":
        return _exec(argv)
    os.chdir(ROOT)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, _environment())


def main(args: list[str]) -> int:
    if not args or args[0] in {"-h", "--help", "help"}:
        print(__doc__)
        return 0
    command, rest = args[0], args[1:]
    _ensure_environment(set() if command == "serve" else {"test"})
    if command == "serve":
        # A developer's webhook receiver listens on this machine (docs/client.md's does).
        os.environ.setdefault("DUCTOR_STREAMS_WEBHOOK_LOOPBACK", "true")
        return _become([_bin("ductor-streams"), "serve", *rest])
    if command == "test":
        for step in (
            [_bin("ruff"), "check", "."],
            [_bin("ruff"), "format", "--check", "."],
            [_bin("lint-imports")],
            [_bin("mypy")],
        ):
            if code := _exec(step):
                return code
        _ensure_chromium(rest)
        return _exec([_bin("python"), "-m", "pytest", *_parallel(rest), *rest])
    if command == "bench":
        _ensure_wrk()
        return _become([_bin("python"), "-m", "bench", *rest])
    if command == "run":
        return _exec(rest)
    print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
