"""HEAD wherever GET is served: GET's status and headers, no body, through the server process
(docs/http-api.md "Conventions"). HEAD is not an access for expiry: tests/integration/
test_expiry.py."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket

import httpx
import pytest

from tests.conftest import api_client
from tests.integration.test_objects_http import prepare_body, stored_files
from tests.support.server import ServerProcess

# Headers that differ between any two answers, whatever the method.
VARYING = {"date", "x-request-id"}


def comparable(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k not in VARYING}


async def head_matches_get(
    client: httpx.AsyncClient, path: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    got = await client.get(path, headers=headers)
    headed = await client.head(path, headers=headers)
    assert headed.status_code == got.status_code, (path, got.text)
    assert headed.content == b""
    assert comparable(headed) == comparable(got), path
    return headed


async def committed_object(api: httpx.AsyncClient, path: str, body: bytes, key: str = "k1") -> str:
    """An object committed on the stream of `path`: its path."""
    prepared = await api.post(
        f"{path}/objects", json=prepare_body(body, key=key, content_type="text/plain")
    )
    assert prepared.status_code == 201, prepared.text
    object_path = f"{path}/objects/{prepared.json()['object_id']}"
    assert (await api.put(f"{object_path}/body", content=body)).status_code == 200
    assert (await api.post(f"{object_path}/commit")).status_code == 201
    return object_path


async def test_head_on_every_get_route_answers_gets_status_and_headers_without_a_body(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
    )
    assert created.status_code == 201, created.text
    path = f"/runs/{run_id}/streams/s"
    appended = await api.post(f"{path}/records", json={"records": [{"data": 1}, {"data": 2}]})
    assert appended.status_code == 201
    object_path = await committed_object(api, path, b"hello, head")
    for route in (
        "/runs",
        f"/runs/{run_id}/streams",
        path,
        f"{path}/records?cursor=1",
        object_path,
        f"{object_path}/body",
    ):
        headed = await head_matches_get(api, route)
        assert headed.status_code == 200
        assert int(headed.headers["content-length"]) > 0
    body = await api.head(f"{object_path}/body")
    digest = base64.b64encode(hashlib.sha256(b"hello, head").digest()).decode()
    assert body.headers["repr-digest"] == f"sha-256=:{digest}:"
    assert body.headers["etag"] == f'"{hashlib.sha256(b"hello, head").hexdigest()}"'
    assert body.headers["accept-ranges"] == "bytes"
    assert body.headers["content-type"] == "text/plain"
    assert body.headers["content-length"] == str(len(b"hello, head"))
    # A range: 206 headers; an unsatisfiable one: 416's.
    ranged = await head_matches_get(api, f"{object_path}/body", {"Range": "bytes=2-4"})
    assert ranged.status_code == 206
    assert ranged.headers["content-range"] == "bytes 2-4/11"
    assert ranged.headers["content-length"] == "3"
    refused = await head_matches_get(api, f"{object_path}/body", {"Range": "bytes=99-"})
    assert refused.status_code == 416
    assert refused.headers["content-range"] == "bytes */11"
    # The operations routes, outside the API prefix.
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as plain:
        for route in ("/healthz", "/readyz", "/schema/openapi.json"):
            headed = await head_matches_get(plain, route)
            assert headed.status_code == 200
        metrics = await plain.head("/metrics")
        assert metrics.status_code == 200 and metrics.content == b""
        assert metrics.headers["content-type"].startswith("text/plain")
        # Counted as HEAD, under its route.
        scraped = (await plain.get("/metrics")).text
        assert 'method="HEAD",route="/metrics",status="200"' in scraped


async def test_head_answers_problem_headers(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    missing = f"/runs/{run_id}/streams/nope"
    for route in (missing, missing + "/records", missing + "/subscribe", missing + "/objects/o"):
        headed = await head_matches_get(api, route)
        assert headed.status_code == 404
        assert headed.headers["content-type"] == "application/problem+json"
    # Bad input as GET answers it.
    bad = await head_matches_get(api, f"/runs/{run_id}/streams/s/records?cursor=-1")
    assert bad.status_code == 400
    async with api_client(server, token="not-a-token") as stranger:
        refused = await head_matches_get(stranger, f"/runs/{run_id}/streams")
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == 'Bearer realm="ductor-streams"'
    # A path without GET: HEAD is 405 too, and Allow lists what the path serves.
    closing = await api.head(f"/runs/{run_id}/streams/s/close")
    assert closing.status_code == 405 and closing.content == b""
    assert closing.headers["allow"] == "OPTIONS, POST"


async def test_head_on_subscribe_answers_the_headers_at_once_and_holds_no_slot(
    api: httpx.AsyncClient, run_id: str
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
    )
    assert created.status_code == 201
    path = f"/runs/{run_id}/streams/s/subscribe"
    # An idle stream: a GET would stay open for ever; each HEAD ends at once.
    for _ in range(3):
        headed = await asyncio.wait_for(api.head(path + "?cursor=0"), 10)
        assert headed.status_code == 200 and headed.content == b""
        assert headed.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert headed.headers["cache-control"] == "no-cache"
    # A cursor GET refuses is refused alike.
    ahead = await asyncio.wait_for(api.head(path + "?cursor=5"), 10)
    got = await api.get(path + "?cursor=5")
    assert ahead.status_code == got.status_code == 400
    assert comparable(ahead) == comparable(got)
    bad_id = await api.head(path, headers={"Last-Event-ID": "x"})
    assert bad_id.status_code == 400


async def test_head_on_an_object_body_does_not_read_the_store(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
    )
    assert created.status_code == 201
    body = os.urandom(1024)
    object_path = await committed_object(api, f"/runs/{run_id}/streams/s", body)
    [stored] = stored_files(server, run_id)
    os.remove(stored)
    got = await api.get(f"{object_path}/body")
    assert got.status_code != 200
    headed = await api.head(f"{object_path}/body")
    assert headed.status_code == 200 and headed.content == b""
    assert headed.headers["content-length"] == "1024"
    assert headed.headers["etag"] == f'"{hashlib.sha256(body).hexdigest()}"'
    ranged = await api.head(f"{object_path}/body", headers={"Range": "bytes=-10"})
    assert ranged.status_code == 206
    assert ranged.headers["content-range"] == "bytes 1014-1023/1024"


@pytest.mark.parametrize("which", ["granian", "uvicorn"])
def test_a_head_answer_sends_no_body_bytes_on_the_connection(
    which: str, request: pytest.FixtureRequest
) -> None:
    """Two requests on one connection, HEAD then GET: the GET's status line follows the HEAD's
    headers at once (a body byte would stand in between), through both HTTP servers."""
    process = request.getfixturevalue("server" if which == "granian" else "uvicorn_server")
    host, port = process.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        ask = "{} /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        connection.sendall((ask.format("HEAD") + ask.format("GET")).encode())
        received = b""
        while received.count(b"HTTP/1.1 200") < 2 or not received.endswith(b"}"):
            chunk = connection.recv(65536)
            assert chunk, received
            received += chunk
    head, rest = received.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200") and b"content-length: 15" in head.lower()
    assert rest.startswith(b"HTTP/1.1 200"), received
    assert rest.endswith(b'{"status":"ok"}')
