"""The idempotency window end to end: a server, the workers, and a short window."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SERVER_ENV, api_client
from tests.support.postgres import create_test_database, drop_test_database
from tests.support.server import ServerProcess, WorkerProcess

WINDOW_SECONDS = 3
SHORT_WINDOW = {
    "DUCTOR_STREAMS_IDEMPOTENCY_WINDOW_SECONDS": str(WINDOW_SECONDS),
    "DUCTOR_STREAMS_SWEEP_INTERVAL_SECONDS": "0.2",
}


@pytest.fixture  # its own database: the short window would sweep the other tests' receipts
def short_window_server(postgres_admin_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    url, name = asyncio.run(create_test_database(postgres_admin_url))
    server = ServerProcess(database_url=url, data_dir=tmp_path / "server", env=SERVER_ENV)
    worker = WorkerProcess(database_url=url, data_dir=tmp_path / "worker", env=SHORT_WINDOW)
    try:
        server.start()
        worker.start()
        yield server
    finally:
        worker.stop()
        server.stop()
        asyncio.run(drop_test_database(postgres_admin_url, name))


async def test_a_key_past_the_window_is_a_new_append(
    short_window_server: ServerProcess, run_id: str
) -> None:
    async with api_client(short_window_server) as api:
        created = await api.post(
            f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
        )
        assert created.status_code == 201, created.text
        path = f"/runs/{run_id}/streams/s/records"
        headers = {"Idempotency-Key": "order-7"}
        first = await api.post(path, json={"records": [{"data": 1}]}, headers=headers)
        assert first.status_code == 201, first.text
        retry = await api.post(path, json={"records": [{"data": 1}]}, headers=headers)
        assert retry.status_code == 200 and retry.headers["Idempotent-Replayed"] == "true"
        assert retry.json() == first.json()
        other = await api.post(path, json={"records": [{"data": 2}]}, headers=headers)
        assert other.status_code == 422 and other.json()["code"] == "idempotency-key-reused"

        await asyncio.sleep(WINDOW_SECONDS)
        async with asyncio.timeout(30):  # the window, then a sweep, a few tenths apart
            while (
                answer := await api.post(path, json={"records": [{"data": 2}]}, headers=headers)
            ).status_code == 422:
                await asyncio.sleep(0.2)
        assert answer.status_code == 201, answer.text
        assert answer.json()["first_sequence"] == 2
        assert "Idempotent-Replayed" not in answer.headers
