"""The append route as the front (entrypoints/front.py) answers it, sent as raw bytes: each
answer must be the one the Litestar route gave (the route's order of checks, its headers byte
for byte)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, Tokens, api_client
from tests.support.server import ServerProcess

AUTH = f"Authorization: Bearer {BOOTSTRAP_TOKEN}\r\n"
BODY = b'{"records":[{"data":1}]}'
MIB = 1024 * 1024


def records_path(run_id: str, stream_id: str = "s") -> str:
    return f"/api/workflow-streams/runs/{run_id}/streams/{stream_id}/records"


def read_answer(connection: socket.socket) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One answer off the connection (head, then a body of its Content-Length), leaving the
    connection open: the status, the raw header fields in order, the body."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = connection.recv(65_536)
        assert chunk, f"closed before an answer: {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = [(n.strip().lower(), v.strip()) for n, _, v in (f.partition(b":") for f in lines[1:])]
    length = int(dict(fields).get(b"content-length", b"0"))
    while len(body) < length:
        chunk = connection.recv(65_536)
        assert chunk, f"closed inside the body: {body!r}"
        body += chunk
    return int(lines[0].split()[1]), fields, body


def exchange(server: ServerProcess, request: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(request)
        status, fields, body = read_answer(connection)
    return status, dict(fields), body


def post(path: str, headers: str, body: bytes = b"", *, length: int | None = None) -> bytes:
    declared = len(body) if length is None else length
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\n{headers}Content-Length: {declared}\r\n\r\n"
    return head.encode("latin-1") + body


@pytest.fixture
async def stream(api: httpx.AsyncClient, run_id: str) -> str:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
    )
    assert created.status_code == 201, created.text
    return records_path(run_id)


# -- the token is checked before the body is read -------------------------------------------------


@pytest.mark.parametrize(
    "credentials", ["", "Authorization: Bearer dst_no_such_token\r\n"], ids=["none", "unknown"]
)
@pytest.mark.parametrize(
    "body",
    [b"{", b"", b'{"records":[]}', b'{"records":[{"data":"\xff"}]}'],
    ids=["malformed", "empty", "invalid", "not-utf8"],
)
def test_an_unauthenticated_append_is_401_whatever_its_body(
    server: ServerProcess, stream: str, credentials: str, body: bytes
) -> None:
    status, headers, answer = exchange(server, post(stream, credentials, body))
    assert status == 401, answer
    assert b'"code":"unauthenticated"' in answer
    assert headers[b"www-authenticate"] == b'Bearer realm="ductor-streams"'
    assert b"connection" not in headers


@pytest.mark.parametrize("length", [None, 9 * MIB], ids=["malformed", "over-the-limit"])
def test_an_unauthenticated_protocol_append_is_401_before_its_body(
    server: ServerProcess, run_id: str, length: int | None
) -> None:
    """The Durable Streams append is answered by the front too, in its route's order."""
    path = f"/api/durable-streams/v1/stream/{run_id}/p"
    headers = "Content-Type: application/json\r\nExpect: 100-continue\r\n"
    status, fields, answer = exchange(
        server, post(path, headers, b"[" if length is None else b"", length=length)
    )
    assert status == 401, answer
    assert b'"code":"unauthenticated"' in answer
    assert fields[b"www-authenticate"] == b'Bearer realm="ductor-streams"'
    assert b"connection" not in fields


@pytest.mark.parametrize(
    ("scopes", "headers", "code"),
    [
        (("streams:read",), "", "forbidden"),
        (("streams:read", "streams:write"), "Producer-Id: p\r\n", "invalid-input"),
        (("streams:read", "streams:write"), "Stream-Seq: \r\n", "invalid-input"),
    ],
    ids=["read-only-token", "half-a-producer-claim", "empty-stream-seq"],
)
async def test_a_protocol_append_refused_by_its_head_is_answered_before_its_body(
    server: ServerProcess,
    tokens: Tokens,
    run_id: str,
    scopes: tuple[str, ...],
    headers: str,
    code: str,
) -> None:
    """The protocol append's own checks of its head (scope, producer and Stream-Seq headers)
    answer before the body is read, as its route did: with Expect: 100-continue the body is
    never sent, and the answer still comes."""
    token = await tokens.create(scopes=scopes)
    path = f"/api/durable-streams/v1/stream/{run_id}/p"
    head = f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
    request = post(path, head + headers + "Expect: 100-continue\r\n", length=1000)
    status, _, answer = exchange(server, request)
    assert status in (400, 403), answer
    assert f'"code":"{code}"'.encode() in answer


def test_an_unauthenticated_append_declaring_a_body_over_the_limit_is_401_not_413(
    server: ServerProcess, stream: str
) -> None:
    # Expect: 100-continue, so the body is never sent: the answer comes from the headers alone.
    request = post(stream, "Expect: 100-continue\r\n", length=9 * MIB)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(request)
        status, fields, answer = read_answer(connection)
    assert status == 401, answer
    # A 401 keeps the connection (only a 413 before the body is read closes it).
    assert (b"connection", b"close") not in fields


def test_an_unauthenticated_append_cut_short_is_401(server: ServerProcess, stream: str) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(post(stream, "", BODY, length=len(BODY) + 50))
        connection.shutdown(socket.SHUT_WR)
        status, _, answer = read_answer(connection)
    assert status == 401, answer


def test_an_authenticated_append_declaring_a_body_over_the_limit_is_413_and_closes(
    server: ServerProcess, stream: str
) -> None:
    request = post(stream, AUTH + "Expect: 100-continue\r\n", length=9 * MIB)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(request)
        status, fields, answer = read_answer(connection)
    assert status == 413, answer
    assert b'"code":"request-too-large"' in answer
    assert (b"connection", b"close") in fields


# -- X-Request-ID -----------------------------------------------------------------------------


@pytest.mark.parametrize("request_id", [b"plain-id", b"caf\xe9-\xff"], ids=["ascii", "latin-1"])
def test_the_request_id_is_echoed_alike_on_every_answer(
    server: ServerProcess, stream: str, request_id: bytes
) -> None:
    """The same bytes as Litestar's routes echo (request_middleware), whether the append
    succeeds or fails; one that is not printable ASCII is not echoed (its bytes came back
    encoded twice): each answer carries an ID of the server's."""
    rid = b"X-Request-ID: " + request_id + b"\r\n"
    reference = b"GET /healthz HTTP/1.1\r\nHost: t\r\n" + rid + b"\r\n"
    _, healthz, _ = exchange(server, reference)
    echoed = healthz[b"x-request-id"]
    appended, ok, _ = exchange(server, post(stream, AUTH + rid.decode("latin-1"), BODY))
    refused, problem, _ = exchange(server, post(stream, rid.decode("latin-1"), BODY))
    malformed, invalid, _ = exchange(server, post(stream, AUTH + rid.decode("latin-1"), b"{"))
    assert (appended, refused, malformed) == (201, 401, 400)
    answered = [ok[b"x-request-id"], problem[b"x-request-id"], invalid[b"x-request-id"], echoed]
    if request_id.isascii():
        assert answered == [request_id] * 4
    else:
        assert all(a.isascii() and request_id not in a for a in answered)
        assert len(set(answered)) == 4  # each its own


# -- a body over the limit -------------------------------------------------------------------


async def test_a_body_over_the_limit_read_to_its_end_keeps_the_connection(
    uvicorn_server: ServerProcess, run_id: str
) -> None:
    """uvicorn hands the application what it has received in one message: here the byte past
    the limit comes with the end of the body, so the body was read whole when it was refused
    and, as request_middleware decides, the connection is not closed."""
    async with api_client(uvicorn_server) as api:
        created = await api.post(
            f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
        )
        assert created.status_code == 201, created.text
    bulk = b'{"records":[{"data":"' + b"x" * (8 * MIB - 24) + b'"}]'
    assert len(bulk) == 8 * MIB
    request = (
        f"POST {records_path(run_id)} HTTP/1.1\r\nHost: t\r\n{AUTH}"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    request += b"%x\r\n" % len(bulk) + bulk + b"\r\n1\r\n}\r\n0\r\n\r\n"  # one byte too many
    with socket.create_connection(("127.0.0.1", uvicorn_server.port), timeout=30) as connection:
        connection.sendall(request)
        status, fields, answer = read_answer(connection)
        assert status == 413, answer
        assert b'"code":"request-too-large"' in answer
        assert (b"connection", b"close") not in fields
        # Not pipelined: uvicorn may drop a request that came behind a body it refused.
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        status, _, answer = read_answer(connection)
        assert (status, answer) == (200, b'{"status":"ok"}')


# -- the body is read to its Content-Length ------------------------------------------------------


def test_a_body_in_pieces_is_read_whole_and_pipelined_appends_each_answered(
    server: ServerProcess, stream: str
) -> None:
    """The front stops reading at the Content-Length's last byte (it does not wait for the
    server's closing message): a body that arrives in pieces is still read whole, and requests
    pipelined on one connection are each answered, in order."""
    body = b'{"records":[{"data":"first"},{"data":"second"}]}'
    head = post(stream, AUTH, length=len(body))
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(head + body[:10])
        time.sleep(0.3)  # the rest in a later segment
        connection.sendall(body[10:])
        status, _, answer = read_answer(connection)
        assert status == 201, answer
        pipelined = b"".join(post(stream, AUTH, b'{"records":[{"data":%d}]}' % n) for n in range(3))
        connection.sendall(pipelined)
        reader = connection.makefile("rb")
        statuses = []
        for _ in range(3):  # each answer: its status line, its fields, its Content-Length body
            statuses.append(int(reader.readline().split()[1]))
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            reader.read(length)
    assert statuses == [201, 201, 201]
    page = httpx.get(
        f"{server.base_url}{stream}?cursor=0",
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
    ).json()
    assert [r["data"] for r in page["records"]] == ["first", "second", 0, 1, 2]
