"""dev.py's one .venv: `serve` installs the project alone, `test` adds its test tools, and the
stamp says which of them were installed from which pyproject.toml."""

from __future__ import annotations

import importlib.util

from tests.support.server import ROOT

_spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
assert _spec is not None and _spec.loader is not None
dev = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dev)

NOW = "a" * 64
BEFORE = "b" * 64
SERVE: set[str] = set()
TEST = {"test"}


def test_a_fresh_serve_installs_the_project_without_the_test_tools() -> None:
    assert dev._plan("", NOW, SERVE) == (set(), f"{NOW} extras=\n")


def test_test_after_serve_installs_the_test_extra() -> None:
    assert dev._plan(f"{NOW} extras=\n", NOW, TEST) == ({"test"}, f"{NOW} extras=test\n")


def test_serve_after_test_installs_nothing() -> None:
    assert dev._plan(f"{NOW} extras=test\n", NOW, SERVE) is None
    assert dev._plan(f"{NOW} extras=test\n", NOW, TEST) is None


def test_serve_after_serve_installs_nothing() -> None:
    assert dev._plan(f"{NOW} extras=\n", NOW, SERVE) is None


def test_a_changed_pyproject_reinstalls_and_counts_nothing_of_the_old_install() -> None:
    # serve installs the project again; the stamp no longer vouches for the test tools, so a
    # later `test` installs them again too.
    assert dev._plan(f"{BEFORE} extras=test\n", NOW, SERVE) == (set(), f"{NOW} extras=\n")
    assert dev._plan(f"{BEFORE} extras=test\n", NOW, TEST) == ({"test"}, f"{NOW} extras=test\n")


def test_a_stamp_of_the_older_format_stood_for_the_test_extra() -> None:
    # Before the split every install had the test extra, and the stamp was the hash alone.
    assert dev._plan(f"{NOW}\n", NOW, SERVE) is None
    assert dev._plan(f"{NOW}\n", NOW, TEST) is None
    assert dev._plan(f"{BEFORE}\n", NOW, TEST) == ({"test"}, f"{NOW} extras=test\n")


def test_serve_needs_no_test_tool_and_the_other_commands_do() -> None:
    seen: list[set[str]] = []
    dev._ensure_environment = seen.append  # the plan above decides; nothing is installed here
    dev._become = lambda argv: 0
    dev._exec = lambda argv: 0
    dev._ensure_chromium = lambda args: None
    dev._ensure_wrk = lambda: None
    for command in ("serve", "test", "bench", "run"):
        dev.main([command, "true"])
    assert seen == [SERVE, TEST, TEST, TEST]


def test_the_suite_runs_three_files_at_a_time_unless_the_caller_chose() -> None:
    assert dev._parallel([]) == ["-n", "3", "--dist", "loadfile"]
    assert dev._parallel(["-m", "not slow", "tests/unit"]) == ["-n", "3", "--dist", "loadfile"]
    for chosen in (
        ["-n", "0"],
        ["-n4"],
        ["--numprocesses=2"],
        ["-p", "no:xdist"],
        ["-pno:xdist"],
        ["--pdb"],
        ["--trace"],
        ["-s"],
        ["--capture=no"],
    ):
        assert dev._parallel(chosen) == [], chosen
