"""A large answer whose client does not read it, against a real server: cut short after its
stall, its connection closed; while it is held, its tenant's next requests are refused 429 and
another tenant is served; a stopping server does not wait for it for long."""

from __future__ import annotations

import base64
import os
import secrets
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import SERVER_ENV, Tokens
from tests.integration.test_tenant_bodies import new_stream
from tests.support.server import ServerProcess

ENV = {
    **SERVER_ENV,
    "DUCTOR_STREAMS_ANSWER_STALL_SECONDS": "2",
    "DUCTOR_STREAMS_MAX_ANSWER_BYTES_PER_TENANT": "1000000",
}


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=database_url, data_dir=tmp_path_factory.mktemp("answers"), env=ENV
    ).start()
    yield process
    process.stop()


def large_stream(server: ServerProcess, token: str) -> str:
    """A stream of about 4.2 MB: its first page (4 MiB) is one large answer, more than the
    connection's kernel buffers take."""
    path = new_stream(server, token)
    chunk = base64.b64encode(os.urandom(45_000)).decode()
    for _ in range(7):
        made = httpx.post(
            server.base_url + path,
            json={"records": [{"data": chunk}] * 10},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert made.status_code == 201, made.text
    return path


def unread(server: ServerProcess, token: str, path: str) -> socket.socket:
    """A read of the page whose answer is never read (a 4 KB receive buffer)."""
    host, port = server.base_url.removeprefix("http://").split(":")
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.connect((host, int(port)))
    conn.sendall(
        f"GET {path}?cursor=0&limit=1000 HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    return conn


def closed_within(conn: socket.socket, seconds: float) -> bool:
    """Whether the server has closed `conn` `seconds` from now (not read until then: what it
    had sent is read then, to find the end)."""
    time.sleep(seconds)
    deadline = time.monotonic() + 2.0
    conn.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if not conn.recv(1 << 20):
                return True
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True
    return False


@pytest.fixture
async def two_tokens(tokens: Tokens) -> tuple[str, str]:
    """A token of each of two new tenants."""
    return (
        await tokens.create(tenant=f"busy-{secrets.token_hex(3)}"),
        await tokens.create(tenant=f"other-{secrets.token_hex(3)}"),
    )


def test_an_answer_not_read_is_cut_after_its_stall_and_holds_its_tenant_back_meanwhile(
    server: ServerProcess, two_tokens: tuple[str, str]
) -> None:
    busy, other = two_tokens
    path, other_path = large_stream(server, busy), new_stream(server, other)
    held = unread(server, busy, path)
    time.sleep(0.5)  # its 4 MiB answer started, and not taken
    refused = httpx.get(
        server.base_url + path, params={"limit": 1}, headers={"Authorization": f"Bearer {busy}"}
    )
    assert refused.status_code == 429, refused.text[:300]
    assert refused.json()["code"] == "too-many-requests"
    assert "not yet taken by their clients" in refused.json()["detail"]
    served = httpx.get(server.base_url + other_path, headers={"Authorization": f"Bearer {other}"})
    assert served.status_code == 200, served.text[:300]
    assert closed_within(held, 4.0), "the unread answer was not cut short after its stall"
    held.close()
    again = httpx.get(
        server.base_url + path, params={"limit": 1}, headers={"Authorization": f"Bearer {busy}"}
    )
    assert again.status_code == 200, again.text[:300]
    assert '"level":"error"' not in server.log()


def test_a_stopping_server_does_not_wait_for_an_answer_nobody_reads(
    database_url: str, tmp_path_factory: pytest.TempPathFactory, two_tokens: tuple[str, str]
) -> None:
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("answers-stop"),
        env={**SERVER_ENV, "DUCTOR_STREAMS_ANSWER_STALL_SECONDS": "120"},
    ).start()
    try:
        token = two_tokens[0]
        held = [unread(process, token, large_stream(process, token)) for _ in range(3)]
        time.sleep(0.5)
        assert process.process is not None
        started = time.monotonic()
        os.killpg(process.process.pid, 15)
        process.process.wait(30)
        # Its answers ended a second after the signal; what granian still held for their
        # clients is dropped 10 s after it (entrypoints/serving.py, KILL_TIMEOUT_SECONDS).
        assert time.monotonic() - started < 16.0
        for conn in held:
            conn.close()
    finally:
        process.stop()


def test_an_object_download_not_read_is_cut_after_its_stall_without_an_error(
    server: ServerProcess, two_tokens: tuple[str, str]
) -> None:
    """An object's body goes out as a stream of 1 MiB chunks, sent from a task group: an
    answer cut short there is no error either (review2)."""
    import hashlib

    token = two_tokens[0]
    auth = {"Authorization": f"Bearer {token}"}
    streams = new_stream(server, token).removesuffix("/records")
    body = os.urandom(4 * 1024 * 1024)
    intent = httpx.post(
        f"{server.base_url}{streams}/objects",
        json={
            "idempotency_key": "k",
            "size": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "content_type": "application/octet-stream",
        },
        headers=auth,
    )
    assert intent.status_code in (200, 201), intent.text
    obj = f"{streams}/objects/{intent.json()['object_id']}"
    put = httpx.put(f"{server.base_url}{obj}/body", content=body, headers=auth, timeout=30)
    assert put.status_code == 200, put.text
    assert httpx.post(f"{server.base_url}{obj}/commit", headers=auth).status_code == 201
    before = server.log()
    host, port = server.base_url.removeprefix("http://").split(":")
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.connect((host, int(port)))
    conn.sendall(
        f"GET {obj}/body HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    assert closed_within(conn, 4.0), "the unread download was not cut short after its stall"
    conn.close()
    time.sleep(0.3)
    assert '"level":"error"' not in server.log()[len(before) :]
