"""A tenant's requests take at most their share of the database pool, through the real server:
with one place of a two-connection pool, a burst of one tenant's reads waits for its own place
(counted in /metrics) and every read is still answered, as is another tenant's meanwhile."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Iterator

import asyncpg
import httpx
import pytest

from tests.conftest import SERVER_ENV, Tokens
from tests.support.pull_wake import claimed_pull_wake
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
    server: ServerProcess, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    """The loud tenant's one place is held (a claim of its subscription waits on the
    subscription's row, which the test holds): its burst of reads waits for the place, and the
    quiet tenant's read is answered meanwhile. (A burst alone did not always overlap on a busy
    machine: its reads could each be done before the next one asked.)"""
    suffix = secrets.token_hex(3)
    loud_tenant = f"loud-{suffix}"
    loud = {"Authorization": f"Bearer {await tokens.create(tenant=loud_tenant)}"}
    quiet = {"Authorization": f"Bearer {await tokens.create(tenant=f'quiet-{suffix}')}"}
    run = "shares-" + secrets.token_hex(4)
    base = f"{server.base_url}{API}/runs/{run}/streams"
    name = "sub-" + secrets.token_hex(4)
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
        client.headers.update(loud)
        await claimed_pull_wake(client, server.base_url + API, "wake-" + suffix, name)
        del client.headers["authorization"]
        before = waits((await client.get(f"{server.base_url}/metrics")).text)
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "SELECT 1 FROM ds_subscriptions WHERE tenant = $1 AND subscription_id = $2 "
                "FOR UPDATE",
                loud_tenant,
                name,
            )
            holding = asyncio.ensure_future(
                client.post(
                    f"{server.base_url}{API}/subscriptions/{name}/claim",
                    json={"worker": "w2"},
                    headers=loud,
                )
            )
            await asyncio.sleep(0.5)  # its change holds the loud tenant's one place
            burst = [
                asyncio.ensure_future(client.get(f"{base}/s/records", headers=loud))
                for _ in range(40)
            ]
            other = await client.get(f"{base}/s/records", headers=quiet)  # served meanwhile
            assert other.status_code == 200, other.text
            await asyncio.sleep(0.3)
            assert not any(b.done() for b in burst)  # waiting for the loud tenant's place
        answers = await asyncio.gather(*burst)
        after = waits((await client.get(f"{server.base_url}/metrics")).text)
        claimed = await holding
    assert claimed.status_code == 409, claimed.text  # (w1 holds the wake)
    assert {a.status_code for a in answers} == {200}
    assert all(len(a.json()["records"]) == 1 for a in answers)
    assert after >= before + 40  # the burst's reads queued on the tenant's one place
