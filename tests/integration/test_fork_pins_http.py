"""Forks against a real server, as found from outside: a fork is never a way around its source's
pins (authorization, placement, content class), a fork chain is bounded at creation and a deep
one reads in one go (no recursion: a chain of 500 once answered 500 from a RecursionError)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import httpx
import msgspec
import pytest

from adapters.postgres.streams import PostgresStreams
from domain.definition import MAX_FORK_DEPTH, Authorization, Fork
from domain.stream import StreamKey
from tests.conftest import Tokens, api_client
from tests.integration.test_durable_streams import ds_client
from tests.integration.test_http_auth import assert_problem
from tests.support.server import ServerProcess

READ, WRITE, ADMIN = "streams:read", "streams:write", "streams:admin"
JSON = {"Content-Type": "application/json"}
MIGRATION = Path(__file__).resolve().parents[2] / "migrations" / "0489_fork_pins.sql"


@pytest.fixture
async def ds(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with ds_client(server) as client:
        yield client


async def principal(server: ServerProcess, tokens: Tokens, name: str):
    token = await tokens.create(principal=name, scopes=(READ, WRITE, ADMIN))
    return api_client(server, token), ds_client(server, token)


async def native_source(api: httpx.AsyncClient, run_id: str, stream_id: str, **pins) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "output", **pins}
    )
    assert created.status_code == 201, created.text
    appended = await api.post(
        f"/runs/{run_id}/streams/{stream_id}/records",
        json={"records": [{"data": {"secret": 1}}, {"data": {"secret": 2}}]},
    )
    assert appended.status_code == 201, appended.text


async def test_a_fork_keeps_its_sources_authorization_on_both_surfaces(
    server: ServerProcess, tokens: Tokens, run_id: str
) -> None:
    alice_api, alice_ds = await principal(server, tokens, "alice")
    bob_api, bob_ds = await principal(server, tokens, "bob")
    async with alice_api, alice_ds, bob_api, bob_ds:
        await native_source(
            alice_api,
            run_id,
            "src",
            authorization={"readers": ["alice"], "writers": ["alice"]},
            content_class="tool_io",
        )
        fork = await alice_ds.put(
            f"/{run_id}/fork", headers={"Stream-Forked-From": f"/v1/stream/{run_id}/src"}
        )
        assert fork.status_code == 201, fork.text

        # alice reads her fork on both surfaces; its definition carries the source's pins.
        assert (await alice_ds.get(f"/{run_id}/fork")).json() == [{"secret": 1}, {"secret": 2}]
        document = (await alice_api.get(f"/runs/{run_id}/streams/fork")).json()
        assert document["authorization"] == {"readers": ["alice"], "writers": ["alice"]}
        assert document["content_class"] == "tool_io"
        source = (await alice_api.get(f"/runs/{run_id}/streams/src")).json()
        assert document["placement"] == source["placement"]

        # bob reads nothing through it, whatever the door.
        for refused in (
            await bob_ds.get(f"/{run_id}/fork"),
            await bob_ds.get(f"/{run_id}/fork", params={"offset": "-1", "live": "long-poll"}),
            await bob_ds.get(f"/{run_id}/fork", params={"offset": "-1", "live": "sse"}),
            await bob_api.get(f"/runs/{run_id}/streams/fork/records"),
            await bob_api.get(f"/runs/{run_id}/streams/fork"),
            await bob_api.get(f"/runs/{run_id}/streams/fork/subscribe"),
        ):
            assert_problem(refused, 403, "forbidden")
        head = await bob_ds.head(f"/{run_id}/fork")
        assert head.status_code == 403
        # bob cannot fork the source (not a reader), nor fork alice's fork to get round it.
        for source_path in (f"/v1/stream/{run_id}/src", f"/v1/stream/{run_id}/fork"):
            refused = await bob_ds.put(
                f"/{run_id}/bobs", headers={"Stream-Forked-From": source_path}
            )
            assert_problem(refused, 403, "forbidden")
        assert (await alice_ds.head(f"/{run_id}/bobs")).status_code == 404
        # Nor write to it: the writers pin is the source's too.
        refused = await bob_ds.post(f"/{run_id}/fork", content=b'{"x":1}', headers=JSON)
        assert_problem(refused, 403, "forbidden")


async def test_a_fork_of_an_open_stream_stays_open_to_all(
    server: ServerProcess, tokens: Tokens, api: httpx.AsyncClient, run_id: str
) -> None:
    await native_source(api, run_id, "open")
    bob_api, bob_ds = await principal(server, tokens, "bob")
    async with bob_api, bob_ds:
        fork = await bob_ds.put(
            f"/{run_id}/bobs",
            content=b'{"own":1}',
            headers={**JSON, "Stream-Forked-From": f"/v1/stream/{run_id}/open"},
        )
        assert fork.status_code == 201, fork.text
        page = await bob_api.get(f"/runs/{run_id}/streams/bobs/records")
        assert [r["data"] for r in page.json()["records"]] == [
            {"secret": 1},
            {"secret": 2},
            {"own": 1},
        ]
        # The same PUT again is the same fork: the inherited pins are part of its definition.
        again = await bob_ds.put(
            f"/{run_id}/bobs",
            content=b'{"own":1}',
            headers={**JSON, "Stream-Forked-From": f"/v1/stream/{run_id}/open"},
        )
        assert again.status_code == 200, again.text


async def test_a_fork_by_a_reader_who_is_not_a_writer_cannot_add_to_it(
    server: ServerProcess, tokens: Tokens, api: httpx.AsyncClient, run_id: str
) -> None:
    await native_source(
        api, run_id, "src", authorization={"readers": ["*"], "writers": ["bootstrap"]}
    )
    bob_api, bob_ds = await principal(server, tokens, "bob")
    async with bob_api, bob_ds:
        headers = {**JSON, "Stream-Forked-From": f"/v1/stream/{run_id}/src"}
        refused = await bob_ds.put(f"/{run_id}/f", content=b'{"by":"bob"}', headers=headers)
        assert_problem(refused, 403, "forbidden")
        assert (await bob_ds.head(f"/{run_id}/f")).status_code == 404  # nothing was created
        created = await bob_ds.put(f"/{run_id}/f", headers=headers)
        assert created.status_code == 201, created.text
        assert (await bob_ds.get(f"/{run_id}/f")).json() == [{"secret": 1}, {"secret": 2}]


async def fork_chain(ds: httpx.AsyncClient, run_id: str, root: str, depth: int) -> str:
    """`depth` forks, each of the last, each with one message of its own: its depth."""
    source = root
    for level in range(1, depth + 1):
        name = f"f{level}"
        created = await ds.put(
            f"/{run_id}/{name}",
            content=json.dumps({"level": level}).encode(),
            headers={**JSON, "Stream-Forked-From": f"/v1/stream/{run_id}/{source}"},
        )
        assert created.status_code == 201, (level, created.text)
        source = name
    return source


async def test_a_chain_at_the_depth_limit_reads_whole_and_one_deeper_is_400(
    ds: httpx.AsyncClient, api: httpx.AsyncClient, run_id: str
) -> None:
    root = await ds.put(f"/{run_id}/root", content=b'{"level":0}', headers=JSON)
    assert root.status_code == 201, root.text
    leaf = await fork_chain(ds, run_id, "root", MAX_FORK_DEPTH)
    expected = [{"level": level} for level in range(MAX_FORK_DEPTH + 1)]

    started = time.monotonic()
    read = await ds.get(f"/{run_id}/{leaf}")
    elapsed = time.monotonic() - started
    assert read.status_code == 200, read.text
    assert read.json() == expected
    assert elapsed < 2.0, elapsed  # ~20 ms here; the recursive read took one query per level
    assert (await ds.head(f"/{run_id}/{leaf}")).status_code == 200
    # Every page boundary inside the chain: from each offset, the rest.
    for offset in (0, 1, 50, 99, 100):
        page = await ds.get(f"/{run_id}/{leaf}", params={"offset": f"{0:016d}_{offset:016d}"})
        assert page.json() == expected[offset:], offset
    native = await api.get(f"/runs/{run_id}/streams/{leaf}/records", params={"limit": 1000})
    assert [r["data"] for r in native.json()["records"]] == expected
    assert [r["sequence"] for r in native.json()["records"]] == list(range(1, 102))
    window = await api.get(f"/runs/{run_id}/streams/{leaf}/records?cursor=40&limit=5")
    assert [r["data"]["level"] for r in window.json()["records"]] == [40, 41, 42, 43, 44]

    deeper = await ds.put(
        f"/{run_id}/too-deep", headers={"Stream-Forked-From": f"/v1/stream/{run_id}/{leaf}"}
    )
    body = assert_problem(deeper, 400, "invalid-input")
    assert str(MAX_FORK_DEPTH) in body["detail"]
    assert (await ds.head(f"/{run_id}/too-deep")).status_code == 404
    # A fork of a shallower stream of the chain is still fine.
    sibling = await ds.put(
        f"/{run_id}/sibling", headers={"Stream-Forked-From": f"/v1/stream/{run_id}/f99"}
    )
    assert sibling.status_code == 201, sibling.text


async def create_through_port(
    repo: PostgresStreams, tenant: str, run_id: str, source_id: str, stream_id: str, **pins
) -> None:
    """A fork made as a server before the depth limit and the pins' inheritance made it."""
    source = await repo.load(StreamKey(tenant, run_id, source_id))
    assert source is not None
    link = Fork(
        run_id=run_id,
        stream_id=source_id,
        source_created_at=source.state.created_at,
        through=source.state.head,
        offset=source.state.head,
    )
    definition = msgspec.structs.replace(
        source.definition, stream_id=stream_id, fork=link, content_type="application/json", **pins
    )
    _, created = await repo.create(
        StreamKey(tenant, run_id, stream_id), definition, datetime.now(UTC)
    )
    assert created


async def test_a_chain_of_500_made_before_the_limit_reads_on_every_surface(
    ds: httpx.AsyncClient, api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str
) -> None:
    root = await ds.put(f"/{run_id}/c0", content=b'["a","b"]', headers=JSON)
    assert root.status_code == 201, root.text
    repo = PostgresStreams(pool)
    for level in range(1, 501):
        await create_through_port(repo, "default", run_id, f"c{level - 1}", f"c{level}")
    assert (await ds.post(f"/{run_id}/c500", content=b'"own"', headers=JSON)).status_code == 204

    read = await ds.get(f"/{run_id}/c500")
    assert read.status_code == 200, read.text
    assert read.json() == ["a", "b", "own"]
    assert (await ds.head(f"/{run_id}/c500")).status_code == 200
    native = await api.get(f"/runs/{run_id}/streams/c500/records")
    assert native.status_code == 200, native.text
    assert [r["data"] for r in native.json()["records"]] == ["a", "b", "own"]
    # It is past the limit: it reads, but is forked no further.
    deeper = await ds.put(
        f"/{run_id}/c501", headers={"Stream-Forked-From": f"/v1/stream/{run_id}/c500"}
    )
    assert_problem(deeper, 400, "invalid-input")


async def test_the_migration_narrows_forks_made_with_the_old_default(
    server: ServerProcess, tokens: Tokens, pool: asyncpg.Pool, run_id: str
) -> None:
    alice_api, alice_ds = await principal(server, tokens, "alice")
    bob_api, bob_ds = await principal(server, tokens, "bob")
    async with alice_api, alice_ds, bob_api, bob_ds:
        await native_source(
            alice_api,
            run_id,
            "src",
            authorization={"readers": ["alice", "carol"], "writers": ["alice"]},
            content_class="tool_io",
            placement={"client_egress_regions": ["local", "elsewhere"]},
        )
        repo = PostgresStreams(pool)
        source = (await alice_api.get(f"/runs/{run_id}/streams/src")).json()
        wide = {
            "authorization": Authorization(readers=("*", "alice"), writers=("*",)),
            "content_class": "application_data",
            "placement": msgspec.structs.replace(
                (await repo.load(StreamKey("default", run_id, "src"))).definition.placement,
                client_egress_regions=("local",),
            ),
        }
        await create_through_port(repo, "default", run_id, "src", "old1", **wide)
        await create_through_port(repo, "default", run_id, "old1", "old2", **wide)
        await pool.execute(MIGRATION.read_text())
        await pool.execute(MIGRATION.read_text())  # and again: nothing more to do
        for name in ("old1", "old2"):
            stored = await pool.fetchval(
                "SELECT definition FROM streams WHERE run_id = $1 AND stream_id = $2",
                run_id,
                name,
            )
            pinned = json.loads(stored)
            assert pinned["authorization"] == {"readers": ["alice", "carol"], "writers": ["alice"]}
            assert pinned["content_class"] == "tool_io"
            assert pinned["placement"] == source["placement"]
            assert pinned["fork"]["stream_id"] == ("src" if name == "old1" else "old1")
            assert_problem(await bob_ds.get(f"/{run_id}/{name}"), 403, "forbidden")
            assert_problem(
                await bob_api.get(f"/runs/{run_id}/streams/{name}/records"), 403, "forbidden"
            )
            page = await alice_api.get(f"/runs/{run_id}/streams/{name}/records")
            assert [r["data"] for r in page.json()["records"]] == [{"secret": 1}, {"secret": 2}]


@pytest.mark.parametrize("depth", [1, 3])
async def test_a_fork_in_a_chain_pins_its_sources_authorization(
    server: ServerProcess, tokens: Tokens, run_id: str, depth: int
) -> None:
    alice_api, alice_ds = await principal(server, tokens, "alice")
    bob_api, bob_ds = await principal(server, tokens, "bob")
    async with alice_api, alice_ds, bob_api, bob_ds:
        await native_source(alice_api, run_id, "root", authorization={"readers": ["alice"]})
        leaf = await fork_chain(alice_ds, run_id, "root", depth)
        assert_problem(await bob_ds.get(f"/{run_id}/{leaf}"), 403, "forbidden")
        read = await alice_ds.get(f"/{run_id}/{leaf}")
        assert read.json()[:2] == [{"secret": 1}, {"secret": 2}]
        assert len(read.json()) == 2 + depth
