"""A tenant holds at most DUCTOR_STREAMS_MAX_STORED_SUBSCRIPTIONS_PER_TENANT subscriptions
(webhook and pull-wake), end to end against a real server: each one costs every append to a
stream it links, and its links are rows of the database every tenant shares. Creations at once
count against each other; a re-confirmation is answered as before; other tenants are served."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import pytest

from tests.conftest import SERVER_ENV, Tokens
from tests.support.server import ServerProcess

LIMIT = 5
ROOT = "/api/durable-streams/v1/stream/__ds/subscriptions"
NATIVE = "/api/workflow-streams/subscriptions"


@pytest.fixture(scope="module")
def limited(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("subscriptions-limited"),
        env={**SERVER_ENV, "DUCTOR_STREAMS_MAX_STORED_SUBSCRIPTIONS_PER_TENANT": str(LIMIT)},
    ).start()
    yield process
    process.stop()


def body(run: str) -> dict[str, object]:
    return {"type": "pull-wake", "pattern": f"{run}/s*", "wake_stream": f"{run}/wakes"}


async def test_past_its_limit_a_tenant_makes_no_more_subscriptions_and_others_do(
    limited: ServerProcess, tokens: Tokens
) -> None:
    tenant, other = "t-" + secrets.token_hex(5), "t-" + secrets.token_hex(5)
    async with (
        await tokens.client(limited, tenant) as api,
        await tokens.client(limited, other) as theirs,
    ):
        names = [f"sub-{i}" for i in range(12)]
        answers = await asyncio.gather(*(api.put(f"{ROOT}/{n}", json=body("r")) for n in names))
        assert sorted(a.status_code for a in answers) == [201] * LIMIT + [409] * (12 - LIMIT)
        refused = next(a for a in answers if a.status_code == 409)
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.json()["code"] == "quota-exhausted"
        assert refused.json()["error"]["code"] == "QUOTA_EXHAUSTED"
        assert refused.json()["max_subscriptions"] == LIMIT
        made = [n for n, a in zip(names, answers, strict=True) if a.status_code == 201]
        for name, answer in zip(names, answers, strict=True):
            if answer.status_code == 409:  # nothing stored
                assert (await api.get(f"{ROOT}/{name}")).status_code == 404
        # The same again is answered as before; the native surface is refused as well.
        assert (await api.put(f"{ROOT}/{made[0]}", json=body("r"))).status_code == 200
        native = await api.put(
            f"{NATIVE}/another",
            json={
                "type": "webhook",
                "pattern": {"run_id": "r", "stream_id": "*"},
                "webhook": {"url": "https://hooks.example/h"},
            },
        )
        assert native.status_code == 409 and native.json()["code"] == "quota-exhausted"
        # Another tenant is served; a deletion gives room back at once.
        assert (await theirs.put(f"{ROOT}/sub-0", json=body("r"))).status_code == 201
        assert (await api.delete(f"{ROOT}/{made[0]}")).status_code == 204
        assert (await api.put(f"{ROOT}/again", json=body("r"))).status_code == 201
        assert (await api.put(f"{ROOT}/more", json=body("r"))).status_code == 409
        usage = (await api.get("/api/workflow-streams/usage")).json()
        assert (usage["subscriptions"], usage["max_subscriptions"]) == (LIMIT, LIMIT)
