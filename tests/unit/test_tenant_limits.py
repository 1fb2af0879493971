"""A tenant's limits (application/tenant_limits.py) on the memory adapters. On the streams it
holds: the count read at most once a second, this process's creations added, a stream already
there answered at the limit, and 0 meaning none. On its records' bytes: decided with each
append under the row lock, after a retry of what was stored is recognized, across a group's
commands, on every way records come in."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from dependency_injector import providers

from adapters.memory.streams import MemoryStreams
from application.access import Caller
from application.append_records import AppendCommand
from application.deciding import decide_all, stored_bytes
from application.errors import Forbidden
from application.group_commit import claimed_bytes
from application.ports import Done, Failed, Idempotency, Replayed
from application.tenant_limits import ByteLimit, StreamLimit, TenantRoom, UsageView
from application.tokens import TokenRequest
from domain import errors
from domain.definition import DefinitionRequest, resolve_definition
from domain.objects import (
    AuthorizationReceipt,
    ObjectIntent,
    ObjectRequest,
    object_record,
    pledged_bytes,
)
from domain.producers import ProducerClaim
from domain.records import (
    RECEIPT_BYTES,
    ROW_BYTES,
    NewRecord,
    RecordInput,
    RecordKind,
    fingerprint,
)
from domain.stream import Stream, StreamKey
from entrypoints.config import Settings
from entrypoints.container import memory_container, start, stop

ALL = frozenset({"streams:read", "streams:write", "streams:admin"})
ALICE = Caller(tenant="acme", principal="alice", scopes=ALL)
BOB = Caller(tenant="other", principal="bob", scopes=ALL)
NOW = datetime(2026, 12, 7, tzinfo=UTC)


class Counts:
    """Counts a test sets, and how often they were read."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.reads = 0

    async def tenant_streams(self, tenant: str) -> int:
        self.reads += 1
        return self.count.get(tenant, 0)

    tenant_bytes = tenant_streams


class Ticks:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def request(stream_id: str) -> DefinitionRequest:
    return msgspec.convert({"stream_id": stream_id, "direction": "output"}, DefinitionRequest)


async def test_the_count_is_read_at_most_once_a_second_with_this_process_creations_added() -> None:
    counts, ticks = Counts(), Ticks()
    limit = StreamLimit(counts, 3, clock=ticks)
    counts.count["a"] = 1
    assert not await limit.reached("a")
    limit.created("a")
    assert not await limit.reached("a")
    limit.created("a")
    # 1 read + 2 created here: the limit, without reading again.
    assert await limit.reached("a")
    assert counts.reads == 1
    # Another process deleted streams meanwhile: seen once the count is a second old.
    counts.count["a"] = 0
    ticks.now += 0.99
    assert await limit.reached("a")
    ticks.now += 0.01
    assert not await limit.reached("a")
    assert counts.reads == 2


async def test_no_limit_reads_nothing() -> None:
    counts = Counts()
    limit = StreamLimit(counts, 0)
    counts.count["a"] = 10**9
    assert not await limit.reached("a")
    assert counts.reads == 0


async def test_the_counts_kept_are_bounded() -> None:
    counts, ticks = Counts(), Ticks()
    limit = StreamLimit(counts, 3, clock=ticks, max_tenants=2)
    for tenant in ("a", "b", "c"):
        await limit.reached(tenant)
    await limit.reached("a")  # forgotten: read again
    assert counts.reads == 4


@pytest.fixture
async def services():
    container = memory_container(Settings(max_streams_per_tenant=2))
    services = await start(container)
    yield container, services
    await stop(container)


async def test_past_the_limit_a_new_stream_is_refused_and_one_already_there_answered(
    services,
) -> None:
    container, services = services
    create = services.create_stream
    assert (await create(ALICE, "r", request("s1")))[1]
    assert (await create(ALICE, "r", request("s2")))[1]
    with pytest.raises(errors.QuotaExhausted) as refused:
        await create(ALICE, "r", request("s3"))
    assert refused.value.extra == {"limit": 2}
    streams = container.streams()
    assert isinstance(streams, MemoryStreams)
    assert await streams.tenant_streams("acme") == 2
    # Its creation repeated is answered as it is; a conflicting one is still a conflict.
    document, created = await create(ALICE, "r", request("s1"))
    assert not created and document.stream_id == "s1"
    with pytest.raises(errors.DefinitionConflict):
        await create(
            ALICE,
            "r",
            msgspec.convert(
                {"stream_id": "s1", "direction": "input", "schema": {}}, DefinitionRequest
            ),
        )
    # Another tenant's limit is its own.
    assert (await create(BOB, "r", request("s1")))[1]


async def test_requests_in_flight_count_against_each_other_and_outcomes_settle() -> None:
    """Each request's room leaves out what the requests before it in this process may store
    (reserved) and what they stored; the count is read at most once a second."""
    counts, ticks = Counts(), Ticks()
    limit = ByteLimit(counts, 100, clock=ticks)
    counts.count["a"] = 40
    first = await limit.reserve("a", 30)
    second = await limit.reserve("a", 20)
    assert (first, second) == (TenantRoom(40, 100), TenantRoom(70, 100))
    limit.release("a", 30, 30)  # stored what it reserved
    limit.release("a", 20, 0)  # refused, or a duplicate: stored nothing
    assert await limit.reserve("a", 5) == TenantRoom(70, 100)
    limit.release("a", 5, 5)
    assert counts.reads == 1
    counts.count["a"] = 10  # pruned or deleted meanwhile, by any process
    ticks.now += 1.0
    assert await limit.reserve("a", 1) == TenantRoom(10, 100)
    assert counts.reads == 2
    assert await ByteLimit(counts, 0).reserve("a", 1) is None
    assert counts.reads == 2


def gated(counts: Counts) -> asyncio.Event:
    """The counts' bytes read only once the event is set (a read under way meanwhile)."""
    gate = asyncio.Event()
    reads = counts.tenant_bytes

    async def slow(tenant: str) -> int:
        await gate.wait()
        return await reads(tenant)

    counts.tenant_bytes = slow  # type: ignore[method-assign]
    return gate


async def test_a_stale_count_is_read_once_for_every_request_waiting_for_it() -> None:
    counts = Counts()
    counts.count["a"] = 7
    gate = gated(counts)
    limit = ByteLimit(counts, 100)
    waiting = [asyncio.ensure_future(limit.reserve("a", 10)) for _ in range(50)]
    await asyncio.sleep(0)
    gate.set()
    rooms = await asyncio.gather(*waiting)
    assert counts.reads == 1
    assert sorted(r.held for r in rooms) == [7 + 10 * n for n in range(50)]


def _append(size: int, key: str | None = None) -> AppendCommand:
    records = [NewRecord(RecordKind.BINARY, "text/plain", b"x" * size, size)]
    idempotency = None if key is None else Idempotency(key, fingerprint(records))
    return AppendCommand(ALICE, records, idempotency, NOW)


def _stream() -> Stream:
    definition = resolve_definition(
        DefinitionRequest(direction="output", stream_id="s"), region="local", egress_region="local"
    )
    stream, _ = Stream.create(StreamKey("acme", "r", "s"), definition, NOW)
    return stream


def test_a_groups_commands_are_each_decided_by_the_room_they_reserved() -> None:
    """A group's commands came at once: each room already leaves out what the ones before it
    in its process may store (`ByteLimit.reserve`), so the decision adds nothing more. Each
    record counts its size and its row (ROW_BYTES, 128): 300 bytes count 428."""
    commands = [_append(300), _append(300), _append(300)]
    for command, held in zip(commands, (0, 428, 856), strict=True):
        command.tenant_room = TenantRoom(held, 1000)  # type: ignore[attr-defined]
    outcomes, changes = decide_all(_stream(), commands, {}, {})
    assert [o.stored for o in outcomes if isinstance(o, Done)] == [428, 428]
    refused = outcomes[2]
    assert isinstance(refused, Failed) and isinstance(refused.error, errors.QuotaExhausted)
    assert refused.error.extra == {"tenant_bytes": 856, "max_tenant_bytes": 1000}
    assert [a.first_sequence for a in changes.appended] == [1, 2]


async def test_what_lands_while_the_count_is_read_is_kept_and_a_forget_then_reads_again() -> None:
    counts = Counts()
    counts.count["a"] = 100
    gate = gated(counts)
    limit = ByteLimit(counts, 1000)
    first = asyncio.ensure_future(limit.reserve("a", 1))
    await asyncio.sleep(0)
    gate.set()
    assert await first == TenantRoom(100, 1000)
    limit.release("a", 1, 1)
    limit.forget("a")  # a deletion: the next request reads again
    gate.clear()
    reading = asyncio.ensure_future(limit.reserve("a", 10))
    for _ in range(3):  # the request, then its read, under way
        await asyncio.sleep(0)
    limit.release("a", 0, 200)  # a commit that lands while the count is read
    limit.forget("a")  # and a deletion the read may not have seen
    counts.count["a"] = 120
    gate.set()
    # Kept rather than missed (counted twice at worst, until the next read) ...
    assert await reading == TenantRoom(320, 1000)
    # ... and read again at the next request, the deletion's forget not lost.
    limit.release("a", 10, 0)
    counts.count["a"] = 90
    assert await limit.reserve("a", 1) == TenantRoom(90, 1000)


async def test_a_budget_with_reservations_in_flight_is_not_forgotten() -> None:
    counts = Counts()
    limit = ByteLimit(counts, 1000, max_tenants=1)
    await limit.reserve("a", 900)
    await limit.reserve("b", 1)  # past max_tenants: "a" holds a reservation, and stays
    counts.count["a"] = 0
    assert await limit.reserve("a", 900) == TenantRoom(900, 1000)


def test_an_idempotent_append_counts_its_receipt_in_what_it_claims_and_stores() -> None:
    """Its records, and its receipt (kept for the idempotency window): its key's bytes and
    RECEIPT_BYTES. Room for the records alone is not enough."""
    claims = 428 + len("kéy".encode()) + RECEIPT_BYTES
    fits = _append(300, key="kéy")
    assert claimed_bytes(fits) == claims
    fits.tenant_room = TenantRoom(1000 - claims, 1000)  # type: ignore[attr-defined]
    [stored], changes = decide_all(_stream(), [fits], {}, {})
    assert isinstance(stored, Done) and stored.stored == claims and changes.receipts
    short = _append(300, key="kéy")
    short.tenant_room = TenantRoom(1000 - claims + 1, 1000)  # type: ignore[attr-defined]
    [refused], changes = decide_all(_stream(), [short], {}, {})
    assert isinstance(refused, Failed) and isinstance(refused.error, errors.QuotaExhausted)
    assert not changes.receipts and not changes.appended


def test_a_retry_of_what_was_stored_is_replayed_at_the_limit() -> None:
    stream, receipts = _stream(), {}
    first = _append(30, key="k")
    outcomes, _ = decide_all(stream, [first], receipts, {})
    assert isinstance(outcomes[0], Done)
    retry = _append(30, key="k")
    retry.tenant_room = TenantRoom(100, 100)  # type: ignore[attr-defined]
    [replayed], _ = decide_all(stream, [retry], receipts, {})
    assert isinstance(replayed, Replayed)


@pytest.fixture
async def bytes_limited():
    """A container whose tenants may hold 10,000 bytes (a test sets its own limit once its
    streams are made), counted afresh at every request."""
    container = memory_container(Settings(max_bytes_per_tenant=10_000))
    container.byte_limit.override(
        providers.Singleton(ByteLimit, container.streams, 10_000, fresh_seconds=0)
    )
    services = await start(container)
    yield container, services
    await stop(container)


def records(*sizes: int) -> list[RecordInput]:
    return [RecordInput(data_base64=base64.b64encode(b"b" * n).decode()) for n in sizes]


async def test_every_way_records_come_in_is_held_to_the_tenant_bytes(bytes_limited) -> None:
    container, services = bytes_limited
    for stream_id in ("s", "other"):
        await services.create_stream(ALICE, "r", request(stream_id))
    held = container.streams().tenant_bytes
    base = await held("acme")  # each stream counts its definition and its row
    assert base > 2 * ROW_BYTES
    container.byte_limit().limit = base + 1500  # 1,500 bytes of room from here
    # Each record counts its size and its row (ROW_BYTES, 128), and an idempotent append's
    # receipt its key and RECEIPT_BYTES (416), while it is kept.
    answer, _ = await services.append_records(ALICE, "r", "s", records(200), "k")
    assert await held("acme") == base + 328 + 1 + RECEIPT_BYTES == base + 745
    # Past the limit on any of the tenant's streams: refused, and nothing is appended.
    with pytest.raises(errors.QuotaExhausted) as refused:
        await services.append_records(ALICE, "r", "other", records(300, 300))
    assert refused.value.extra == {"tenant_bytes": base + 745, "max_tenant_bytes": base + 1500}
    # The retry of what was stored is replayed as it was.
    assert await services.append_records(ALICE, "r", "s", records(200), "k") == (answer, True)
    # A Durable Streams write, and the producer's retry of what was stored.
    claim = ProducerClaim("p", 0, 0)
    produce = services.append_records.produce
    written = await produce(ALICE, "r", "other", [_record(30)], producer=claim)
    with pytest.raises(errors.QuotaExhausted):
        await produce(ALICE, "r", "other", [_record(700)], producer=ProducerClaim("p", 0, 1))
    again = await produce(ALICE, "r", "other", [_record(30)], producer=claim)
    assert again.duplicate and again.head == written.head == 1
    assert await held("acme") == base + 903
    # An object's intent pledges what its record will count: its size, its reference, its row.
    with pytest.raises(errors.QuotaExhausted):
        await services.objects.prepare(ALICE, "r", "s", object_request(600))
    assert await held("acme") == base + 903
    await services.objects.prepare(ALICE, "r", "s", object_request(10))
    assert base + 903 + 10 + ROW_BYTES < await held("acme") < base + 1500
    # A new stream counts its definition: at the limit, none is created.
    filler = base + 1500 - await held("acme") - ROW_BYTES
    await services.append_records(ALICE, "r", "other", records(filler))
    assert await held("acme") == base + 1500
    with pytest.raises(errors.QuotaExhausted):
        await services.create_stream(ALICE, "r", request("third"))
    # Another tenant's room is its own.
    await services.create_stream(BOB, "r", request("s"))
    await services.append_records(BOB, "r", "s", records(800))
    # Receipts forgotten after their window give their bytes back.
    assert await container.streams().forget_receipts(timedelta(0)) == 1
    assert await held("acme") == base + 1500 - 1 - RECEIPT_BYTES
    # A deletion gives the room back (its definition, its record and its open intent).
    await services.delete_stream(ALICE, "r", "s")
    assert await held("acme") < base
    await services.append_records(ALICE, "r", "other", records(300, 200))


def _record(size: int) -> NewRecord:
    return NewRecord(RecordKind.BINARY, "application/octet-stream", b"d" * size, size)


def object_request(size: int) -> ObjectRequest:
    body = b"o" * size
    fields = {
        "idempotency_key": "o",
        "size": size,
        "sha256": hashlib.sha256(body).hexdigest(),
        "content_type": "application/octet-stream",
    }
    return msgspec.convert(fields, ObjectRequest)


def test_an_intent_pledges_its_size_until_its_commit_takes_it_up_or_it_ends() -> None:
    """`stored_bytes`: a prepare adds its size, a commit adds its record and ends its pledge
    (nothing in all), an abort or an expiry gives it back."""
    stream = _stream()
    request = object_request(40)
    intent = ObjectIntent(
        object_id="o1",
        idempotency_key="o",
        state="prepared",
        size=40,
        sha256=request.sha256,
        content_type=request.content_type,
        schema=None,
        storage_region="local",
        storage_key="k",
        receipt=AuthorizationReceipt(principal="alice", scopes=(), decided_at=NOW),
        expires_at=NOW + timedelta(hours=1),
        created_at=NOW,
    )
    prepared = stream.prepare_object(intent, NOW, None)
    pledge = pledged_bytes(intent)
    assert pledge > 40 + ROW_BYTES  # its reference too
    assert stored_bytes(stream, prepared, ()) == pledge
    for event in prepared:
        stream.apply(event)
    for event in stream.mark_uploaded("o1", NOW):
        stream.apply(event)
    record = object_record(stream.state.objects["o1"])
    committed = stream.commit_object("o1", 40, request.sha256, record, NOW)
    assert stored_bytes(stream, committed, [record]) == 0
    assert stored_bytes(stream, stream.abort_object("o1", NOW), ()) == -pledge
    appended = _stream().append([_record(7)], NOW)
    assert stored_bytes(stream, appended, [_record(7)]) == 7 + ROW_BYTES


async def test_usage_is_counted_now_and_says_no_limit_as_null() -> None:
    container = memory_container(
        Settings(
            max_streams_per_tenant=0,
            max_bytes_per_tenant=0,
            max_tokens_per_tenant=5,
            max_stored_subscriptions_per_tenant=0,
        )
    )
    services = await start(container)
    try:
        await services.create_stream(ALICE, "r", request("s"))
        await services.append_records(ALICE, "r", "s", records(12))
        usage = await services.tenant_usage(ALICE)
        held = await container.streams().tenant_bytes("acme")
        assert held > 140  # its record and row (140), its stream's definition and row
        assert usage == UsageView(
            streams=1, max_streams=None, bytes=held, max_bytes=None, tokens=0, max_tokens=5
        )
        await services.mint_token(
            ALICE, TokenRequest(scopes=["streams:read"], expires_in_seconds=9)
        )
        assert (await services.tenant_usage(ALICE)).tokens == 1
        assert await services.tenant_usage(BOB) == UsageView(0, None, 0, None, 0, 5)
        with pytest.raises(Forbidden):
            await services.tenant_usage(Caller("acme", "w", frozenset({"streams:write"})))
        with pytest.raises(Forbidden):
            await services.tenant_usage(Caller("acme", "a", ALL, runs=frozenset({"r"})))
    finally:
        await stop(container)
