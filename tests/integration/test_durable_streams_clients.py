"""The official Durable Streams clients against a real server process on real PostgreSQL, with
the Bearer token on every request: the TypeScript client (npm @durable-streams/client, the node
script tests/conformance/client-check.mjs) and the Python client (PyPI durable-streams, here in
process). Each creates a stream, appends (the TypeScript client through an idempotent producer,
the Python one with Stream-Seq), reads it back, follows it live and resumes from a saved
offset."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from durable_streams import AsyncDurableStream, SeqConflictError, StreamExistsError, astream

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.node import CONFORMANCE_DIR, ensure_node_packages, node
from tests.support.server import ServerProcess

DS_SERVER_ENV = {**SERVER_ENV, "DUCTOR_STREAMS_LONG_POLL_SECONDS": "3"}


@pytest.fixture(scope="module")
def ds_server(
    own_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=own_database, data_dir=tmp_path_factory.mktemp("clients"), env=DS_SERVER_ENV
    ).start()
    yield process
    process.stop()


def protocol_base(server: ServerProcess) -> str:
    return server.base_url + "/api/durable-streams"


# --- TypeScript -----------------------------------------------------------------------------


def run_typescript_client(base_url: str, token: str) -> str:
    """Run client-check.mjs; returns its output, or fails the test with it."""
    ensure_node_packages()
    done = subprocess.run(
        [node(), "client-check.mjs"],
        cwd=CONFORMANCE_DIR,
        env={**os.environ, "DS_BASE_URL": base_url, "DS_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    print(output)
    assert done.returncode == 0, output
    assert output.rstrip().endswith("client check passed"), output
    return output


def test_the_typescript_client_creates_produces_reads_follows_and_resumes(
    ds_server: ServerProcess,
) -> None:
    output = run_typescript_client(protocol_base(ds_server), BOOTSTRAP_TOKEN)
    for step in ("create", "idempotent producer", "read", "follow (SSE)", "follow (long-poll)"):
        assert f"ok {step}" in output


# --- Python ---------------------------------------------------------------------------------


async def python_client_scenario(base_url: str, token: str) -> list[str]:
    """The Python client's round trip; returns the steps done (asserting on the way)."""
    url = f"{base_url}/v1/stream/py-client-{secrets.token_hex(6)}"
    headers = {"Authorization": f"Bearer {token}"}
    steps: list[str] = []
    async with httpx.AsyncClient(timeout=30) as http:
        handle = await AsyncDurableStream.create(
            url, content_type="application/json", headers=headers, client=http, batching=False
        )
        head = await handle.head()
        assert (head.content_type or "").startswith("application/json")
        with pytest.raises(StreamExistsError):  # same URL, another configuration
            await AsyncDurableStream.create(
                url, content_type="text/plain", headers=headers, client=http
            )
        steps.append("create")

        first = await handle.append({"n": 1}, seq="0001")
        await handle.append({"n": 2}, seq="0002")
        await handle.append({"n": 3}, seq="0003")
        with pytest.raises(SeqConflictError):  # a writer sequence that does not increase
            await handle.append({"n": "again"}, seq="0003")
        steps.append("append")

        async with handle.stream(live=False) as res:
            items = await res.read_json()
            saved = res.offset
        assert items == [{"n": 1}, {"n": 2}, {"n": 3}]
        async with handle.stream(offset=first.next_offset, live=False) as res:
            assert await res.read_json() == [{"n": 2}, {"n": 3}]
        steps.append("read")

        for live, values in (("sse", [4, 5]), ("long-poll", [6])):
            received, saved = await _follow(handle, saved, live, values)
            assert received == [{"n": v} for v in values], (live, received)
            steps.append(f"follow ({live})")

        await handle.append({"n": 7})
        async with astream(url, offset=saved, live=False, headers=headers, client=http) as res:
            assert await res.read_json() == [{"n": 7}]
            end = res.offset
        async with astream(url, offset=end, live=False, headers=headers, client=http) as res:
            assert await res.read_json() == []
        steps.append("resume")

        await handle.delete()
        steps.append("delete")
    return steps


async def _follow(
    handle: AsyncDurableStream, offset: str, live: str, values: list[int]
) -> tuple[list[object], str]:
    """Follow from `offset` in `live` mode while `values` are appended; returns the items that
    arrived and the offset after them."""
    received: list[object] = []
    last = offset

    async def consume() -> None:
        nonlocal last
        async with handle.stream(offset=offset, live=live) as res:  # type: ignore[arg-type]
            events: AsyncIterator = res.iter_events(mode="json")
            async for event in events:
                received.extend(event.data)
                last = event.next_offset
                if len(received) >= len(values):
                    return

    follower = asyncio.create_task(consume())
    await asyncio.sleep(0.3)  # let it connect and go live; the appends come after
    for v in values:
        await handle.append({"n": v})
    await asyncio.wait_for(follower, 20)
    return received, last


async def test_the_python_client_creates_appends_reads_follows_and_resumes(
    ds_server: ServerProcess,
) -> None:
    steps = await python_client_scenario(protocol_base(ds_server), BOOTSTRAP_TOKEN)
    assert steps == [
        "create",
        "append",
        "read",
        "follow (sse)",
        "follow (long-poll)",
        "resume",
        "delete",
    ]
