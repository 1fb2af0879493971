"""Integers of thousands of digits, wherever a client's digits become a number, are 400
problem+json: Python's int() refuses more than 4,300 digits with a ValueError, which a pattern
check before it once let through to a 500."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.integration.test_durable_streams import ds_client
from tests.integration.test_http_auth import assert_problem
from tests.support.server import ServerProcess

HUGE = "1" + "0" * 4999  # 5,000 digits
JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def ds(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with ds_client(server) as client:
        yield client


async def test_protocol_headers_of_5000_digits_are_400(ds: httpx.AsyncClient, run_id: str) -> None:
    created = await ds.put(f"/{run_id}/s", content=b'{"a":1}', headers=JSON)
    assert created.status_code == 201, created.text
    producer = {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"}
    for name in ("Producer-Epoch", "Producer-Seq"):
        refused = await ds.post(
            f"/{run_id}/s", content=b'{"a":2}', headers={**JSON, **producer, name: HUGE}
        )
        body = assert_problem(refused, 400, "invalid-input")
        assert body["field"] == name
    refused = await ds.put(f"/{run_id}/ttl", headers={**JSON, "Stream-TTL": HUGE})
    assert_problem(refused, 400, "invalid-input")
    refused = await ds.put(
        f"/{run_id}/sub",
        headers={
            "Stream-Forked-From": f"/v1/stream/{run_id}/s",
            "Stream-Fork-Offset": f"{0:016d}_{0:016d}",
            "Stream-Fork-Sub-Offset": HUGE,
        },
    )
    assert_problem(refused, 400, "invalid-input")
    for name in ("ttl", "sub"):
        assert (await ds.head(f"/{run_id}/{name}")).status_code == 404
    # A Stream-Cursor echoed back of any length is still answered (a greater one).
    polled = await ds.get(
        f"/{run_id}/s",
        params={"offset": f"{0:016d}_{0:016d}", "live": "long-poll", "cursor": HUGE},
    )
    assert polled.status_code == 200, polled.text
    assert len(polled.headers["Stream-Cursor"]) == len(HUGE) + 1
    # Nothing was appended by the refused writes.
    assert (await ds.get(f"/{run_id}/s")).json() == [{"a": 1}]


async def test_native_digits_of_5000_are_400(api: httpx.AsyncClient, run_id: str) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
    )
    assert created.status_code == 201, created.text
    base = f"/runs/{run_id}/streams/s"
    refused = await api.get(f"{base}/subscribe", headers={"Last-Event-ID": HUGE})
    body = assert_problem(refused, 400, "invalid-input")
    assert body["field"] == "Last-Event-ID"
    # Past the largest sequence, and not ASCII digits: refused the same way.
    for value in (str(2**63), "²".encode("latin-1")):
        refused = await api.get(f"{base}/subscribe", headers={"Last-Event-ID": value})
        assert_problem(refused, 400, "invalid-input")
    for name in ("cursor", "limit", "wait"):
        assert_problem(await api.get(f"{base}/records", params={name: HUGE}), 400, "invalid-input")
    assert_problem(await api.get("/runs", params={"limit": HUGE}), 400, "invalid-input")
    # JSON bodies: msgspec refuses an integer that long, as invalid input.
    ack = await api.post(f"{base}/consumers/c/ack", content=f'{{"sequence": {HUGE}}}'.encode())
    assert_problem(ack, 400, "invalid-input")
    limits = await api.post(
        f"/runs/{run_id}/streams",
        content=(
            '{"stream_id": "l", "direction": "output", "limits": {"max_unread_items": '
            + HUGE
            + "}}"
        ).encode(),
        headers=JSON,
    )
    assert_problem(limits, 400, "invalid-input")


# A pointer is at most 1,024 characters: a 1,000-digit index is still far past any integer.
@pytest.mark.parametrize("token", [HUGE[:1000], "²", "01"])
async def test_a_redaction_index_of_any_digits_never_fails_an_append(
    api: httpx.AsyncClient, run_id: str, token: str
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={
            "stream_id": "r",
            "direction": "output",
            "redaction": {"json_pointers": [f"/list/{token}", "/list/1"]},
        },
    )
    assert created.status_code == 201, created.text
    appended = await api.post(
        f"/runs/{run_id}/streams/r/records", json={"records": [{"data": {"list": [1, 2, 3]}}]}
    )
    assert appended.status_code == 201, appended.text
    page = await api.get(f"/runs/{run_id}/streams/r/records")
    assert page.json()["records"][0]["data"] == {"list": [1, "[REDACTED]", 3]}


async def test_a_5000_digit_number_in_record_data_is_kept_or_refused_never_a_500(
    api: httpx.AsyncClient, ds: httpx.AsyncClient, run_id: str
) -> None:
    """Record data is any JSON: a number too long for Python is stored and read back as sent;
    a stream that redacts must decode it, and refuses it (400) instead."""
    body = ('{"records": [{"data": {"n": ' + HUGE + "}}]}").encode()
    for stream_id, pointers, status in (("plain", [], 201), ("redacted", ["/secret"], 400)):
        created = await api.post(
            f"/runs/{run_id}/streams",
            json={
                "stream_id": stream_id,
                "direction": "output",
                "redaction": {"json_pointers": pointers},
            },
        )
        assert created.status_code == 201, created.text
        appended = await api.post(
            f"/runs/{run_id}/streams/{stream_id}/records", content=body, headers=JSON
        )
        assert appended.status_code == status, appended.text
        protocol = await ds.post(
            f"/{run_id}/{stream_id}", content=('{"n": ' + HUGE + "}").encode(), headers=JSON
        )
        assert protocol.status_code == (204 if status == 201 else 400), protocol.text
    read = await ds.get(f"/{run_id}/plain")
    assert read.content == ('[{"n":' + HUGE + '},{"n":' + HUGE + "}]").encode()
