"""Data handling: redacted values and record payloads leave no trace where they must not."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import asyncpg
import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.conftest import SERVER_ENV, api_client
from tests.support.server import ServerProcess


async def occurrences(pool: asyncpg.Pool, marker: str) -> dict[str, int]:
    """Rows of every table whose text form holds the marker, as text or as bytea hex."""
    tables = await pool.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
    )
    found = {}
    for (table,) in tables:
        count = await pool.fetchval(
            f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE $1 OR t::text LIKE $2',
            f"%{marker}%",
            f"%{marker.encode().hex()}%",
        )
        if count:
            found[table] = count
    return found


async def test_a_redacted_value_is_nowhere_in_postgresql(
    api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str
) -> None:
    secret = "ssn-" + secrets.token_hex(8)
    kept = "kept-" + secrets.token_hex(8)
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={
            "stream_id": "r",
            "direction": "output",
            "redaction": {"json_pointers": ["/user/ssn"]},
        },
    )
    assert created.status_code == 201
    appended = await api.post(
        f"/runs/{run_id}/streams/r/records",
        headers={"Idempotency-Key": "k1"},
        json={"records": [{"data": {"user": {"ssn": secret, "name": kept}}}]},
    )
    assert appended.status_code == 201
    assert await occurrences(pool, secret) == {}
    assert await occurrences(pool, kept) == {"stream_records": 1}  # the check can see payloads


@pytest.fixture(scope="module")
def chatty_server(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("chatty"),
        env={**SERVER_ENV, "DUCTOR_STREAMS_LOG_LEVEL": "DEBUG"},
    ).start()
    yield process
    process.stop()


async def test_record_payloads_never_appear_in_the_logs(
    chatty_server: ServerProcess, run_id: str
) -> None:
    marker = "payload-" + secrets.token_hex(8)
    async with api_client(chatty_server) as api:
        base = f"/runs/{run_id}/streams/p"
        assert (
            await api.post(
                f"/runs/{run_id}/streams", json={"stream_id": "p", "direction": "output"}
            )
        ).status_code == 201
        async with aconnect_sse(api, "GET", f"{base}/subscribe") as source:
            for i in range(3):
                body = {"records": [{"data": {"m": marker, "i": i}}]}
                assert (await api.post(f"{base}/records", json=body)).status_code == 201
            seen = []
            async with asyncio.timeout(10):
                async for event in source.aiter_sse():
                    if event.event == "record":
                        seen.append(event.data)
                    if len(seen) == 3:
                        break
        assert all(marker in s for s in seen)
        page = await api.get(f"{base}/records", params={"cursor": 0})
        assert marker in page.text
        bad = await api.post(f"{base}/records", json={"records": [{"data": marker, "x": 1}]})
        assert bad.status_code == 400
        await api.post(f"{base}/close")
    log = chatty_server.log()
    assert log  # DEBUG logging did write something
    assert marker not in log
