"""A body is never left behind by a process that dies mid-upload, on real PostgreSQL with the
filesystem store: an upload arms its body's deletion before the put (docs/architecture.md,
"Object bodies"), so a process killed after its put and before its bookkeeping leaves nothing
that no record references, even when an abort's deletion ran while the put was under way."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import msgspec
import pytest
from dependency_injector import providers

from adapters.objects.filesystem import FilesystemObjectStore
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

    async def put(
        self,
        key: str,
        chunks: AsyncIterator[bytes],
        *,
        max_size: int,
        expect: StoredObject | None = None,
    ) -> StoredObject:
        self.started.set()
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
        """Run every deletion due now, as the deletion worker does; answer how many ran."""
        ran = 0
        while claimed := await jobs.claim(100):
            for job in claimed:
                await jobs.done(job, await deleter.run_job(job))
                ran += 1
        return ran

    run_id = "run-" + secrets.token_hex(4)
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
    # The abort's deletion is not due while the put may still land: before the arming, it ran
    # at once, removed nothing, and was done.
    assert await drain() == 0
    store.gate.set()
    with pytest.raises(_Died):
        await upload
    [key] = [k async for k in store.inner.keys(f"acme/{run_id}/")]
    assert await store.inner.stat(key) is not None  # the body no record will ever reference
    await asyncio.sleep(2.2)  # past the intent's deadline: no put of it can land any more
    assert await drain() == 1
    assert [k async for k in store.inner.keys(f"acme/{run_id}/")] == []


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


async def test_an_uploaded_body_is_kept_by_a_twins_arming_and_removed_by_its_abort(
    setup, own_pool: asyncpg.Pool
) -> None:
    """A twin upload may arm the deletion again after the first upload disarmed it: the body
    is the intent's own, and stays; the abort that follows takes the done row over."""
    objects, store, drain, run_id = setup
    store.dying = False
    store.gate.set()
    view, _ = await objects.prepare(CALLER, run_id, "s", request("k3", expires_in=60))
    await objects.upload(CALLER, run_id, "s", view.object_id, body())
    [key] = [k async for k in store.inner.keys(f"acme/{run_id}/")]
    twin = PostgresStreams(own_pool).uploading
    await twin(StreamKey("acme", run_id, "s"), "local", key, utc_now())
    assert await drain() == 1
    assert await store.inner.stat(key) is not None
    await objects.abort(CALLER, run_id, "s", view.object_id)
    assert await drain() == 1
    assert await store.inner.stat(key) is None


async def test_a_put_that_runs_past_the_intents_deadline_is_cut_off(setup) -> None:
    objects, store, _, run_id = setup
    store.dying = False
    view, _ = await objects.prepare(CALLER, run_id, "s", request("k4", expires_in=1))
    with pytest.raises(errors.ObjectStateConflict, match="expired while its body was uploading"):
        await asyncio.wait_for(objects.upload(CALLER, run_id, "s", view.object_id, body()), 10)
    assert [k async for k in store.inner.keys(f"acme/{run_id}/")] == []
