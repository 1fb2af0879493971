"""The pruner's use case on the memory adapters: by count, by age, never under a legal hold."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest

from adapters.memory.deliveries import MemoryInputDeliveries
from adapters.memory.streams import MemoryStreams
from application.delete_stream import DeleteCommand
from application.group_commit import GroupCommit
from application.retention import CHUNK, PruneRetention
from application.set_legal_hold import LegalHoldCommand
from domain.definition import Fork, Retention
from tests.support.builders import NOW, append, definition, new_key, record


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self):
        return self.now


@pytest.fixture
def setup():
    streams = MemoryStreams()
    clock = Clock()
    deliveries = MemoryInputDeliveries(streams)
    prune = PruneRetention(
        streams, streams, GroupCommit(streams), clock, deliveries, interval_seconds=7
    )
    return streams, prune, clock


async def create(streams, **retention):
    key = new_key()
    d = definition(max_unread_items=100_000)
    await streams.create(key, msgspec.structs.replace(d, retention=Retention(**retention)), NOW)
    return key


async def test_max_records_keeps_only_the_newest(setup) -> None:
    streams, prune, _ = setup
    key = await create(streams, max_records=3)
    await streams.update(key, [append([record(b"%d" % i) for i in range(10)])])
    assert await prune(key) == 7
    state = (await streams.load(key)).state
    assert (state.earliest, state.head, state.pruned_bytes) == (8, 10, 7)
    _, records = await streams.page(key, 7, 100)
    assert [r.sequence for r in records] == [8, 9, 10]


async def test_max_age_prunes_the_expired_prefix(setup) -> None:
    streams, prune, clock = setup
    key = await create(streams, max_age_seconds=60)
    await streams.update(key, [append([record(), record()])])
    clock.now = NOW + timedelta(seconds=30)
    young = append([record()])
    young.now = clock.now
    await streams.update(key, [young])
    clock.now = NOW + timedelta(seconds=61)
    await prune(key)
    assert (await streams.load(key)).state.earliest == 3


async def test_a_legal_hold_stops_pruning_until_it_is_lifted(setup) -> None:
    streams, prune, _ = setup
    key = await create(streams, max_records=1)
    await streams.update(key, [append([record(), record(), record()])])
    await streams.update(key, [LegalHoldCommand(True, "audit", NOW)])
    await prune(key)
    assert (await streams.load(key)).state.earliest == 1
    await streams.update(key, [LegalHoldCommand(False, None, NOW)])
    await prune(key)
    assert (await streams.load(key)).state.earliest == 3


async def test_pruning_goes_in_bounded_chunks_and_asks_to_come_back_at_once(setup) -> None:
    streams, prune, _ = setup
    key = await create(streams, max_records=1)
    for _ in range(CHUNK // 1000 + 1):
        await streams.update(key, [append([record(b"x") for _ in range(1000)])])
    assert await prune(key) == 0.0
    assert (await streams.load(key)).state.earliest == CHUNK + 1


async def test_a_stream_without_retention_needs_no_job(setup) -> None:
    streams, prune, _ = setup
    key = await create(streams)
    assert await prune(key) is None


async def test_retention_keeps_what_a_fork_inherits_and_resumes_once_it_is_gone(setup) -> None:
    streams, prune, _ = setup
    key = await create(streams, max_records=1)
    for _ in range(CHUNK // 1000 + 1):
        await streams.update(key, [append([record(b"x") for _ in range(1000)])])
    source = await streams.load(key)
    link = Fork(
        run_id=key.run_id,
        stream_id=key.stream_id,
        source_created_at=source.state.created_at,
        through=2,
        offset=2,
    )
    fork = key._replace(stream_id="fork")
    await streams.create(fork, msgspec.structs.replace(definition(), fork=link), NOW)
    assert await prune(key) == 7  # nothing pruned: not at once again (no busy loop)
    assert (await streams.load(key)).state.earliest == 1
    _, records = await streams.page(fork, 0, 10)
    assert [r.sequence for r in records] == [1, 2]
    await streams.update(fork, [DeleteCommand(NOW)])
    assert await prune(key) == 0.0  # a whole chunk: come back at once
    assert (await streams.load(key)).state.earliest == CHUNK + 1
