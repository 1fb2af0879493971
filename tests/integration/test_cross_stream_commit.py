"""The commit across streams, end to end (docs/architecture.md "Group commit across streams"):
appends to many streams at once, through real server processes on one PostgreSQL, each
request answered alone; overlapping processes never deadlock; a kill -9 mid-commit loses and
duplicates nothing an idempotent writer retries."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import signal
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import msgspec
import pytest

from adapters.postgres.erasure import ERASED_TABLES
from adapters.postgres.forks import any_forked
from adapters.postgres.stream_writes import LOCK_MANY_STATEMENT
from adapters.postgres.streams import PostgresStreams
from application.close_stream import CloseCommand
from application.delete_stream import DeleteCommand
from application.errors import NotFound
from application.ports import Command, Done, Failed, Outcome
from application.set_legal_hold import LegalHoldCommand
from domain.definition import Fork
from domain.errors import LegalHoldActive
from domain.stream import StreamKey
from tests.conftest import SERVER_ENV, api_client
from tests.integration.test_durable_streams import ds_client
from tests.integration.test_http_records import assert_problem, create
from tests.support.builders import NOW, WRITER, append, definition, new_key
from tests.support.server import ServerProcess


async def records_of(api: httpx.AsyncClient, run_id: str, stream_id: str) -> list[dict[str, Any]]:
    """Every record of the stream, in sequence order."""
    found: list[dict[str, Any]] = []
    cursor = 0
    while True:
        response = await api.get(
            f"/runs/{run_id}/streams/{stream_id}/records", params={"cursor": cursor, "limit": 1000}
        )
        assert response.status_code == 200, response.text
        page = response.json()
        found += page["records"]
        if not page["records"]:
            return found
        cursor = page["records"][-1]["sequence"]


async def test_refused_appends_in_one_spread_commit_answer_alone_and_fail_nothing_else(
    server: ServerProcess, api: httpx.AsyncClient, run_id: str
) -> None:
    names = [f"s{i:02d}" for i in range(20)]
    for name in names:
        await create(api, run_id, name)
    for name in ("closed", "held", "doomed", "keyed"):
        await create(api, run_id, name)
    await create(api, run_id, "full", limits={"max_unread_items": 1})
    assert (await api.post(f"/runs/{run_id}/streams/closed/close")).status_code == 200
    assert (
        await api.put(f"/runs/{run_id}/streams/held/legal-hold", json={"enabled": True})
    ).status_code == 200
    url = f"/runs/{run_id}/streams/{{}}/records"

    def body(value: object) -> dict[str, object]:
        return {"records": [{"data": value}]}

    assert (await api.post(url.format("full"), json=body("first"))).status_code == 201
    assert (
        await api.post(url.format("keyed"), json=body("k"), headers={"Idempotency-Key": "k"})
    ).status_code == 201
    async with ds_client(server) as ds:
        text = {"Content-Type": "text/plain"}
        assert (await ds.put(f"/{run_id}/produced", headers=text)).status_code == 201
        bump = {"Producer-Id": "p", "Producer-Epoch": "2", "Producer-Seq": "0"}
        posted = await ds.post(f"/{run_id}/produced", content=b"a", headers={**text, **bump})
        assert posted.status_code == 200
        stale = {"Producer-Id": "p", "Producer-Epoch": "1", "Producer-Seq": "1"}

        # Everything at once, so that the server's leader finds them waiting together.
        calls = [api.post(url.format(n), json=body(f"{n}-{i}")) for i in range(3) for n in names]
        calls += [
            api.post(url.format("closed"), json=body("no")),
            api.post(url.format("full"), json=body("no")),
            api.post(url.format("held"), json=body("yes")),
            api.delete(f"/runs/{run_id}/streams/held"),
            api.delete(f"/runs/{run_id}/streams/doomed"),
            *(api.post(url.format("doomed"), json=body("maybe")) for _ in range(5)),
            api.post(url.format("keyed"), json=body("other"), headers={"Idempotency-Key": "k"}),
            api.post(url.format("keyed"), json=body("k"), headers={"Idempotency-Key": "k"}),
            ds.post(f"/{run_id}/produced", content=b"z", headers={**text, **stale}),
        ]
        answers = await asyncio.gather(*calls)
    spread, rest = answers[: 3 * len(names)], answers[3 * len(names) :]
    assert all(a.status_code == 201 for a in spread), [a.text for a in spread]
    closed, full, held, held_delete, doomed_delete, *rest = rest
    doomed, (reused, replayed, stale_epoch) = rest[:5], rest[5:]
    assert_problem(closed, 409, "stream-closed")
    assert_problem(full, 429, "backpressure")
    assert held.status_code == 201
    assert_problem(held_delete, 409, "legal-hold-active")
    assert doomed_delete.status_code == 204
    assert all(d.status_code in (201, 404) for d in doomed), [d.text for d in doomed]
    assert_problem(reused, 422, "idempotency-key-reused")
    assert replayed.status_code == 200  # a replay
    assert_problem(stale_epoch, 403, "producer-epoch-stale")
    for name in names:  # contiguous per stream, each request's records once
        found = await records_of(api, run_id, name)
        assert [r["sequence"] for r in found] == [1, 2, 3]
        assert sorted(r["data"] for r in found) == [f"{name}-{i}" for i in range(3)]
    assert [r["data"] for r in await records_of(api, run_id, "held")] == ["yes"]
    assert [r["data"] for r in await records_of(api, run_id, "full")] == ["first"]
    assert [r["data"] for r in await records_of(api, run_id, "keyed")] == ["k"]
    assert (await api.get(f"/runs/{run_id}/streams/doomed")).status_code == 404


@pytest.mark.slow
async def test_replicas_and_processes_hammering_overlapping_streams_never_deadlock_or_lose(
    server: ServerProcess,
    server_b: ServerProcess,
    api: httpx.AsyncClient,
    api_b: httpx.AsyncClient,
    database_url: str,
    tmp_path: Path,
    run_id: str,
) -> None:
    """Each writer appends its numbered records one by one to random streams of one shared set,
    through one of two replicas or a `serve --workers 2` (four processes in all): every one
    batches across streams and locks overlapping rows."""
    names = [f"s{i:02d}" for i in range(24)]
    for name in names:
        await create(api, run_id, name)
    acked: dict[str, list[tuple[int, int]]] = defaultdict(list)
    failures: list[str] = []
    logged = [(p, len(p.log())) for p in (server, server_b)]

    async def writer(number: int, client: httpx.AsyncClient, deadline: float) -> None:
        rng = random.Random(number)
        n = 0
        while time.monotonic() < deadline:
            name = rng.choice(names)
            response = await client.post(
                f"/runs/{run_id}/streams/{name}/records",
                json={"records": [{"data": [number, n]}, {"data": [number, n + 1]}]},
            )
            if response.status_code != 201:
                failures.append(response.text)
                return
            acked[name].append((number, n))
            n += 2

    pair = ServerProcess(
        database_url=database_url, data_dir=tmp_path, env=SERVER_ENV, args=["--workers", "2"]
    ).start()
    try:
        async with api_client(pair) as api_c:
            clients = (api, api_b, api_c)
            deadline = time.monotonic() + 8
            await asyncio.gather(*(writer(i, clients[i % 3], deadline) for i in range(36)))
        # No batch was refused (a deadlock or a failing write would have been, and its streams
        # then committed one by one).
        logs = [p.log()[start:] for p, start in logged] + [pair.log()]
        assert not [line for text in logs for line in text.splitlines() if "refused" in line]
    finally:
        pair.stop()
    assert not failures, failures[:3]
    total = 0
    for name in names:
        found = await records_of(api, run_id, name)
        assert [r["sequence"] for r in found] == list(range(1, len(found) + 1))
        pairs = [tuple(r["data"]) for r in found]
        assert len(pairs) == len(set(pairs))  # each once
        expected = {p for number, n in acked[name] for p in ((number, n), (number, n + 1))}
        assert set(pairs) == expected  # every acknowledged record, nothing else
        by_writer: dict[int, list[int]] = defaultdict(list)
        for number, n in pairs:
            by_writer[number].append(n)
        assert all(ns == sorted(ns) for ns in by_writer.values())  # each writer's in order
        total += len(pairs)
    assert total > 200


@pytest.mark.slow
async def test_a_kill_9_mid_commit_loses_and_duplicates_nothing_idempotent_writers_retry(
    database_url: str, tmp_path: Path, run_id: str
) -> None:
    """Idempotent writers on 100 streams; the server is killed while they append, started
    again, and every request whose answer was lost is retried with its key."""
    names = [f"s{i:03d}" for i in range(100)]
    process = ServerProcess(database_url=database_url, data_dir=tmp_path, env=SERVER_ENV).start()
    try:
        async with api_client(process) as client:
            for name in names:
                await create(client, run_id, name)
            attempted: dict[str, tuple[str, dict[str, Any]]] = {}
            acked: set[str] = set()
            stop = asyncio.Event()

            async def writer(number: int) -> None:
                rng = random.Random(number)
                n = 0
                while not stop.is_set():
                    key = f"w{number}-{n}"
                    name = rng.choice(names)
                    body = {"records": [{"data": key}]}
                    attempted[key] = (name, body)
                    try:
                        response = await client.post(
                            f"/runs/{run_id}/streams/{name}/records",
                            json=body,
                            headers={"Idempotency-Key": key},
                        )
                    except httpx.HTTPError:
                        return  # the server died under this request
                    if response.status_code != 201:
                        return
                    acked.add(key)
                    n += 1

            writers = [asyncio.create_task(writer(i)) for i in range(48)]
            async with asyncio.timeout(60):  # some acknowledged first, however busy the machine
                while len(acked) <= 100:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            process.stop(signal.SIGKILL)  # mid-commit: dozens of requests under way
            stop.set()
            await asyncio.gather(*writers)
        assert len(acked) > 100
        process = ServerProcess(
            database_url=database_url, data_dir=tmp_path, env=SERVER_ENV
        ).start()
        async with api_client(process) as client:
            for key in set(attempted) - acked:  # unanswered: committed or not, retried
                name, body = attempted[key]
                retried = await client.post(
                    f"/runs/{run_id}/streams/{name}/records",
                    json=body,
                    headers={"Idempotency-Key": key},
                )
                assert retried.status_code in (200, 201), retried.text  # replayed or new
            seen: list[str] = []
            for name in names:
                found = await records_of(client, run_id, name)
                assert [r["sequence"] for r in found] == list(range(1, len(found) + 1))
                assert all(attempted[r["data"]][0] == name for r in found)
                seen += [r["data"] for r in found]
        assert len(seen) == len(set(seen))  # 0 duplicates
        assert set(seen) == set(attempted)  # 0 lost: every acknowledged one, every retried one
        print(json.dumps({"acked_before_kill": len(acked), "retried": len(attempted) - len(acked)}))
    finally:
        process.stop()


class RefusingOnce(PostgresStreams):
    """The first batch is refused by the server, as a deadlock victim is."""

    refused = 0

    async def _update_many(
        self, groups: Sequence[tuple[StreamKey, Sequence[Command]]]
    ) -> list[list[Outcome] | Exception]:
        if not self.refused:
            self.refused += 1
            raise asyncpg.DeadlockDetectedError("deadlock detected")
        return await super()._update_many(groups)


async def test_a_refused_batch_is_committed_stream_by_stream_each_answering_alone(
    pool: asyncpg.Pool,
) -> None:
    repo = RefusingOnce(pool)
    run = new_key()
    keys = [run._replace(stream_id=name) for name in ("a", "b", "closed")]
    for key in keys:
        await repo.create(key, definition(key.stream_id), NOW)
    await repo.update(keys[2], [CloseCommand(WRITER, NOW)])
    gone = run._replace(stream_id="gone")
    results = await repo.update_many(
        [
            (keys[0], [append(), append()]),
            (gone, [append()]),
            (keys[1], [append()]),
            (keys[2], [append()]),
        ]
    )
    assert repo.refused == 1
    assert [o.answer.first_sequence for o in results[0]] == [1, 2]
    assert isinstance(results[1], NotFound)
    assert [o.answer.first_sequence for o in results[2]] == [1]
    assert isinstance(results[3][0], Failed)
    assert (await repo.page(keys[0], 0, 10))[0].head == 2


async def _fork_of(
    repo: PostgresStreams, source: StreamKey, stream_id: str, into: str | None = None
) -> StreamKey:
    """A fork of `source` through its head, in the source's run (or in run `into`)."""
    loaded = await repo.load(source)
    assert loaded is not None and loaded.state.created_at is not None
    head = loaded.state.head
    link = Fork(
        run_id=source.run_id,
        stream_id=source.stream_id,
        source_created_at=loaded.state.created_at,
        through=head,
        offset=head,
    )
    key = source._replace(stream_id=stream_id, run_id=into or source.run_id)
    made = msgspec.structs.replace(loaded.definition, stream_id=stream_id, fork=link)
    assert (await repo.create(key, made, NOW))[1]
    return key


async def test_a_chain_of_forks_out_of_a_run_and_back_leaves_nothing_once_both_runs_go(
    pool: asyncpg.Pool,
) -> None:
    """s in run A <- f in run B <- g in run A. Deleting B keeps f (g reads it); deleting A then
    erases g, which releases f, which releases s: nothing is left soft-deleted for ever."""
    repo = PostgresStreams(pool)
    a, b = new_key(), new_key()
    s = a._replace(stream_id="s")
    await repo.create(s, definition("s"), NOW)
    await repo.update(s, [append()])
    f = await _fork_of(repo, s, "f", into=b.run_id)
    g = await _fork_of(repo, f, "g", into=a.run_id)
    await repo.delete_run(b.tenant, b.run_id, NOW)
    kept = await repo.load(f)
    assert kept is not None and kept.state.soft_deleted  # g still reads it
    await repo.delete_run(a.tenant, a.run_id, NOW)
    for key in (s, f, g):
        assert await _rows_of(pool, key) == {}, key


async def test_a_source_deleted_in_the_batch_that_erases_its_last_fork_is_released(
    pool: asyncpg.Pool,
) -> None:
    """The source is decided first (its forks still link to it: soft-deleted), then its last
    forks are erased in the same batch: it goes too, in that transaction, whatever order the
    batch decided them in."""
    repo = PostgresStreams(pool)
    for order in ("source first", "forks first"):
        run = new_key()
        source = run._replace(stream_id="m-source")
        await repo.create(source, definition("m-source"), NOW)
        await repo.update(source, [append()])
        forks = [await _fork_of(repo, source, name) for name in ("a-fork", "z-fork")]
        batch = [source, *forks] if order == "source first" else [*forks, source]
        results = await repo.update_many([(k, [DeleteCommand(NOW)]) for k in batch])
        assert all(not isinstance(r, BaseException) and isinstance(r[0], Done) for r in results)
        for key in (source, *forks):
            assert await _rows_of(pool, key) == {}, (order, key)
            assert await repo.load(key) is None


async def test_a_chain_soft_deleted_in_one_batch_goes_whole_in_any_order(
    pool: asyncpg.Pool,
) -> None:
    """p <- s <- f (s a fork of p, f of s), all deleted in one batch: in every order the batch
    may decide them in, nothing is left (p and s each soft-deleted while a fork linked them)."""
    repo = PostgresStreams(pool)
    for order in ("psf", "pfs", "spf", "sfp", "fps", "fsp"):
        run = new_key()
        p = run._replace(stream_id="p")
        await repo.create(p, definition("p"), NOW)
        await repo.update(p, [append()])
        s = await _fork_of(repo, p, "s")
        f = await _fork_of(repo, s, "f")
        named = {"p": p, "s": s, "f": f}
        results = await repo.update_many([(named[n], [DeleteCommand(NOW)]) for n in order])
        assert all(not isinstance(r, BaseException) and isinstance(r[0], Done) for r in results)
        for key in (p, s, f):
            assert await _rows_of(pool, key) == {}, (order, key)


async def test_a_stream_its_batch_erased_before_deciding_it_answers_404_alone(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A soft-deleted source released by the cascade of its last fork, decided earlier in the
    same batch, is gone when its own commands are decided: they answer 404, and the batch is
    not refused for it (its definition, no longer kept here, could not be read back)."""
    repo = PostgresStreams(pool)
    run = new_key()
    source, other = run._replace(stream_id="src"), run._replace(stream_id="other")
    for key in (source, other):
        await repo.create(key, definition(key.stream_id), NOW)
        await repo.update(key, [append()])
    fork = await _fork_of(repo, source, "fork")
    [soft] = await repo.update(source, [DeleteCommand(NOW)])  # its fork still reads it
    assert isinstance(soft, Done)
    kept = repo._definitions.get
    monkeypatch.setattr(  # evicted, as a busy process's cache may have
        repo._definitions, "get", lambda key: None if key == source else kept(key)
    )
    with caplog.at_level(logging.WARNING, logger="ductor_streams.group_commit"):
        results = await repo.update_many(
            [(fork, [DeleteCommand(NOW)]), (source, [append()]), (other, [append()])]
        )
    assert not [r.message for r in caplog.records if "was refused" in r.message]
    fork_result, source_result, other_result = results
    assert isinstance(source_result, NotFound)
    assert not isinstance(fork_result, BaseException) and isinstance(fork_result[0], Done)
    assert not isinstance(other_result, BaseException) and isinstance(other_result[0], Done)
    for key in (source, fork):
        assert await _rows_of(pool, key) == {}, key


async def _rows_of(pool: asyncpg.Pool, key: StreamKey) -> dict[str, int]:
    """The stream's rows still in any table a deletion erases (its streams row included)."""
    counts = {}
    for table in (*ERASED_TABLES, "streams"):
        query = f"SELECT count(*) FROM {table} WHERE tenant = $1 AND run_id = $2 AND stream_id = $3"
        counts[table] = await pool.fetchval(query, *key)
    return {table: n for table, n in counts.items() if n}


async def test_a_batchs_deletions_are_erased_together_each_answering_alone(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deletions of streams no fork links to are erased together once the batch is decided
    (two statements, not three round trips each): every row of each goes, a fork among them
    releases its soft-deleted source, a held stream refuses alone, the rest commits."""
    repo = PostgresStreams(pool)
    run = new_key()
    doomed = [run._replace(stream_id=f"d{i}") for i in range(6)]
    held, kept, source = (run._replace(stream_id=name) for name in ("held", "kept", "src"))
    for key in (*doomed, held, kept, source):
        await repo.create(key, definition(key.stream_id), NOW)
        await repo.update(key, [append(key="k1"), append()])
    await repo.update(held, [LegalHoldCommand(True, "audit", NOW)])
    fork = await _fork_of(repo, source, "fork")
    [soft] = await repo.update(source, [DeleteCommand(NOW)])  # its fork still reads it
    assert isinstance(soft, Done) and (await repo.load(source)) is not None

    def one_at_a_time(*args: object) -> None:
        raise AssertionError("a deletion in this batch was erased on its own")

    monkeypatch.setattr("adapters.postgres.streams.erase", one_at_a_time)
    results = await repo.update_many(
        [
            *((key, [append(), DeleteCommand(NOW)]) for key in doomed),
            (fork, [DeleteCommand(NOW)]),
            (held, [append(), DeleteCommand(NOW)]),
            (kept, [append()]),
        ]
    )
    *deleted, fork_deleted, held_results, kept_results = results
    for outcomes in (*deleted, fork_deleted):
        assert not isinstance(outcomes, BaseException)
        assert all(isinstance(o, Done) for o in outcomes)
    assert not isinstance(held_results, BaseException)
    appended, refused = held_results
    assert isinstance(appended, Done) and isinstance(refused, Failed)
    assert isinstance(refused.error, LegalHoldActive)
    assert not isinstance(kept_results, BaseException)
    [kept_append] = kept_results
    assert isinstance(kept_append, Done) and kept_append.answer.first_sequence == 3
    for key in (*doomed, fork, source):  # the source released with its last fork
        assert await _rows_of(pool, key) == {}, key
        assert await repo.load(key) is None
    loaded = await repo.load(held)
    assert loaded is not None and loaded.state.head == 3


async def test_a_batch_deleting_a_stream_a_fork_reads_decides_each_deletion_in_turn(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """With a fork linking to one of the streams a batch deletes, every deletion is decided and
    erased in turn, as one stream's are: that one is soft-deleted, the others erased, in the
    batch's transaction (erasing the source would break its fork's link: the batch would be
    refused and committed stream by stream, and say so)."""
    repo = PostgresStreams(pool)
    run = new_key()
    doomed = [run._replace(stream_id=f"d{i}") for i in range(3)]
    source = run._replace(stream_id="src")
    for key in (*doomed, source):
        await repo.create(key, definition(key.stream_id), NOW)
        await repo.update(key, [append()])
    async with pool.acquire() as conn:
        assert not await any_forked(conn, [*doomed, source])
        fork = await _fork_of(repo, source, "fork")
        assert await any_forked(conn, [*doomed, source]) and await any_forked(conn, [source])
        assert not await any_forked(conn, doomed)
    with caplog.at_level(logging.WARNING, logger="ductor_streams.group_commit"):
        results = await repo.update_many([(k, [DeleteCommand(NOW)]) for k in (*doomed, source)])
    assert not [r.message for r in caplog.records if "was refused" in r.message]
    assert all(not isinstance(r, BaseException) and isinstance(r[0], Done) for r in results)
    for key in doomed:
        assert await _rows_of(pool, key) == {}, key
    soft = await repo.load(source)
    assert soft is not None and soft.state.soft_deleted
    assert (await repo.load(fork)) is not None


async def test_a_batch_locks_its_rows_in_key_order_whatever_order_it_was_given(
    pool: asyncpg.Pool,
) -> None:
    """The order every process locks in is what keeps overlapping batches from deadlocking: a
    batch given its streams last-first still locks the first in key order before it waits for
    the last. (The hammering test above sees a broken order only when a deadlock happens to
    occur; this sees it at once.)"""
    repo = PostgresStreams(pool)
    run = new_key()
    keys = [run._replace(stream_id=f"k{i}") for i in range(10)]
    for key in keys:
        await repo.create(key, definition(key.stream_id), NOW)
    *earlier, last = keys
    lock_one = "SELECT 1 FROM streams WHERE tenant = $1 AND run_id = $2 AND stream_id = $3"
    async with pool.acquire() as blocker, blocker.transaction():
        await blocker.execute(lock_one + " FOR UPDATE", *last)
        given = [last, *reversed(earlier)]
        batch = asyncio.create_task(repo.update_many([(k, [append()]) for k in given]))
        for _ in range(200):  # until the batch waits for the blocker's lock
            waiting = await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND (query LIKE '%FOR NO KEY UPDATE OF s%' "
                f"OR query LIKE 'BEGIN; EXECUTE {LOCK_MANY_STATEMENT}(%')"
            )
            if waiting:
                break
            await asyncio.sleep(0.02)
        assert waiting, "the batch never waited for the last stream's lock"
        async with pool.acquire() as probe, probe.transaction():
            free = await probe.fetch(
                "SELECT stream_id FROM streams WHERE tenant = $1 AND run_id = $2 "
                "AND stream_id = ANY($3::text[]) FOR UPDATE SKIP LOCKED",
                run.tenant,
                run.run_id,
                [k.stream_id for k in earlier],
            )
        assert [r[0] for r in free] == []  # each one before the last was locked before it
    results = await batch
    assert all(not isinstance(r, BaseException) for r in results)
    assert all(o.answer.first_sequence == 1 for r in results for o in r)


async def test_large_appends_beside_small_ones_each_commit_once_and_in_order(
    api: httpx.AsyncClient, run_id: str
) -> None:
    """Four writers append requests of 4.3 MB (each large by itself: they commit aside, at most
    two batches at once, the others passed over until a slot ends) to streams of their own, one
    of them alternating with one-record appends, while another writer appends one record at a
    time: every request is answered 201, and every stream holds each record once, in the order
    it was sent."""
    names = [f"big{i}" for i in range(4)]
    for name in (*names, "small"):
        await create(api, run_id, name, limits={"max_unread_bytes": 2**40})
    url = f"/runs/{run_id}/streams/{{}}/records"
    pad = "x" * 62_000
    sent: dict[str, list[str]] = defaultdict(list)

    async def post(name: str, values: list[str]) -> None:
        response = await api.post(url.format(name), json={"records": [{"data": v} for v in values]})
        assert response.status_code == 201, response.text
        sent[name] += values

    async def large(name: str) -> None:
        for round_ in range(3):
            await post(name, [f"{round_}.{n}.{pad}" for n in range(70)])
            if name == names[0]:
                await post(name, [f"{round_}.small"])

    async def small() -> None:
        for n in range(40):
            await post("small", [str(n)])

    await asyncio.gather(*(large(name) for name in names), small())
    for name in (*names, "small"):
        found = await records_of(api, run_id, name)
        assert [r["data"] for r in found] == sent[name]
        assert [r["sequence"] for r in found] == list(range(1, len(sent[name]) + 1))
