"""Deleting streams and runs, and listing runs, through the use cases on the memory adapters."""

from __future__ import annotations

import pytest

from adapters.memory.access import MemoryStreamAccess
from adapters.memory.streams import MemoryStreams
from adapters.objects.memory import MemoryObjectStore
from application.access import Caller
from application.definitions import Definitions
from application.delete_stream import DeleteRun, DeleteStream
from application.deletions import DeleteBodies
from application.errors import Forbidden, NotFound
from application.expiry import AccessLog
from application.group_commit import GroupCommit
from application.list_runs import ListRuns
from application.objects import ObjectStores
from application.placement import Deployment, Misdirected
from application.set_legal_hold import LegalHoldCommand
from application.workers import Job
from domain import errors
from domain.definition import DefinitionRequest, resolve_definition
from tests.support.builders import NOW, WRITER, append, definition, new_key

READER = Caller(tenant="t1", principal="reader", scopes=frozenset({"streams:read"}))


@pytest.fixture
def streams() -> MemoryStreams:
    return MemoryStreams()


def use_cases(streams: MemoryStreams) -> tuple[DeleteStream, DeleteRun]:
    access = AccessLog(MemoryStreamAccess(streams), lambda: NOW)
    definitions = Definitions(streams, Deployment("local", "local"), access)
    return (
        DeleteStream(definitions, GroupCommit(streams), lambda: NOW),
        DeleteRun(streams, definitions, lambda: NOW),
    )


async def test_deleting_needs_the_admin_scope_and_the_callers_tenant(streams) -> None:
    delete_stream, delete_run = use_cases(streams)
    key = new_key()
    await streams.create(key, definition(), NOW)
    with pytest.raises(Forbidden):
        await delete_stream(READER, key.run_id, key.stream_id)
    with pytest.raises(Forbidden):
        await delete_run(READER, key.run_id)
    outsider = Caller(tenant="t2", principal="x", scopes=WRITER.scopes)
    with pytest.raises(NotFound):
        await delete_stream(outsider, key.run_id, key.stream_id)
    with pytest.raises(NotFound):
        await delete_run(outsider, key.run_id)
    with pytest.raises(errors.InvalidInput):
        await delete_run(WRITER, "bad id")
    assert await streams.load(key) is not None
    await delete_stream(WRITER, key.run_id, key.stream_id)
    assert await streams.load(key) is None
    with pytest.raises(NotFound):
        await delete_stream(WRITER, key.run_id, key.stream_id)
    with pytest.raises(NotFound):
        await delete_run(WRITER, key.run_id)


async def test_a_run_with_a_stream_homed_elsewhere_is_not_deleted_at_all(streams) -> None:
    _, delete_run = use_cases(streams)
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [append()])
    elsewhere = resolve_definition(
        DefinitionRequest(direction="output", stream_id="far"), region="eu", egress_region="eu"
    )
    await streams.create(key._replace(stream_id="far"), elsewhere, NOW)
    with pytest.raises(Misdirected):
        await delete_run(WRITER, key.run_id)
    assert len(await streams.list_run(key.tenant, key.run_id)) == 2


async def test_runs_are_listed_with_next_after_only_when_more_follow(streams) -> None:
    list_runs = ListRuns(streams)
    for run_id in ("a", "b", "c"):
        await streams.create(new_key()._replace(run_id=run_id), definition(), NOW)
    await streams.create(new_key("t2")._replace(run_id="a0"), definition(), NOW)
    page = await list_runs(READER, limit=2)
    assert [r.run_id for r in page.runs] == ["a", "b"] and page.next_after == "b"
    page = await list_runs(READER, after="b", limit=2)
    assert [r.run_id for r in page.runs] == ["c"] and page.next_after is None
    page = await list_runs(READER, limit=3)
    assert len(page.runs) == 3 and page.next_after is None
    for limit in (0, 1001):
        with pytest.raises(errors.InvalidInput):
            await list_runs(READER, limit=limit)
    with pytest.raises(errors.InvalidInput):
        await list_runs(READER, after="no such/id")
    page = await list_runs(READER, prefix="b")
    assert [r.run_id for r in page.runs] == ["b"] and page.next_after is None
    page = await list_runs(READER, prefix="a", limit=1)  # not t2's a0
    assert [r.run_id for r in page.runs] == ["a"] and page.next_after is None
    with pytest.raises(errors.InvalidInput):
        await list_runs(READER, prefix="no such/prefix")
    with pytest.raises(Forbidden):
        await list_runs(Caller(tenant="t1", principal="w", scopes=frozenset()), limit=2)


async def test_an_erased_streams_bodies_do_not_wait_for_a_hold_on_its_successor(streams) -> None:
    store = MemoryObjectStore()

    async def one_chunk():
        yield b"body"

    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [LegalHoldCommand(True, "the new stream's case", NOW)])
    delete = DeleteBodies(
        streams, ObjectStores({"local": store}), streams, lambda: NOW, hold_recheck_seconds=7
    )
    for name, reason, waits in (("a", "aborted", True), ("b", "stream-deleted", False)):
        await store.put(name, one_chunk(), max_size=10)
        job = Job(key, 0, 1, storage_region="local", storage_key=name, reason=reason)
        assert await delete.run_job(job) == (7 if waits else None)
        assert (await store.stat(name) is not None) == waits
