"""Every example in the docs runs as pasted, against a real server, in the walk-through's order.

The README's walk-through, then each page of docs/ in turn: every fenced block that is meant to
run is run as a reader would, from a checkout-like directory (`.venv/`, `docs/` and the
development token file `.ductor-streams/dev-token`, with `DUCTOR_STREAMS_URL` set as the README
says for a server on another port):

- ```sh: in one shell session (a terminal: variables carry from block to block), one command at
  a time. Each must exit 0 and print no problem document, and where the block shows what a
  command prints (an own-line comment right after it that looks like output: `# 201`, `# {...}`,
  `# HTTP/1.1 200 OK ...`, `# : subscribed ...`), the output must match it: a status is the
  answer's (curl's `-w '%{http_code}'` line, its `-i` status line, or a problem's `status`), any
  other shape is a sequence of pieces (`...` or `…` between them) found in that order, spaces
  ignored. A read shown with its answer is read again for up to READ_AGAIN_SECONDS until it
  matches: the README says when an answer takes a moment (input delivery).
- ```sh background: a command that follows live until Ctrl-C, run "in another terminal": a fresh
  shell without the first one's variables, started before the next block and checked (its
  expected output, every piece) and interrupted after that block ran.
- ```python: a whole script, saved as a file and run with the project's Python; it must exit 0.
- ```json, ```text: shapes of answers and diagrams, never run.
- ```sh no-run, ```python no-run: not run, each for the reason NOT_RUN gives.

A block without a language fails the first test: each block says what it is."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.server import ROOT, ServerProcess, WorkerProcess

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"sh", "python"}
DATA = {"json", "text"}
FLAGS = {"no-run", "background"}
COMMAND_SECONDS = 120.0  # one command or script, under a loaded machine (not a speed check)
READ_AGAIN_SECONDS = 15.0
BACKGROUND_SECONDS = 15.0  # for a background command to show what it is expected to

# The blocks left out, by page and first line, each with its reason. Keep this short: every
# other block of those languages runs.
NOT_RUN = {
    ("README.md", "python3 dev.py serve"): "starts the server this test runs, and the suite",
    ("README.md", "open http://127.0.0.1:8080/console"): "opens a browser (tests/browser)",
    ("docs/benchmarks.md", "python3 dev.py bench"): "minutes of the whole machine each",
    ("docs/integrators.md", "# tests/integration/test_my_store.py"): "a template for your own",
    ("docs/integrators.md", "import os"): (
        "a DBOS or Restate workflow: it runs inside that engine; tests/integration/"
        "test_engines.py runs the same pattern (tests/engines/) against real engines"
    ),
    ("docs/integrators.md", "npm ci --prefix tests/engines"): "the engines' own tests and bench",
}


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    language: str
    flags: set[str]
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def first_line(self) -> str:
        return next((line for line in self.text.splitlines() if line.strip()), "")


def blocks_of(path: Path) -> list[Block]:
    page = str(path.relative_to(ROOT))
    found: list[Block] = []
    lines = path.read_text().splitlines()
    opening: tuple[int, str] | None = None
    body: list[str] = []
    for number, line in enumerate(lines, 1):
        if opening is None:
            if line.startswith("```"):
                opening, body = (number, line[3:].strip()), []
            continue
        if line.strip() == "```":
            words = opening[1].split()
            found.append(
                Block(page, opening[0], words[0] if words else "", set(words[1:]), "\n".join(body))
            )
            opening = None
        else:
            body.append(line)
    assert opening is None, f"{page}:{opening[0]}: a block is never closed"
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks_of(page)]


def skipped_for(block: Block) -> str | None:
    for (page, start), reason in NOT_RUN.items():
        if block.page == page and block.first_line.startswith(start):
            return reason
    return None


def test_every_block_says_what_it_is_and_only_the_listed_ones_are_left_out() -> None:
    blocks = all_blocks()
    assert blocks, "no blocks found"
    for block in blocks:
        assert block.language in RUN | DATA, f"{block.where}: say what it is (```sh, ```python, …)"
        assert block.flags <= FLAGS, f"{block.where}: unknown flags {block.flags - FLAGS}"
        assert not block.flags or block.language in RUN, f"{block.where}: flags on data"
        assert "background" not in block.flags or block.language == "sh", block.where
        if "no-run" in block.flags:
            assert skipped_for(block), f"{block.where}: no-run without a reason in NOT_RUN"
        else:
            assert not skipped_for(block), f"{block.where}: in NOT_RUN but not marked no-run"
    for (page, start), _ in NOT_RUN.items():
        assert any(b.page == page and b.first_line.startswith(start) for b in blocks), (
            f"NOT_RUN names a block that is gone: {page}: {start}"
        )


# -- shell commands and what they are shown to print -------------------------------------------


@dataclass
class Command:
    text: str
    line: int  # within the block, 1-based
    expected: list[str] = field(default_factory=list)  # the comment lines that show its output
    shown: bool = False  # what follows it is no longer its output (a blank line, prose)

    @property
    def is_read(self) -> bool:
        """A curl that only reads (no method, no body): safe to send again."""
        return self.text.lstrip().startswith("curl ") and not re.search(
            r"\s(-X|-d|--data|-T)\b", self.text
        )


OUTPUT_LIKE = re.compile(r"^(\{|\[|:|HTTP/|\d{3}\b|(event|id|data):)")


def is_complete(text: str) -> bool:
    if text.rstrip().endswith("\\"):
        return False
    checked = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    return checked.returncode == 0


def commands_of(block: Block) -> list[Command]:
    """The block's commands (a command ends where bash would run it), each with the output-like
    comment lines right after it."""
    commands: list[Command] = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(block.text.splitlines(), 1):
        stripped = line.strip()
        last = commands[-1] if commands else None
        if not pending and (not stripped or stripped.startswith("#")):
            if last is not None:
                shown = stripped[1:].strip()
                goes_on = last.expected and shown.startswith(("...", "…"))  # its next line
                if stripped and not last.shown and (OUTPUT_LIKE.match(shown) or goes_on):
                    last.expected.append(shown)
                else:
                    last.shown = True
            continue
        if not pending:
            start = number
        pending.append(line)
        if is_complete("\n".join(pending)):
            commands.append(Command("\n".join(pending), start))
            pending = []
    assert not pending, f"{block.where}: an incomplete command at its end"
    return commands


def status_of(output: str) -> int | None:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if not lines:
        return None
    if match := re.match(r"HTTP/\S+ (\d{3})", lines[0]):
        return int(match.group(1))
    if re.fullmatch(r"\d{3}", lines[-1].strip()):
        return int(lines[-1])
    try:
        body = json.loads(output)
    except ValueError:
        return None
    if isinstance(body, dict) and isinstance(body.get("status"), int) and "code" in body:
        return body["status"]
    return None


def mismatch(expected: list[str], output: str) -> str | None:
    """Why `output` is not what the comments show, or None when it is."""
    if not expected:
        if (status := status_of(output)) is not None and status >= 400:
            return f"answered {status}"
        if "https://ductor.dev/problems/" in output:
            return "printed a problem"
        return None
    if match := re.match(r"(\d{3})\b", expected[0]):
        status = status_of(output)
        return None if status == int(match.group(1)) else f"answered {status}, shown {match[1]}"
    flat = re.sub(r"\s+", "", output)
    position = 0
    for piece in re.split(r"\.\.\.|…", re.sub(r"\s+", "", "".join(expected))):
        found = flat.find(piece, position)
        if found < 0:
            return f"{piece!r} not found (in order) in the output"
        position = found + len(piece)
    return None


class Terminal:
    """One interactive-like bash session: commands one at a time, variables kept."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def run(self, command: str) -> tuple[int, str]:
        assert self.process.stdin is not None
        marker = f"__done_{uuid.uuid4().hex}__"
        # Its stdin is not the session's: a command that reads stdin gets nothing, as it would
        # from a terminal where nothing is typed, and never eats the commands that follow.
        self.process.stdin.write(f"{{\n{command}\n}} < /dev/null\nprintf '\\n{marker} %s\\n' $?\n")
        self.process.stdin.flush()
        output: list[str] = []
        deadline = time.monotonic() + COMMAND_SECONDS
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no end within {COMMAND_SECONDS} s; printed so far:\n{''.join(output)}"
                ) from None
            if line.startswith(marker):
                text = "".join(output)
                return int(line.split()[1]), text[:-1] if text.endswith("\n") else text
            output.append(line)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


class Background:
    """A command run in another terminal: a fresh shell, output collected as it comes."""

    def __init__(self, block: Block, cwd: Path, env: dict[str, str]) -> None:
        self.block = block
        self.commands = commands_of(block)
        self.process = subprocess.Popen(
            ["bash", "--norc", "--noprofile", "-c", block.text],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.output = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        # Like a reader who starts it, then turns to the other terminal: it has connected (it
        # printed something) or had a moment to.
        deadline = time.monotonic() + 3
        while not self.output and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def _read(self) -> None:
        assert self.process.stdout is not None
        while chunk := self.process.stdout.read1(65536):  # type: ignore[attr-defined]
            self.output.extend(chunk)

    def text(self) -> str:
        return self.output.decode(errors="replace")

    def check_and_stop(self) -> None:
        expected = [line for command in self.commands for line in command.expected]
        deadline = time.monotonic() + BACKGROUND_SECONDS
        while (why := mismatch(expected, self.text())) and time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.reader.join(5)  # it ended: what it printed last, read to the end first
                break
            time.sleep(0.1)
        why = mismatch(expected, self.text())
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)  # Ctrl-C
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
            code = 0
        else:
            code = self.process.returncode  # it ended by itself: it must have ended well
        self.reader.join(5)
        assert why is None and code == 0, (
            f"{self.block.where} (another terminal): {why or f'exit {code}'}\n{self.text()}"
        )


# -- the walk-through --------------------------------------------------------------------------


@dataclass
class Checkout:
    path: Path
    server_url: str
    database_url: str

    def environment(self) -> dict[str, str]:
        """A reader's shell: no DUCTOR_STREAMS_* of the tests, the project's .venv not on PATH
        (the docs say .venv/bin/… where they need it); the server's URL exported as the README
        says to for a server on another port, and the database the token commands use (a
        `serve` on the embedded defaults shares its own with them)."""
        venv_bin = str(Path(sys.prefix) / "bin")
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("DUCTOR_STREAMS_", "PYTEST_", "VIRTUAL_ENV"))
        }
        env["PATH"] = os.pathsep.join(
            p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin
        )
        env["DUCTOR_STREAMS_URL"] = self.server_url
        env["DUCTOR_STREAMS_DATABASE_URL"] = self.database_url
        return env


@pytest.fixture(scope="module")
def checkout(own_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Checkout]:
    """A server and its workers on a database of their own, and a directory a reader would run
    the examples from: `.venv` (this one), the pages, and the development token file."""
    data = tmp_path_factory.mktemp("docs-server")
    env = {**SERVER_ENV, "DUCTOR_STREAMS_POOL_MIN_SIZE": "1", "DUCTOR_STREAMS_POOL_MAX_SIZE": "4"}
    server = ServerProcess(database_url=own_database, data_dir=data, env=env).start()
    worker = WorkerProcess(database_url=own_database, data_dir=data, env=env).start()
    where = tmp_path_factory.mktemp("checkout")
    (where / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    (where / "docs").symlink_to(ROOT / "docs", target_is_directory=True)
    (where / "README.md").symlink_to(ROOT / "README.md")
    (where / ".ductor-streams").mkdir()
    (where / ".ductor-streams" / "dev-token").write_text(BOOTSTRAP_TOKEN + "\n")
    yield Checkout(where, server.base_url, own_database)
    worker.stop()
    server.stop()


def run_shell(terminal: Terminal, block: Block) -> None:
    for command in commands_of(block):
        deadline = time.monotonic() + READ_AGAIN_SECONDS
        while True:
            code, output = terminal.run(command.text)
            why = f"exit {code}" if code else mismatch(command.expected, output)
            if why is None or not (command.is_read and command.expected and not code):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert why is None, (
            f"{block.where}+{command.line}: {why}\n$ {command.text}\n{output}\n"
            f"shown: {command.expected}"
        )


def run_python(block: Block, checkout: Path, env: dict[str, str]) -> None:
    script = checkout / f"example_{block.page.replace('/', '_')}_{block.line}.py"
    script.write_text(block.text + "\n")
    done = subprocess.run(
        [str(checkout / ".venv" / "bin" / "python"), script.name],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
    )
    assert done.returncode == 0, (
        f"{block.where}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    )


def test_every_example_runs_as_pasted_in_the_walk_through_order(checkout: Checkout) -> None:
    env = checkout.environment()
    where = checkout.path
    terminal = Terminal(where, env)
    waiting: list[Background] = []
    ran = 0
    try:
        for block in all_blocks():
            if block.language not in RUN or "no-run" in block.flags:
                continue
            ran += 1
            if "background" in block.flags:
                waiting.append(Background(block, where, env))
                continue
            if block.language == "sh":
                run_shell(terminal, block)
            else:
                run_python(block, where, env)
            # The other terminals show what this block did: check them, then Ctrl-C.
            for background in waiting:
                background.check_and_stop()
            waiting = []
        for background in waiting:
            background.check_and_stop()
    finally:
        for background in waiting:
            if background.process.poll() is None:
                os.killpg(background.process.pid, signal.SIGKILL)
        terminal.close()
    assert ran >= 20, ran  # the README's blocks and the client's, at least


def test_the_command_splitter_and_the_output_matcher_mean_what_they_say() -> None:
    """The checks above can fail: a wrong status, a missing piece, a problem printed."""
    block = Block(
        "x.md",
        1,
        "sh",
        set(),
        "A=1\ncurl -s -X POST $API \\\n  -d '{\"a\":\n 1}'\n# 201\n# prose\nB=2   # a comment\n",
    )
    commands = commands_of(block)
    assert [c.text.split()[0] for c in commands] == ["A=1", "curl", "B=2"]
    assert commands[1].expected == ["201"] and commands[2].expected == []
    assert mismatch(["201"], "201") is None
    assert mismatch(["201"], "409") is not None
    assert mismatch(["204"], "HTTP/1.1 204 No Content\ndate: x\n") is None
    problem = '{"type":"https://ductor.dev/problems/not-found","status":404,"code":"not-found"}'
    assert mismatch([], problem) == "answered 404"
    assert mismatch(["409: held"], problem.replace("404", "409")) is None
    assert (
        mismatch(['{"head":2,...,"closed":true...}'], '{"head": 2, "x": 1, "closed": true}') is None
    )
    assert mismatch(['{"head":3...}'], '{"head":2}') is not None
    assert (
        mismatch([": subscribed ... id: 2", "event: closed"], ": subscribed\n\nid: 1\n") is not None
    )
    follows = Block("x.md", 1, "sh", {"background"}, 'tail\n# {"n":1}\n# ... {"n":2}\n# prose\n')
    assert commands_of(follows)[0].expected == ['{"n":1}', '... {"n":2}']
