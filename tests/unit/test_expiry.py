"""Stream expiry on the memory adapters: the definition, the one check every route makes, the
batched access log and the sweep, with a clock the tests move."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from dependency_injector import providers

from application.access import Caller
from application.errors import NotFound
from application.expiry import SweepExpired, not_an_access
from domain import errors
from domain.definition import DefinitionRequest, Expiry, resolve_definition
from domain.events import StreamDeleted
from domain.records import RecordInput
from domain.stream import StreamKey
from entrypoints.config import Settings
from entrypoints.container import memory_container, start, stop

ALL = frozenset({"streams:read", "streams:write", "streams:admin"})
ALICE = Caller(tenant="acme", principal="alice", scopes=ALL)
FLUSH = 60.0  # the flush interval
MARGIN = 2 * FLUSH  # how far the recorded last access may lag: a route allows for it
GRACE = timedelta(seconds=MARGIN)


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
    # The background flush (every FLUSH real seconds) never runs during a test: it flushes
    # only when a test says so.
    container = memory_container(
        Settings(access_flush_seconds=FLUSH, expiry_grace_seconds=GRACE.total_seconds())
    )
    container.clock.override(providers.Object(clock))
    services = await start(container)
    yield container, services, clock
    await stop(container)


def request(**fields: object) -> DefinitionRequest:
    return msgspec.convert({"direction": "output", **fields}, DefinitionRequest)


def data(*values: object) -> list[RecordInput]:
    return [RecordInput(data=msgspec.Raw(msgspec.json.encode(v))) for v in values]


def sweeper(container, clock: Clock) -> SweepExpired:
    return SweepExpired(
        container.streams(), container.stream_access(), clock, GRACE, container.access_log()
    )


async def every_route_is_404(s, stream_id: str) -> None:
    for call in (
        lambda: s.get_stream(ALICE, "r", stream_id),
        lambda: s.read_records(ALICE, "r", stream_id),
        lambda: s.append_records(ALICE, "r", stream_id, data(1)),
        lambda: s.acknowledge(ALICE, "r", stream_id, "c", 0),
        lambda: s.close_stream(ALICE, "r", stream_id),
        lambda: s.subscribe(ALICE, "r", stream_id, 0),
        lambda: s.set_legal_hold(ALICE, "r", stream_id, True, None),
        lambda: s.objects.describe(ALICE, "r", stream_id, "obj-1"),
    ):
        with pytest.raises(NotFound):
            await call()


# -- the definition --------------------------------------------------------------------------------


def test_expiry_defaults_to_never_and_shows_in_the_definition() -> None:
    definition = resolve_definition(request(), region="eu", egress_region="eu")
    assert definition.expiry == Expiry(idle_seconds=None, expires_at=None)
    assert not definition.expiry.enabled


def test_both_fields_are_refused() -> None:
    both = request(expiry={"idle_seconds": 5, "expires_at": "2031-01-01T00:00:00Z"})
    with pytest.raises(errors.InvalidInput, match="not both"):
        resolve_definition(both, region="eu", egress_region="eu")


@pytest.mark.parametrize(
    "expiry",
    [
        {"idle_seconds": 0},
        {"idle_seconds": 100 * 365 * 86_400 + 1},
        {"idle_seconds": 1.5},
        {"expires_at": "2031-01-01T00:00:00"},  # no timezone
        {"expires_at": "tomorrow"},
        {"idle": 5},
    ],
)
def test_bad_expiry_fields_fail_decoding(expiry: dict) -> None:
    with pytest.raises(msgspec.ValidationError):
        request(expiry=expiry)


def test_expires_at_is_kept_in_utc() -> None:
    definition = resolve_definition(
        request(expiry={"expires_at": "2031-01-01T02:00:00+02:00"}), region="eu", egress_region="eu"
    )
    assert definition.expiry.expires_at == datetime(2031, 1, 1, tzinfo=UTC)
    assert definition.expiry.expires_at.utcoffset() == timedelta(0)


async def test_a_past_expires_at_is_refused_at_create(app) -> None:
    _, s, clock = app
    past = (clock.now - timedelta(seconds=1)).isoformat()
    with pytest.raises(errors.InvalidInput, match="already passed"):
        await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"expires_at": past}))


async def test_expiry_is_part_of_the_idempotent_create_comparison(app) -> None:
    _, s, _ = app
    first, created = await s.create_stream(
        ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 30})
    )
    assert created and first.expiry == Expiry(idle_seconds=30)
    again, created = await s.create_stream(
        ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 30})
    )
    assert not created and again == first
    for other in ({"idle_seconds": 31}, {}, {"expires_at": "2031-01-01T00:00:00Z"}):
        with pytest.raises(errors.DefinitionConflict):
            await s.create_stream(ALICE, "r", request(stream_id="x", expiry=other))


# -- the check ---------------------------------------------------------------------------------


async def test_reads_keep_an_idle_stream_alive_and_then_it_is_404_everywhere(app) -> None:
    _, s, clock = app
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 10}))
    await s.create_stream(ALICE, "r", request(stream_id="forever"))
    for _ in range(20):  # 20 reads 9 s apart: far past idle_seconds, read every 9 s
        clock.advance(9)
        await s.read_records(ALICE, "r", "x")
    clock.advance(9)
    await s.get_stream(ALICE, "r", "x")
    clock.advance(10 + MARGIN)  # idle, and past the margin for accesses not yet flushed
    await every_route_is_404(s, "x")
    listed = await s.list_streams(ALICE, "r")
    assert [d.stream_id for d in listed.streams] == ["forever"]
    await s.get_stream(ALICE, "r", "forever")


async def test_a_stream_its_reader_loaded_is_expired_still_once_the_sweep_erased_it(app) -> None:
    """A read that loaded the stream before the sweep erased it asked for its access row, found
    none, and answered the stream as alive (200 just after a 404: a CI flake)."""
    container, s, clock = app
    await s.create_stream(ALICE, "r", request(stream_id="gone", expiry={"idle_seconds": 10}))
    await s.read_records(ALICE, "r", "gone")
    key = StreamKey(ALICE.tenant, "r", "gone")
    definition = await container.definitions().get(key, runs=None)  # loaded while it lives
    clock.advance(10 + MARGIN)
    access_log = container.access_log()
    assert await access_log.expired(key, definition, clock())
    clock.advance(GRACE.total_seconds() + 1)
    assert await sweeper(container, clock)() == 1  # erased: its access row too
    assert await container.stream_access().last_access(key) is None
    assert await access_log.expired(key, definition, clock())


async def test_a_write_is_an_access_too(app) -> None:
    _, s, clock = app
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 10}))
    for _ in range(5):
        clock.advance(10 + MARGIN - 1)
        await s.append_records(ALICE, "r", "x", data(1))
    clock.advance(10 + MARGIN - 1)
    assert (await s.get_stream(ALICE, "r", "x")).state.head == 5


async def test_an_idle_stream_is_not_404_before_the_margin_for_unflushed_accesses(app) -> None:
    """Another process's accesses reach this one only through the table, up to a flush late."""
    container, s, clock = app
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 10}))
    log = container.access_log()
    log._known.clear()  # as if another process served it
    clock.advance(10 + MARGIN - 1)
    await s.get_stream(ALICE, "r", "x")
    await log.flush()
    log._known.clear()  # and once more, knowing nothing here: the table says
    clock.advance(10 + MARGIN)
    with pytest.raises(NotFound):
        await s.get_stream(ALICE, "r", "x")


async def test_an_open_subscription_keeps_touching(app) -> None:
    container, s, clock = app
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 10}))
    subscription = await s.subscribe(ALICE, "r", "x", 0)
    await s.append_records(ALICE, "r", "x", data(1))
    async with contextlib.aclosing(subscription):
        await anext(subscription)  # the record
        for _ in range(5):  # no delivery at all: each flush still counts the open subscription
            clock.advance(10 + MARGIN - 1)
            await container.access_log().flush()
        await s.get_stream(ALICE, "r", "x")
    clock.advance(10 + MARGIN)
    await container.access_log().flush()  # closed: it no longer counts
    with pytest.raises(NotFound):
        await s.get_stream(ALICE, "r", "x")


async def test_reads_waiting_on_either_surface_keep_touching(app) -> None:
    """A read waiting for the next append is a live connection on the stream, as a
    subscription is: an idle-expiring stream does not expire under it (before, the other
    routes answered 404 while it waited, and it then answered an empty page)."""
    container, s, clock = app
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 10}))
    native = asyncio.create_task(s.read_records(ALICE, "r", "x", 0, wait=30))
    key, definition = await s.durable_reads.open(ALICE, "r", "x")
    protocol = asyncio.create_task(
        s.durable_reads.wait(key, 0, 30, caller=ALICE, definition=definition)
    )
    async with asyncio.timeout(5):  # both waiting
        while container.access_log()._open.get(key) != 2:
            await asyncio.sleep(0.01)
    for _ in range(5):
        clock.advance(10 + MARGIN - 1)
        await container.access_log().flush()
    await s.get_stream(ALICE, "r", "x")
    await s.append_records(ALICE, "r", "x", data(1))
    async with asyncio.timeout(5):
        assert len((await native).records) == 1
        assert len((await protocol).records) == 1
    clock.advance(10 + MARGIN)
    await container.access_log().flush()  # done waiting: they no longer count
    with pytest.raises(NotFound):
        await s.get_stream(ALICE, "r", "x")


async def test_expires_at_is_404_once_passed(app) -> None:
    _, s, clock = app
    at = clock.now + timedelta(seconds=30)
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"expires_at": at.isoformat()}))
    clock.advance(29)
    await s.read_records(ALICE, "r", "x")
    clock.advance(1)
    await every_route_is_404(s, "x")
    with pytest.raises(NotFound):  # the run's only stream: the run is gone too
        await s.list_streams(ALICE, "r")


async def test_a_stream_the_sweep_erases_while_it_is_read_is_404_not_its_document(
    app, monkeypatch
) -> None:
    container, s, clock = app
    at = clock.now + timedelta(seconds=30)
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"expires_at": at.isoformat()}))
    clock.advance(31)

    async def erased_meanwhile(key: object) -> None:
        return None  # the sweep erased it (its access row too) after the read loaded it

    monkeypatch.setattr(container.stream_access(), "last_access", erased_meanwhile)
    with pytest.raises(NotFound):
        await s.get_stream(ALICE, "r", "x")


async def test_a_legal_hold_suspends_expiry_and_lifting_it_lets_it_expire(app) -> None:
    _, s, clock = app
    at = clock.now + timedelta(seconds=30)
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"expires_at": at.isoformat()}))
    await s.create_stream(ALICE, "r", request(stream_id="y", expiry={"idle_seconds": 10}))
    await s.append_records(ALICE, "r", "x", data(1))
    for stream_id in ("x", "y"):
        await s.set_legal_hold(ALICE, "r", stream_id, True, "audit")
    clock.advance(3600)
    for stream_id in ("x", "y"):  # whole and readable while held
        page = await s.read_records(ALICE, "r", stream_id)
        assert len(page.records) == (1 if stream_id == "x" else 0)
    assert {d.stream_id for d in (await s.list_streams(ALICE, "r")).streams} == {"x", "y"}
    for stream_id in ("x", "y"):
        await s.set_legal_hold(ALICE, "r", stream_id, False, None)
    await every_route_is_404(s, "x")  # past expires_at: at once
    clock.advance(9)  # lifting the hold is a write: idle_seconds count from it
    await s.get_stream(ALICE, "r", "y")
    clock.advance(10 + MARGIN)
    await every_route_is_404(s, "y")


async def test_head_does_not_count_as_an_access(app) -> None:
    container, s, clock = app
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 10}))
    definitions = container.definitions()
    key = ALICE.key("r", "x")
    for _ in range(3):
        clock.advance(10)
        await definitions.get(key, touch=False, runs=None)
    clock.advance(MARGIN)
    with pytest.raises(NotFound):
        await definitions.get(key, touch=False, runs=None)


async def test_no_read_within_not_an_access_counts(app) -> None:
    """What the HTTP layer wraps a HEAD in: every read route is checked (404 once expired) but
    none keeps the stream alive, while the same reads outside it do."""
    _, s, clock = app
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 10}))
    await s.create_stream(ALICE, "r", request(stream_id="y", expiry={"idle_seconds": 10}))

    async def read(stream_id: str) -> None:
        await s.get_stream(ALICE, "r", stream_id)
        await s.read_records(ALICE, "r", stream_id)
        await s.subscribe.check(ALICE, "r", stream_id, 0)
        with pytest.raises(NotFound):  # no such object: found only once the stream is
            await s.objects.describe(ALICE, "r", stream_id, "obj-1")

    for _ in range(4):
        clock.advance(9)
        with not_an_access():
            await read("x")
        await read("y")
    clock.advance(MARGIN)
    with not_an_access():
        await every_route_is_404(s, "x")
    await read("y")


# -- the access log ------------------------------------------------------------------------------


async def test_accesses_are_flushed_in_batches_not_per_request(app) -> None:
    container, s, clock = app
    access, log = container.stream_access(), container.access_log()
    for stream_id in ("a", "b", "c"):
        await s.create_stream(ALICE, "r", request(stream_id=stream_id, expiry={"idle_seconds": 9}))
    await s.create_stream(ALICE, "r", request(stream_id="never"))
    before = access.writes
    for _ in range(50):
        clock.advance(0.01)
        for stream_id in ("a", "b", "c", "never"):
            await s.read_records(ALICE, "r", stream_id)
    assert access.writes == before  # 200 reads, nothing written yet
    assert await log.flush() == 3  # one write, the latest access of each expiring stream
    assert access.writes == before + 1
    for stream_id in ("a", "b", "c"):
        record = await access.last_access(ALICE.key("r", stream_id))
        assert record is not None and record.last_access == clock.now
    assert await access.last_access(ALICE.key("r", "never")) is None
    assert await log.flush() == 0 and access.writes == before + 1  # nothing new: no write


async def test_an_access_long_after_the_recorded_one_is_written_at_once(app) -> None:
    """So that a crash before the next flush cannot lose more than the margin of its life."""
    container, s, clock = app
    access = container.stream_access()
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 1000}))
    before = access.writes
    clock.advance(MARGIN - 1)  # recorded at creation, less than the margin ago: batched
    await s.read_records(ALICE, "r", "x")
    assert access.writes == before
    clock.advance(1)  # the recorded access is the margin old: this one is written at once
    await s.read_records(ALICE, "r", "x")
    assert access.writes == before + 1
    record = await access.last_access(ALICE.key("r", "x"))
    assert record is not None and record.last_access == clock.now
    for _ in range(10):  # and then batched again
        clock.advance(1)
        await s.read_records(ALICE, "r", "x")
    assert access.writes == before + 1


async def test_a_failed_flush_keeps_the_accesses_for_the_next(app, monkeypatch) -> None:
    container, s, clock = app
    access, log = container.stream_access(), container.access_log()
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 9}))
    clock.advance(5)
    await s.read_records(ALICE, "r", "x")
    seen = clock.now
    real = access.record_access

    async def down(accesses):
        raise OSError("database unreachable")

    monkeypatch.setattr(access, "record_access", down)
    with pytest.raises(OSError):
        await log.flush()
    monkeypatch.setattr(access, "record_access", real)
    assert await log.flush() == 1
    record = await access.last_access(ALICE.key("r", "x"))
    assert record is not None and record.last_access == seen


async def test_a_stopping_process_flushes_what_is_pending() -> None:
    clock = Clock()
    container = memory_container(Settings(access_flush_seconds=FLUSH))
    container.clock.override(providers.Object(clock))
    s = await start(container)
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 9}))
    clock.advance(5)
    await s.read_records(ALICE, "r", "x")
    await stop(container)
    record = await container.stream_access().last_access(ALICE.key("r", "x"))
    assert record is not None and record.last_access == clock.now


# -- the sweep -------------------------------------------------------------------------------------


async def test_the_sweep_erases_only_past_idle_plus_grace(app) -> None:
    container, s, clock = app
    sweep = sweeper(container, clock)
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 10}))
    await s.create_stream(ALICE, "r", request(stream_id="forever"))
    clock.advance(5)
    await s.read_records(ALICE, "r", "x")
    await container.access_log().flush()
    clock.advance(10 + GRACE.total_seconds() - 1)
    assert await sweep() == 0
    clock.advance(1)
    assert await sweep() == 1
    assert await container.streams().load(ALICE.key("r", "x")) is None  # erased
    assert await sweep() == 0
    with pytest.raises(NotFound):
        await s.get_stream(ALICE, "r", "x")
    # The ID is free: a new stream, from sequence 1.
    document, created = await s.create_stream(
        ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 10})
    )
    assert created and document.state.head == 0
    answer, _ = await s.append_records(ALICE, "r", "x", data(1))
    assert answer.first_sequence == 1
    await s.get_stream(ALICE, "r", "forever")


async def test_the_sweep_decides_expired_under_the_lock_with_stream_deleted(app) -> None:
    container, s, clock = app
    streams = container.streams()
    at = clock.now + timedelta(seconds=30)
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"expires_at": at.isoformat()}))
    stream = await streams.load(ALICE.key("r", "x"))
    clock.advance(30)
    [event] = stream.expire(clock.now, None)
    assert isinstance(event, StreamDeleted) and event.reason == "expired"
    assert stream.expire(clock.now - timedelta(seconds=1), None) == []


async def test_a_create_of_an_expired_stream_not_yet_erased_erases_it_first(app) -> None:
    _, s, clock = app
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 10}))
    await s.append_records(ALICE, "r", "x", data(1, 2))
    clock.advance(10 + MARGIN)
    document, created = await s.create_stream(
        ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 10})
    )
    assert created and document.state.head == 0
    # Even with another definition: the old stream is gone, this is a new one.
    clock.advance(10 + MARGIN)
    document, created = await s.create_stream(ALICE, "r", request(stream_id="x"))
    assert created and document.expiry == Expiry()


async def test_the_sweep_counts_this_processs_unflushed_accesses(app) -> None:
    container, s, clock = app
    sweep = sweeper(container, clock)
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"idle_seconds": 10}))
    clock.advance(10 + MARGIN - 1)
    await s.read_records(ALICE, "r", "x")  # not flushed
    clock.advance(GRACE.total_seconds())
    assert await sweep() == 0


async def test_the_sweep_leaves_a_held_stream_even_one_held_after_it_was_found(app) -> None:
    container, s, clock = app
    sweep = sweeper(container, clock)
    at = clock.now + timedelta(seconds=30)
    await s.create_stream(ALICE, "r", request(stream_id="x", expiry={"expires_at": at.isoformat()}))
    await s.set_legal_hold(ALICE, "r", "x", True, "audit")
    clock.advance(31)
    assert await container.stream_access().expiry_candidates(clock.now, GRACE, 10) == []
    assert await sweep() == 0
    await s.read_records(ALICE, "r", "x")

    # Found while not held, held before the row lock: the domain decides again under it.
    await s.set_legal_hold(ALICE, "r", "x", False, None)
    access = container.stream_access()
    [found] = await access.expiry_candidates(clock.now, GRACE, 10)
    streams = container.streams()
    stream = await streams.load(found)
    assert stream.expire(clock.now, None) != []
    stream.state.legal_hold.enabled = True
    assert stream.expire(clock.now, None) == []


async def test_the_sweep_takes_bounded_batches(app) -> None:
    container, s, clock = app
    at = clock.now + timedelta(seconds=30)
    for n in range(7):
        await s.create_stream(
            ALICE, "r", request(stream_id=f"x{n}", expiry={"expires_at": at.isoformat()})
        )
    clock.advance(31)
    access = container.stream_access()
    assert len(await access.expiry_candidates(clock.now, GRACE, 3)) == 3
    sweep = SweepExpired(container.streams(), access, clock, GRACE, batch=3, rounds=2)
    assert await sweep() == 6  # two rounds of three: the rest at the next sweep
