"""The server process answers on real PostgreSQL: create, append, read."""

from __future__ import annotations

import httpx


async def test_a_record_appended_over_http_reads_back_in_order(
    api: httpx.AsyncClient, run_id: str
) -> None:
    created = await api.post(f"/runs/{run_id}/streams", json={"direction": "output"})
    assert created.status_code == 201
    stream_id = created.json()["stream_id"]
    appended = await api.post(
        f"/runs/{run_id}/streams/{stream_id}/records",
        json={"records": [{"data": {"n": 1}}, {"data": {"n": 2}}]},
    )
    assert appended.status_code == 201, appended.text
    assert appended.json()["first_sequence"] == 1
    page = (await api.get(f"/runs/{run_id}/streams/{stream_id}/records")).json()
    assert [r["data"] for r in page["records"]] == [{"n": 1}, {"n": 2}]
    assert page["next_cursor"] == 2
