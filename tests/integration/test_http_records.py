"""Records over HTTP: append, read, wait, idempotency, redaction, credit and concurrency
(docs/http-api.md "Records" and "Consumers and credit")."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from typing import Any

import asyncpg
import httpx
import pytest

from tests.integration.test_tokens_http import minted
from tests.support.server import ServerProcess

PROBLEM_JSON = "application/problem+json"
CREDIT_FIELDS = {"unread_items", "unread_bytes", "max_unread_items", "max_unread_bytes"}


def assert_problem(response: httpx.Response, status: int, code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body = response.json()
    for field in ("type", "title", "status", "detail", "code"):
        assert field in body, body
    assert body["status"] == status
    if code is not None:
        assert body["code"] == code, body
    return body


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


async def create(api: httpx.AsyncClient, run_id: str, stream_id: str, **definition: Any) -> None:
    response = await api.post(
        f"/runs/{run_id}/streams",
        json={"stream_id": stream_id, "direction": "output", **definition},
    )
    assert response.status_code == 201, response.text


async def append(
    api: httpx.AsyncClient, run_id: str, stream_id: str, *data: Any, **kwargs: Any
) -> httpx.Response:
    return await api.post(
        f"/runs/{run_id}/streams/{stream_id}/records",
        json={"records": [{"data": d} for d in data]},
        **kwargs,
    )


async def blocked(api: httpx.AsyncClient, run_id: str, stream_id: str, seconds: float) -> None:
    """A stream of one unread record at most, whose appends wait `seconds` for credit, already
    holding one: the next append waits."""
    await create(
        api,
        run_id,
        stream_id,
        limits={"max_unread_items": 1, "unread_policy": "block", "block_timeout_seconds": seconds},
    )
    assert (await append(api, run_id, stream_id, "first")).status_code == 201


async def read(
    api: httpx.AsyncClient, run_id: str, stream_id: str, **params: Any
) -> httpx.Response:
    return await api.get(f"/runs/{run_id}/streams/{stream_id}/records", params=params)


async def page(api: httpx.AsyncClient, run_id: str, stream_id: str, **params: Any) -> dict:
    response = await read(api, run_id, stream_id, **params)
    assert response.status_code == 200, response.text
    return response.json()


async def state(api: httpx.AsyncClient, run_id: str, stream_id: str) -> dict[str, Any]:
    response = await api.get(f"/runs/{run_id}/streams/{stream_id}")
    assert response.status_code == 200, response.text
    return response.json()["state"]


async def ack(
    api: httpx.AsyncClient, run_id: str, stream_id: str, consumer: str, sequence: int
) -> httpx.Response:
    return await api.post(
        f"/runs/{run_id}/streams/{stream_id}/consumers/{consumer}/ack", json={"sequence": sequence}
    )


# -- append ---------------------------------------------------------------------------------------


async def test_append_answers_201_with_contiguous_sequences_per_batch(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, "s")
    first = await append(api, run_id, "s", 1, 2, 3)
    assert first.status_code == 201, first.text
    body = first.json()
    assert set(body) == {"first_sequence", "last_sequence", "head", "credit"}
    assert (body["first_sequence"], body["last_sequence"], body["head"]) == (1, 3, 3)
    assert set(body["credit"]) == CREDIT_FIELDS
    assert body["credit"]["unread_items"] == 3
    assert body["credit"]["unread_bytes"] == 3
    assert body["credit"]["max_unread_items"] == 10_000

    second = (await append(api, run_id, "s", 4, 5)).json()
    assert (second["first_sequence"], second["last_sequence"], second["head"]) == (4, 5, 5)
    assert second["credit"]["unread_items"] == 5

    single = (await append(api, run_id, "s", 6)).json()
    assert (single["first_sequence"], single["last_sequence"], single["head"]) == (6, 6, 6)
    records = (await page(api, run_id, "s"))["records"]
    assert [r["sequence"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["data"] for r in records] == [1, 2, 3, 4, 5, 6]


async def test_json_and_base64_records_read_back_as_sent(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, "mixed")
    raw = bytes(range(256)) + b"\x00tail"
    response = await api.post(
        f"/runs/{run_id}/streams/mixed/records",
        json={
            "records": [
                {"data": {"text": "hello", "n": [1, 2.5, None, True]}},
                {"data_base64": base64.b64encode(raw).decode(), "content_type": "image/x-test"},
                {"data": "plain string", "content_type": "application/vnd.test+json"},
                {"data_base64": base64.b64encode(b"abc").decode()},
            ]
        },
    )
    assert response.status_code == 201, response.text
    records = (await page(api, run_id, "mixed"))["records"]
    assert len(records) == 4
    for record in records:
        assert {"sequence", "appended_at", "size", "content_type"} <= set(record)
    json_record, binary, typed, untyped = records
    assert json_record["data"] == {"text": "hello", "n": [1, 2.5, None, True]}
    assert "data_base64" not in json_record
    assert json_record["size"] == len(compact(json_record["data"]))
    assert base64.b64decode(binary["data_base64"]) == raw
    assert "data" not in binary
    assert binary["content_type"] == "image/x-test"
    assert binary["size"] == len(raw)
    assert typed["data"] == "plain string"
    assert typed["content_type"] == "application/vnd.test+json"
    assert base64.b64decode(untyped["data_base64"]) == b"abc"
    assert untyped["size"] == 3
    assert isinstance(untyped["content_type"], str)
    assert untyped["content_type"]


async def test_a_records_size_is_the_byte_length_of_its_compact_json(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, "sizes")
    body = b'{"records": [{"data": {"a" : 1}}, {"data" : [ 1 ,\n 2 , {"b" :  null} ] }]}'
    response = await api.post(
        f"/runs/{run_id}/streams/sizes/records",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
    assert response.json()["credit"]["unread_bytes"] == 7 + 16
    records = (await page(api, run_id, "sizes"))["records"]
    assert [r["size"] for r in records] == [7, 16]  # {"a":1} and [1,2,{"b":null}]
    assert records[0]["data"] == {"a": 1}
    assert records[1]["data"] == [1, 2, {"b": None}]
    assert (await state(api, run_id, "sizes"))["total_bytes"] == 23


# -- read -----------------------------------------------------------------------------------------


async def test_read_pages_by_cursor_and_limit(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id, "paged")
    assert (await append(api, run_id, "paged", *range(1, 6))).status_code == 201

    first = await page(api, run_id, "paged", cursor=0, limit=2)
    assert set(first) >= {"records", "next_cursor", "head", "earliest", "closed"}
    assert [r["sequence"] for r in first["records"]] == [1, 2]
    assert (first["next_cursor"], first["head"], first["earliest"], first["closed"]) == (
        2,
        5,
        1,
        False,
    )
    second = await page(api, run_id, "paged", cursor=first["next_cursor"], limit=2)
    assert [r["sequence"] for r in second["records"]] == [3, 4]
    assert second["next_cursor"] == 4
    third = await page(api, run_id, "paged", cursor=second["next_cursor"], limit=2)
    assert [r["sequence"] for r in third["records"]] == [5]
    assert third["next_cursor"] == 5
    middle = await page(api, run_id, "paged", cursor=1, limit=3)
    assert [r["data"] for r in middle["records"]] == [2, 3, 4]


async def test_read_defaults_to_cursor_0_and_limit_100(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id, "many")
    assert (await append(api, run_id, "many", *range(150))).status_code == 201
    default = await page(api, run_id, "many")
    assert [r["sequence"] for r in default["records"]] == list(range(1, 101))
    assert default["next_cursor"] == 100
    everything = await page(api, run_id, "many", limit=1000)
    assert [r["sequence"] for r in everything["records"]] == list(range(1, 151))
    assert everything["next_cursor"] == 150


async def test_a_page_of_large_records_stops_at_4_mib_and_reads_on_from_next_cursor(
    api: httpx.AsyncClient, run_id: str
) -> None:
    """1,000 records of 64 KiB would be a 64 MB read and an 87 MB answer: a page stops
    before the record that would take its payloads past 4 MiB."""
    await create(api, run_id, "large")
    chunk = base64.b64encode(b"x" * 60_000).decode()
    for _ in range(2):
        answer = await api.post(
            f"/runs/{run_id}/streams/large/records",
            json={"records": [{"data_base64": chunk} for _ in range(50)]},
        )
        assert answer.status_code == 201, answer.text
    fits = 4 * 1024 * 1024 // 60_000  # 69
    first = await page(api, run_id, "large", limit=1000)
    assert [r["sequence"] for r in first["records"]] == list(range(1, fits + 1))
    assert (first["next_cursor"], first["head"]) == (fits, 100)
    rest = await page(api, run_id, "large", cursor=first["next_cursor"], limit=1000)
    assert [r["sequence"] for r in rest["records"]] == list(range(fits + 1, 101))
    assert rest["records"][-1]["data_base64"] == chunk


async def test_cursor_at_head_gives_an_empty_page(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id, "tail")
    empty = await page(api, run_id, "tail")
    assert empty["records"] == []
    assert (empty["next_cursor"], empty["head"], empty["earliest"]) == (0, 0, 1)
    assert (await append(api, run_id, "tail", "a", "b")).status_code == 201
    at_head = await page(api, run_id, "tail", cursor=2)
    assert at_head["records"] == []
    assert at_head["next_cursor"] == 2
    assert at_head["head"] == 2


async def test_cursor_ahead_of_head_is_400(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id, "ahead")
    assert_problem(await read(api, run_id, "ahead", cursor=1), 400, "cursor-ahead-of-head")
    assert (await append(api, run_id, "ahead", 1, 2)).status_code == 201
    assert_problem(await read(api, run_id, "ahead", cursor=3), 400, "cursor-ahead-of-head")
    assert_problem(await read(api, run_id, "ahead", cursor=3, wait=1), 400, "cursor-ahead-of-head")


async def test_wait_on_an_empty_tail_returns_after_the_wait_with_no_records(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, "idle")
    assert (await append(api, run_id, "idle", 1)).status_code == 201
    started = time.monotonic()
    body = await page(api, run_id, "idle", cursor=1, wait=1)
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 3, elapsed
    assert body["records"] == []
    assert body["next_cursor"] == 1
    assert body["head"] == 1


async def test_wait_returns_as_soon_as_another_task_appends(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, "live")
    started = time.monotonic()
    waiting = asyncio.create_task(page(api, run_id, "live", cursor=0, wait=5))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    assert (await append(api, run_id, "live", {"hello": "world"})).status_code == 201
    body = await asyncio.wait_for(waiting, 10)
    elapsed = time.monotonic() - started
    assert elapsed < 3, elapsed
    assert [r["data"] for r in body["records"]] == [{"hello": "world"}]
    assert body["next_cursor"] == 1


async def test_wait_with_records_already_there_does_not_wait(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, "ready")
    assert (await append(api, run_id, "ready", 1)).status_code == 201
    started = time.monotonic()
    body = await page(api, run_id, "ready", cursor=0, wait=5)
    assert time.monotonic() - started < 2
    assert [r["sequence"] for r in body["records"]] == [1]


# -- idempotency ----------------------------------------------------------------------------------


async def test_a_retry_with_the_same_key_and_body_replays_the_answer(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, "idem")
    assert (await append(api, run_id, "idem", "before")).status_code == 201
    headers = {"Idempotency-Key": "key-1"}
    first = await append(api, run_id, "idem", "a", "b", headers=headers)
    assert first.status_code == 201, first.text
    assert first.headers.get("idempotent-replayed") is None
    retry = await append(api, run_id, "idem", "a", "b", headers=headers)
    assert retry.status_code == 200, retry.text
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.json() == first.json()
    assert (first.json()["first_sequence"], first.json()["last_sequence"]) == (2, 3)
    for answer in (first, retry):  # the append route answers past Litestar's pipeline
        assert answer.headers["content-type"] == "application/json"
        assert answer.headers["content-length"] == str(len(answer.content))
        assert answer.headers["x-request-id"]
    body = await page(api, run_id, "idem")
    assert [r["data"] for r in body["records"]] == ["before", "a", "b"]
    assert (await state(api, run_id, "idem"))["total_items"] == 3


async def test_the_same_key_with_another_body_is_422(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id, "reuse")
    headers = {"Idempotency-Key": "key-2"}
    assert (await append(api, run_id, "reuse", 1, headers=headers)).status_code == 201
    other = await append(api, run_id, "reuse", 2, headers=headers)
    assert_problem(other, 422, "idempotency-key-reused")
    body = await page(api, run_id, "reuse")
    assert [r["data"] for r in body["records"]] == [1]


async def test_a_key_is_per_stream(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id, "one")
    await create(api, run_id, "two")
    headers = {"Idempotency-Key": "shared"}
    assert (await append(api, run_id, "one", 1, headers=headers)).status_code == 201
    assert (await append(api, run_id, "two", 1, headers=headers)).status_code == 201
    assert (await state(api, run_id, "two"))["head"] == 1


async def test_twenty_concurrent_requests_with_one_key_append_once(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, "race")
    headers = {"Idempotency-Key": "race-key"}
    responses = await asyncio.gather(
        *(append(api, run_id, "race", "x", "y", headers=headers) for _ in range(20))
    )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 19 + [201], [r.text for r in responses if r.status_code >= 300]
    answers = {json.dumps(r.json(), sort_keys=True) for r in responses}
    assert len(answers) == 1
    for response in responses:
        if response.status_code == 200:
            assert response.headers["idempotent-replayed"] == "true"
    body = await page(api, run_id, "race")
    assert [r["data"] for r in body["records"]] == ["x", "y"]
    assert (await state(api, run_id, "race"))["total_items"] == 2


# -- redaction ------------------------------------------------------------------------------------


async def test_redaction_pointers_replace_values_before_storage(
    api: httpx.AsyncClient, run_id: str, pool: asyncpg.Pool
) -> None:
    await create(
        api,
        run_id,
        "redacted",
        redaction={"json_pointers": ["/secret", "/nested/token", "/list/1", "/a~1b", "/absent"]},
    )
    record = {
        "secret": "hunter2-secret",
        "nested": {"token": "tok-hunter2", "keep": 1},
        "list": [1, "hunter2-in-list", 3],
        "a/b": "hunter2-slash",
        "other": "ok",
    }
    response = await append(api, run_id, "redacted", record, {"unrelated": True})
    assert response.status_code == 201, response.text
    expected = {
        "secret": "[REDACTED]",
        "nested": {"token": "[REDACTED]", "keep": 1},
        "list": [1, "[REDACTED]", 3],
        "a/b": "[REDACTED]",
        "other": "ok",
    }
    records = (await page(api, run_id, "redacted"))["records"]
    assert records[0]["data"] == expected
    assert records[1]["data"] == {"unrelated": True}
    assert records[0]["size"] == len(compact(expected))
    rows = await pool.fetch(
        "SELECT payload FROM stream_records WHERE run_id = $1 AND stream_id = $2",
        run_id,
        "redacted",
    )
    assert len(rows) == 2
    for row in rows:
        assert b"hunter2" not in bytes(row["payload"])


# -- credit ---------------------------------------------------------------------------------------


async def test_reject_policy_answers_429_with_retry_after_and_appends_nothing(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, "tight", limits={"max_unread_items": 2})
    assert (await append(api, run_id, "tight", 1, 2)).status_code == 201
    refused = await append(api, run_id, "tight", 3)
    assert_problem(refused, 429, "backpressure")
    retry_after = refused.headers["retry-after"]
    assert retry_after.isdigit(), retry_after
    assert int(retry_after) >= 1
    current = await state(api, run_id, "tight")
    assert current["head"] == 2
    assert current["credit"]["unread_items"] == 2


async def test_unread_bytes_ceiling_also_refuses(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id, "bytes", limits={"max_unread_bytes": 10})
    assert (await append(api, run_id, "bytes", "12345678")).status_code == 201  # 10 bytes
    assert_problem(await append(api, run_id, "bytes", 1), 429, "backpressure")
    assert (await state(api, run_id, "bytes"))["head"] == 1


async def test_an_ack_frees_credit_for_the_next_append(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id, "freed", limits={"max_unread_items": 2})
    assert (await append(api, run_id, "freed", 1, 2)).status_code == 201
    assert (await append(api, run_id, "freed", 3)).status_code == 429
    acked = await ack(api, run_id, "freed", "reader", 2)
    assert acked.status_code == 200, acked.text
    assert acked.json()["credit"]["unread_items"] == 0
    after = await append(api, run_id, "freed", 3)
    assert after.status_code == 201, after.text
    assert after.json()["first_sequence"] == 3
    assert after.json()["credit"]["unread_items"] == 1


async def test_max_total_items_is_409_quota_exhausted_and_appends_nothing(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, "quota", limits={"max_total_items": 3})
    assert (await append(api, run_id, "quota", 1, 2)).status_code == 201
    assert_problem(await append(api, run_id, "quota", 3, 4), 409, "quota-exhausted")
    assert (await state(api, run_id, "quota"))["head"] == 2
    assert (await append(api, run_id, "quota", 3)).status_code == 201
    assert_problem(await append(api, run_id, "quota", 4), 409, "quota-exhausted")
    # Acknowledging frees unread credit, never the total quota.
    assert (await ack(api, run_id, "quota", "c", 3)).status_code == 200
    assert_problem(await append(api, run_id, "quota", 4), 409, "quota-exhausted")
    current = await state(api, run_id, "quota")
    assert current["head"] == 3
    assert current["total_items"] == 3


async def test_max_total_bytes_is_409_quota_exhausted(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id, "quota-bytes", limits={"max_total_bytes": 5})
    assert (await append(api, run_id, "quota-bytes", 123)).status_code == 201  # 3 bytes
    assert_problem(await append(api, run_id, "quota-bytes", 456), 409, "quota-exhausted")
    assert (await state(api, run_id, "quota-bytes"))["total_bytes"] == 3


@pytest.mark.parametrize(
    ("limits", "data"),
    [
        ({"max_unread_items": 2}, [1, 2, 3]),
        ({"max_unread_bytes": 10}, ["123456789"]),  # 11 bytes with its quotes
    ],
    ids=["items", "bytes"],
)
async def test_a_batch_that_can_never_fit_the_unread_ceiling_is_400(
    api: httpx.AsyncClient, run_id: str, limits: dict[str, int], data: list[Any]
) -> None:
    await create(api, run_id, "never", limits=limits)
    assert_problem(await append(api, run_id, "never", *data), 400, None)
    current = await state(api, run_id, "never")
    assert current["head"] == 0
    assert current["total_items"] == 0


async def test_block_policy_without_an_ack_times_out_with_429(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(
        api,
        run_id,
        "blocked",
        limits={"max_unread_items": 1, "unread_policy": "block", "block_timeout_seconds": 1},
    )
    assert (await append(api, run_id, "blocked", 1)).status_code == 201
    started = time.monotonic()
    response = await append(api, run_id, "blocked", 2)
    elapsed = time.monotonic() - started
    assert_problem(response, 429, "backpressure")
    assert response.headers["retry-after"].isdigit()
    assert 0.9 <= elapsed < 4, elapsed
    assert (await state(api, run_id, "blocked"))["head"] == 1


async def test_block_policy_appends_once_a_concurrent_ack_frees_credit(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(
        api,
        run_id,
        "unblocked",
        limits={"max_unread_items": 1, "unread_policy": "block", "block_timeout_seconds": 10},
    )
    assert (await append(api, run_id, "unblocked", 1)).status_code == 201
    started = time.monotonic()
    blocked = asyncio.create_task(append(api, run_id, "unblocked", 2))
    await asyncio.sleep(0.7)
    assert not blocked.done()
    assert (await ack(api, run_id, "unblocked", "reader", 1)).status_code == 200
    response = await asyncio.wait_for(blocked, 15)
    elapsed = time.monotonic() - started
    assert response.status_code == 201, response.text
    assert response.json()["first_sequence"] == 2
    assert elapsed < 5, elapsed
    records = (await page(api, run_id, "unblocked"))["records"]
    assert [r["data"] for r in records] == [1, 2]


@pytest.mark.parametrize("surface", ["native", "durable-streams"])
async def test_a_blocked_append_whose_client_left_is_not_made(
    server: ServerProcess, api: httpx.AsyncClient, run_id: str, surface: str
) -> None:
    """Its client gone (a timeout, then a retry without a key), an append waiting for credit
    went on waiting, held its live slot, and appended its record once credit came back: the
    retry's record then came twice."""
    stream = "left-" + surface
    await blocked(api, run_id, stream, 20)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up on it, and leaves
        if surface == "native":
            await append(api, run_id, stream, "abandoned", timeout=1.0)
        else:
            await api.post(
                f"{server.base_url}/api/durable-streams/v1/stream/{run_id}/{stream}",
                content=b'"abandoned"',
                headers={"Content-Type": "application/json"},
                timeout=1.0,
            )
    await asyncio.sleep(0.5)
    assert (await ack(api, run_id, stream, "reader", 1)).status_code == 200
    await asyncio.sleep(1.5)  # long enough for a waiter still there to append
    records = (await page(api, run_id, stream))["records"]
    assert [r["data"] for r in records] == ["first"]
    metrics = (await api.get(f"{server.base_url}/metrics")).text
    live = [line for line in metrics.splitlines() if line.startswith("ductor_streams_active_sub")]
    assert all(line.endswith(" 0.0") for line in live), live


@pytest.mark.parametrize("surface", ["native", "durable-streams", "object-commit"])
async def test_a_write_waiting_for_credit_ends_when_its_token_is_revoked(
    server: ServerProcess, api: httpx.AsyncClient, run_id: str, surface: str
) -> None:
    """A write waiting for credit is an open connection on its token: revoked meanwhile (here
    through the token that minted it), it answers 401 within about 2 s and writes nothing when
    credit comes back. An object commit waiting so holds a live-connection slot too."""
    stream = "revoked-" + surface
    await blocked(api, run_id, stream, 30)
    parent = await minted(api, runs=[run_id])  # (read, write and admin)
    child = await minted(
        api,
        {"Authorization": f"Bearer {parent['token']}"},
        scopes=["streams:read", "streams:write"],
        expires_in_seconds=300,
    )
    writer = {"Authorization": f"Bearer {child['token']}"}
    path = f"/runs/{run_id}/streams/{stream}"
    if surface == "native":
        waiting = append(api, run_id, stream, "after", headers=writer)
    elif surface == "durable-streams":
        waiting = api.post(
            f"{server.base_url}/api/durable-streams/v1/stream/{run_id}/{stream}",
            content=b'"after"',
            headers={"Content-Type": "application/json", **writer},
        )
    else:
        body = b"a body"
        intent = await api.post(
            f"{path}/objects",
            json={
                "idempotency_key": "o",
                "size": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
            },
            headers=writer,
        )
        assert intent.status_code == 201, intent.text
        object_id = intent.json()["object_id"]
        put = await api.put(f"{path}/objects/{object_id}/body", content=body, headers=writer)
        assert put.status_code == 200, put.text
        waiting = api.post(f"{path}/objects/{object_id}/commit", headers=writer)
    task = asyncio.ensure_future(waiting)
    await asyncio.sleep(0.7)
    assert not task.done()
    metrics = (await api.get(f"{server.base_url}/metrics")).text
    held = [line for line in metrics.splitlines() if line.startswith("ductor_streams_active_sub")]
    assert any(not line.endswith(" 0.0") for line in held), held  # it holds a live slot
    revoked_at = time.monotonic()
    assert (await api.delete(f"/tokens/{parent['id']}")).status_code == 204
    answer = await asyncio.wait_for(task, 15)
    assert_problem(answer, 401, "unauthenticated")
    assert time.monotonic() - revoked_at < 4
    assert (await ack(api, run_id, stream, "reader", 1)).status_code == 200
    await asyncio.sleep(1.0)
    assert (await state(api, run_id, stream))["head"] == 1  # nothing written after


# -- concurrency ----------------------------------------------------------------------------------


async def test_fifty_concurrent_appends_get_each_sequence_exactly_once(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, "busy")
    responses = await asyncio.gather(*(append(api, run_id, "busy", {"i": i}) for i in range(50)))
    assert all(r.status_code == 201 for r in responses), [r.text for r in responses]
    sequences = sorted(r.json()["first_sequence"] for r in responses)
    assert sequences == list(range(1, 51))
    assert all(r.json()["first_sequence"] == r.json()["last_sequence"] for r in responses)
    by_sequence = {r.json()["first_sequence"]: i for i, r in enumerate(responses)}
    records = (await page(api, run_id, "busy", limit=100))["records"]
    assert [r["sequence"] for r in records] == list(range(1, 51))
    for record in records:
        assert record["data"] == {"i": by_sequence[record["sequence"]]}
    current = await state(api, run_id, "busy")
    assert current["head"] == 50
    assert current["total_items"] == 50
