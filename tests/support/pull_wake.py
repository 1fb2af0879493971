"""A pull-wake subscription claimed, with work pending: what the tests of its wake routes
(acks, releases) start from."""

from __future__ import annotations

from typing import Any

import httpx


async def claimed_pull_wake(
    client: httpx.AsyncClient, api: str, run_id: str, name: str
) -> dict[str, Any]:
    """Streams `wake` and `e1` in `run_id`, a pull-wake subscription `name` over `e*` waking on
    `wake`, a record appended to `e1`, and the subscription claimed by worker `w1`: the claim's
    answer (`wake_id`, `generation`, `token`, ...). `api`: the native API's prefix, "" for a
    client whose base URL is it."""
    for stream in ("wake", "e1"):
        made = await client.post(
            f"{api}/runs/{run_id}/streams", json={"stream_id": stream, "direction": "output"}
        )
        assert made.status_code == 201, made.text
    put = await client.put(
        f"{api}/subscriptions/{name}",
        json={
            "type": "pull-wake",
            "pattern": {"run_id": run_id, "stream_id": "e*"},
            "wake_stream": {"run_id": run_id, "stream_id": "wake"},
        },
    )
    assert put.status_code == 201, put.text
    appended = await client.post(
        f"{api}/runs/{run_id}/streams/e1/records", json={"records": [{"data": 1}]}
    )
    assert appended.status_code == 201, appended.text
    claim = await client.post(f"{api}/subscriptions/{name}/claim", json={"worker": "w1"})
    assert claim.status_code == 200, claim.text
    claimed: dict[str, Any] = claim.json()
    return claimed
