"""A tenant's limit on its records' bytes (DUCTOR_STREAMS_MAX_BYTES_PER_TENANT), on real
PostgreSQL and real server and worker processes: the count every way of writing and removing
records keeps (migration 0509: the write statement, a large group's COPY, an object's commit, a
prune, an erasure, a run's deletion), and the 409 past the limit on both surfaces, with a retry
of what was stored still answered as before."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest

from adapters.postgres.migrations import migrate
from adapters.postgres.streams import PostgresStreams
from adapters.postgres.tenant_counts import (
    fold_tenant_counts,
    recount_tenant_bytes,
    tenant_bytes,
)
from application.delete_stream import DeleteCommand
from application.input_delivery import event_bytes
from domain.records import NewRecord, RecordKind, held_bytes
from domain.stream import StreamKey
from ductor_streams_client import StreamsClient, Usage
from tests.conftest import SERVER_ENV, Tokens
from tests.support.postgres import database_before
from tests.support.server import ServerProcess, WorkerProcess

LIMIT = 20_000
DS = "/api/durable-streams/v1/stream"
CLI = str(Path(sys.executable).parent / "ductor-streams")
NATIVE = "/api/workflow-streams"
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def limited(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose tenants may hold 20,000 bytes each (a stream's definition counts about
    750)."""
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("bytes-limited"),
        env={**SERVER_ENV, "DUCTOR_STREAMS_MAX_BYTES_PER_TENANT": str(LIMIT)},
    ).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def pruner(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    process = WorkerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("bytes-pruner"),
        env={
            "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.1",
            "DUCTOR_STREAMS_PRUNE_INTERVAL_SECONDS": "0.2",
            "DUCTOR_STREAMS_SWEEP_INTERVAL_SECONDS": "0.2",  # intents' expiry among them
            "DUCTOR_STREAMS_WORKER_LEASE_SECONDS": "2",
        },
    ).start()
    yield process
    process.stop()


@pytest.fixture
async def api(limited: ServerProcess, tokens: Tokens) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the limited server, for a tenant of its own."""
    async with await tokens.client(limited, "t-" + secrets.token_hex(5)) as client:
        yield client


async def counted(pool: asyncpg.Pool, tenant: str) -> tuple[int, int]:
    """The tenant's bytes as the write statements count them, and as its records, open
    object intents, receipts and wait events hold them: each record its size, its row (128
    bytes) and an object's reference; each open intent its pledge; each receipt its key and 416
    bytes; each wait event its payload and its row, and each undelivered input record what its
    event pledged; each stream its definition and its row."""
    actual = await pool.fetchval(
        "SELECT coalesce(sum(size), 0) FROM ("
        " SELECT size + 128 + CASE WHEN kind = 2 THEN octet_length(payload) ELSE 0 END AS size"
        " FROM stream_records WHERE tenant = $1"
        " UNION ALL SELECT pledge FROM object_intents"
        " WHERE tenant = $1 AND state IN ('prepared', 'uploaded')"
        " UNION ALL SELECT octet_length(idempotency_key) + 416 FROM append_receipts"
        " WHERE tenant = $1"
        " UNION ALL SELECT coalesce(size, octet_length(payload::text)) + 128"
        " FROM workflow_wait_events"
        " WHERE tenant = $1"
        " UNION ALL SELECT pledge FROM input_deliveries"
        " WHERE tenant = $1 AND pledge IS NOT NULL AND delivered_at IS NULL"
        " UNION ALL SELECT octet_length(definition) + 128 FROM streams WHERE tenant = $1) AS held",
        tenant,
    )
    return await tenant_bytes(pool, tenant), actual


def intent_of(body: bytes, key: str) -> dict:
    return {
        "idempotency_key": key,
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "content_type": "application/octet-stream",
    }


async def create(api: httpx.AsyncClient, run: str, stream: str, **definition: object) -> str:
    answer = await api.post(
        f"{NATIVE}/runs/{run}/streams",
        json={"stream_id": stream, "direction": "output", **definition},
    )
    assert answer.status_code == 201, answer.text
    return f"{NATIVE}/runs/{run}/streams/{stream}"


async def append(
    api: httpx.AsyncClient, path: str, data: list[object], key: str | None = None
) -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    return await api.post(
        f"{path}/records", json={"records": [{"data": d} for d in data]}, headers=headers
    )


async def test_every_way_of_writing_and_removing_records_is_counted(
    server: ServerProcess, pruner: WorkerProcess, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    tenant = "t-" + secrets.token_hex(5)
    async with await tokens.client(server, tenant) as api:
        # Small appends (the write statement), together on many streams, and one large group
        # (COPY: 64 records and more).
        paths = [await create(api, "r1", f"s{i}") for i in range(5)]
        answers = await asyncio.gather(
            *(append(api, p, ["x" * (10 + i)] * 3) for i, p in enumerate(paths))
        )
        assert [a.status_code for a in answers] == [201] * 5
        assert (await append(api, paths[0], list(range(500)))).status_code == 201
        held, actual = await counted(pool, tenant)
        assert held == actual > 0
        # Idempotent appends keep a receipt each, a large group's too; a replay adds nothing. A
        # key's bytes count as stored (a byte past ASCII arrives as Latin-1 and is stored as
        # two).
        for key, data in (("k1", ["z"]), ("k3", list(range(100)))):
            assert (await append(api, paths[1], data, key=key)).status_code == 201
        accented = await api.post(
            f"{paths[1]}/records",
            json={"records": [{"data": "z"}, {"data": "zz"}]},
            headers={"Idempotency-Key": "k-é".encode("latin-1")},
        )
        assert accented.status_code == 201, accented.text
        receipts = 2 + 2 + len("k-é".encode()) + 3 * 416
        with_receipts, actual = await counted(pool, tenant)
        assert with_receipts == actual > held + receipts
        replayed = await append(api, paths[1], ["z"], key="k1")
        assert replayed.headers.get("idempotent-replayed") == "true"
        held, actual = await counted(pool, tenant)
        assert held == actual == with_receipts

        # A Durable Streams creation with its first records, and its appends.
        made = await api.put(f"{DS}/r2/ds", content=b'[{"a":1},{"b":22}]', headers=JSON)
        assert made.status_code == 201, made.text
        for n in range(3):
            posted = await api.post(f"{DS}/r2/ds", content=b'{"n":%d}' % n, headers=JSON)
            assert posted.status_code in (200, 204), posted.text
        held, actual = await counted(pool, tenant)
        assert held == actual

        # An object's intent pledges its size from its prepare; its record counts it once
        # committed; an aborted one's pledge ends.
        body = secrets.token_bytes(70_000)
        objects = await create(api, "r1", "objects")
        prepared = await api.post(f"{objects}/objects", json=intent_of(body, "k"))
        assert prepared.status_code == 201, prepared.text
        before = held
        held, actual = await counted(pool, tenant)
        assert held == actual > before + len(body) + 128  # its size, its reference, its row
        object_path = f"{objects}/objects/{prepared.json()['object_id']}"
        assert (await api.put(f"{object_path}/body", content=body)).status_code == 200
        assert (await api.post(f"{object_path}/commit")).status_code == 201
        assert await counted(pool, tenant) == (held, actual)
        dropped = await api.post(f"{objects}/objects", json=intent_of(b"a" * 5_000, "a"))
        assert (await counted(pool, tenant))[0] > held + 5_000
        aborted = await api.post(f"{objects}/objects/{dropped.json()['object_id']}/abort")
        assert aborted.status_code == 200, aborted.text
        assert await counted(pool, tenant) == (held, actual)
        # An expired one's pledge ends (the workers' sweep).
        expiring = await api.post(
            f"{objects}/objects", json={**intent_of(b"e" * 4_000, "e"), "expires_in_seconds": 1}
        )
        assert expiring.status_code == 201, expiring.text
        assert (await counted(pool, tenant))[0] > held + 4_000
        expiring_path = f"{objects}/objects/{expiring.json()['object_id']}"
        async with asyncio.timeout(20):
            while (await api.get(expiring_path)).json()["state"] != "expired":
                await asyncio.sleep(0.1)
        assert await counted(pool, tenant) == (held, actual)
        # One left open goes with its stream (below).
        left = await api.post(f"{objects}/objects", json=intent_of(b"l" * 3_000, "l"))
        assert left.status_code == 201, left.text
        held, actual = await counted(pool, tenant)
        assert held == actual

        # A prune by retention (the worker's).
        kept = await create(api, "r3", "kept", retention={"max_records": 2})
        assert (await append(api, kept, ["y" * 100] * 10)).status_code == 201
        async with asyncio.timeout(20):
            while (await api.get(kept)).json()["state"]["earliest"] != 9:
                await asyncio.sleep(0.1)
        held, actual = await counted(pool, tenant)
        assert held == actual

        # A fork, its source deleted (kept, records and all, while the fork reads it), then the
        # fork: both go.
        fork = await api.put(
            f"{DS}/r2/fork", headers={"Stream-Forked-From": "/v1/stream/r2/ds", **JSON}
        )
        assert fork.status_code == 201, fork.text
        with_fork, actual = await counted(pool, tenant)
        assert with_fork == actual > held  # the fork's definition and row
        assert (await api.delete(f"{DS}/r2/ds")).status_code == 204
        assert await counted(pool, tenant) == (with_fork, actual)
        assert (await api.delete(f"{DS}/r2/fork")).status_code == 204
        held, actual = await counted(pool, tenant)
        assert held == actual

        # A stream deleted alone, and whole runs.
        assert (await api.delete(paths[0])).status_code == 204
        held, actual = await counted(pool, tenant)
        assert held == actual
        for run in ("r1", "r3"):
            assert (await api.delete(f"{NATIVE}/runs/{run}")).status_code == 204
        assert await counted(pool, tenant) == (0, 0)


async def test_a_batch_erased_together_gives_its_bytes_back(
    server: ServerProcess, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    """Deletions committed in one batch are erased in one statement (`_ERASE_KEYS`): their
    records, open intents and receipts come off their tenants' counts as a lone erasure's do."""
    tenants = ["t-" + secrets.token_hex(5) for _ in range(2)]
    keys = []
    for tenant in tenants:
        async with await tokens.client(server, tenant) as api:
            for stream in ("a", "b"):
                path = await create(api, "r", stream)
                assert (await append(api, path, ["x" * 50] * 70)).status_code == 201  # COPY
                assert (await append(api, path, ["y" * 20] * 2, key="k")).status_code == 201
                opened = await api.post(f"{path}/objects", json=intent_of(b"i" * 900, "i"))
                assert opened.status_code == 201, opened.text
                keys.append(StreamKey(tenant, "r", stream))
    for tenant in tenants:
        held, actual = await counted(pool, tenant)
        assert held == actual > 2 * (900 + 417)
    now = datetime.now(UTC)
    results = await PostgresStreams(pool).update_many([(k, [DeleteCommand(now)]) for k in keys])
    assert all(not isinstance(r, BaseException) for r in results), results
    for tenant in tenants:
        assert await counted(pool, tenant) == (0, 0)


async def test_the_fold_sums_the_byte_rows_of_ended_backends(pool: asyncpg.Pool) -> None:
    tenant = "t-" + secrets.token_hex(5)
    await pool.execute(
        "INSERT INTO tenant_byte_counts (tenant, backend, bytes) "
        "VALUES ($1, $2, 40), ($1, $3, 2), ($1, 0, 100)",
        tenant,
        2**31 - 5,  # no backend has these
        2**31 - 6,
    )
    await fold_tenant_counts(pool)
    rows = await pool.fetch(
        "SELECT backend, bytes FROM tenant_byte_counts WHERE tenant = $1", tenant
    )
    assert [tuple(r) for r in rows] == [(0, 142)]
    assert await tenant_bytes(pool, tenant) == 142
    await pool.execute("DELETE FROM tenant_byte_counts WHERE tenant = $1", tenant)


async def problem_of(answer: httpx.Response) -> dict:
    assert answer.status_code == 409, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    problem = answer.json()
    assert problem["code"] == "quota-exhausted"
    assert problem["max_tenant_bytes"] == LIMIT
    return problem


async def held_now(api: httpx.AsyncClient) -> int:
    """What the caller's tenant holds, as `GET /usage` counts it."""
    usage = await api.get(f"{NATIVE}/usage")
    assert usage.status_code == 200, usage.text
    held: int = usage.json()["bytes"]
    return held


async def test_past_its_limit_a_tenant_stores_nothing_more_and_the_others_are_served(
    limited: ServerProcess, tokens: Tokens, api: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    path = await create(api, "run", "s")
    made = await api.put(f"{DS}/run/ds", headers=JSON)
    assert made.status_code == 201, made.text
    producer = {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"}
    small = await api.post(f"{DS}/run/ds", content=b'{"a":1}', headers={**JSON, **producer})
    assert small.status_code in (200, 204), small.text
    # Two streams' definitions and rows, and a record of 7 bytes and its row.
    held = await held_now(api)
    # Each record of 30 characters is 32 bytes of JSON and counts 160 with its row, and each
    # append's receipt its key and 416: appends of 3 while they fit, then one record that fills
    # the limit to the byte.
    n = 0
    while held + 480 + 416 + len(f"k{n}") + 131 <= LIMIT:
        first = await append(api, path, ["z" * 30] * 3, key=f"k{n}")
        assert first.status_code == 201, first.text
        held, n = held + 480 + 416 + len(f"k{n}"), n + 1
    filler = await append(api, path, ["f" * (LIMIT - held - 130)])  # its quotes and its row
    assert filler.status_code == 201, filler.text
    assert await held_now(api) == LIMIT
    # More is refused, and nothing is appended.
    problem = await problem_of(await append(api, path, ["z"]))
    assert problem["tenant_bytes"] == LIMIT
    assert (await api.get(path)).json()["state"]["head"] == 3 * n + 1
    # The retry of an append that was stored is answered as before, at the limit.
    again = await append(api, path, ["z" * 30] * 3, key=f"k{n - 1}")
    assert again.status_code == 200, again.text
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.json() == first.json()

    # The Durable Streams surface: an append past the limit, a creation with records.
    large = b'{"a":"' + b"w" * 200 + b'"}'
    refused = await api.post(
        f"{DS}/run/ds", content=large, headers={**JSON, **producer, "Producer-Seq": "1"}
    )
    assert refused.status_code == 409, refused.text
    # The producer's retry of what was stored is its duplicate, at the limit.
    duplicate = await api.post(f"{DS}/run/ds", content=b'{"a":1}', headers={**JSON, **producer})
    assert duplicate.status_code == 204, duplicate.text
    refused = await api.put(f"{DS}/run/ds2", content=b"[" + large + b"]", headers=JSON)
    assert refused.status_code == 409, refused.text
    assert (await api.head(f"{DS}/run/ds2")).status_code == 404
    # So is a new stream at all: its definition and row count.
    await problem_of(
        await api.post(
            f"{NATIVE}/runs/run/streams", json={"stream_id": "more", "direction": "output"}
        )
    )
    assert (await api.get(f"{NATIVE}/runs/run/streams/more")).status_code == 404
    # Empty records count their rows: at the limit, they are refused too (counted at nothing,
    # a tenant at its limit appended 13 MB a second of them).
    empty = await api.post(f"{path}/records", json={"records": [{"data_base64": ""}] * 3})
    assert (await problem_of(empty))["tenant_bytes"] == LIMIT
    # An object's intent whose size would pass the limit.
    await problem_of(await api.post(f"{path}/objects", json=intent_of(b"o" * 500, "o")))
    # A token restricted to a run is refused so too, without being told what the tenant's
    # other runs hold (as `GET /usage` does not tell it).
    minted = await api.post(
        f"{NATIVE}/tokens",
        json={"scopes": ["streams:write"], "expires_in_seconds": 600, "runs": ["run"]},
    )
    assert minted.status_code == 201, minted.text
    restricted = {"Authorization": f"Bearer {minted.json()['token']}"}
    refused = await api.post(
        f"{path}/records", json={"records": [{"data": "z" * 300}]}, headers=restricted
    )
    problem = await problem_of(refused)
    assert "tenant_bytes" not in problem and str(LIMIT) not in problem["detail"].split(":")[-1]
    created = await api.post(
        f"{NATIVE}/runs/run/streams",
        json={"stream_id": "theirs", "direction": "output"},
        headers=restricted,
    )
    assert "tenant_bytes" not in await problem_of(created)

    # Another tenant is not held by it.
    async with await tokens.client(limited, "t-" + secrets.token_hex(5)) as other:
        other_path = await create(other, "run", "s")
        assert (await append(other, other_path, ["z" * 300] * 3)).status_code == 201

    # Once a stream is deleted, the tenant may create and append again at once: the process
    # that deleted it reads the count again.
    assert (await api.delete(path)).status_code == 204
    fresh = await create(api, "run", "fresh")
    answer = await append(api, fresh, ["z" * 30] * 3)
    assert answer.status_code == 201, answer.text


async def test_receipts_count_while_they_are_kept_and_their_bytes_come_back_when_forgotten(
    limited: ServerProcess, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    """An idempotent append keeps a receipt for a day. Counted at nothing, a tenant at its limit
    could append under a new key each time to a stream that keeps nothing (or append empty
    records and prune them), and hold its append rate times a day of receipts."""
    tenant = "t-" + secrets.token_hex(5)
    async with await tokens.client(limited, tenant) as api:
        path = await create(api, "run", "s")
        base = await held_now(api)
        # One-record appends under new keys until the limit: each counts its record and its
        # receipt, so far fewer fit than their records alone would let in.
        stored = 0
        while True:
            answer = await append(api, path, ["r"], key=f"key-{stored:04d}")
            if answer.status_code == 409:
                break
            assert answer.status_code == 201, answer.text
            stored += 1
            assert stored < 200, "receipts are not counted"
        assert "append receipts" in (await problem_of(answer))["detail"]
        record, receipt = 3 + 128, len("key-0000") + 416
        assert stored == (LIMIT - base) // (record + receipt)
        held, actual = await counted(pool, tenant)
        assert held == actual == base + stored * (record + receipt) == await held_now(api)
        # Without a key, a record's own bytes still fit in what is left.
        assert (await append(api, path, ["r"])).status_code == 201

        # The receipts' sweep forgets them after the window, and their bytes come back (its
        # statement, run here: a worker of this module's, on the default window, may hold the
        # sweep's lease).
        await PostgresStreams(pool).forget_receipts(timedelta(0))
        assert not await pool.fetchval(
            "SELECT count(*) FROM append_receipts WHERE tenant = $1", tenant
        )
        held, actual = await counted(pool, tenant)
        assert held == actual == base + (stored + 1) * record
        # The process that refused reads the count again within a second: the room is back.
        async with asyncio.timeout(10):
            while (await append(api, path, ["r"], key="after")).status_code == 409:
                await asyncio.sleep(0.2)


async def test_an_input_streams_wait_events_count_while_they_are_kept(
    limited: ServerProcess, pruner: WorkerProcess, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    """The default wait service keeps a copy of each input record (`workflow_wait_events`)
    until its stream is erased or its engine removes it, whatever retention prunes: counted at
    nothing, an input stream that keeps one record let a tenant at its limit append, and the
    copies grow, without bound. An append is charged what its events will hold as it is
    decided (they land later), and the events count once they land (migration 0511's
    triggers)."""
    tenant = "t-" + secrets.token_hex(5)
    async with await tokens.client(limited, tenant) as api:
        path = await create(api, "run", "in", direction="input", retention={"max_records": 1})
        base = await held_now(api)
        assert (await append(api, path, ["x" * 298] * 10)).status_code == 201
        record = NewRecord(RecordKind.JSON, "application/json", b'"' + b"x" * 298 + b'"', 300)
        charged = 10 * (held_bytes(record) + event_bytes(StreamKey(tenant, "run", "in"), record))
        async with asyncio.timeout(20):  # delivered, then pruned to its last record
            while (await api.get(path)).json()["state"]["earliest"] != 10:
                await asyncio.sleep(0.1)
        events = await pool.fetchval(
            "SELECT count(*) FROM workflow_wait_events WHERE tenant = $1", tenant
        )
        held, actual = await counted(pool, tenant)
        assert events == 10 and held == actual > base + 10 * (300 + 128) + 428
        # The charge was the most its records and events hold, with up to 200 bytes an event
        # to spare (its numbers counted at 19 digits; one record kept, nine pruned).
        landed = held - base + 9 * held_bytes(record)
        assert charged - 10 * 200 < landed <= charged
        # Its records alone (one kept) would let 10 more in; with their copies, they are not.
        await problem_of(await append(api, path, ["x" * 298] * 10))
        # What the engine (or an operator) removes of them gives their bytes back.
        removed = await pool.fetchval(
            "WITH gone AS (DELETE FROM workflow_wait_events WHERE tenant = $1 AND sequence <= 5"
            " RETURNING size) SELECT sum(size + 128) FROM gone",
            tenant,
        )
        assert await counted(pool, tenant) == (held - removed, actual - removed)
        # An erasure takes them away with the rest.
        assert (await api.delete(path)).status_code == 204
        assert await counted(pool, tenant) == (0, 0)

        # Small records of an input stream with long IDs and content type make events many
        # times their size: the append is refused as it is decided, though its records alone
        # would fit (charged only as the events landed, a tenant's stored 12 times its limit).
        long_path = await create(api, "r" * 128, "i" * 128, direction="input")
        small = await api.post(
            f"{long_path}/records",
            json={"records": [{"data_base64": "", "content_type": "x/" + "y" * 200}] * 20},
        )
        await problem_of(small)
        assert await counted(pool, tenant) == (await held_now(api),) * 2


async def test_input_records_pledge_their_events_until_they_are_delivered(
    own_database: str, tmp_path: Path, tokens: Tokens
) -> None:
    """No dispatcher runs: the events wait, and what they will hold is pledged on their
    delivery rows as the records are appended, so it stays counted past the server's
    second-old view of the count (charged in the process alone, a tenant whose events waited
    stored 9.7 times its limit). Delivered, each event counts itself and its pledge goes."""
    server = ServerProcess(
        database_url=own_database,
        data_dir=tmp_path / "server",
        env={**SERVER_ENV, "DUCTOR_STREAMS_MAX_BYTES_PER_TENANT": str(LIMIT)},
    ).start()
    pool = await asyncpg.create_pool(own_database, min_size=1, max_size=2)
    tenant = "t-" + secrets.token_hex(5)
    try:
        async with await Tokens(pool).client(server, tenant) as api:
            path = await create(api, "r" * 128, "i" * 128, direction="input")
            # An object committed to it pledges its event too, as an append does.
            prepared = await api.post(f"{path}/objects", json=intent_of(b"o", "o"))
            assert prepared.status_code == 201, prepared.text
            object_path = f"{path}/objects/{prepared.json()['object_id']}"
            assert (await api.put(f"{object_path}/body", content=b"o")).status_code == 200
            assert (await api.post(f"{object_path}/commit")).status_code == 201
            assert await pool.fetchval(
                "SELECT pledge FROM input_deliveries WHERE tenant = $1 AND sequence = 1", tenant
            ) > 2 * (128 + 128 + 12)
            one = [{"data_base64": "", "content_type": "x/" + "y" * 200}]
            stored = 1
            for _ in range(100):
                await asyncio.sleep(1.1)  # the server's view of the count read again each time
                answer = await api.post(f"{path}/records", json={"records": one})
                if answer.status_code == 409:
                    break
                assert answer.status_code == 201, answer.text
                stored += 1
            await problem_of(answer)
            pending = await pool.fetchval(
                "SELECT count(*) FROM input_deliveries WHERE tenant = $1 AND pledge > 0", tenant
            )
            held, actual = await counted(pool, tenant)
            assert pending == stored and held == actual <= LIMIT
            worker = WorkerProcess(
                database_url=own_database,
                data_dir=tmp_path / "worker",
                env={"DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.1"},
            ).start()
            try:
                async with asyncio.timeout(20):
                    while (await api.get(path)).json()["state"]["input_delivery"]["pending"]:
                        await asyncio.sleep(0.1)
            finally:
                worker.stop()
            landed, actual = await counted(pool, tenant)
            assert landed == actual <= held  # each event no more than it pledged
            assert (
                await pool.fetchval(
                    "SELECT count(*) FROM workflow_wait_events WHERE tenant = $1", tenant
                )
                == stored
            )
            assert (await api.delete(path)).status_code == 204
            assert await counted(pool, tenant) == (0, 0)
    finally:
        await pool.close()
        server.stop()


async def test_appends_at_once_in_one_process_count_against_each_other(
    api: httpx.AsyncClient, pool: asyncpg.Pool, tokens: Tokens, limited: ServerProcess
) -> None:
    """A hundred appends at once, over ten streams: each request's room leaves out what the
    others in flight may store, so together they stop at the limit (each checked against the
    same count alone, they stored 5-45 times a small limit)."""
    tenant = "t-" + secrets.token_hex(5)
    async with await tokens.client(limited, tenant) as client:
        paths = [await create(client, "many", f"s{i}") for i in range(10)]
        base, _ = await counted(pool, tenant)  # their definitions and rows
        fit = (LIMIT - base) // 228  # 100 bytes and a row each
        answers = await asyncio.gather(
            *(append(client, paths[i % 10], ["x" * 98]) for i in range(fit + 30))
        )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201] * fit + [409] * 30
    assert await counted(pool, tenant) == (base + 228 * fit,) * 2
    # On one stream, appends at once commit in one batch: each is decided by its own room,
    # the others' bytes counted once (counted twice, 4 or 5 of 8 that fitted were stored).
    tenant = "t-" + secrets.token_hex(5)
    async with await tokens.client(limited, tenant) as client:
        path = await create(client, "one", "s")
        base, _ = await counted(pool, tenant)
        fit = (LIMIT - base) // 228
        answers = await asyncio.gather(*(append(client, path, ["x" * 98]) for _ in range(fit + 5)))
    assert sorted(a.status_code for a in answers) == [201] * fit + [409] * 5
    assert await counted(pool, tenant) == (base + 228 * fit,) * 2


async def test_two_replicas_appending_and_deleting_at_once_keep_the_count_exact(
    server: ServerProcess, server_b: ServerProcess, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    """One tenant's appends, large and small, and deletions, through two server processes on
    overlapping streams at once: every statement adds to its own backend's row, so none waits
    for another on the count, none fails, and the count stays exact."""
    tenant = "t-" + secrets.token_hex(5)
    async with (
        await tokens.client(server, tenant) as a,
        await tokens.client(server_b, tenant) as b,
    ):
        paths = [await create(a, "r", f"s{i}") for i in range(6)]

        async def writer(api: httpx.AsyncClient, n: int) -> None:
            for turn in range(15):
                path = paths[(n + turn) % len(paths)]
                size = 100 if turn % 5 else 3  # every fifth a large group (COPY)
                answer = await append(api, path, ["v" * (n + 1)] * size)
                assert answer.status_code == 201, answer.text
            doomed = await create(api, "gone", f"d{n}")
            assert (await append(api, doomed, ["x" * 50] * 80)).status_code == 201
            assert (await api.delete(doomed)).status_code == 204

        await asyncio.gather(*(writer(a if n % 2 else b, n) for n in range(8)))
        held, actual = await counted(pool, tenant)
        assert held == actual > 0
        assert (await a.delete(f"{NATIVE}/runs/r")).status_code == 204
        assert await counted(pool, tenant) == (0, 0)


async def test_under_two_workers_the_limit_holds_for_writes_their_owners_commit(
    database_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    tokens: Tokens,
    pool: asyncpg.Pool,
) -> None:
    """`serve --workers 2`: each stream's writes are committed by its owner among the two, so
    half of what one connection writes is forwarded. The owner decides with the room the
    receiving process saw, and the receiving process counts what it forwarded: one writer, on
    both surfaces, never passes the limit."""
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("bytes-workers"),
        env={**SERVER_ENV, "DUCTOR_STREAMS_MAX_BYTES_PER_TENANT": str(LIMIT)},
        args=["--workers", "2"],
    ).start()
    try:
        tenant = "t-" + secrets.token_hex(5)
        async with await tokens.client(process, tenant) as api:
            native = [await create(api, "r", f"s{i}") for i in range(6)]
            for i in range(6):
                made = await api.put(f"{DS}/r/ds{i}", headers=JSON)
                assert made.status_code == 201, made.text
            base, _ = await counted(pool, tenant)  # the streams' definitions and rows
            # Records of 998 bytes and a row (1,126): the limit is reached within the second a
            # count is kept.
            fit = (LIMIT - base) // 1_126
            refused = 0
            for n in range(fit + 20):
                if n % 2:
                    answer = await append(api, native[n % 6], ["q" * 996])
                else:
                    answer = await api.post(
                        f"{DS}/r/ds{n % 6}", content=b'"' + b"q" * 996 + b'"', headers=JSON
                    )
                if answer.status_code == 409:
                    refused += 1
                else:
                    assert answer.status_code in (200, 201, 204), answer.text
            assert await counted(pool, tenant) == (base + fit * 1_126,) * 2
            assert refused == 20
    finally:
        process.stop()


async def test_open_intents_pledge_their_sizes_and_a_commit_at_the_limit_goes_through(
    limited: ServerProcess, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    """Object bodies uploaded for intents never committed would otherwise be stored beyond the
    limit (in the object store): an intent pledges from its prepare what its record will count.
    A commit turns its pledge into its record, so it is not refused at the limit; an abort
    gives the room back."""
    tenant = "t-" + secrets.token_hex(5)
    async with await tokens.client(limited, tenant) as api:
        await pledges_at_the_limit(api, pool, tenant)


async def pledges_at_the_limit(api: httpx.AsyncClient, pool: asyncpg.Pool, tenant: str) -> None:
    paths = [await create(api, "run", f"o{i}") for i in range(12)]
    base, _ = await counted(pool, tenant)  # the streams' definitions and rows
    body = b"p" * 1_000
    intents = []
    for i, path in enumerate(paths):
        prepared = await api.post(f"{path}/objects", json=intent_of(body, f"k{i}"))
        if prepared.status_code == 409:
            break
        assert prepared.status_code == 201, prepared.text
        intents.append(f"{path}/objects/{prepared.json()['object_id']}")
    # Each pledges what its record will count: its 1,000 bytes, its reference and its row.
    pledge = ((await counted(pool, tenant))[0] - base) // len(intents)
    assert pledge > 1_000 + 128
    assert len(intents) == (LIMIT - base) // pledge >= 2
    assert (await problem_of(prepared))["tenant_bytes"] == base + len(intents) * pledge
    # A commit at the limit goes through: its record takes its intent's pledge up.
    assert (await api.put(f"{intents[0]}/body", content=body)).status_code == 200
    committed = await api.post(f"{intents[0]}/commit")
    assert committed.status_code == 201, committed.text
    assert await counted(pool, tenant) == (base + len(intents) * pledge,) * 2
    # An abort gives its pledge back, at once.
    assert (await api.post(f"{intents[1]}/abort")).status_code == 200
    assert await counted(pool, tenant) == (base + (len(intents) - 1) * pledge,) * 2
    again = await api.post(f"{paths[-1]}/objects", json=intent_of(body, "again"))
    assert again.status_code == 201, again.text


async def test_migration_0509_counts_the_records_and_open_intents_already_there(
    postgres_admin_url: str, tmp_path: Path
) -> None:
    async with database_before(postgres_admin_url, 509, tmp_path) as url:
        conn = await asyncpg.connect(url)
        try:
            record = (
                "INSERT INTO stream_records (tenant, run_id, stream_id, sequence, appended_at,"
                " kind, content_type, size, end_offset, payload)"
                " VALUES ($1, 'r', $2, $3, now(), 1, 'text/plain', $4, 0, '\\x00')"
            )
            for tenant, stream, sequence, size in [
                ("a", "s", 1, 10),
                ("a", "s", 2, 20),
                ("a", "t", 1, 5),
                ("b", "s", 1, 7),
            ]:
                await conn.execute(record, tenant, stream, sequence, size)
            intent = (
                "INSERT INTO object_intents (tenant, run_id, stream_id, object_id,"
                " idempotency_key, state, size, sha256, content_type, storage_region,"
                " storage_key, receipt, expires_at, created_at, updated_at)"
                " VALUES ('a', 'r', 's', $1, $1, $2, $3, '\\x00', 'x', 'local', $1, '\\x00',"
                " now(), now(), now())"
            )
            for object_id, state, size in [
                ("o1", "prepared", 100),
                ("o2", "uploaded", 200),
                ("o3", "committed", 400),  # its record counts it (not inserted here)
                ("o4", "aborted", 800),
            ]:
                await conn.execute(intent, object_id, state, size)
            assert "0509_tenant_byte_counts.sql" in await migrate(conn)
            # Each record its size and a row (128); each open intent its size and a row.
            assert await tenant_bytes(conn, "a") == 35 + 3 * 128 + 100 + 200 + 2 * 128
            assert await tenant_bytes(conn, "b") == 7 + 128
            assert await tenant_bytes(conn, "c") == 0
        finally:
            await conn.close()


async def test_migration_0510_counts_the_receipts_already_there(
    postgres_admin_url: str, tmp_path: Path
) -> None:
    async with database_before(postgres_admin_url, 510, tmp_path) as url:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "INSERT INTO tenant_byte_counts (tenant, backend, bytes) VALUES ('a', 0, 1000)"
            )
            receipt = (
                "INSERT INTO append_receipts (tenant, run_id, stream_id, idempotency_key,"
                " fingerprint, answer) VALUES ($1, 'r', 's', $2, '\\x00', '\\x00')"
            )
            for tenant, key in [("a", "k1"), ("a", "key-2"), ("b", "é")]:
                await conn.execute(receipt, tenant, key)
            assert "0510_tenant_receipt_bytes.sql" in await migrate(conn)
            # Each receipt its key's bytes and 416, added to what was counted.
            assert await tenant_bytes(conn, "a") == 1000 + 2 + 5 + 2 * 416
            assert await tenant_bytes(conn, "b") == 2 + 416
        finally:
            await conn.close()


async def test_migration_0511_counts_the_wait_events_already_there(
    postgres_admin_url: str, tmp_path: Path
) -> None:
    async with database_before(postgres_admin_url, 511, tmp_path) as url:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "INSERT INTO tenant_byte_counts (tenant, backend, bytes) VALUES ('a', 0, 1000)"
            )
            event = (
                "INSERT INTO workflow_wait_events (event_id, tenant, run_id, stream_id,"
                " sequence, payload) VALUES ($1, $2, 'r', 's', 1, $3::text::jsonb)"
            )
            for event_id, tenant, payload in [
                ("e1", "a", '{"x": 1}'),
                ("e2", "a", '{"y":"é"}'),
                ("e3", "b", "[]"),
            ]:
                await conn.execute(event, event_id, tenant, payload)
            assert "0511_tenant_wait_event_bytes.sql" in await migrate(conn)
            # Each event its payload as stored (jsonb's text) and 128 for its row.
            expected_a = 1000 + len('{"x": 1}') + len('{"y": "é"}'.encode()) + 2 * 128
            assert await tenant_bytes(conn, "a") == expected_a
            assert await tenant_bytes(conn, "b") == 2 + 128
            # From here its triggers count every way in and out: an event with its size (as
            # the wait service lands it now), one without (an earlier version's), deletions.
            await conn.execute(
                "INSERT INTO workflow_wait_events (event_id, tenant, run_id, stream_id,"
                " sequence, payload, size) VALUES ('e4', 'b', 'r', 's', 2, '[1,  2]', 7)"
            )
            await conn.execute(event, "e5", "b", "[3]")
            assert await tenant_bytes(conn, "b") == 2 + 7 + 3 + 3 * 128
            await conn.execute("DELETE FROM workflow_wait_events WHERE tenant = 'b'")
            await conn.execute("DELETE FROM workflow_wait_events WHERE event_id = 'e1'")
            assert await tenant_bytes(conn, "b") == 0
            assert await tenant_bytes(conn, "a") == expected_a - len('{"x": 1}') - 128
        finally:
            await conn.close()


async def test_usage_shows_what_the_tenant_holds_against_its_limits(
    limited: ServerProcess, server: ServerProcess, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    tenant = "t-" + secrets.token_hex(5)
    async with await tokens.client(limited, tenant) as api:
        path = await create(api, "run", "s")
        assert (await append(api, path, ["u" * 98] * 2)).status_code == 201
        prepared = await api.post(f"{path}/objects", json=intent_of(b"i" * 50, "i"))
        assert prepared.status_code == 201, prepared.text
        held, _ = await counted(pool, tenant)
        assert held > 2 * 228 + 50  # its two records and its intent's pledge
        usage = await api.get(f"{NATIVE}/usage")
        assert usage.status_code == 200, usage.text
        assert usage.json() == {
            "streams": 1,
            "max_streams": 1_000_000,
            "bytes": held,
            "max_bytes": LIMIT,
            "tokens": 1,  # the client's own
            "max_tokens": 1_000_000,
            "subscriptions": 0,
            "max_subscriptions": 10_000,
        }
        # The typed client reads it too.
        token = api.headers["Authorization"].removeprefix("Bearer ")
        async with StreamsClient(limited.base_url, token) as client:
            assert await client.usage() == Usage(
                streams=1,
                max_streams=1_000_000,
                bytes=held,
                max_bytes=LIMIT,
                tokens=1,
                max_tokens=1_000_000,
                max_subscriptions=10_000,
            )
        # Tenant-wide: not for a token restricted to runs, nor one without streams:admin.
        minted = await api.post(
            f"{NATIVE}/tokens",
            json={"scopes": ["streams:admin"], "expires_in_seconds": 600, "runs": ["run"]},
        )
        assert minted.status_code == 201, minted.text
        restricted = {"Authorization": f"Bearer {minted.json()['token']}"}
        refused = await api.get(f"{NATIVE}/usage", headers=restricted)
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
        writer = await tokens.create(tenant=tenant, scopes=("streams:read", "streams:write"))
        refused = await api.get(f"{NATIVE}/usage", headers={"Authorization": f"Bearer {writer}"})
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    # A server on its defaults: a terabyte.
    async with await tokens.client(server, "t-" + secrets.token_hex(5)) as other:
        assert (await other.get(f"{NATIVE}/usage")).json() == {
            "streams": 0,
            "max_streams": 1_000_000,
            "bytes": 0,
            "max_bytes": 1 << 40,
            "tokens": 1,
            "max_tokens": 1_000_000,
            "subscriptions": 0,
            "max_subscriptions": 10_000,
        }


def lines_of(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """`tenants`' lines by tenant."""
    assert done.returncode == 0, done.stderr
    return {line.split("\t")[0]: line for line in done.stdout.splitlines()}


def tenants_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_STREAMS_")}
    env["DUCTOR_STREAMS_DATABASE_URL"] = database_url
    return subprocess.run(
        [CLI, "tenants", *args], capture_output=True, text=True, env=env, timeout=60
    )


async def test_the_tenants_command_prints_what_each_tenant_holds(
    server: ServerProcess, tokens: Tokens, database_url: str, pool: asyncpg.Pool
) -> None:
    held = {}
    for n in (1, 2):
        tenant = f"t-{n}-" + secrets.token_hex(5)
        async with await tokens.client(server, tenant) as api:
            for i in range(n):
                path = await create(api, "r", f"s{i}")
                assert (await append(api, path, ["c" * (10 * n)])).status_code == 201
        held[tenant] = (n, (await counted(pool, tenant))[0], 1)  # the client's own token
    done = await asyncio.to_thread(tenants_cli, database_url)
    assert done.returncode == 0, done.stderr
    lines = [line.split("\t") for line in done.stdout.splitlines()]
    assert [t for t, *_ in lines] == sorted(t for t, *_ in lines)  # by tenant
    printed = {t: (int(s), int(b), int(k)) for t, s, b, k in lines}
    for tenant, figures in held.items():
        assert printed[tenant] == figures
    one = await asyncio.to_thread(tenants_cli, database_url, "--tenant", tenant)
    assert one.stdout == "\t".join(map(str, (tenant, *held[tenant]))) + "\n"
    nobody = await asyncio.to_thread(tenants_cli, database_url, "--tenant", "nobody-here")
    assert nobody.stdout == "nobody-here\t0\t0\t0\n"
    bad = await asyncio.to_thread(tenants_cli, database_url, "--tenant", "no/slashes")
    assert bad.returncode == 2 and "tenant" in bad.stderr and not bad.stdout


async def test_a_recount_counts_every_tenant_again_from_its_rows(own_database: str) -> None:
    """`tenants --recount`: what a process of an earlier version wrote without counting it
    (here, rows written by hand and a count row gone wrong) is counted again."""
    conn = await asyncpg.connect(own_database)
    try:
        await conn.execute(
            "INSERT INTO stream_records (tenant, run_id, stream_id, sequence, appended_at, kind,"
            " content_type, size, end_offset, payload)"
            " SELECT 'old', 'r', 's', n, now(), 1, 'text/plain', 100, 0, '\\x00'"
            " FROM generate_series(1, 7) n"
        )
        await conn.execute(
            "INSERT INTO append_receipts (tenant, run_id, stream_id, idempotency_key,"
            " fingerprint, answer) VALUES ('old', 'r', 's', 'key', '\\x00', '\\x00')"
        )
        await conn.execute(
            "INSERT INTO workflow_wait_events (event_id, tenant, run_id, stream_id, sequence,"
            " payload) VALUES ('e', 'old', 'r', 's', 1, '[1]')"
        )
        await conn.execute(
            "INSERT INTO tenant_byte_counts (tenant, backend, bytes) VALUES ('gone', 0, 55)"
        )
    finally:
        await conn.close()
    # (The module's other tests' tenants are in this database too: only these two are read.)
    before = lines_of(await asyncio.to_thread(tenants_cli, own_database))
    assert before["gone"] == "gone\t0\t55\t0"
    assert before["old"] == "old\t0\t131\t0"  # its wait event's (counted by the trigger)
    done = await asyncio.to_thread(tenants_cli, own_database, "--recount")
    assert done.returncode == 0, done.stderr
    after = lines_of(done)
    assert after["old"] == f"old\t0\t{7 * (100 + 128) + 3 + 416 + 3 + 128}\t0"
    assert "gone" not in after


async def test_intents_opened_by_an_earlier_version_end_and_erase_without_a_pledge(
    server: ServerProcess, tokens: Tokens, pool: asyncpg.Pool, database_url: str
) -> None:
    """An intent a process of an earlier version opened during a rolling upgrade has no pledge
    and was counted nowhere: its commit, abort and erasure take nothing away (each answered
    500 when they tried), and a recount gives it its pledge."""
    tenant = "t-" + secrets.token_hex(5)

    async def as_if_opened_before(api: httpx.AsyncClient, path: str, body: bytes, key: str) -> str:
        prepared = await api.post(f"{path}/objects", json=intent_of(body, key))
        assert prepared.status_code == 201, prepared.text
        object_id = prepared.json()["object_id"]
        pledge = await pool.fetchval(
            "WITH o AS (SELECT pledge FROM object_intents WHERE tenant = $1 AND object_id = $2)"
            " UPDATE object_intents SET pledge = NULL WHERE tenant = $1 AND object_id = $2"
            " RETURNING (SELECT pledge FROM o)",
            tenant,
            object_id,
        )
        await pool.execute(
            "INSERT INTO tenant_byte_counts (tenant, backend, bytes) VALUES ($1, 0, -$2::int8)"
            " ON CONFLICT (tenant, backend)"
            " DO UPDATE SET bytes = tenant_byte_counts.bytes + excluded.bytes",
            tenant,
            pledge,
        )
        return f"{path}/objects/{object_id}"

    async with await tokens.client(server, tenant) as api:
        path = await create(api, "r", "s")
        base, _ = await counted(pool, tenant)  # its definition and row
        body = b"b" * 1_000
        committing = await as_if_opened_before(api, path, body, "c")
        aborting = await as_if_opened_before(api, path, body, "a")
        assert await counted(pool, tenant) == (base, base)
        assert (await api.put(f"{committing}/body", content=body)).status_code == 200
        assert (await api.post(f"{committing}/commit")).status_code == 201
        assert (await api.post(f"{aborting}/abort")).status_code == 200
        held, actual = await counted(pool, tenant)
        assert held == actual > base + 1_000
        await as_if_opened_before(api, path, body, "left")
        done = await asyncio.to_thread(tenants_cli, database_url, "--recount", "--tenant", tenant)
        assert done.returncode == 0, done.stderr
        held, actual = await counted(pool, tenant)
        assert held == actual > base + 2_000  # the one left open counted, with its pledge
        assert (await api.delete(path)).status_code == 204
        assert await counted(pool, tenant) == (0, 0)


async def test_a_recount_gives_way_to_a_large_append_rather_than_deadlock(
    own_database: str,
) -> None:
    """A large append holds its stream's row, writes its records, then its row; a recount holds
    `streams` while it waits for `stream_records`. Each would wait for the other: the recount
    gives up its locks (a lock timeout, before PostgreSQL's deadlock check, or the deadlock's
    error) and tries again, and the append goes through."""
    tenant = "t-" + secrets.token_hex(5)
    append = await asyncpg.connect(own_database)
    pool = await asyncpg.create_pool(own_database, min_size=1, max_size=2)
    try:
        await append.execute(
            "INSERT INTO streams (tenant, run_id, stream_id, definition, created_at, version,"
            " state) VALUES ($1, 'r', 's', '\\x00', now(), 1, '\\x00')",
            tenant,
        )
        transaction = append.transaction()
        await transaction.start()
        await append.execute("SELECT 1 FROM streams WHERE tenant = $1 FOR NO KEY UPDATE", tenant)
        await append.execute(
            "INSERT INTO stream_records (tenant, run_id, stream_id, sequence, appended_at, kind,"
            " content_type, size, end_offset, payload)"
            " VALUES ($1, 'r', 's', 1, now(), 1, 'text/plain', 1, 1, '\\x00')",
            tenant,
        )
        recount = asyncio.ensure_future(recount_tenant_bytes(pool))
        await asyncio.sleep(0.2)  # it holds `streams`, and waits for `stream_records`
        await append.execute("UPDATE streams SET version = 2 WHERE tenant = $1", tenant)
        await transaction.commit()
        await asyncio.wait_for(recount, 30)
        assert await tenant_bytes(pool, tenant) == 1 + 128 + 1 + 128  # definition, record
    finally:
        await append.close()
        await pool.close()
