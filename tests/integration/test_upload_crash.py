"""A body is never left behind by a process that dies mid-upload, on real PostgreSQL with the
filesystem store: an upload arms its body's deletion before the put (docs/architecture.md,
"Object bodies"), so a process killed after its put and before its bookkeeping leaves nothing
that no record references, even when an abort's deletion ran while the put was under way."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import msgspec
import pytest
from dependency_injector import providers

from adapters.objects.filesystem import FilesystemObjectStore
from adapters.postgres.cleanup import PostgresCleanup
from adapters.postgres.figures import PostgresFigures
from adapters.postgres.jobs import PostgresDeletionJobs
from adapters.postgres.streams import PostgresStreams
from application.access import SCOPES, Caller
from application.deletions import DeleteBodies
from application.objects import Objects, ObjectStores
from application.ports import StoredObject
from domain import errors
from domain.definition import DefinitionRequest
from domain.objects import ObjectRequest
from domain.stream import StreamKey
from entrypoints.config import Settings
from entrypoints.container import Container, provided, start, stop, utc_now

BODY = b"a body that outlives its upload " * 64
CALLER = Caller(tenant="acme", principal="alice", scopes=frozenset(SCOPES))


class _Died(BaseException):
    """The process is gone: no handler of the use case runs after the put."""


class DyingStore:
    """The filesystem store, whose put waits at `gate` before storing the body and then kills
    the upload (as a kill -9 after the put would)."""

    def __init__(self, inner: FilesystemObjectStore) -> None:
        self.inner = inner
        self.started = asyncio.Event()
        self.gate = asyncio.Event()
        self.dying = True
        self.raising: BaseException | None = None

    async def put(
        self,
        key: str,
        chunks: AsyncIterator[bytes],
        *,
        max_size: int,
        expect: StoredObject | None = None,
    ) -> StoredObject:
        self.started.set()
        if self.raising is not None:
            raise self.raising
        await self.gate.wait()
        stored = await self.inner.put(key, chunks, max_size=max_size, expect=expect)
        if self.dying:
            raise _Died
        return stored

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def body() -> AsyncIterator[bytes]:
    yield BODY


def request(key: str, expires_in: int) -> ObjectRequest:
    fields = {
        "idempotency_key": key,
        "size": len(BODY),
        "sha256": hashlib.sha256(BODY).hexdigest(),
        "expires_in_seconds": expires_in,
    }
    return msgspec.convert(fields, ObjectRequest)


@pytest.fixture
async def setup(own_database: str, own_pool: asyncpg.Pool, tmp_path: Path):
    store = DyingStore(FilesystemObjectStore(tmp_path / "objects"))
    stores = ObjectStores({"local": store})
    run_id = "run-" + secrets.token_hex(4)
    container = Container(settings=Settings(database_url=own_database, pool_min_size=1))
    container.object_stores.override(providers.Object(stores))
    services = await start(container)
    repo = PostgresStreams(own_pool)
    # No grace past an intent's deadline: the test's store ends every put by then.
    definitions, commits = await provided(container.definitions), await provided(container.commits)
    objects = Objects(definitions, repo, commits, stores, utc_now, upload_grace_seconds=0)
    jobs = PostgresDeletionJobs(own_pool, "deleter-" + secrets.token_hex(3), lease_seconds=30)
    deleter = DeleteBodies(repo, stores, repo, utc_now, hold_recheck_seconds=30)

    async def drain() -> int:
        """Run every deletion due now, as the deletion worker does; answer how many of this
        test's run ran (the module's database holds the other tests' too)."""
        ran = 0
        while claimed := await jobs.claim(100):
            for job in claimed:
                try:
                    await jobs.done(job, await deleter.run_job(job))
                except OSError as error:  # retried later, as the worker does
                    await jobs.failed(job, str(error), 30)
                ran += job.key.run_id == run_id
        return ran

    definition = msgspec.convert({"direction": "output", "stream_id": "s"}, DefinitionRequest)
    await services.create_stream(CALLER, run_id, definition)
    yield objects, store, drain, run_id
    await stop(container)


async def test_a_body_put_after_its_aborts_deletion_ran_is_removed_though_the_upload_died(
    setup,
) -> None:
    objects, store, drain, run_id = setup
    view, _ = await objects.prepare(CALLER, run_id, "s", request("k1", expires_in=2))
    upload = asyncio.create_task(objects.upload(CALLER, run_id, "s", view.object_id, body()))
    await store.started.wait()  # armed, and the put under way
    await objects.abort(CALLER, run_id, "s", view.object_id)
    # The abort's deletion runs at once and removes nothing yet; before the arming it was
    # then done, and the body the put landed afterwards stayed for good.
    assert await drain() == 1
    store.gate.set()
    with pytest.raises(_Died):
        await upload
    [key] = [k async for k in store.inner.keys(f"acme/{run_id}/")]
    assert await store.inner.stat(key) is not None  # the body no record will ever reference
    assert await drain() == 0
    await asyncio.sleep(2.2)  # past the intent's deadline: no put of it can land any more
    assert await drain() == 1  # the same deletion, again
    assert [k async for k in store.inner.keys(f"acme/{run_id}/")] == []
    assert await drain() == 0


async def test_a_body_stored_by_an_upload_that_died_before_marking_it_is_removed(setup) -> None:
    objects, store, drain, run_id = setup
    view, _ = await objects.prepare(CALLER, run_id, "s", request("k2", expires_in=1))
    store.gate.set()
    with pytest.raises(_Died):
        await objects.upload(CALLER, run_id, "s", view.object_id, body())
    assert (await objects.describe(CALLER, run_id, "s", view.object_id)).state == "prepared"
    assert await drain() == 0
    await asyncio.sleep(1.2)
    assert await drain() == 1
    assert [k async for k in store.inner.keys(f"acme/{run_id}/")] == []


async def test_a_committed_body_is_kept_by_a_twins_arming(setup, own_pool: asyncpg.Pool) -> None:
    """A twin upload may arm the deletion again after the first upload disarmed it: when it
    falls due, the body is the committed intent's own, and stays."""
    objects, store, drain, run_id = setup
    store.dying = False
    store.gate.set()
    view, _ = await objects.prepare(CALLER, run_id, "s", request("k3", expires_in=2))
    await objects.upload(CALLER, run_id, "s", view.object_id, body())
    await objects.commit(CALLER, run_id, "s", view.object_id)
    [key] = [k async for k in store.inner.keys(f"acme/{run_id}/")]
    due = await PostgresStreams(own_pool).intent(StreamKey("acme", run_id, "s"), view.object_id)
    assert due is not None
    twin = PostgresStreams(own_pool).uploading
    await twin(StreamKey("acme", run_id, "s"), "local", key, due.expires_at)
    assert await drain() == 0
    await asyncio.sleep(2.2)
    assert await drain() == 1
    assert await store.inner.stat(key) is not None
    done = "SELECT done_at IS NOT NULL FROM deletion_outbox WHERE storage_key = $1"
    assert await own_pool.fetchval(done, key)


async def test_a_put_that_runs_past_the_intents_deadline_is_cut_off(setup) -> None:
    objects, store, _, run_id = setup
    store.dying = False
    view, _ = await objects.prepare(CALLER, run_id, "s", request("k4", expires_in=1))
    with pytest.raises(errors.ObjectStateConflict, match="expired while its body was uploading"):
        await asyncio.wait_for(objects.upload(CALLER, run_id, "s", view.object_id, body()), 10)
    assert [k async for k in store.inner.keys(f"acme/{run_id}/")] == []


async def test_a_twin_uploads_put_landing_after_the_first_upload_and_an_abort_is_removed(
    setup, own_pool: asyncpg.Pool
) -> None:
    """Two uploads of one intent arm one row. The first to mark the intent uploaded ends only
    its own put (the row is kept, the cleanup leaves it); the abort takes it over and deletes at
    once, and once more when no put can land any more: the twin's late put is removed then."""
    objects, store, drain, run_id = setup
    store.dying = False
    store.gate.set()
    view, _ = await objects.prepare(CALLER, run_id, "s", request("k5", expires_in=2))
    key = StreamKey("acme", run_id, "s")
    intent = await PostgresStreams(own_pool).intent(key, view.object_id)
    assert intent is not None
    # The twin arms first; the first upload arms the same row, puts, and disarms it.
    await PostgresStreams(own_pool).uploading(key, "local", intent.storage_key, intent.expires_at)
    await objects.upload(CALLER, run_id, "s", view.object_id, body())
    await PostgresCleanup(own_pool).forget_done_deletions(timedelta(0))
    under_way = "SELECT uploads_under_way FROM deletion_outbox WHERE storage_key = $1"
    assert await own_pool.fetchval(under_way, intent.storage_key) == 1  # the twin's, kept
    await objects.abort(CALLER, run_id, "s", view.object_id)
    assert await drain() == 1  # deleted at once...
    assert await store.inner.stat(intent.storage_key) is None
    await store.inner.put(intent.storage_key, body(), max_size=len(BODY))  # the twin's put
    assert await drain() == 0  # ...and again when no put can land any more
    await asyncio.sleep(2.2)
    assert await drain() == 1
    assert await store.inner.stat(intent.storage_key) is None
    assert await drain() == 0


async def test_a_stores_own_timeout_is_no_expiry(setup) -> None:
    """Only the intent's deadline answers "expired"; a store's own timeout is an outage's."""
    objects, store, _, run_id = setup
    store.raising = TimeoutError()
    view, _ = await objects.prepare(CALLER, run_id, "s", request("k6", expires_in=60))
    with pytest.raises(TimeoutError):
        await objects.upload(CALLER, run_id, "s", view.object_id, body())


async def test_an_armed_deletion_is_no_backlog_before_it_is_due(
    setup, own_pool: asyncpg.Pool
) -> None:
    objects, store, drain, run_id = setup

    async def backlog() -> int:
        figures = await PostgresFigures(own_pool).figures()
        [deletion] = [b for b in figures.backlogs if b.outbox == "deletion"]
        return deletion.pending

    await drain()  # what the other tests left due
    before = await backlog()
    view, _ = await objects.prepare(CALLER, run_id, "s", request("k7", expires_in=60))
    upload = asyncio.create_task(objects.upload(CALLER, run_id, "s", view.object_id, body()))
    await store.started.wait()  # armed
    assert await backlog() == before
    # A deletion that fails waits for its retry, and stays in the backlog meanwhile.
    await objects.abort(CALLER, run_id, "s", view.object_id)
    store.inner.delete = failing  # type: ignore[method-assign]
    await drain()
    assert await backlog() == before + 1
    upload.cancel()


async def failing(key: str) -> None:
    raise OSError("the object store is out of reach")
