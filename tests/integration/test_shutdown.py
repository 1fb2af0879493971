"""Stopping a server with live subscribers: SIGTERM ends each subscription cleanly (the client
resumes elsewhere with Last-Event-ID) and the process exits, instead of draining forever."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.server import ServerProcess

PREFIX = "/api/workflow-streams"


def quiet_server(database_url: str, data_dir: Path, *args: str) -> ServerProcess:
    """A server of its own (it is stopped by the test), without heartbeats during the test."""
    server = ServerProcess(
        database_url=database_url,
        data_dir=data_dir,
        env={**SERVER_ENV, "DUCTOR_STREAMS_SSE_HEARTBEAT_SECONDS": "60"},
        args=list(args),
    ).start()
    assert server.process is not None
    return server


def client_of(server: ServerProcess) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.base_url + PREFIX,
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
        timeout=60,
    )


async def create_stream(api: httpx.AsyncClient, run_id: str) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
    )
    assert created.status_code == 201, created.text


async def test_sigterm_ends_live_subscriptions_and_the_server_exits(
    database_url: str, tmp_path_factory: pytest.TempPathFactory, run_id: str
) -> None:
    server = quiet_server(database_url, tmp_path_factory.mktemp("shutdown"))
    assert server.process is not None
    try:
        async with client_of(server) as api:
            await create_stream(api, run_id)
            appended = await api.post(
                f"/runs/{run_id}/streams/s/records",
                json={"records": [{"data": n} for n in range(3)]},
            )
            assert appended.status_code == 201, appended.text

            events: list[tuple[str, str]] = []
            got_all = asyncio.Event()

            async def follow() -> None:
                url = f"/runs/{run_id}/streams/s/subscribe?cursor=0"
                async with aconnect_sse(api, "GET", url) as source:
                    async for event in source.aiter_sse():
                        events.append((event.event, event.id))
                        if len(events) == 3:
                            got_all.set()

            followers = [asyncio.create_task(follow()) for _ in range(3)]
            async with asyncio.timeout(15):
                await got_all.wait()
            await asyncio.sleep(0.2)  # every follower is connected and idle

            server.process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(20):
                # each response ends by itself; none is cut by the test
                await asyncio.gather(*followers)
            code = await asyncio.to_thread(server.process.wait, 20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not exit after SIGTERM:\n{server.log()}")
    finally:
        server.stop()

    assert code == 0, server.log()
    records = [e for e in events if e[0] == "record"]
    assert len(records) == 9  # 3 records to each of 3 subscribers
    assert not any(name == "closed" for name, _ in events)  # the stream itself is still open
    assert "Traceback" not in server.log()


@pytest.mark.slow
async def test_a_supervised_server_with_a_live_subscriber_stops_within_its_kill_timeout(
    database_url: str, tmp_path_factory: pytest.TempPathFactory, run_id: str
) -> None:
    """`serve --supervised`: granian's supervisor stops a worker that is still draining after
    10 s; the subscriber's connection ends and the whole process group exits."""
    server = quiet_server(
        database_url, tmp_path_factory.mktemp("shutdown-supervised"), "--supervised"
    )
    assert server.process is not None
    try:
        async with client_of(server) as api:
            await create_stream(api, run_id)
            opened = asyncio.Event()

            async def follow() -> None:
                url = f"/runs/{run_id}/streams/s/subscribe?cursor=0"
                async with api.stream("GET", url) as response:
                    assert response.status_code == 200
                    opened.set()
                    async for _ in response.aiter_bytes():
                        pass

            follower = asyncio.create_task(follow())
            async with asyncio.timeout(15):
                await opened.wait()
            server.process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                await asyncio.gather(follower, return_exceptions=True)
            await asyncio.to_thread(server.process.wait, 30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the supervised server did not exit after SIGTERM:\n{server.log()}")
    finally:
        server.stop()
    assert server.process.returncode is not None
