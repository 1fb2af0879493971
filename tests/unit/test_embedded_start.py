"""`serve` on the embedded defaults when the PostgreSQL it starts dies while starting (its
postmaster killed: pg_ctl fails): started again, or one line and exit 2, never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from entrypoints import bootstrap
from entrypoints.bootstrap import CommandError, database_url
from entrypoints.config import Settings


def failing(times: int, calls: list[Path]):  # type: ignore[no-untyped-def]
    def start(pgdata: Path) -> str:
        calls.append(pgdata)
        if len(calls) <= times:
            raise subprocess.CalledProcessError(1, ["pg_ctl", "start"])
        return "postgresql://postgres@/postgres?host=" + str(pgdata)

    return start


def test_a_start_that_fails_once_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(bootstrap, "start_embedded", failing(1, calls))
    monkeypatch.delenv("DUCTOR_STREAMS_DATABASE_URL", raising=False)
    url = database_url(Settings(data_dir=tmp_path))
    assert url.endswith(str(tmp_path / "pg")) and len(calls) == 2


def test_a_start_that_keeps_failing_is_one_line_naming_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(bootstrap, "start_embedded", failing(99, calls))
    with pytest.raises(CommandError) as refused:
        database_url(Settings(data_dir=tmp_path))
    assert str(tmp_path / "pg" / "log") in str(refused.value)
    assert len(calls) == bootstrap.EMBEDDED_STARTS
