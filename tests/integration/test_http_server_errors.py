"""Requests the HTTP server (granian) refuses before the application sees them: what a client
gets is pinned here, as docs/errors.md "Answers from the HTTP server itself" describes. granian
answers these through hyper, with no hook for the application, so they are not problem JSON."""

from __future__ import annotations

import asyncio
import socket

import asyncpg
import httpx
import pytest

from tests.integration.test_http_bad_input import stored
from tests.support.server import ServerProcess


def exchange(server: ServerProcess, request: bytes) -> bytes:
    """Send raw bytes and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65_536):
            received += chunk
    return received


def refusal(status: int, reason: str) -> bytes:
    """The whole answer but its date: no body, no content type, and the connection closed."""
    return f"HTTP/1.1 {status} {reason}\r\nconnection: close\r\ncontent-length: 0\r\n".encode()


def without_date(answer: bytes) -> bytes:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
    return b"\r\n".join(lines) + b"\r\n" + body


HEAD = b"Host: 127.0.0.1\r\n"
CASES = {
    "101-header-fields": (
        b"GET /healthz HTTP/1.1\r\n" + HEAD + b"".join(b"X-%d: y\r\n" % i for i in range(100)),
        refusal(431, "Request Header Fields Too Large"),
    ),
    # Either answer, by where the parser's buffer fills: inside the request line (414) or past
    # it (431); both were seen on the same build.
    "request-line-of-500-kb": (
        b"GET /healthz?" + b"q" * 500_000 + b" HTTP/1.1\r\n" + HEAD,
        (refusal(431, "Request Header Fields Too Large"), refusal(414, "URI Too Long")),
    ),
    "content-length-not-a-number": (
        b"POST /healthz HTTP/1.1\r\n" + HEAD + b"Content-Length: abc\r\n",
        refusal(400, "Bad Request"),
    ),
    "content-length-negative": (
        b"POST /healthz HTTP/1.1\r\n" + HEAD + b"Content-Length: -1\r\n",
        refusal(400, "Bad Request"),
    ),
    "two-different-content-lengths": (
        b"POST /healthz HTTP/1.1\r\n" + HEAD + b"Content-Length: 1\r\nContent-Length: 2\r\n",
        refusal(400, "Bad Request"),
    ),
    "request-line-garbage": (b"GARBAGE\r\n", refusal(400, "Bad Request")),
    "unknown-http-version": (b"GET /healthz HTTP/9.9\r\n" + HEAD, refusal(400, "Bad Request")),
    "nul-in-a-header-value": (
        b"GET /healthz HTTP/1.1\r\n" + HEAD + b"X-Note: a\x00b\r\n",
        refusal(400, "Bad Request"),
    ),
}


@pytest.mark.parametrize(("request_head", "answer"), CASES.values(), ids=list(CASES))
async def test_the_server_refuses_a_malformed_request_with_an_empty_answer(
    server: ServerProcess, request_head: bytes, answer: bytes
) -> None:
    received = await asyncio.to_thread(exchange, server, request_head + b"\r\n")
    assert without_date(received) in (answer if isinstance(answer, tuple) else (answer,))


@pytest.mark.parametrize("control", [b"\x00", b"\x01", b"\x1b", b"\x7f", b"\r"])
async def test_a_control_character_in_the_idempotency_key_header_stores_nothing(
    server: ServerProcess,
    api: httpx.AsyncClient,
    pool: asyncpg.Pool,
    run_id: str,
    control: bytes,
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
    )
    assert created.status_code == 201, created.text
    before = await stored(pool, run_id)
    body = b'{"records": [{"data": 1}]}'
    request = (
        f"POST /api/workflow-streams/runs/{run_id}/streams/s/records HTTP/1.1\r\n".encode()
        + HEAD
        + f"Authorization: {api.headers['authorization']}\r\n".encode()
        + b"Content-Type: application/json\r\n"
        + b"Content-Length: %d\r\n" % len(body)
        + b"Idempotency-Key: key"
        + control
        + b"x\r\n\r\n"
        + body
    )
    received = await asyncio.to_thread(exchange, server, request)
    assert received.startswith(b"HTTP/1.1 400 Bad Request\r\n"), received
    assert (await stored(pool, run_id)) == before
