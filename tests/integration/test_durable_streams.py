"""The Durable Streams surface end to end: a real server process on PostgreSQL, driven over
HTTP both through the protocol (/api/durable-streams) and the native API
(/api/workflow-streams): one stream, two surfaces (docs/durable-streams.md)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, Tokens
from tests.integration.test_http_records import assert_problem
from tests.support.offsets import At
from tests.support.server import ServerProcess, WorkerProcess

OFFSET_0 = "0000000000000000_0000000000000000"


def offset(n: int) -> str:
    """An offset as minted before offsets stated their stream's incarnation (still taken, as
    the position it names in the stream that has the ID now)."""
    return f"{0:016d}_{n:016d}"


def ds_client(server: ServerProcess, token: str = BOOTSTRAP_TOKEN) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.base_url + "/api/durable-streams/v1/stream",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


@pytest.fixture
async def ds(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with ds_client(server) as client:
        yield client


async def test_create_append_read_head_delete_round_trip(
    ds: httpx.AsyncClient, run_id: str
) -> None:
    url = f"/{run_id}/notes"
    created = await ds.put(url, content=b"hello ", headers={"Content-Type": "text/plain"})
    assert created.status_code == 201, created.text
    assert created.headers["content-type"] == "text/plain"
    # Every offset of the stream states the same incarnation: the creation's, an append's, a
    # read's, a HEAD's and a refusal's.
    minted = created.headers["stream-next-offset"]
    assert minted == At(1)
    assert created.headers["location"].endswith(f"/api/durable-streams/v1/stream{url}")
    assert created.headers["x-content-type-options"] == "nosniff"
    again = await ds.put(url, headers={"Content-Type": "TEXT/PLAIN"})
    assert again.status_code == 200
    assert_problem(await ds.put(url, headers={"Content-Type": "text/html"}), 409, None)
    appended = await ds.post(url, content=b"world", headers={"Content-Type": "text/plain"})
    assert appended.status_code == 204, appended.text
    assert appended.headers["stream-next-offset"] == At(2, of=minted)
    read = await ds.get(url)
    assert read.headers["stream-next-offset"] == appended.headers["stream-next-offset"]
    assert (read.status_code, read.content) == (200, b"hello world")
    assert read.headers["stream-up-to-date"] == "true"
    assert "stream-closed" not in read.headers
    tag = read.headers["etag"]
    # A cache keeps a copy per token: who may read is the token's to say.
    assert {"origin", "authorization"} <= {
        v.strip().lower() for v in read.headers["vary"].split(",")
    }
    assert (await ds.get(url, headers={"If-None-Match": tag})).status_code == 304
    later = await ds.get(url, params={"offset": offset(1)})
    assert later.content == b"world"
    assert (await ds.get(url, params={"offset": minted})).content == b"world"
    head = await ds.head(url)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["stream-next-offset"] == appended.headers["stream-next-offset"]
    assert head.headers["cache-control"] == "no-store"
    closed = await ds.post(url, headers={"Stream-Closed": "true"})
    assert closed.status_code == 204 and closed.headers["stream-closed"] == "true"
    tail = await ds.get(url, params={"offset": offset(2)})
    assert (tail.content, tail.headers["stream-closed"]) == (b"", "true")
    assert (await ds.get(url, headers={"If-None-Match": tag})).status_code == 200  # closure
    refused = await ds.post(url, content=b"more", headers={"Content-Type": "text/plain"})
    assert_problem(refused, 409, "stream-closed")
    assert refused.headers["stream-closed"] == "true"
    assert refused.headers["stream-next-offset"] == appended.headers["stream-next-offset"]
    assert (await ds.delete(url)).status_code == 204
    assert_problem(await ds.get(url), 404, "not-found")
    assert (await ds.put(url, headers={"Content-Type": "text/plain"})).status_code == 201


async def test_the_default_run_is_the_native_run_named_default(
    ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str
) -> None:
    stream = f"in-default-{run_id}"
    assert (await ds.put(f"/{stream}", headers={"Content-Type": "text/plain"})).status_code == 201
    document = (await api.get(f"/runs/default/streams/{stream}")).json()
    assert (document["run_id"], document["state"]["head"]) == ("default", 0)
    assert (await ds.delete(f"/{stream}")).status_code == 204


async def test_json_mode_flattens_one_level_and_reads_natively_as_records(
    ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str
) -> None:
    url = f"/{run_id}/events"
    json_type = {"Content-Type": "application/json"}
    assert (await ds.put(url, content=b"[]", headers=json_type)).status_code == 201
    assert (await ds.get(url)).json() == []
    ok = await ds.post(url, content=b'[{"a": 1}, [2, 3]]', headers=json_type)
    assert ok.status_code == 204 and ok.headers["stream-next-offset"] == At(2)
    assert (await ds.post(url, content=b'"three"', headers=json_type)).status_code == 204
    assert_problem(await ds.post(url, content=b"[]", headers=json_type), 400, "invalid-input")
    assert_problem(await ds.post(url, content=b"{nope", headers=json_type), 400, "invalid-input")
    read = await ds.get(url)
    assert read.headers["content-type"] == "application/json"
    assert read.json() == [{"a": 1}, [2, 3], "three"]
    native = (await api.get(f"/runs/{run_id}/streams/events/records")).json()
    assert [r["data"] for r in native["records"]] == [{"a": 1}, [2, 3], "three"]
    assert native["head"] == 3


async def test_a_native_json_stream_reads_and_appends_through_the_protocol(
    ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "native", "direction": "output"}
    )
    assert created.status_code == 201, created.text
    body = {"records": [{"data": {"n": 1}}, {"data_base64": "AAE=", "content_type": "x/y"}]}
    assert (await api.post(f"/runs/{run_id}/streams/native/records", json=body)).status_code == 201
    read = await ds.get(f"/{run_id}/native")
    assert read.headers["content-type"] == "application/json"
    first, second = read.json()
    assert first == {"n": 1}
    assert (second["sequence"], second["data_base64"]) == (2, "AAE=")
    appended = await ds.post(
        f"/{run_id}/native", content=b'{"n": 3}', headers={"Content-Type": "application/json"}
    )
    assert appended.status_code == 204, appended.text
    native = (await api.get(f"/runs/{run_id}/streams/native/records?cursor=2")).json()
    assert native["records"][0]["data"] == {"n": 3}
    wrong = await ds.post(f"/{run_id}/native", content=b"x", headers={"Content-Type": "text/plain"})
    assert_problem(wrong, 409, None)


async def test_bytes_are_binary_records_natively_split_at_the_inline_limit(
    ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str
) -> None:
    url = f"/{run_id}/bytes"
    data = bytes(range(256)) * 300  # 76,800 bytes: two records
    assert (await ds.put(url, headers={"Content-Type": "application/x-thing"})).status_code == 201
    appended = await ds.post(url, content=data, headers={"Content-Type": "application/x-thing"})
    assert appended.headers["stream-next-offset"] == At(2)
    native = (await api.get(f"/runs/{run_id}/streams/bytes/records")).json()
    records = native["records"]
    assert [r["size"] for r in records] == [65_536, len(data) - 65_536]
    assert {r["content_type"] for r in records} == {"application/x-thing"}
    assert b"".join(base64.b64decode(r["data_base64"]) for r in records) == data
    assert (await ds.get(url)).content == data


async def test_credit_backpressure_is_429_with_retry_after(
    ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={"stream_id": "tight", "direction": "output", "limits": {"max_unread_items": 2}},
    )
    assert created.status_code == 201
    json_type = {"Content-Type": "application/json"}
    assert (
        await ds.post(f"/{run_id}/tight", content=b"[1, 2]", headers=json_type)
    ).status_code == 204
    refused = await ds.post(f"/{run_id}/tight", content=b"3", headers=json_type)
    assert_problem(refused, 429, "backpressure")
    assert int(refused.headers["retry-after"]) >= 1
    ack = await api.post(f"/runs/{run_id}/streams/tight/consumers/c/ack", json={"sequence": 2})
    assert ack.status_code == 200
    assert (await ds.post(f"/{run_id}/tight", content=b"3", headers=json_type)).status_code == 204


async def test_a_legal_hold_blocks_delete(
    ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str
) -> None:
    assert (
        await ds.put(f"/{run_id}/held", headers={"Content-Type": "text/plain"})
    ).status_code == 201
    hold = await api.put(
        f"/runs/{run_id}/streams/held/legal-hold", json={"enabled": True, "reason": "case"}
    )
    assert hold.status_code == 200
    assert_problem(await ds.delete(f"/{run_id}/held"), 409, "legal-hold-active")
    assert (await ds.head(f"/{run_id}/held")).status_code == 200


async def test_tenancy_and_scopes(server: ServerProcess, tokens: Tokens, run_id: str) -> None:
    async with ds_client(server) as ds:
        assert (await ds.put(f"/{run_id}/mine", content=b"x")).status_code == 201
    other = await tokens.create(tenant="other-tenant")
    reader = await tokens.create(scopes=("streams:read",))
    writer = await tokens.create(scopes=("streams:write",))
    async with ds_client(server, other) as ds:
        assert_problem(await ds.get(f"/{run_id}/mine"), 404, "not-found")
        assert_problem(await ds.post(f"/{run_id}/mine", content=b"y"), 404, "not-found")
        assert_problem(await ds.delete(f"/{run_id}/mine"), 404, "not-found")
    async with ds_client(server, reader) as ds:
        assert (await ds.get(f"/{run_id}/mine")).content == b"x"
        assert_problem(await ds.put(f"/{run_id}/new"), 403, "forbidden")
        posted = await ds.post(
            f"/{run_id}/mine", content=b"y", headers={"Content-Type": "application/octet-stream"}
        )
        assert_problem(posted, 403, "forbidden")
    async with ds_client(server, writer) as ds:
        assert_problem(await ds.get(f"/{run_id}/mine"), 403, "forbidden")
        assert_problem(await ds.delete(f"/{run_id}/mine"), 403, "forbidden")
    async with ds_client(server, "nope") as ds:
        unknown = await ds.get(f"/{run_id}/mine")
        assert_problem(unknown, 401, "unauthenticated")
        assert unknown.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    ("method", "headers", "body", "query"),
    [
        ("PUT", {"Stream-TTL": "01"}, b"", {}),
        ("PUT", {"Stream-TTL": "1e3"}, b"", {}),
        ("PUT", {"Stream-TTL": "60", "Stream-Expires-At": "2099-01-01T00:00:00Z"}, b"", {}),
        ("PUT", {"Stream-Expires-At": "tomorrow"}, b"", {}),
        ("PUT", {"Content-Type": "not a type"}, b"", {}),
        ("PUT", {"Content-Type": "application/json"}, b"[1,", {}),
        ("PUT", {"Stream-Fork-Sub-Offset": "0"}, b"", {}),
        ("POST", {"Content-Type": "application/octet-stream"}, b"", {}),
        ("POST", {}, b"data", {}),
        ("POST", {"Producer-Id": "p", "Producer-Epoch": "0"}, b"x", {}),
        ("POST", {"Producer-Id": "p", "Producer-Epoch": "-1", "Producer-Seq": "0"}, b"x", {}),
        ("GET", {}, b"", {"offset": "0,1"}),
        ("GET", {}, b"", {"offset": ""}),
        ("GET", {}, b"", {"offset": "../x"}),
        ("GET", {}, b"", {"offset": "99999999999999999_0000000000000000"}),
        ("GET", {}, b"", {"live": "long-poll"}),
        ("GET", {}, b"", {"offset": "-1", "live": "forever"}),
    ],
)
async def test_malformed_requests_are_400_problems_and_change_nothing(
    ds: httpx.AsyncClient,
    run_id: str,
    method: str,
    headers: dict[str, str],
    body: bytes,
    query: dict[str, str],
) -> None:
    existing = f"/{run_id}/target"
    assert (await ds.put(existing, content=b"kept")).status_code == 201
    url = existing if method != "PUT" else f"/{run_id}/fresh"
    answer = await ds.request(method, url, headers=headers, content=body, params=query)
    assert_problem(answer, 400, None)
    assert (await ds.get(existing)).content == b"kept"
    if method == "PUT":
        assert (await ds.head(url)).status_code == 404


async def test_bad_ids_and_paths_are_4xx_problems(ds: httpx.AsyncClient) -> None:
    for path in ("/-lead", "/a/b/c", "/" + "a" * 129, "/sp%20ace"):
        answer = await ds.get(path)
        assert answer.status_code in (400, 404), (path, answer.text)
        assert answer.headers["content-type"].startswith("application/problem+json")


async def test_long_poll_wakes_on_append_and_times_out_with_204(
    ds: httpx.AsyncClient, run_id: str
) -> None:
    url = f"/{run_id}/live"
    assert (await ds.put(url, headers={"Content-Type": "text/plain"})).status_code == 201
    waiting = [
        asyncio.create_task(ds.get(url, params={"offset": offset(0), "live": "long-poll"}))
        for _ in range(5)
    ]
    await asyncio.sleep(0.3)
    assert not any(task.done() for task in waiting)
    await ds.post(url, content=b"ping", headers={"Content-Type": "text/plain"})
    for answer in await asyncio.gather(*waiting):
        assert (answer.status_code, answer.content) == (200, b"ping")
        assert answer.headers["stream-next-offset"] == At(1)
        assert answer.headers["stream-cursor"].isdigit()
    timed_out = await ds.get(url, params={"offset": offset(1), "live": "long-poll"})
    assert timed_out.status_code == 204
    assert timed_out.headers["stream-up-to-date"] == "true"
    assert timed_out.headers["stream-next-offset"] == At(1)
    await ds.post(url, headers={"Stream-Closed": "true"})
    at_end = await ds.get(url, params={"offset": offset(1), "live": "long-poll"})
    assert (at_end.status_code, at_end.headers["stream-closed"]) == (204, "true")


async def test_sse_delivers_history_then_live_data_then_closure(
    ds: httpx.AsyncClient, run_id: str
) -> None:
    url = f"/{run_id}/sse"
    assert (
        await ds.put(url, content=b"\x00\x01", headers={"Content-Type": "x/bin"})
    ).status_code == 201
    events: list[tuple[str, str]] = []
    async with ds.stream("GET", url, params={"offset": "-1", "live": "sse"}) as answer:
        assert answer.headers["content-type"] == "text/event-stream"
        assert answer.headers["stream-sse-data-encoding"] == "base64"
        kind = None
        async for line in answer.aiter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data:") and kind is not None:
                events.append((kind, line[5:]))
                if kind == "control" and len(events) == 2:
                    await ds.post(
                        url,
                        content=b"\x02",
                        headers={"Content-Type": "x/bin", "Stream-Closed": "true"},
                    )
                if kind == "control" and json.loads(line[5:]).get("streamClosed"):
                    break
    data = b"".join(base64.b64decode(payload) for kind, payload in events if kind == "data")
    assert data == b"\x00\x01\x02"
    controls = [json.loads(payload) for kind, payload in events if kind == "control"]
    assert controls[0] == {**controls[0], "streamNextOffset": At(1), "upToDate": True}
    assert controls[-1]["streamClosed"] is True and "streamCursor" not in controls[-1]


async def _sse_text(ds: httpx.AsyncClient, url: str) -> str:
    """The text of every data event up to the first up-to-date control event, parsed as the SSE
    standard says (one space after `data:` stripped, an event's lines joined by LF)."""
    texts: list[str] = []
    lines: list[str] = []
    kind = None
    async with ds.stream("GET", url, params={"offset": "-1", "live": "sse"}) as answer:
        assert "stream-sse-data-encoding" not in answer.headers
        async for line in answer.aiter_lines():
            if line.startswith("event:"):
                kind, lines = line[6:].removeprefix(" "), []
            elif line.startswith("data:"):
                lines.append(line[5:].removeprefix(" "))
            elif line == "" and kind is not None:
                if kind == "data":
                    texts.append("\n".join(lines))
                elif json.loads("\n".join(lines)).get("upToDate"):
                    break
                kind = None
    return "".join(texts)


@pytest.mark.parametrize(
    ("content_type", "appends", "text"),
    [
        # A line that begins with a space kept it only in catch-up reads: `data:` + line lost
        # one space to every SSE reader.
        ("text/plain", [b" indented\n\tx", b"  two"], " indented\n\tx  two"),
        # A declared charset: its text, as UTF-8 (it came as U+FFFD).
        ("text/plain; charset=latin-1", [b"caf\xe9 \xff"], "caf\u00e9 \u00ff"),
        ('text/csv; charset="windows-1252"', [b"\x80 5"], "\u20ac 5"),
        # Codecs that are no charset, or refuse what they are given: read as UTF-8 (the read
        # was cut short by the error).
        ("text/plain; charset=hex", [b"hello\n"], "hello\n"),
        ("text/plain; charset=undefined", [b"caf\xc3\xa9"], "caf\u00e9"),
        ("text/plain; charset=punycode", [b"\xff-\xff"], "\ufffd-\ufffd"),
        # A charset whose text may hold a lone surrogate, which no UTF-8 text can carry.
        ("text/plain; charset=utf-7", [b"a+2AA-b"], "a\ufffdb"),
    ],
)
async def test_sse_text_is_the_text_appended(
    ds: httpx.AsyncClient, run_id: str, content_type: str, appends: list[bytes], text: str
) -> None:
    url = f"/{run_id}/sse-text-{abs(hash(content_type)) % 10_000}"
    assert (await ds.put(url, headers={"Content-Type": content_type})).status_code == 201
    for body in appends:
        posted = await ds.post(url, content=body, headers={"Content-Type": content_type})
        assert posted.status_code == 204, posted.text
    catch_up = await ds.get(url, params={"offset": "-1"})
    assert catch_up.content == b"".join(appends)  # the bytes as stored
    assert await _sse_text(ds, url) == text


WORKER_ENV = {
    "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.1",
    "DUCTOR_STREAMS_PRUNE_INTERVAL_SECONDS": "0.2",
    "DUCTOR_STREAMS_WORKER_LEASE_SECONDS": "2",
}


@pytest.fixture(scope="module")
def worker(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    process = WorkerProcess(
        database_url=database_url, data_dir=tmp_path_factory.mktemp("ds-worker"), env=WORKER_ENV
    ).start()
    yield process
    process.stop()


async def test_an_offset_before_retention_is_410_and_the_start_is_what_it_kept(
    ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str, worker: WorkerProcess
) -> None:
    """An offset this server issued whose next record retention removed is 410; `-1` (or no
    offset) is the start of the stream (PROTOCOL.md section 8), the earliest record kept, in
    every read mode: a new reader can always read from the start."""
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={"stream_id": "kept", "direction": "output", "retention": {"max_records": 2}},
    )
    assert created.status_code == 201
    body = {"records": [{"data": n} for n in range(5)]}
    assert (await api.post(f"/runs/{run_id}/streams/kept/records", json=body)).status_code == 201
    async with asyncio.timeout(15):
        while (await api.get(f"/runs/{run_id}/streams/kept")).json()["state"]["earliest"] != 4:
            await asyncio.sleep(0.1)
    gone = await ds.get(f"/{run_id}/kept", params={"offset": offset(1)})
    assert_problem(gone, 410, "cursor-expired")
    # Told in offsets, as the client knows its positions: the one it asked, the one to read
    # from for the earliest record kept, and the tail.
    problem = gone.json()
    assert (problem["offset"], problem["earliest_offset"]) == (At(1), At(3))
    assert problem["next_offset"] == At(5) and problem["reason"] == "retention"
    assert problem["earliest_offset"] in problem["detail"] and "earliest" not in problem
    kept = await ds.get(f"/{run_id}/kept", params={"offset": problem["earliest_offset"]})
    assert kept.json() == [3, 4]
    assert (await ds.get(f"/{run_id}/kept", params={"offset": offset(3)})).json() == [3, 4]
    for params in ({"offset": "-1"}, {}, {"offset": "-1", "live": "long-poll"}):
        start = await ds.get(f"/{run_id}/kept", params=params)
        assert start.status_code == 200 and start.json() == [3, 4], (params, start.text)
        assert start.headers["Stream-Next-Offset"] == At(5)
    async with ds.stream(
        "GET", f"/{run_id}/kept", params={"offset": "-1", "live": "sse"}
    ) as events:
        assert events.status_code == 200
        text = ""
        async for chunk in events.aiter_text():
            text += chunk
            if "event: control" in text:
                break
    assert "event: data\ndata:[3,4]" in text.replace("\r\n", "\n"), text


async def test_an_offset_of_a_stream_deleted_since_never_reads_the_new_one_from_its_middle(
    ds: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """A client kept an offset (after three records) of a stream that was then deleted and
    created again under the same path with four. Read as a position of the new stream, it
    would answer only the fourth record, and the reader would never see the first three. It
    is another stream's offset: the read starts at the new stream's start, on every read mode;
    a fork at it, and a subscription's ack of it, are refused."""
    text = {"Content-Type": "text/plain"}
    url = f"/{run_id}/again"
    assert (await ds.put(url, content=b"1", headers=text)).status_code == 201
    for part in (b"2", b"3"):
        assert (await ds.post(url, content=part, headers=text)).status_code == 204
    kept = (await ds.head(url)).headers["stream-next-offset"]
    assert kept == At(3)
    assert (await ds.delete(url)).status_code == 204
    created = await ds.put(url, content=b"a", headers=text)
    assert created.status_code == 201
    assert (
        created.headers["stream-next-offset"] == At(1)
        and created.headers["stream-next-offset"] > kept
    )  # the new stream's offsets sort after the old one's
    for part in (b"b", b"c", b"d"):
        assert (await ds.post(url, content=part, headers=text)).status_code == 204
    read = await ds.get(url, params={"offset": kept})
    assert (read.status_code, read.content) == (200, b"abcd")
    head = read.headers["stream-next-offset"]
    assert head == At(4, of=created.headers["stream-next-offset"])
    polled = await ds.get(url, params={"offset": kept, "live": "long-poll"})
    assert (polled.status_code, polled.content) == (200, b"abcd")
    async with ds.stream("GET", url, params={"offset": kept, "live": "sse"}) as events:
        first_data = ""
        async for line in events.aiter_lines():
            if line.startswith("data:"):
                first_data = line.removeprefix("data:")
                break
    assert first_data == "abcd"
    # The new stream's own offsets are positions of it, as ever; the legacy form too.
    after_one = await ds.get(url, params={"offset": created.headers["stream-next-offset"]})
    assert after_one.content == b"bcd"
    assert (await ds.get(url, params={"offset": offset(3)})).content == b"d"
    fork = await ds.put(
        f"/{run_id}/again-fork",
        headers={"Stream-Forked-From": f"/v1/stream{url}", "Stream-Fork-Offset": kept},
    )
    assert_problem(fork, 400, "invalid-input")
    assert fork.json()["field"] == "Stream-Fork-Offset"  # the header, not the native field
    assert_problem(await ds.get(f"/{run_id}/again-fork"), 404, "not-found")
    past = await ds.put(
        f"/{run_id}/past", headers={**text, "Stream-Expires-At": "2020-01-01T00:00:00Z"}
    )
    assert_problem(past, 400, "invalid-input")
    assert past.json()["field"] == "Stream-Expires-At"


async def test_a_wake_states_its_streams_offsets_and_an_ack_of_a_deleted_streams_is_refused(
    ds: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """A pull-wake claim shows each stream's offsets as a read of the stream does (the same
    text: a worker compares them). Once the stream is deleted and created again, an ack of the
    offset the claim showed names a position of the deleted stream: refused (409), and the new
    stream's records stay pending, never acknowledged unseen."""
    text = {"Content-Type": "text/plain"}
    root = f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions"
    name = "sub-" + run_id[-8:]
    assert (await ds.put(f"/{run_id}/wake", headers=text)).status_code == 201
    assert (await ds.put(f"/{run_id}/e1", content=b"x", headers=text)).status_code == 201
    put = await ds.put(
        f"{root}/{name}",
        json={"type": "pull-wake", "pattern": f"{run_id}/e*", "wake_stream": f"{run_id}/wake"},
    )
    assert put.status_code == 201, put.text
    for part in (b"y", b"z"):
        assert (await ds.post(f"/{run_id}/e1", content=part, headers=text)).status_code == 204
    claim = await ds.post(f"{root}/{name}/claim", json={"worker": "w1"})
    assert claim.status_code == 200, claim.text
    wake = claim.json()
    [stream] = wake["streams"]
    head = (await ds.head(f"/{run_id}/e1")).headers["stream-next-offset"]
    assert stream["tail_offset"] == head == At(3)
    # A read from the acked offset the claim showed (the head when the pattern linked it) is
    # what is pending.
    assert (await ds.get(f"/{run_id}/e1", params={"offset": stream["acked_offset"]})).content == (
        b"yz"
    )
    assert (await ds.delete(f"/{run_id}/e1")).status_code == 204
    created = await ds.put(f"/{run_id}/e1", content=b"new", headers=text)
    assert created.status_code == 201
    for part in (b"-2", b"-3", b"-4"):
        assert (await ds.post(f"/{run_id}/e1", content=part, headers=text)).status_code == 204
    auth = {"Authorization": f"Bearer {wake['token']}"}
    ack = {"wake_id": wake["wake_id"], "generation": wake["generation"]}
    refused = await ds.post(
        f"{root}/{name}/ack",
        json={**ack, "acks": [{"path": f"{run_id}/e1", "offset": head}]},
        headers=auth,
    )
    assert refused.status_code == 409, refused.text  # the protocol's INVALID_OFFSET
    assert refused.json()["error"]["code"] == "INVALID_OFFSET"
    shown = (await ds.get(f"{root}/{name}")).json()
    assert shown["streams"][0]["acked_offset"] == At(0, of=created.headers["stream-next-offset"])
    new_head = (await ds.head(f"/{run_id}/e1")).headers["stream-next-offset"]
    done = await ds.post(
        f"{root}/{name}/ack",
        json={**ack, "acks": [{"path": f"{run_id}/e1", "offset": new_head}], "done": True},
        headers=auth,
    )
    assert done.status_code == 200, done.text
    shown = (await ds.get(f"{root}/{name}")).json()
    assert shown["streams"][0]["acked_offset"] == new_head
