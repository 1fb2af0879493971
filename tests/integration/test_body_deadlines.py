"""A request body must keep coming: one that stops, or drips, is answered 408 and its
connection closed, through the append front and through Litestar alike; an object upload
(streamed to the store) is held to the idle bound only. Against a real server process with
short bounds."""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.server import ServerProcess

API = "/api/workflow-streams"
IDLE, TOTAL = 1.0, 3.0


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("body-deadlines"),
        env={
            **SERVER_ENV,
            "DUCTOR_STREAMS_BODY_IDLE_SECONDS": str(IDLE),
            "DUCTOR_STREAMS_BODY_SECONDS": str(TOTAL),
            # The bounds above alone (the minimum rate: test_tenant_bodies.py).
            "DUCTOR_STREAMS_BODY_MIN_BYTES_PER_SECOND": "0",
        },
    ).start()
    yield process
    process.stop()


def raw(
    server: ServerProcess, method: str, path: str, length: int, pieces: list[bytes], pause: float
) -> tuple[bytes, float]:
    """Sends a request head announcing `length` bytes, then `pieces` `pause` apart; answers
    everything the server sent before closing, and when the answer began."""
    host, port = server.base_url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {BOOTSTRAP_TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode()
        )
        for piece in pieces:
            try:
                conn.sendall(piece)
            except OSError:
                break
            time.sleep(pause)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                break
        took = time.monotonic() - started
        conn.settimeout(5)
        try:  # closed by the server once answered
            while conn.recv(65536):
                pass
        except OSError:
            pass
    return answer, took


def new_stream(server: ServerProcess) -> str:
    run = "body-" + secrets.token_hex(4)
    made = httpx.post(
        f"{server.base_url}{API}/runs/{run}/streams",
        json={"stream_id": "s", "direction": "output"},
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
    )
    assert made.status_code == 201, made.text
    return f"{API}/runs/{run}/streams/s"


def assert_timed_out(answer: bytes) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"connection: close" in head.lower()
    assert b"application/problem+json" in head
    assert json.loads(body)["code"] == "request-timeout"


@pytest.mark.parametrize("route", ["append (front)", "create (Litestar)"])
def test_a_body_that_stops_coming_is_408_and_changes_nothing(
    server: ServerProcess, route: str
) -> None:
    stream = new_stream(server)
    path = f"{stream}/records" if route.startswith("append") else stream.rsplit("/", 1)[0]
    answer, took = raw(server, "POST", path, 1000, [b'{"records": ['], 0.0)
    assert_timed_out(answer)
    assert took < IDLE + 2, took
    page = httpx.get(
        f"{server.base_url}{stream}/records",
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
    ).json()
    assert page["records"] == []


def test_a_body_that_drips_is_408_once_its_total_bound_passes(server: ServerProcess) -> None:
    stream = new_stream(server)
    body = json.dumps({"records": [{"data": "x" * 100}]}).encode()
    pieces = [body[i : i + 4] for i in range(0, len(body), 4)]  # far more than TOTAL at 0.5 s
    answer, took = raw(server, "POST", f"{stream}/records", len(body), pieces, 0.5)
    assert_timed_out(answer)
    assert TOTAL - 0.5 < took < TOTAL + 2, took


def test_an_upload_may_take_longer_than_the_total_bound_while_it_keeps_coming(
    server: ServerProcess,
) -> None:
    stream = new_stream(server)
    body = b"0123456789" * 4
    intent = httpx.post(
        f"{server.base_url}{stream}/objects",
        json={
            "idempotency_key": "slow",
            "size": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
        },
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
    ).json()
    pieces = [body[i : i + 4] for i in range(0, len(body), 4)]  # 10 pieces, 0.5 s apart
    answer, took = raw(
        server, "PUT", f"{stream}/objects/{intent['object_id']}/body", len(body), pieces, 0.5
    )
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert took > TOTAL


def test_a_route_whose_last_segment_is_body_is_no_upload(server: ServerProcess) -> None:
    """A Durable Streams stream, or a subscription, may be named "body": its PUT is held to the
    total bound like any body read whole."""
    run = "body-" + secrets.token_hex(4)
    pieces = [b"x"] * 20  # 10 s at 0.5 s apart, far past TOTAL
    answer, took = raw(server, "PUT", f"/api/durable-streams/v1/stream/{run}/body", 20, pieces, 0.5)
    assert_timed_out(answer)
    assert took < TOTAL + 2, took


def test_a_refused_body_that_drips_is_not_drained_forever_nor_logged_as_an_error(
    server: ServerProcess,
) -> None:
    """Refused before its body was read (here: no token), the rest is drained while it comes,
    up to the body's deadline; that deadline passing is no server error."""
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(
            b"POST /api/workflow-streams/runs/r/streams/s/records HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer nope\r\nContent-Length: 1000\r\n\r\n"
        )
        answer = conn.recv(65536)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        started = time.monotonic()
        try:
            while time.monotonic() - started < TOTAL + 3:
                conn.sendall(b"x")
                time.sleep(0.5)
        except OSError:
            pass  # closed: the rest is not waited for any more
    assert "Traceback" not in server.log()
    assert '"level":"error"' not in server.log()
