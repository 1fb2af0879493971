"""A tenant's requests take at most their share of the database pool, through the real server:
with one place of a two-connection pool, a burst of one tenant's reads waits for its own place
(counted in /metrics) and every read is still answered, as is another tenant's meanwhile."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import SERVER_ENV, Tokens
from tests.support.server import ServerProcess

API = "/api/workflow-streams"


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("tenant-shares"),
        env={
            **SERVER_ENV,
            "DUCTOR_STREAMS_POOL_MIN_SIZE": "1",
            "DUCTOR_STREAMS_POOL_MAX_SIZE": "2",
            "DUCTOR_STREAMS_POOL_TENANT_SHARE": "0.5",
        },
    ).start()
    yield process
    process.stop()


def waits(metrics: str) -> float:
    found = re.search(r"^ductor_streams_tenant_share_waits_total (\S+)$", metrics, re.M)
    assert found is not None, metrics[:2000]
    return float(found.group(1))


async def test_a_tenants_burst_waits_for_its_own_place_and_the_other_tenant_is_served(
    server: ServerProcess, tokens: Tokens
) -> None:
    suffix = secrets.token_hex(3)
    loud = {"Authorization": f"Bearer {await tokens.create(tenant=f'loud-{suffix}')}"}
    quiet = {"Authorization": f"Bearer {await tokens.create(tenant=f'quiet-{suffix}')}"}
    run = "shares-" + secrets.token_hex(4)
    base = f"{server.base_url}{API}/runs/{run}/streams"
    async with httpx.AsyncClient(timeout=30) as client:
        for headers in (loud, quiet):
            made = await client.post(
                base, json={"stream_id": "s", "direction": "output"}, headers=headers
            )
            assert made.status_code == 201, made.text
            appended = await client.post(
                f"{base}/s/records", json={"records": [{"data": 1}]}, headers=headers
            )
            assert appended.status_code == 201, appended.text
        before = waits((await client.get(f"{server.base_url}/metrics")).text)
        burst = [client.get(f"{base}/s/records", headers=loud) for _ in range(40)]
        answers = await asyncio.gather(*burst, client.get(f"{base}/s/records", headers=quiet))
        after = waits((await client.get(f"{server.base_url}/metrics")).text)
    assert {a.status_code for a in answers} == {200}
    assert all(len(a.json()["records"]) == 1 for a in answers)
    assert after > before  # the burst's reads queued on the tenant's one place
