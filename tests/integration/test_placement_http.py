"""Another deployment (REGION / EGRESS_REGION) on the same database is held to the pins."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import SERVER_ENV, api_client
from tests.support.server import ServerProcess


@pytest.fixture(scope="module")
def elsewhere(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("elsewhere"),
        env={
            **SERVER_ENV,
            "DUCTOR_STREAMS_REGION": "mars",
            "DUCTOR_STREAMS_EGRESS_REGION": "mars-clients",
        },
    ).start()
    yield process
    process.stop()


async def test_another_region_gets_misdirected_and_another_egress_is_denied(
    api: httpx.AsyncClient, elsewhere: ServerProcess, run_id: str
) -> None:
    local = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "home", "direction": "output"}
    )
    assert local.status_code == 201
    shared = await api.post(
        f"/runs/{run_id}/streams",
        json={
            "stream_id": "shared",
            "direction": "output",
            "placement": {"metadata_replicas": ["mars"], "client_egress_regions": ["local"]},
        },
    )
    assert shared.status_code == 201, shared.text
    async with api_client(elsewhere) as mars:
        misdirected = await mars.get(f"/runs/{run_id}/streams/home/records")
        assert misdirected.status_code == 421
        body = misdirected.json()
        assert body["code"] == "misdirected" and body["metadata_home"] == "local"
        assert misdirected.headers["content-type"].startswith("application/problem+json")
        appended = await mars.post(
            f"/runs/{run_id}/streams/shared/records", json={"records": [{"data": 1}]}
        )
        assert appended.status_code == 201  # a replica region serves the stream
        denied = await mars.get(f"/runs/{run_id}/streams/shared/records")
        assert denied.status_code == 403 and denied.json()["code"] == "egress-region-denied"
        document = await mars.get(f"/runs/{run_id}/streams/shared")
        assert document.status_code == 200
    page = (await api.get(f"/runs/{run_id}/streams/shared/records")).json()
    assert [r["data"] for r in page["records"]] == [1]


async def test_a_subscription_over_a_stream_served_elsewhere_is_shown_claimed_and_acked(
    api: httpx.AsyncClient, elsewhere: ServerProcess, run_id: str
) -> None:
    """A pattern links a stream homed in this region; on the other region's servers, the
    subscription's configuration, view, claim and ack answer as ever (its offsets state no
    incarnation there: the stream's definition is not served there), never 421."""
    for stream in ("e1", "wake"):
        made = await api.post(
            f"/runs/{run_id}/streams", json={"stream_id": stream, "direction": "output"}
        )
        assert made.status_code == 201
    appended = await api.post(f"/runs/{run_id}/streams/e1/records", json={"records": [{"data": 1}]})
    assert appended.status_code == 201
    async with api_client(elsewhere) as mars:
        root = f"{elsewhere.base_url}/api/durable-streams/v1/stream/__ds/subscriptions"
        name = "sub-" + run_id[-8:]
        put = await mars.put(
            f"{root}/{name}",
            json={"type": "pull-wake", "pattern": f"{run_id}/e*", "wake_stream": f"{run_id}/w"},
        )
        assert put.status_code == 201, put.text
        assert (await mars.get(f"{root}/{name}")).status_code == 200
        more = await api.post(f"/runs/{run_id}/streams/e1/records", json={"records": [{"data": 2}]})
        assert more.status_code == 201
        claim = await mars.post(f"{root}/{name}/claim", json={"worker": "w1"})
        assert claim.status_code == 200, claim.text
        wake = claim.json()
        [stream] = wake["streams"]
        acked = await mars.post(
            f"{root}/{name}/ack",
            json={
                "wake_id": wake["wake_id"],
                "generation": wake["generation"],
                "acks": [{"path": f"{run_id}/e1", "offset": stream["tail_offset"]}],
                "done": True,
            },
            headers={"Authorization": f"Bearer {wake['token']}"},
        )
        assert acked.status_code == 200, acked.text
