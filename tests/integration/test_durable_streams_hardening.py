"""Bad requests on the Durable Streams surface (and their native twins) are refused cleanly:
each is a 4xx problem that changes nothing, never a 500, and protocol writes follow the native
append's record rules (redaction, input streams)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.conftest import BOOTSTRAP_TOKEN
from tests.integration.test_durable_streams import ds_client
from tests.integration.test_http_records import assert_problem
from tests.support.server import ServerProcess

JSON = {"Content-Type": "application/json"}
PREFIX = "/api/durable-streams/v1/stream"


@pytest.fixture
async def ds(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with ds_client(server) as client:
        yield client


async def native_data(api: httpx.AsyncClient, run_id: str, stream_id: str) -> list:
    page = await api.get(f"/runs/{run_id}/streams/{stream_id}/records")
    assert page.status_code == 200, page.text
    return [r.get("data") for r in page.json()["records"]]


async def test_protocol_appends_apply_the_streams_redaction(
    ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={
            "stream_id": "nat",
            "direction": "output",
            "redaction": {"json_pointers": ["/secret"]},
        },
    )
    assert created.status_code == 201, created.text
    ok = await ds.post(f"/{run_id}/nat", content=b'[{"secret":"pw2","k":1}]', headers=JSON)
    assert ok.status_code == 204, ok.text
    assert await native_data(api, run_id, "nat") == [{"secret": "[REDACTED]", "k": 1}]
    assert (await ds.get(f"/{run_id}/nat")).json() == [{"secret": "[REDACTED]", "k": 1}]
    # A fork reads the source's records and redacts what it does: its own writes too.
    fork = await ds.put(
        f"/{run_id}/fork",
        content=b'{"secret":"pw3"}',
        headers={**JSON, "Stream-Forked-From": f"/v1/stream/{run_id}/nat"},
    )
    assert fork.status_code == 201, fork.text
    assert (await ds.post(f"/{run_id}/fork", content=b'{"secret":"pw4"}', headers=JSON)).is_success
    assert (await ds.get(f"/{run_id}/fork")).json() == [{"secret": "[REDACTED]", "k": 1}] + [
        {"secret": "[REDACTED]"}
    ] * 2


async def test_a_content_type_with_an_empty_parameter_is_stored_without_it(
    ds: httpx.AsyncClient, run_id: str
) -> None:
    """`application/json;` is a media type with no parameter: stored (and served) as
    `application/json`, the same configuration as a PUT without the `;`."""
    created = await ds.put(f"/{run_id}/semi", headers={"Content-Type": "application/json;"})
    assert created.status_code == 201, created.text
    head = await ds.head(f"/{run_id}/semi")
    assert head.headers["content-type"] == "application/json"
    again = await ds.put(f"/{run_id}/semi", headers={"Content-Type": "application/json"})
    assert again.status_code == 200, again.text


async def test_a_nul_in_json_for_an_input_stream_is_refused_as_natively(
    ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "in", "direction": "input"}
    )
    assert created.status_code == 201, created.text
    refused = await ds.post(f"/{run_id}/in", content=b'{"a":"x\\u0000y"}', headers=JSON)
    assert_problem(refused, 400, "invalid-input")
    assert await native_data(api, run_id, "in") == []
    assert (await ds.post(f"/{run_id}/in", content=b'{"a":"xy"}', headers=JSON)).status_code == 204


@pytest.mark.parametrize(
    "at", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-00:01", "9999-12-31T23:59:59-14:00"]
)
async def test_an_expiry_past_the_calendar_is_400_on_both_surfaces(
    ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str, at: str
) -> None:
    refused = await ds.put(
        f"/{run_id}/exp", headers={"Content-Type": "text/plain", "Stream-Expires-At": at}
    )
    assert_problem(refused, 400, "invalid-input")
    native = await api.post(
        f"/runs/{run_id}/streams",
        json={"stream_id": "exp", "direction": "output", "expiry": {"expires_at": at}},
    )
    assert_problem(native, 400, "invalid-input")
    assert (await ds.head(f"/{run_id}/exp")).status_code == 404


def raw_exchange(server: ServerProcess, request: bytes, *, half_close: bool) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(request)
        if half_close:
            connection.shutdown(socket.SHUT_WR)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = connection.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def request(method: str, path: str, headers: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {BOOTSTRAP_TOKEN}\r\n"
    return (head + headers + "\r\n").encode() + body


@pytest.mark.parametrize(
    ("framing", "body"),
    [
        ("Content-Length: 100\r\n", b'{"a":1}'),
        ("Transfer-Encoding: chunked\r\n", b"zz\r\nabc\r\n"),
    ],
)
async def test_a_body_cut_short_is_400_not_500_on_both_surfaces(
    server: ServerProcess, api: httpx.AsyncClient, run_id: str, framing: str, body: bytes
) -> None:
    assert (
        await api.post(f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"})
    ).status_code == 201
    for path in (
        f"{PREFIX}/{run_id}/s",
        f"/api/workflow-streams/runs/{run_id}/streams/s/records",
    ):
        answer = raw_exchange(
            server,
            request("POST", path, "Content-Type: application/json\r\n" + framing, body),
            half_close=True,
        )
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
        assert b'"code":"invalid-input"' in answer
    assert await native_data(api, run_id, "s") == []


async def test_an_encoded_slash_is_no_separator_and_a_trailing_slash_names_no_stream(
    server: ServerProcess, ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str
) -> None:
    for path in (f"{PREFIX}/{run_id}a%2Fb", f"{PREFIX}/{run_id}%2fx/b"):
        answer = raw_exchange(
            server,
            request("PUT", path, "Content-Type: text/plain\r\nContent-Length: 0\r\n"),
            half_close=False,
        )
        assert answer.split(b"\r\n")[0] == b"HTTP/1.1 400 Bad Request", answer[:300]
    # Decoded into a path no route matches, the same: 400, not 404, on both surfaces.
    for path in (
        f"/api/workflow-streams/runs/{run_id}%2Fx/streams",
        f"/api/workflow-streams/runs/{run_id}/streams/se%2Fcret",
        f"{PREFIX}/a%2Fb%2Fc",
    ):
        answer = raw_exchange(server, request("GET", path, ""), half_close=False)
        assert answer.startswith(b"HTTP/1.1 400 "), (path, answer[:300])
        assert b'"code":"invalid-input"' in answer and b"x-request-id" in answer.lower()
    assert (await ds.head(f"/{run_id}a/b")).status_code == 404
    assert (
        await api.post(f"/runs/{run_id}/streams", json={"stream_id": "nat1", "direction": "output"})
    ).status_code == 201
    answer = raw_exchange(
        server,
        request("GET", f"/api/workflow-streams/runs/{run_id}%2Fstreams%2Fnat1", ""),
        half_close=False,
    )
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
    trailing = await ds.put(f"/{run_id}t/", headers={"Content-Type": "text/plain"})
    assert_problem(trailing, 404, "not-found")
    assert (await ds.head(f"/{run_id}t")).status_code == 404
    # A path of more segments than run and stream says what a stream's path is.
    for method in ("GET", "PUT"):
        deep = await ds.request(method, f"/{run_id}/a/b", headers={"Content-Type": "text/plain"})
        assert_problem(deep, 404, "not-found")
        assert "{runID}/{streamID}" in deep.json()["detail"], deep.text


async def test_a_coded_body_is_415_on_both_surfaces(
    server: ServerProcess, ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str
) -> None:
    gz = {"Content-Type": "text/plain", "Content-Encoding": "gzip"}
    assert_problem(
        await ds.put(f"/{run_id}/gz", content=b"\x1f\x8b", headers=gz),
        415,
        "unsupported-media-type",
    )
    assert (await ds.head(f"/{run_id}/gz")).status_code == 404
    assert (
        await ds.put(f"/{run_id}/gz", headers={"Content-Type": "text/plain"})
    ).status_code == 201
    assert_problem(
        await ds.post(f"/{run_id}/gz", content=b"\x1f\x8b", headers=gz),
        415,
        "unsupported-media-type",
    )
    ok = await ds.post(
        f"/{run_id}/gz", content=b"x", headers={**gz, "Content-Encoding": "identity"}
    )
    assert ok.status_code == 204
    assert (await ds.get(f"/{run_id}/gz")).content == b"x"
    native = await api.post(
        f"/runs/{run_id}/streams",
        content=b"{}",
        headers={"Content-Type": "application/json", "Content-Encoding": "br"},
    )
    assert_problem(native, 415, "unsupported-media-type")
    answer = raw_exchange(
        server,
        request(
            "POST",
            f"{PREFIX}/{run_id}/gz",
            "Content-Type: text/plain\r\nTransfer-Encoding: gzip, chunked\r\n",
            b"3\r\nabc\r\n0\r\n\r\n",
        ),
        half_close=False,
    )
    assert answer.startswith((b"HTTP/1.1 415 ", b"HTTP/1.1 400 ")), answer[:300]
    assert (await ds.get(f"/{run_id}/gz")).content == b"x"


async def test_a_long_poll_cursor_ahead_gets_a_greater_one(
    ds: httpx.AsyncClient, run_id: str
) -> None:
    assert (
        await ds.put(f"/{run_id}/lp", headers={"Content-Type": "text/plain"})
    ).status_code == 201
    for cursor in ("99999999999999999999999", "1" * 2000):
        answer = await ds.get(
            f"/{run_id}/lp", params={"offset": "now", "live": "long-poll", "cursor": cursor}
        )
        assert answer.status_code == 204
        assert int(answer.headers["stream-cursor"]) > int(cursor)
    junk = await ds.get(
        f"/{run_id}/lp", params={"offset": "now", "live": "long-poll", "cursor": "x"}
    )
    assert junk.headers["stream-cursor"].isdigit()


async def test_headers_that_say_one_thing_once_ascii_and_a_location_of_our_own(
    server: ServerProcess, ds: httpx.AsyncClient, run_id: str
) -> None:
    for name, values in (
        ("Stream-TTL", ("10", "20")),
        ("Stream-Expires-At", ("2999-01-01T00:00:00Z", "2998-01-01T00:00:00Z")),
    ):
        headers = [("Content-Type", "text/plain"), *((name, v) for v in values)]
        assert_problem(await ds.put(f"/{run_id}/dup", headers=headers), 400, "invalid-input")
    assert (await ds.head(f"/{run_id}/dup")).status_code == 404
    created = await ds.put(
        f"/{run_id}/dup",
        headers={"Content-Type": "text/plain; charset=utf-8", "Host": "evil.example"},
    )
    assert created.status_code == 201
    assert "evil.example" not in created.headers["location"]
    assert created.headers["location"].endswith(f"{PREFIX}/{run_id}/dup")
    same = await ds.put(f"/{run_id}/dup", headers={"Content-Type": 'text/plain; charset="utf-8"'})
    assert same.status_code == 200, same.text
    for name, values in (
        ("Stream-Seq", ("b", "a")),
        ("Producer-Seq", ("0", "1")),
    ):
        headers = [("Content-Type", "text/plain"), ("Producer-Id", "p"), ("Producer-Epoch", "0")]
        if name == "Stream-Seq":
            headers = [("Content-Type", "text/plain")]
        headers += [(name, v) for v in values]
        assert_problem(
            await ds.post(f"/{run_id}/dup", content=b"x", headers=headers), 400, "invalid-input"
        )
    answer = raw_exchange(
        server,
        request(
            "POST",
            f"{PREFIX}/{run_id}/dup",
            "Content-Type: text/plain\r\nStream-Seq: \xe9\r\nContent-Length: 1\r\n",
        ).replace(b"\xc3\xa9", b"\xe9")
        + b"x",
        half_close=False,
    )
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert (await ds.get(f"/{run_id}/dup")).content == b""


async def test_options_without_a_token_is_401_on_the_protocol_surface(
    server: ServerProcess, ds: httpx.AsyncClient, run_id: str
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url) as anonymous_client:
        anonymous = await anonymous_client.options(f"{PREFIX}/{run_id}/o")
    assert_problem(anonymous, 401, "unauthenticated")
    assert (await ds.options(f"/{run_id}/o")).status_code == 204


async def test_an_event_streams_catch_up_ends_where_the_stream_was_created_again(
    ds: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """An SSE reader catching up page by page, on a stream deleted and created again under
    its ID between two pages, ends there, cleanly: the next page, of the new stream, is never
    sent as if it followed the old one's, and the new stream's head behind the reader's
    offset is no error (it ended the response mid-body, logged as a server error)."""
    import asyncio

    path = f"/{run_id}/again"
    text = {"Content-Type": "text/plain"}
    chunk = 256 * 1024

    async def fill(letter: bytes) -> None:
        created = await ds.put(path, headers=text)
        assert created.status_code == 201, created.text
        for _ in range(100):  # 25 MiB: more than the connection's buffers hold
            appended = await ds.post(path, content=letter * chunk, headers=text)
            assert appended.status_code in (200, 204), appended.text

    await fill(b"A")
    received = bytearray()
    async with ds.stream("GET", path, params={"offset": "-1", "live": "sse"}) as answer:
        assert answer.status_code == 200
        reading = answer.aiter_raw()
        received += await anext(reading)
        # The server is held at a page's send by now; the stream is deleted and made again.
        assert (await ds.delete(path)).status_code in (200, 204)
        await fill(b"B")
        async with asyncio.timeout(60):
            async for piece in reading:
                received += piece
    assert b"A" * 1024 in received
    assert b"BBBB" not in received
    errors = [line for line in server.log().splitlines() if run_id in line and '"error"' in line]
    assert errors == []
