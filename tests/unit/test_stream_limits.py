"""A tenant's limit on the streams it holds (application/stream_limits.py), on the memory
adapters: the count read at most once a second, this process's creations added, a stream
already there answered at the limit, and 0 meaning none."""

from __future__ import annotations

import msgspec
import pytest

from adapters.memory.streams import MemoryStreams
from application.access import Caller
from application.stream_limits import StreamLimit
from domain import errors
from domain.definition import DefinitionRequest
from entrypoints.config import Settings
from entrypoints.container import memory_container, start, stop

ALL = frozenset({"streams:read", "streams:write", "streams:admin"})
ALICE = Caller(tenant="acme", principal="alice", scopes=ALL)
BOB = Caller(tenant="other", principal="bob", scopes=ALL)


class Counts:
    """Counts a test sets, and how often they were read."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.reads = 0

    async def tenant_streams(self, tenant: str) -> int:
        self.reads += 1
        return self.count.get(tenant, 0)


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
