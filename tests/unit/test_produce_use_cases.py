"""The Durable Streams write use cases on the memory adapters: `AppendRecords.produce` and
`CreateStream.create_resolved`, through the group commit, access checks and expiry as a native
request goes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from dependency_injector import providers

from application.access import Caller
from application.append_records import Produced
from application.errors import Forbidden, NotFound
from domain import errors
from domain.definition import (
    MAX_COMMAND_RECORDS,
    DefinitionRequest,
    StreamDefinition,
    resolve_definition,
)
from domain.producers import ProducerClaim
from domain.records import NewRecord, RecordKind
from entrypoints.config import Settings
from entrypoints.container import memory_container, start, stop

ALL = frozenset({"streams:read", "streams:write", "streams:admin"})
ALICE = Caller(tenant="acme", principal="alice", scopes=ALL)
BOB = Caller(tenant="acme", principal="bob", scopes=ALL)
EVE = Caller(tenant="evil", principal="eve", scopes=ALL)
READER = Caller(tenant="acme", principal="reader", scopes=frozenset({"streams:read"}))
FLUSH = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
async def app():
    clock = Clock()
    container = memory_container(
        Settings(access_flush_seconds=FLUSH, expiry_grace_seconds=2 * FLUSH)
    )
    container.clock.override(providers.Object(clock))
    services = await start(container)
    yield container, services, clock
    await stop(container)


def resolved(
    stream_id: str = "x", content_type: str | None = None, **fields: object
) -> StreamDefinition:
    request = msgspec.convert(
        {"direction": "output", "stream_id": stream_id, **fields}, DefinitionRequest
    )
    definition = resolve_definition(request, region="local", egress_region="local")
    return msgspec.structs.replace(definition, content_type=content_type)


def text(*chunks: bytes) -> list[NewRecord]:
    return [NewRecord(RecordKind.BINARY, "text/plain", c, len(c)) for c in chunks]


async def created(s, **fields: object) -> None:
    definition = resolved(**fields)
    await s.create_stream.create_resolved(ALICE, "r", definition)


async def test_produce_appends_and_answers_what_it_did(app) -> None:
    _, s, _ = app
    await created(s)
    p = ProducerClaim("writer-1", 0, 0)
    answer = await s.append_records.produce(ALICE, "r", "x", text(b"a", b"b"), producer=p)
    created_at = answer.created_at  # the stream's incarnation, which its offsets state
    assert created_at is not None
    expected = Produced(
        head=2,
        closed=False,
        duplicate=False,
        producer_epoch=0,
        producer_seq=0,
        created_at=created_at,
    )
    assert answer == expected
    again = await s.append_records.produce(ALICE, "r", "x", text(b"other"), producer=p)
    assert again == msgspec.structs.replace(expected, duplicate=True)
    closing = await s.append_records.produce(
        ALICE, "r", "x", text(b"end"), writer_seq="1", close=True
    )
    assert (closing.head, closing.closed, closing.duplicate) == (3, True, False)
    with pytest.raises(errors.StreamClosed) as refused:
        await s.append_records.produce(ALICE, "r", "x", text(b"late"))
    assert refused.value.extra == {"head": 3}
    close_only = await s.append_records.produce(ALICE, "r", "x", [], close=True)
    assert (close_only.closed, close_only.duplicate) == (True, True)
    document = await s.get_stream(ALICE, "r", "x")
    assert document.state.head == 3 and document.state.closed


async def test_produce_is_checked_like_a_native_append(app) -> None:
    _, s, _ = app
    await created(s, authorization={"writers": ["alice"]})
    produce = s.append_records.produce
    with pytest.raises(Forbidden):
        await produce(READER, "r", "x", text(b"a"))
    with pytest.raises(Forbidden):
        await produce(BOB, "r", "x", text(b"a"))
    with pytest.raises(NotFound):
        await produce(EVE, "r", "x", text(b"a"))
    with pytest.raises(NotFound):
        await produce(ALICE, "r", "nope", [], close=True)
    with pytest.raises(errors.InvalidInput):
        await produce(ALICE, "r", "x", [])  # nothing, and no close
    # The protocol's batches (1 MiB of messages) may carry more than a native append's 1,000
    # records, up to the most one decision takes.
    with pytest.raises(errors.RequestTooLarge):
        await produce(ALICE, "r", "x", text(*[b"a"] * (MAX_COMMAND_RECORDS + 1)))
    with pytest.raises(errors.RecordTooLarge):  # the caller splits bodies into inline records
        await produce(ALICE, "r", "x", text(b"a", b"x" * 65_537))
    with pytest.raises(errors.InvalidInput):  # a bad claim is 400 before the stream is looked up
        await produce(ALICE, "r", "nope", text(b"a"), producer=ProducerClaim("", 0, 0))
    with pytest.raises(errors.InvalidInput):
        await produce(ALICE, "r", "nope", text(b"a"), writer_seq="")
    assert (await s.get_stream(ALICE, "r", "x")).state.head == 0


async def test_a_blocked_produce_appends_once_a_consumer_acknowledges(app) -> None:
    _, s, _ = app
    limits = {"max_unread_items": 1, "unread_policy": "block", "block_timeout_seconds": 30}
    await created(s, limits=limits)
    await s.append_records.produce(ALICE, "r", "x", text(b"1"), producer=ProducerClaim("p", 0, 0))
    waiting = asyncio.ensure_future(
        s.append_records.produce(ALICE, "r", "x", text(b"2"), producer=ProducerClaim("p", 0, 1))
    )
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await s.acknowledge(BOB, "r", "x", "c", 1)
    answer = await asyncio.wait_for(waiting, 5)
    assert (answer.head, answer.producer_seq) == (2, 1)


async def test_a_blocked_produce_gives_up_with_backpressure_and_a_close_only_never_waits(
    app,
) -> None:
    _, s, _ = app
    limits = {"max_unread_items": 1, "unread_policy": "block", "block_timeout_seconds": 0.05}
    await created(s, limits=limits)
    await s.append_records.produce(ALICE, "r", "x", text(b"1"))
    with pytest.raises(errors.Backpressure):
        await s.append_records.produce(
            ALICE, "r", "x", text(b"2"), producer=ProducerClaim("p", 0, 0)
        )
    closed = await s.append_records.produce(ALICE, "r", "x", [], close=True)
    assert closed.closed and closed.head == 1


async def test_the_reject_policy_is_backpressure_at_once(app) -> None:
    _, s, _ = app
    await created(s, limits={"max_unread_items": 1})
    await s.append_records.produce(ALICE, "r", "x", text(b"1"))
    with pytest.raises(errors.Backpressure):
        await s.append_records.produce(ALICE, "r", "x", text(b"2"))


async def test_create_resolved_commits_initial_records_and_closure_with_the_stream(app) -> None:
    _, s, _ = app
    definition = resolved(content_type="text/plain")
    stream, was_created = await s.create_stream.create_resolved(
        ALICE, "r", definition, initial=text(b"hello ", b"world"), closed=True
    )
    assert was_created and stream.head == 2 and stream.state.closed
    assert stream.definition == definition
    page = await s.read_records(ALICE, "r", "x")
    assert [r.sequence for r in page.records] == [1, 2]
    again, created_again = await s.create_stream.create_resolved(
        ALICE, "r", definition, initial=text(b"more")
    )
    assert not created_again and again.head == 2  # answered as it is: the caller compares
    with pytest.raises(errors.DefinitionConflict):
        await s.create_stream.create_resolved(ALICE, "r", resolved(content_type="text/csv"))


async def test_create_resolved_with_nothing_is_a_plain_create(app) -> None:
    _, s, _ = app
    stream, was_created = await s.create_stream.create_resolved(ALICE, "r", resolved())
    assert was_created and stream.head == 0 and not stream.state.closed
    assert stream.state.version == 1


async def test_create_resolved_is_refused_whole_for_a_reader_or_a_writer_not_allowed(app) -> None:
    _, s, _ = app
    with pytest.raises(Forbidden):
        await s.create_stream.create_resolved(READER, "r", resolved(), closed=True)
    with pytest.raises(Forbidden):
        await s.create_stream.create_resolved(
            BOB, "r", resolved(authorization={"writers": ["alice"]}), initial=text(b"a")
        )
    with pytest.raises(NotFound):
        await s.get_stream(ALICE, "r", "x")


async def test_create_resolved_follows_the_expiry_rules(app) -> None:
    container, s, clock = app
    past = {"expires_at": (clock.now - timedelta(seconds=1)).isoformat()}
    with pytest.raises(errors.InvalidInput):
        await s.create_stream.create_resolved(ALICE, "r", resolved(expiry=past), closed=True)
    idle = resolved(expiry={"idle_seconds": 10})
    await s.create_stream.create_resolved(ALICE, "r", idle, initial=text(b"old"))
    key = ALICE.key("r", "x")
    assert container.access_log().known(key) == clock.now  # the creation is its first access
    clock.advance(10 + 2 * FLUSH + 1)  # expired, not erased yet
    stream, was_created = await s.create_stream.create_resolved(
        ALICE, "r", idle, initial=text(b"new"), closed=True
    )
    assert was_created and stream.head == 1 and stream.state.closed
    _, records = await container.streams().page(key, 0, 10)
    assert [r.payload for r in records] == [b"new"]


async def test_a_body_of_another_content_type_is_decided_by_the_stream_under_its_lock(app) -> None:
    """The stream, not the protocol module, decides a body that is not of its content type: a
    conflict with its definition while open, its closure (with its head) once closed."""
    _, s, _ = app
    await created(s, content_type="text/plain")
    use_case = s.append_records
    key = use_case.writing(ALICE, "r", "x")
    definition = await use_case.writable(ALICE, key)
    with pytest.raises(errors.DefinitionConflict):
        await use_case.produce_checked(
            ALICE, key, definition, [], content_conflict="not text/plain"
        )
    await use_case.produce(ALICE, "r", "x", text(b"a"), close=True)
    with pytest.raises(errors.StreamClosed) as closed:
        await use_case.produce_checked(
            ALICE, key, definition, [], content_conflict="not text/plain"
        )
    assert closed.value.extra == {"head": 1}
    document = await s.get_stream(ALICE, "r", "x")
    assert document.state.head == 1  # neither appended anything


async def test_appends_waiting_for_credit_take_live_connection_slots() -> None:
    """A blocked append holds its connection open as a waiting read does: past the principal's
    cap, the next one is refused (429) instead of waiting, and a slot comes back when a wait
    ends. 16,600 of them once held every connection the server accepts."""
    from application.subscribe import TooManySubscriptions

    container = memory_container(Settings(max_subscriptions_per_principal=2))
    s = await start(container)
    try:
        limits = {"max_unread_items": 1, "unread_policy": "block", "block_timeout_seconds": 30}
        await created(s, limits=limits)
        await s.append_records.produce(ALICE, "r", "x", text(b"1"))
        waiting = [
            asyncio.ensure_future(s.append_records.produce(ALICE, "r", "x", text(b"w")))
            for _ in range(2)
        ]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiting)
        with pytest.raises(TooManySubscriptions):
            await s.append_records.produce(ALICE, "r", "x", text(b"3"))
        other = asyncio.ensure_future(s.append_records.produce(BOB, "r", "x", text(b"b")))
        await asyncio.sleep(0.05)
        assert not other.done()  # another principal still waits its turn
        for _ in range(3):
            await s.acknowledge(
                BOB, "r", "x", "c", (await s.get_stream(ALICE, "r", "x")).state.head
            )
            await asyncio.sleep(0.05)
        await asyncio.wait_for(asyncio.gather(*waiting, other), 5)
        # Their slots came back: an append may wait again.
        again = asyncio.ensure_future(s.append_records.produce(ALICE, "r", "x", text(b"4")))
        await asyncio.sleep(0.05)
        assert not again.done()
        again.cancel()
    finally:
        await stop(container)


async def test_a_native_append_over_a_mebibyte_is_prepared_off_the_event_loop(
    app, monkeypatch
) -> None:
    """Its records are checked in a thread (7.7 MB of numbers held the loop 0.65 s before);
    a small one on the loop, as before. Both append the same way."""
    import application.append_records as module
    from domain.records import RecordInput

    _, s, _ = app
    await created(s)
    threaded: list[object] = []
    to_thread = asyncio.to_thread

    async def spy(function, *args, **kwargs):
        threaded.append(function)
        return await to_thread(function, *args, **kwargs)

    monkeypatch.setattr(module.asyncio, "to_thread", spy)
    big = msgspec.Raw(b"[" + b",".join([b"1.5"] * 16_000) + b"]")
    answer, _ = await s.append_records(ALICE, "r", "x", [RecordInput(data=big)] * 20)
    assert (answer.first_sequence, answer.last_sequence) == (1, 20) and len(threaded) == 1
    answer, _ = await s.append_records(ALICE, "r", "x", [RecordInput(data=msgspec.Raw(b"1"))])
    assert answer.last_sequence == 21 and len(threaded) == 1
