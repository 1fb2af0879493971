"""What the write statement stores is what was appended, byte for byte, however the rows
travel to PostgreSQL (adapters/postgres/stream_writes.py: each table's rows as one JSON array,
bytes as base64, sent as a string constant of the simple query that also commits): every byte
value, quotes, backslashes, dollar signs (a dollar-quoted constant's delimiter among them),
escapes and non-ASCII text, a key holding quotes and dollars, alone or in a batch of many
streams committed together."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx

from tests.integration.test_http_records import create, page

EVERY_BYTE = bytes(range(256))
AWKWARD: Any = {
    "quote": 'it\'s "quoted"',
    "backslash": "C:\\path\\ and \\u0041",
    "nul": "before\u0000after",
    "text": "naïve café, 漢字, 🙂",
    "json in a string": '{"a": [1, 2]}',
    "big": 2**62,
    "float": 1.5e300,
}
KEY = 'it\'s-"a"\\key-$w$-$$-$w'
CONTENT_TYPE = 'x/y; q="a\'b $w$ \\$"'


def records() -> list[dict[str, Any]]:
    return [
        {"data": AWKWARD},
        {"data_base64": base64.b64encode(EVERY_BYTE).decode(), "content_type": CONTENT_TYPE},
        {"data": "plain"},
    ]


async def check_stored(api: httpx.AsyncClient, run_id: str, stream_id: str) -> None:
    got = (await page(api, run_id, stream_id))["records"]
    assert [r["sequence"] for r in got] == [1, 2, 3]
    assert got[0]["data"] == AWKWARD
    assert got[0]["content_type"] == "application/json"
    assert base64.b64decode(got[1]["data_base64"]) == EVERY_BYTE
    assert got[1]["content_type"] == CONTENT_TYPE
    assert got[2]["data"] == "plain"
    sizes = [len(json.dumps(AWKWARD, separators=(",", ":"), ensure_ascii=False).encode()), 256, 7]
    assert [r["size"] for r in got] == sizes


async def test_awkward_records_and_key_are_stored_as_appended_and_replayed(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, "s")
    path = f"/runs/{run_id}/streams/s/records"
    first = await api.post(path, json={"records": records()}, headers={"Idempotency-Key": KEY})
    assert first.status_code == 201, first.text
    await check_stored(api, run_id, "s")
    again = await api.post(path, json={"records": records()}, headers={"Idempotency-Key": KEY})
    assert again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    await check_stored(api, run_id, "s")  # nothing appended twice


async def test_many_streams_appended_at_once_each_store_their_own(
    api: httpx.AsyncClient, run_id: str
) -> None:
    streams = [f"s{i:02d}" for i in range(24)]
    await asyncio.gather(*(create(api, run_id, s) for s in streams))

    async def append(stream_id: str) -> None:
        answer = await api.post(
            f"/runs/{run_id}/streams/{stream_id}/records",
            json={"records": records()},
            headers={"Idempotency-Key": f"{KEY}-{stream_id}"},
        )
        assert answer.status_code == 201, answer.text
        assert (answer.json()["first_sequence"], answer.json()["head"]) == (1, 3)

    # Sent together: the group commit takes what waits for many streams in one transaction.
    await asyncio.gather(*(append(s) for s in streams))
    for stream_id in streams:
        await check_stored(api, run_id, stream_id)
        document = (await api.get(f"/runs/{run_id}/streams/{stream_id}")).json()
        assert (document["state"]["head"], document["state"]["total_items"]) == (3, 3)
