"""Session fixtures: PostgreSQL (see tests/support/postgres.py) and a real server process."""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # make `tests.support` importable
pytest.register_assert_rewrite("tests.support")

from adapters.postgres.tokens import PostgresTokens  # noqa: E402
from application.access import SCOPES  # noqa: E402
from application.tokens import IssueToken, make_caller  # noqa: E402
from tests.support.postgres import (  # noqa: E402
    create_test_database,
    drop_test_database,
    postgres_server,
)
from tests.support.seaweedfs import SeaweedFS, seaweedfs  # noqa: E402, F401  (a session fixture)
from tests.support.server import ServerProcess  # noqa: E402


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def database_url(postgres_admin_url: str) -> Iterator[str]:
    url, name = asyncio.run(create_test_database(postgres_admin_url))
    yield url
    asyncio.run(drop_test_database(postgres_admin_url, name))


@pytest.fixture(scope="module")
def own_database(postgres_admin_url: str) -> Iterator[str]:
    """A database of the requesting test module's own, for tests that run workers: no other
    test's workers claim its jobs, and its workers claim no other test's."""
    url, name = asyncio.run(create_test_database(postgres_admin_url))
    yield url
    asyncio.run(drop_test_database(postgres_admin_url, name))


@pytest.fixture
async def own_pool(own_database: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(own_database, min_size=1, max_size=4)
    yield pool
    await pool.close()


@pytest.fixture(scope="session")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=10)
    yield pool
    await pool.close()


class Tokens:
    """Issue tokens straight into the database the server reads."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._issue = IssueToken(PostgresTokens(pool))

    async def create(
        self,
        tenant: str = "default",
        principal: str = "tester",
        scopes: tuple[str, ...] = SCOPES,
        expires_in_seconds: int | None = None,
    ) -> str:
        caller = make_caller(tenant, principal, list(scopes))
        return await self._issue(caller, expires_in_seconds=expires_in_seconds)

    async def client(self, server: ServerProcess, tenant: str) -> httpx.AsyncClient:
        """An HTTP client of `server` (at its root), with a new token of `tenant`'s."""
        token = await self.create(tenant=tenant)
        return httpx.AsyncClient(
            base_url=server.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )


@pytest.fixture(scope="session")
def tokens(pool: asyncpg.Pool) -> Tokens:
    return Tokens(pool)


BOOTSTRAP_TOKEN = "dst_bootstrap_" + secrets.token_hex(8)


# Short live-delivery intervals so tests observe heartbeats and repairs quickly.
SERVER_ENV = {
    "DUCTOR_STREAMS_BOOTSTRAP_TOKEN": BOOTSTRAP_TOKEN,
    "DUCTOR_STREAMS_SSE_HEARTBEAT_SECONDS": "1",
    "DUCTOR_STREAMS_HEAD_CHECK_SECONDS": "0.5",
    "DUCTOR_STREAMS_MAX_SUBSCRIPTIONS_PER_PRINCIPAL": "50",
    "DUCTOR_STREAMS_LONG_POLL_SECONDS": "1",
}


@pytest.fixture(scope="session")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real `ductor-streams serve` process for the session; tests isolate by run ID."""
    process = ServerProcess(
        database_url=database_url, data_dir=tmp_path_factory.mktemp("server"), env=SERVER_ENV
    ).start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def uvicorn_server(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server process like `server`, under `serve --server uvicorn`."""
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("server-uvicorn"),
        env=SERVER_ENV,
        args=["--server", "uvicorn"],
    ).start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def s3_server(
    database_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    seaweedfs: SeaweedFS,  # noqa: F811  (the fixture imported above)
) -> Iterator[ServerProcess]:
    """A server process like `server` that keeps object bodies in S3 (a real SeaweedFS store)."""
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("server-s3"),
        env={**SERVER_ENV, **seaweedfs.client_env()},
    ).start()
    yield process
    process.stop()


def on_each_object_store(request: pytest.FixtureRequest, server: ServerProcess) -> ServerProcess:
    """For a module's `server` fixture parametrized over ["filesystem", "s3"]: the session's
    server (bodies in files) or `s3_server` (bodies in SeaweedFS)."""
    if request.param == "s3":
        return request.getfixturevalue("s3_server")
    return server


@pytest.fixture(scope="session")
def server_b(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A second server process on the same PostgreSQL (another replica)."""
    process = ServerProcess(
        database_url=database_url, data_dir=tmp_path_factory.mktemp("server-b"), env=SERVER_ENV
    ).start()
    yield process
    process.stop()


@pytest.fixture
def run_id() -> str:
    return "run-" + secrets.token_hex(6)


def api_client(server: ServerProcess, token: str = BOOTSTRAP_TOKEN) -> httpx.AsyncClient:
    """An HTTP client on the API prefix of `server`, authenticated with `token`."""
    return httpx.AsyncClient(
        base_url=server.base_url + "/api/workflow-streams",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


@pytest.fixture
async def api(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on the API prefix, authenticated as the bootstrap principal."""
    async with api_client(server) as client:
        yield client


@pytest.fixture
async def api_b(server_b: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    """The same, on the second server process."""
    async with api_client(server_b) as client:
        yield client
