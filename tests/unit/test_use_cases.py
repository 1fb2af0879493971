"""The use cases on the memory adapters: no database, no network."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from application.access import Caller
from application.errors import Forbidden, NotFound, Unauthenticated
from application.subscribe import TooManySubscriptions
from application.tokens import token_hash
from domain import errors
from domain.definition import DefinitionRequest
from domain.records import RecordInput
from entrypoints.config import Settings
from entrypoints.container import memory_container, start, stop

ALL = frozenset({"streams:read", "streams:write", "streams:admin"})
ALICE = Caller(tenant="acme", principal="alice", scopes=ALL)
BOB = Caller(tenant="acme", principal="bob", scopes=ALL)
EVE = Caller(tenant="evil", principal="eve", scopes=ALL)
READER = Caller(tenant="acme", principal="reader", scopes=frozenset({"streams:read"}))


@pytest.fixture
async def app():
    container = memory_container()
    services = await start(container)
    yield container, services
    await stop(container)


def request(body: bytes) -> DefinitionRequest:
    return msgspec.json.decode(body, type=DefinitionRequest)


def data(*values: object) -> list[RecordInput]:
    return [RecordInput(data=msgspec.Raw(msgspec.json.encode(v))) for v in values]


async def test_what_is_appended_is_read_back_after_the_cursor(app) -> None:
    _, s = app
    await s.create_stream(ALICE, "r", request(b'{"direction":"output","stream_id":"x"}'))
    answer, replayed = await s.append_records(ALICE, "r", "x", data(1, 2, 3))
    assert (answer.first_sequence, answer.last_sequence, replayed) == (1, 3, False)
    page = await s.read_records(ALICE, "r", "x", cursor=1)
    assert [bytes(r.data) for r in page.records] == [b"2", b"3"]
    assert page.next_cursor == 3


async def test_another_tenant_finds_nothing(app) -> None:
    _, s = app
    await s.create_stream(ALICE, "r", request(b'{"direction":"output","stream_id":"x"}'))
    for call in (
        s.get_stream(EVE, "r", "x"),
        s.read_records(EVE, "r", "x"),
        s.append_records(EVE, "r", "x", data(1)),
        s.list_streams(EVE, "r"),
    ):
        with pytest.raises(NotFound):
            await call


async def test_scopes_and_pinned_authorization_are_enforced(app) -> None:
    _, s = app
    body = b'{"direction":"output","stream_id":"x","authorization":{"writers":["alice"]}}'
    await s.create_stream(ALICE, "r", request(body))
    with pytest.raises(Forbidden):
        await s.append_records(READER, "r", "x", data(1))
    with pytest.raises(Forbidden):
        await s.append_records(BOB, "r", "x", data(1))
    with pytest.raises(Forbidden):
        await s.set_legal_hold(READER, "r", "x", True, None)
    await s.append_records(ALICE, "r", "x", data(1))


async def test_a_cursor_ahead_of_the_head_is_invalid_never_a_reset(app) -> None:
    _, s = app
    await s.create_stream(ALICE, "r", request(b'{"direction":"output","stream_id":"x"}'))
    with pytest.raises(errors.CursorAheadOfHead):
        await s.read_records(ALICE, "r", "x", cursor=1)


async def test_a_cursor_behind_retention_is_gone_with_the_410_fields(app) -> None:
    container, s = app
    await s.create_stream(ALICE, "r", request(b'{"direction":"output","stream_id":"x"}'))
    await s.append_records(ALICE, "r", "x", data(1, 2, 3, 4))
    streams = container.streams()
    key = ALICE.key("r", "x")
    stream = await streams.load(key)
    for event in stream.prune(2, 2, "retention", stream.state.created_at):
        stream.apply(event)

    class Prune:
        idempotency = None
        records = ()
        offset_of = None
        producer = None

        def decide(self, st, offset):
            return st.prune(2, 2, "retention", st.state.created_at)

        def answer(self, st, events):
            return None

    await streams.update(key, [Prune()])
    with pytest.raises(errors.CursorExpired) as gone:
        await s.read_records(ALICE, "r", "x", cursor=0)
    assert gone.value.extra == {"requested": 1, "earliest": 3, "latest": 4, "reason": "retention"}
    page = await s.read_records(ALICE, "r", "x", cursor=2)
    assert [bytes(r.data) for r in page.records] == [b"3", b"4"]


async def test_a_long_poll_returns_as_soon_as_a_record_arrives(app) -> None:
    _, s = app
    await s.create_stream(ALICE, "r", request(b'{"direction":"output","stream_id":"x"}'))
    reader = asyncio.ensure_future(s.read_records(ALICE, "r", "x", cursor=0, wait=30))
    await asyncio.sleep(0.01)
    assert not reader.done()
    await s.append_records(ALICE, "r", "x", data("hi"))
    page = await asyncio.wait_for(reader, 5)
    assert [bytes(r.data) for r in page.records] == [b'"hi"']


async def test_a_blocked_producer_appends_once_a_consumer_acknowledges(app) -> None:
    _, s = app
    body = (
        b'{"direction":"output","stream_id":"x",'
        b'"limits":{"max_unread_items":1,"unread_policy":"block","block_timeout_seconds":30}}'
    )
    await s.create_stream(ALICE, "r", request(body))
    await s.append_records(ALICE, "r", "x", data(1))
    producer = asyncio.ensure_future(s.append_records(ALICE, "r", "x", data(2)))
    await asyncio.sleep(0.05)
    assert not producer.done()
    await s.acknowledge(BOB, "r", "x", "c", 1)
    answer, _ = await asyncio.wait_for(producer, 5)
    assert answer.first_sequence == 2


async def test_a_blocked_producer_gives_up_with_backpressure_after_its_timeout(app) -> None:
    _, s = app
    body = (
        b'{"direction":"output","stream_id":"x",'
        b'"limits":{"max_unread_items":1,"unread_policy":"block","block_timeout_seconds":0.05}}'
    )
    await s.create_stream(ALICE, "r", request(body))
    await s.append_records(ALICE, "r", "x", data(1))
    with pytest.raises(errors.Backpressure):
        await s.append_records(ALICE, "r", "x", data(2))


async def test_tokens_are_found_by_hash_and_unknown_ones_are_refused(app) -> None:
    container, s = app
    await container.tokens().put(token_hash("secret"), ALICE)
    caller = await s.authenticate("Bearer secret")
    assert (caller.tenant, caller.principal, caller.scopes) == (
        ALICE.tenant,
        ALICE.principal,
        ALICE.scopes,
    )
    for header in (None, "", "Bearer", "Basic secret", "Bearer nope"):
        with pytest.raises(Unauthenticated):
            await s.authenticate(header)


async def test_a_stopping_process_ends_its_subscriptions_and_refuses_new_ones(app) -> None:
    _, s = app
    await s.create_stream(ALICE, "r", request(b'{"direction":"output","stream_id":"x"}'))
    await s.append_records(ALICE, "r", "x", data(1, 2))
    subscription = await s.subscribe(ALICE, "r", "x", 0)
    first = await anext(subscription)
    assert [r.sequence for r in first.records] == [1, 2]
    s.subscribe.end_all()
    async with asyncio.timeout(5):
        rest = [d async for d in subscription]
    assert rest == []  # ended, without a `closed`: the stream is still open
    with pytest.raises(errors.Backpressure) as refused:
        await s.subscribe(ALICE, "r", "x", 0)
    assert refused.value.code == "unavailable"
    assert refused.value.retry_after >= 1


async def test_checking_a_subscription_takes_no_slot_but_is_refused_at_the_cap() -> None:
    container = memory_container(Settings(max_subscriptions_per_principal=1))
    s = await start(container)
    try:
        await s.create_stream(ALICE, "r", request(b'{"direction":"output","stream_id":"x"}'))
        slots = container.live_slots()
        for _ in range(3):
            await s.subscribe.check(ALICE, "r", "x", 0)
        assert slots.count() == 0
        with pytest.raises(errors.CursorAheadOfHead):
            await s.subscribe.check(ALICE, "r", "x", 5)  # ahead of the head, as subscribe says
        subscription = await s.subscribe(ALICE, "r", "x", 0)
        assert slots.count() == 1
        with pytest.raises(TooManySubscriptions):
            await s.subscribe.check(ALICE, "r", "x", 0)
        await subscription.aclose()
        await s.subscribe.check(ALICE, "r", "x", 0)
    finally:
        await stop(container)


async def test_a_stream_page_passes_over_a_bounded_number_of_unreadable_streams(app) -> None:
    from application.list_streams import MAX_BATCHES

    _, s = app
    hidden = b',"authorization":{"readers":["alice"]}'
    for n in range(MAX_BATCHES * 2 + 1):  # limit 1: a batch is two streams, the last one seen
        body = b'{"direction":"output","stream_id":"s-%03d"%s}' % (n, hidden if n else b"")
        await s.create_stream(ALICE, "r", request(body))
    first = await s.list_streams(BOB, "r", None, 1)
    assert [d.stream_id for d in first.streams] == ["s-000"] and first.next_after == "s-000"
    # Nothing bob may read in the next MAX_BATCHES batches: a short page, and where it stopped.
    passed = await s.list_streams(BOB, "r", "s-000", 1)
    assert passed.streams == [] and passed.next_after == f"s-{MAX_BATCHES:03d}"
    rest = await s.list_streams(BOB, "r", passed.next_after, 1)
    assert rest.streams == [] and rest.next_after is None
    everything = await s.list_streams(ALICE, "r", None, 1000)
    assert len(everything.streams) == MAX_BATCHES * 2 + 1 and everything.next_after is None
    with pytest.raises(errors.InvalidInput):
        await s.list_streams(ALICE, "r", None, 1001)


async def test_a_stream_page_stops_at_its_bytes_and_says_where(
    app, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page reads at most PAGE_BYTES of stored definitions and states (past its first stream):
    shorter than its limit then, with `next_after` where it stopped; paging on lists every
    stream once, in order."""
    from application import list_streams

    _, s = app
    ids = [f"s-{n:02d}" for n in range(12)]
    for stream_id in ids:
        body = b'{"direction":"output","stream_id":"%s"}' % stream_id.encode()
        await s.create_stream(ALICE, "r", request(body))
    whole = await s.list_streams(ALICE, "r", None, 1000)
    assert [d.stream_id for d in whole.streams] == ids and whole.next_after is None
    monkeypatch.setattr(list_streams, "PAGE_BYTES", 1)  # one stream a page, the first always
    seen, after, pages = [], None, 0
    while True:
        page = await s.list_streams(ALICE, "r", after, 1000)
        pages += 1
        seen += [d.stream_id for d in page.streams]
        if page.next_after is None:
            break
        assert len(page.streams) == 1 and page.next_after == page.streams[-1].stream_id
        after = page.next_after
    assert seen == ids and pages == len(ids)
    # After the last stream: nothing, and the run still there (read within the bytes too).
    past = await s.list_streams(ALICE, "r", "s-99", 1000)
    assert past.streams == [] and past.next_after is None


async def test_waiting_reads_of_both_surfaces_and_subscriptions_share_one_cap() -> None:
    container = memory_container(Settings(max_subscriptions_per_principal=3))
    s = await start(container)
    try:
        await s.create_stream(ALICE, "r", request(b'{"direction":"output","stream_id":"x"}'))
        await s.append_records(ALICE, "r", "x", data(1))
        slots = container.live_slots()
        # A read answered at once takes no slot, even with a wait.
        assert len((await s.read_records(ALICE, "r", "x", 0, wait=5)).records) == 1
        assert slots.count() == 0
        subscription = await s.subscribe(ALICE, "r", "x", 0)
        native = asyncio.create_task(s.read_records(ALICE, "r", "x", 1, wait=30))
        key, definition = await s.durable_reads.open(ALICE, "r", "x")
        protocol = asyncio.create_task(
            s.durable_reads.wait(key, 1, 30, caller=ALICE, definition=definition)
        )
        async with asyncio.timeout(5):
            while slots.count() < 3:
                await asyncio.sleep(0.01)
        with pytest.raises(TooManySubscriptions):
            await s.read_records(ALICE, "r", "x", 1, wait=30)
        with pytest.raises(TooManySubscriptions):
            await s.durable_reads.wait(key, 1, 30, caller=ALICE, definition=definition)
        with pytest.raises(TooManySubscriptions):
            s.durable_reads.hold_live(ALICE)
        with pytest.raises(TooManySubscriptions):
            await s.subscribe(ALICE, "r", "x", 0)
        other = s.durable_reads.hold_live(BOB)  # another principal has a cap of its own
        s.durable_reads.release_live(BOB, other)

        await s.append_records(ALICE, "r", "x", data(2))
        async with asyncio.timeout(5):
            assert len((await native).records) == 1
            assert len((await protocol).records) == 1
        await subscription.aclose()
        assert slots.count() == 0
        # A wait that times out, and one cancelled (its client left), give their slots back.
        assert (await s.read_records(ALICE, "r", "x", 2, wait=0.05)).records == []
        waited = await s.durable_reads.wait(key, 2, 0.05, caller=ALICE, definition=definition)
        assert waited.records == []
        cancelled = asyncio.create_task(s.read_records(ALICE, "r", "x", 2, wait=30))
        async with asyncio.timeout(5):
            while slots.count() < 1:
                await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert slots.count() == 0
    finally:
        await stop(container)
