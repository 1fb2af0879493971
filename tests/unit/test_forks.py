"""`Forks.resolve` and the native use cases on forks and soft-deleted sources (memory)."""

from __future__ import annotations

import asyncio
import base64

import msgspec
import pytest

from application import live
from application.access import Caller
from application.errors import NotFound
from application.forks import Forks
from application.views import record_view
from domain import errors
from domain.definition import DefinitionRequest, Expiry
from domain.objects import ObjectRequest
from domain.records import RecordInput, RecordKind
from domain.stream import StreamKey
from entrypoints.container import memory_container, start, stop
from tests.support.builders import definition

ALL = frozenset({"streams:read", "streams:write", "streams:admin"})
ALICE = Caller(tenant="acme", principal="alice", scopes=ALL)
EVE = Caller(tenant="evil", principal="eve", scopes=ALL)


@pytest.fixture
async def app():
    container = memory_container()
    services = await start(container)
    forks = Forks(container.definitions(), container.streams(), container.streams())
    yield container, services, forks
    await stop(container)


def native(stream_id: str) -> DefinitionRequest:
    return DefinitionRequest(direction="output", stream_id=stream_id)


def data(*values: object) -> list[RecordInput]:
    return [RecordInput(data=msgspec.Raw(msgspec.json.encode(v))) for v in values]


def raw(*chunks: bytes) -> list[RecordInput]:
    return [RecordInput(data_base64=base64.b64encode(c).decode()) for c in chunks]


async def make(
    container, stream_id: str, *, content_type=None, fork=None, expiry=None
) -> StreamKey:
    """A stream as the protocol surface creates one: with its content type, or a fork."""
    key = ALICE.key("r", stream_id)
    changed = msgspec.structs.replace(
        definition(stream_id), content_type=content_type, fork=fork, expiry=expiry or Expiry()
    )
    _, created = await container.streams().create(key, changed, container.clock()())
    assert created
    return key


async def test_a_json_fork_inherits_whole_records_and_reads_stitched(app) -> None:
    container, s, forks = app
    await s.create_stream(ALICE, "r", native("src"))
    await s.append_records(ALICE, "r", "src", data(1, 2, 3, 4))
    fork, records, content_type = await forks.resolve(ALICE, "r", "src", 1, 2, None)
    assert (fork.through, fork.offset, fork.sub_offset, records) == (3, 1, 2, [])
    assert content_type == "application/json"  # a native stream reads as JSON
    key = await make(container, "f", fork=fork)
    await s.append_records(ALICE, "r", "f", data(30))
    await s.append_records(ALICE, "r", "src", data(5))  # after the fork: never in it
    page = await s.read_records(ALICE, "r", "f", cursor=0)
    assert [bytes(r.data) for r in page.records] == [b"1", b"2", b"3", b"30"]
    assert [r.sequence for r in page.records] == [1, 2, 3, 4]
    assert (page.head, page.earliest) == (4, 1)
    assert (await s.get_stream(ALICE, "r", "f")).state.head == 4
    assert key == StreamKey("acme", "r", "f")


async def test_the_fork_point_defaults_to_the_head(app) -> None:
    _, s, forks = app
    await s.create_stream(ALICE, "r", native("src"))
    await s.append_records(ALICE, "r", "src", data(1, 2))
    fork, _, _ = await forks.resolve(ALICE, "r", "src", None, 0, "application/json")
    assert (fork.through, fork.offset) == (2, None)


async def test_a_binary_sub_offset_copies_the_partial_record(app) -> None:
    container, s, forks = app
    await make(container, "bin", content_type="text/plain")
    await s.append_records(ALICE, "r", "bin", raw(b"first", b"second"))
    fork, [partial], content_type = await forks.resolve(ALICE, "r", "bin", 1, 3, None)
    assert (fork.through, content_type) == (1, "text/plain")
    assert (partial.kind, partial.payload, partial.size) == (RecordKind.BINARY, b"sec", 3)
    whole, none, _ = await forks.resolve(ALICE, "r", "bin", 0, 11, "text/plain")
    assert (whole.through, none) == (2, [])
    key = await make(container, "f", content_type="text/plain", fork=fork)
    await s.append_records(ALICE, "r", "f", raw(partial.payload))
    page = await s.read_records(ALICE, "r", key.stream_id)
    assert [base64.b64decode(r.data_base64) for r in page.records] == [b"first", b"sec"]


@pytest.mark.parametrize(
    ("offset", "sub_offset"),
    [(5, 0), (-1, 0), (None, 1), (0, -1), (2, 1), (0, 3)],
)
async def test_a_fork_point_past_the_source_is_invalid_input(app, offset, sub_offset) -> None:
    _, s, forks = app
    await s.create_stream(ALICE, "r", native("src"))
    await s.append_records(ALICE, "r", "src", data(1, 2))
    with pytest.raises(errors.InvalidInput):
        await forks.resolve(ALICE, "r", "src", offset, sub_offset, None)


async def test_binary_sub_offset_overshoot_and_empty_source_are_invalid(app) -> None:
    container, s, forks = app
    await make(container, "bin", content_type="text/plain")
    with pytest.raises(errors.InvalidInput):
        await forks.resolve(ALICE, "r", "bin", 0, 1, None)
    await s.append_records(ALICE, "r", "bin", raw(b"hi"))
    with pytest.raises(errors.InvalidInput):
        await forks.resolve(ALICE, "r", "bin", 0, 5, None)


async def test_missing_source_mismatched_type_and_other_tenant(app) -> None:
    container, _, forks = app
    with pytest.raises(NotFound):
        await forks.resolve(ALICE, "r", "nothing", None, 0, None)
    await make(container, "bin", content_type="text/plain")
    with pytest.raises(errors.DefinitionConflict):
        await forks.resolve(ALICE, "r", "bin", None, 0, "application/json")
    await forks.resolve(ALICE, "r", "bin", None, 0, "Text/Plain; charset=utf-8")
    with pytest.raises(NotFound):
        await forks.resolve(EVE, "r", "bin", None, 0, None)


async def test_a_soft_deleted_source_is_gone_for_every_direct_operation(app) -> None:
    container, s, forks = app
    await s.create_stream(ALICE, "r", native("src"))
    await s.append_records(ALICE, "r", "src", data(1, 2), "key")
    prepared = msgspec.convert(
        {"idempotency_key": "o", "size": 1, "sha256": "0" * 64, "content_type": "text/plain"},
        ObjectRequest,
    )
    await s.objects.prepare(ALICE, "r", "src", prepared)
    fork, _, _ = await forks.resolve(ALICE, "r", "src", 2, 0, None)
    await make(container, "f", fork=fork)
    await s.delete_stream(ALICE, "r", "src")
    for call in (
        s.read_records(ALICE, "r", "src"),
        # the retry of an append it stored too (its receipt is kept until it is erased)
        s.append_records(ALICE, "r", "src", data(1, 2), "key"),
        s.append_records(ALICE, "r", "src", data(9), "key"),
        # and of an object's prepare
        s.objects.prepare(ALICE, "r", "src", prepared),
        s.read_records(ALICE, "r", "src", wait=1),
        s.get_stream(ALICE, "r", "src"),
        s.append_records(ALICE, "r", "src", data(3)),
        s.acknowledge(ALICE, "r", "src", "c", 1),
        s.close_stream(ALICE, "r", "src"),
        s.set_legal_hold(ALICE, "r", "src", True, "case"),
        s.delete_stream(ALICE, "r", "src"),
        s.subscribe(ALICE, "r", "src", 0),
    ):
        with pytest.raises(errors.StreamGone):
            await call
    with pytest.raises(errors.DefinitionConflict):
        await s.create_stream(ALICE, "r", native("src"))
    with pytest.raises(errors.DefinitionConflict):
        await forks.resolve(ALICE, "r", "src", None, 0, None)
    assert [d.stream_id for d in (await s.list_streams(ALICE, "r")).streams] == ["f"]
    page = await s.read_records(ALICE, "r", "f")
    assert [bytes(r.data) for r in page.records] == [b"1", b"2"]
    await s.delete_stream(ALICE, "r", "f")  # the last fork: the source goes with it
    with pytest.raises(NotFound):
        await s.read_records(ALICE, "r", "src")
    await s.create_stream(ALICE, "r", native("src"))
    assert (await s.get_stream(ALICE, "r", "src")).state.head == 0


async def test_live_readers_of_a_source_end_when_it_is_soft_deleted(app) -> None:
    container, s, forks = app
    await s.create_stream(ALICE, "r", native("src"))
    await s.append_records(ALICE, "r", "src", data(1))
    fork, _, _ = await forks.resolve(ALICE, "r", "src", None, 0, None)
    await make(container, "f", fork=fork)
    subscription = await s.subscribe(ALICE, "r", "src", 0)
    first = await anext(subscription)
    assert [r.sequence for r in first.records] == [1]
    waiting = asyncio.create_task(s.read_records(ALICE, "r", "src", cursor=1, wait=10))
    await asyncio.sleep(0.05)
    await s.delete_stream(ALICE, "r", "src")
    async with asyncio.timeout(5):
        rest = [d async for d in subscription]
        with pytest.raises(errors.StreamGone):
            await waiting
    assert rest == [live.StreamGone()]
    # The fork's own subscription follows it, not its source.
    follower = await s.subscribe(ALICE, "r", "f", 0)
    delivered = await anext(follower)
    assert [bytes(r.data) for r in map(record_view, delivered.records)] == [b"1"]
    await follower.aclose()


async def test_a_fork_inherits_its_sources_expiry_unless_it_sets_its_own(app) -> None:
    container, s, forks = app
    idle = Expiry(idle_seconds=3600)
    await make(container, "ttl", expiry=idle)
    assert await forks.inherited_expiry(ALICE, "r", "ttl", Expiry()) == idle
    own = Expiry(idle_seconds=60)
    assert await forks.inherited_expiry(ALICE, "r", "ttl", own) == own
    await s.create_stream(ALICE, "r", native("forever"))
    assert await forks.inherited_expiry(ALICE, "r", "forever", Expiry()) == Expiry()
