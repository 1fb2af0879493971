"""What one tenant's request bodies may take of a server process, against a real server: a body
that drips below the minimum rate ends (408) long before the total bound; a tenant's bodies
arriving at once, and their bytes held, are capped (429 `too-many-requests`, the connection
closed, nothing read), while another tenant is served throughout."""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import SERVER_ENV, Tokens
from tests.support.server import ServerProcess

API = "/api/workflow-streams"
ARRIVING, HELD_BYTES = 3, 100_000


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("tenant-bodies"),
        env={
            **SERVER_ENV,
            "DUCTOR_STREAMS_BODY_MIN_BYTES_PER_SECOND": "100",
            "DUCTOR_STREAMS_MAX_ARRIVING_BODIES_PER_TENANT": str(ARRIVING),
            "DUCTOR_STREAMS_MAX_BODY_BYTES_PER_TENANT": str(HELD_BYTES),
        },
    ).start()
    yield process
    process.stop()


@pytest.fixture
async def two_tenants(tokens: Tokens) -> tuple[str, str]:
    suffix = secrets.token_hex(3)
    return (
        await tokens.create(tenant=f"loud-{suffix}"),
        await tokens.create(tenant=f"quiet-{suffix}"),
    )


def new_stream(server: ServerProcess, token: str) -> str:
    run = "bodies-" + secrets.token_hex(4)
    made = httpx.post(
        f"{server.base_url}{API}/runs/{run}/streams",
        json={"stream_id": "s", "direction": "output"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert made.status_code == 201, made.text
    return f"{API}/runs/{run}/streams/s/records"


def open_body(server: ServerProcess, token: str, path: str, length: int) -> socket.socket:
    """A request whose head announces `length` bytes of body, none of it sent yet."""
    host, port = server.base_url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=30)
    conn.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode()
    )
    return conn


def answer_of(conn: socket.socket) -> tuple[int, dict[str, str], dict]:
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def append(server: ServerProcess, token: str, path: str) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}{path}",
        json={"records": [{"data": "x"}]},
        headers={"Authorization": f"Bearer {token}"},
    )


def wait_until_arriving(conns: list[socket.socket]) -> None:
    """Each request's handler is reading its body once its first piece was taken: a byte sent,
    then a moment for the server to take it."""
    for conn in conns:
        conn.sendall(b"{")
    time.sleep(0.5)


def dripped(
    server: ServerProcess, tenant: str, path: str, length: int, piece: bytes
) -> tuple[int, dict[str, str], dict, float]:
    """A body of `length` bytes sent `piece` every half second until it is answered (or for a
    minute): the answer's status, headers and body, and how long it took."""
    started = time.monotonic()
    with open_body(server, tenant, path, length) as conn:
        try:
            while time.monotonic() - started < 60:
                conn.sendall(piece)
                time.sleep(0.5)
        except OSError:
            pass  # answered and closed
        conn.settimeout(5)
        status, headers, body = answer_of(conn)
    return status, headers, body, time.monotonic() - started


def test_a_body_that_drips_below_the_minimum_rate_is_408_long_before_the_total_bound(
    server: ServerProcess, two_tenants: tuple[str, str]
) -> None:
    loud, _ = two_tenants
    path = new_stream(server, loud)
    # 2 bytes a second: within the 30 s idle bound
    status, headers, body, took = dripped(server, loud, path, 1000, b" ")
    assert (status, body["code"]) == (408, "request-timeout")
    assert headers.get("connection") == "close"
    # The total bound is 120 s; the rate (100 B/s after 5 s) ends it at about 5 s.
    assert took < 30, took
    page = httpx.get(f"{server.base_url}{path}", headers={"Authorization": f"Bearer {loud}"}).json()
    assert page["records"] == []


def test_a_body_a_little_below_the_minimum_rate_is_408_too(
    server: ServerProcess, two_tenants: tuple[str, str]
) -> None:
    """At 90% of the rate: counted from the end of the 5 s grace, the average such a body needed
    was met until about 50 s (at 98%, never: only the total bound ended it)."""
    loud, _ = two_tenants
    path = new_stream(server, loud)
    # 90 bytes a second against 100
    status, _, body, took = dripped(server, loud, path, 100_000, b" " * 45)
    assert (status, body["code"]) == (408, "request-timeout")
    assert took < 20, took


def test_a_tenants_bodies_arriving_at_once_are_capped_and_another_tenant_is_served(
    server: ServerProcess, two_tenants: tuple[str, str]
) -> None:
    loud, quiet = two_tenants
    loud_path, quiet_path = new_stream(server, loud), new_stream(server, quiet)
    held = [open_body(server, loud, loud_path, 1000) for _ in range(ARRIVING)]
    try:
        wait_until_arriving(held)
        with open_body(server, loud, loud_path, 30) as refused:
            refused.sendall(b'{"records": [{"data": 1}]}'.ljust(30))
            status, headers, body = answer_of(refused)
            assert (status, body["code"]) == (429, "too-many-requests")
            assert headers.get("retry-after") == "1" and headers.get("connection") == "close"
            assert refused.recv(100) == b""  # closed: the body was never read
        # Through Litestar (a stream's creation) as through the append front.
        create = json.dumps({"stream_id": "other", "direction": "output"}).encode()
        with open_body(server, loud, loud_path.removesuffix("/s/records"), len(create)) as other:
            other.sendall(create)
            status, _, body = answer_of(other)
            assert (status, body["code"]) == (429, "too-many-requests")
        assert append(server, quiet, quiet_path).status_code == 201  # the other tenant
    finally:
        for conn in held:
            conn.close()
    deadline = time.monotonic() + 10
    while (answer := append(server, loud, loud_path)).status_code == 429:
        assert time.monotonic() < deadline, "the closed bodies were never released"
        time.sleep(0.1)
    assert answer.status_code == 201, answer.text
    page = httpx.get(
        f"{server.base_url}{loud_path}", headers={"Authorization": f"Bearer {loud}"}
    ).json()
    assert [r["data"] for r in page["records"]] == ["x"]  # nothing of the refused one


def test_a_tenants_held_body_bytes_are_capped(
    server: ServerProcess, two_tenants: tuple[str, str]
) -> None:
    loud, quiet = two_tenants
    loud_path, quiet_path = new_stream(server, loud), new_stream(server, quiet)
    with open_body(server, loud, loud_path, 200_000) as big:
        big.sendall(b'{"records": [{"data": "' + b"x" * 80_000)
        time.sleep(0.5)  # 80,000 bytes held of the tenant's 100,000
        body = json.dumps({"records": [{"data": "y" * 30_000}]}).encode()
        with open_body(server, loud, loud_path, len(body)) as second:
            second.sendall(body)
            status, _, problem = answer_of(second)
        assert (status, problem["code"]) == (429, "too-many-requests")
        small = append(server, loud, loud_path)  # 80,000 + 27 bytes: within the cap
        assert small.status_code == 201, small.text
        assert append(server, quiet, quiet_path).status_code == 201


async def test_appends_waiting_for_credit_do_not_count_as_bodies_arriving(
    server: ServerProcess, two_tenants: tuple[str, str]
) -> None:
    """Their bodies are in: only bodies still coming count against the tenant's cap, whatever
    the request does next (under granian, whose closing empty message nobody waits for)."""
    loud, _ = two_tenants
    headers = {"Authorization": f"Bearer {loud}"}
    run = "credit-" + secrets.token_hex(4)
    api = f"{server.base_url}{API}/runs/{run}/streams"
    limits = {"max_unread_items": 1, "unread_policy": "block", "block_timeout_seconds": 5}
    async with httpx.AsyncClient(headers=headers, timeout=30) as client:
        for stream, extra in (("blocked", {"limits": limits}), ("other", {})):
            made = await client.post(
                api, json={"stream_id": stream, "direction": "output", **extra}
            )
            assert made.status_code == 201, made.text
        first = await client.post(f"{api}/blocked/records", json={"records": [{"data": 0}]})
        assert first.status_code == 201, first.text
        blocked = [
            asyncio.create_task(
                client.post(f"{api}/blocked/records", json={"records": [{"data": n}]})
            )
            for n in range(1, ARRIVING + 1)
        ]
        await asyncio.sleep(1.0)  # their bodies read; each waits for credit
        other = await client.post(f"{api}/other/records", json={"records": [{"data": "x"}]})
        assert other.status_code == 201, other.text
        answers = await asyncio.gather(*blocked)
        assert {a.status_code for a in answers} == {429}  # no ack came: backpressure, not ours
        assert {a.json()["code"] for a in answers} == {"backpressure"}


def test_a_webhook_callback_without_a_valid_wake_token_holds_none_of_its_body(
    server: ServerProcess,
) -> None:
    """Its wake token is checked before its body is read: a stranger's 8 MiB body, sent up to
    its last bytes and then dripped, was held for two minutes with no tenant to charge."""
    path = "/api/durable-streams/v1/stream/__ds/subscriptions/sub-x/callback"
    host, port = server.base_url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer junk\r\n"
            f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n".encode()
        )
        conn.sendall(b'{"generation": 1')  # and then nothing more
        status, _, body = answer_of(conn)
    assert (status, body["code"]) == (401, "wake-token-invalid"), body
    assert time.monotonic() - started < 10  # answered at once, not at the body's deadlines
