"""One tenant's statements take at most its share of the pool's connections (TenantShares in
adapters/postgres/bounded.py): its flood waits behind itself, while another tenant's statement,
an append leader's or a worker's (acting for none) goes straight to the pool."""

from __future__ import annotations

import asyncio

import pytest

from adapters.postgres.bounded import BoundedPool, TenantShares
from application import waiting
from application.waiting import Unanswered, act_for, acting_for, acts_like


class HeldPool:
    """A pool whose statements run until `release` is set; `running` names the tenant of each
    statement on it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running: list[object] = []

    async def fetchval(self, query: str, tenant: object) -> str:
        self.running.append(tenant)
        try:
            await self.release.wait()
        finally:
            self.running.remove(tenant)
        return query


async def statement(pool: BoundedPool, tenant: str | None) -> str:
    if tenant is not None:
        act_for(tenant)
    return await pool.fetchval("select", tenant)


async def test_a_tenants_flood_takes_its_places_only_and_others_go_straight_through() -> None:
    held = HeldPool()
    pool = BoundedPool(held, TenantShares(3))  # type: ignore[arg-type]
    flood = [asyncio.create_task(statement(pool, "loud")) for _ in range(10)]
    await asyncio.sleep(0.05)
    assert held.running.count("loud") == 3  # the other 7 wait for the tenant's places
    quiet = asyncio.create_task(statement(pool, "quiet"))
    shared = asyncio.create_task(statement(pool, None))  # a leader's or a worker's
    await asyncio.sleep(0.05)
    assert held.running.count("quiet") == 1 and None in held.running
    held.release.set()
    assert await asyncio.gather(*flood, quiet, shared) == ["select"] * 12
    assert pool.shares is not None and pool.shares.waited == 7
    assert pool.shares._gates == {}  # nothing kept once no statement takes or awaits a place


async def test_a_statement_that_cannot_get_a_place_within_the_allowance_is_unanswered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held = HeldPool()
    pool = BoundedPool(held, TenantShares(1))  # type: ignore[arg-type]
    first = asyncio.create_task(statement(pool, "loud"))  # on the pool for up to 5 s
    await asyncio.sleep(0.02)
    monkeypatch.setattr(waiting, "_bound", [0.1])  # the next statement's allowance
    with pytest.raises(Unanswered, match="share"):
        await statement(pool, "loud")
    held.release.set()
    assert await first == "select"
    assert pool.shares is not None and pool.shares._gates == {}


async def test_a_task_acts_for_a_tenant_only_when_it_is_the_requests_or_started_for_it() -> None:
    seen: dict[str, str | None] = {}

    async def request() -> None:
        act_for("acme")

        async def look(name: str) -> None:
            seen[name] = acting_for()

        own = asyncio.create_task(look("own"))
        acts_like(own)  # started to do the request's own work
        shared = asyncio.create_task(look("shared"))  # e.g. an append leader it happens to start
        await asyncio.gather(own, shared)
        seen["request"] = acting_for()

    await asyncio.create_task(request())
    assert seen == {"own": "acme", "shared": None, "request": "acme"}
    assert acting_for() is None  # this test's own task acts for no one
