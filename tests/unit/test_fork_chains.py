"""Fork chains on the memory adapter: read without recursion (a chain deeper than Python's stack
reads whole), every page of a random tree of forks as a model says, the depth bounded at
creation, and a fork's pins taken from its source."""

from __future__ import annotations

import random
import sys

import msgspec
import pytest

from application.access import Caller
from application.fork_reads import ForkLink, Segment, segments
from application.forks import Forks
from domain import errors
from domain.definition import (
    MAX_FORK_DEPTH,
    Authorization,
    DefinitionRequest,
    Fork,
    Placement,
    Redaction,
    with_source_pins,
)
from domain.records import RecordInput
from domain.stream import StreamKey
from entrypoints.container import memory_container, start, stop
from tests.support.builders import definition

ALL = frozenset({"streams:read", "streams:write", "streams:admin"})
ALICE = Caller(tenant="acme", principal="alice", scopes=ALL)


@pytest.fixture
async def app():
    container = memory_container()
    services = await start(container)
    yield container, services
    await stop(container)


def data(*values: object) -> list[RecordInput]:
    return [RecordInput(data=msgspec.Raw(msgspec.json.encode(v))) for v in values]


async def fork_of(container, source: str, name: str, through: int | None = None) -> StreamKey:
    """A fork of `source` at `through` (its head by default), made through the port as the
    protocol surface makes one (no depth check: that is the use case's)."""
    streams = container.streams()
    loaded = await streams.load(ALICE.key("r", source))
    link = Fork(
        run_id="r",
        stream_id=source,
        source_created_at=loaded.state.created_at,
        through=loaded.state.head if through is None else through,
    )
    key = ALICE.key("r", name)
    fork = msgspec.structs.replace(definition(name), content_type="application/json", fork=link)
    _, created = await streams.create(key, fork, container.clock()())
    assert created
    return key


async def values(container, key: StreamKey, cursor: int = 0, limit: int = 10_000) -> list:
    found = await container.streams().page(key, cursor, limit)
    assert found is not None
    return [msgspec.json.decode(r.payload) for r in found[1]]


async def test_a_chain_deeper_than_the_stack_reads_whole(app) -> None:
    container, s = app
    depth = sys.getrecursionlimit() * 3  # the recursive read overflowed at a third of this
    await s.create_stream(ALICE, "r", DefinitionRequest(direction="output", stream_id="c0"))
    await s.append_records(ALICE, "r", "c0", data(0))
    for level in range(1, depth + 1):
        await fork_of(container, f"c{level - 1}", f"c{level}")
    await s.append_records(ALICE, "r", f"c{depth}", data("own"))
    leaf = ALICE.key("r", f"c{depth}")
    assert await values(container, leaf) == [0, "own"]
    assert await values(container, leaf, cursor=1) == ["own"]
    chain = await container.streams().chain(leaf)
    assert len(chain) == depth
    assert chain[0].source == ALICE.key("r", f"c{depth - 1}")
    assert chain[-1].source == ALICE.key("r", "c0")
    page = await s.read_records(ALICE, "r", f"c{depth}", cursor=0)
    assert [r.sequence for r in page.records] == [1, 2]


@pytest.mark.parametrize("seed", range(6))
async def test_every_page_of_a_random_tree_of_forks_is_the_models(app, seed: int) -> None:
    """Forks of forks at random points (inside a source's own part or its inherited one), with
    own appends between: each stream reads as its source's first `through` records, then its own."""
    container, s = app
    rng = random.Random(seed)
    await s.create_stream(ALICE, "r", DefinitionRequest(direction="output", stream_id="s0"))
    model: dict[str, list] = {"s0": []}
    for step in range(40):
        name = rng.choice(sorted(model))
        if rng.random() < 0.45:
            through = rng.randint(0, len(model[name]))
            child = f"s{len(model)}"
            await fork_of(container, name, child, through)
            model[child] = model[name][:through]
        else:
            added = [f"{name}.{step}.{i}" for i in range(rng.randint(1, 3))]
            await s.append_records(ALICE, "r", name, data(*added))
            model[name] += added
    for name, expected in model.items():
        key = ALICE.key("r", name)
        for cursor in range(len(expected) + 1):
            for limit in (1, 2, 3, 7, 1000):
                position, records = await container.streams().page(key, cursor, limit)
                assert [msgspec.json.decode(r.payload) for r in records] == expected[
                    cursor : cursor + limit
                ], (name, cursor, limit)
                assert [r.sequence for r in records] == list(
                    range(cursor + 1, cursor + 1 + len(records))
                )
                assert (position.head, position.earliest) == (len(expected), 1)


def test_segments_split_a_range_over_the_chain() -> None:
    at = None
    a, b, c = (StreamKey("t", "r", n) for n in "abc")
    # The fork inherits 1..8 from b; b inherits 1..5 from a, and a 1..3 from c (the root).
    chain = [ForkLink(b, at, 8), ForkLink(a, at, 5), ForkLink(c, at, 3)]  # type: ignore[arg-type]
    assert segments(chain, 0, 100) == [Segment(b, 5, 8), Segment(a, 3, 5), Segment(c, 0, 3)]
    assert segments(chain, 4, 2) == [Segment(b, 5, 6), Segment(a, 4, 5), Segment(c, 4, 4)]
    assert segments(chain, 8, 10) == [Segment(b, 8, 8), Segment(a, 8, 8), Segment(c, 8, 8)]
    # A fork of b inside what b inherits (at 2): b and a serve nothing, c serves 1..2.
    low = [ForkLink(b, at, 2), ForkLink(a, at, 5), ForkLink(c, at, 3)]  # type: ignore[arg-type]
    assert segments(low, 0, 100) == [Segment(b, 2, 2), Segment(a, 2, 2), Segment(c, 0, 2)]


async def test_a_fork_past_the_depth_limit_is_refused(app) -> None:
    container, s = app
    forks = Forks(container.definitions(), container.streams(), container.streams())
    await s.create_stream(ALICE, "r", DefinitionRequest(direction="output", stream_id="c0"))
    for level in range(1, MAX_FORK_DEPTH + 1):
        await fork_of(container, f"c{level - 1}", f"c{level}")
    fork, _, _ = await forks.resolve(ALICE, "r", f"c{MAX_FORK_DEPTH - 1}", None, 0, None)
    assert fork.stream_id == f"c{MAX_FORK_DEPTH - 1}"  # the last fork the limit allows
    with pytest.raises(errors.InvalidInput) as refused:
        await forks.resolve(ALICE, "r", f"c{MAX_FORK_DEPTH}", None, 0, None)
    assert f"at most {MAX_FORK_DEPTH} forks" in refused.value.detail


def test_a_forks_pins_are_its_sources() -> None:
    requested = definition("f")
    source = msgspec.structs.replace(
        definition("src"),
        authorization=Authorization(readers=("alice",), writers=("alice", "bob")),
        redaction=Redaction(json_pointers=("/secret",)),
        placement=Placement("eu", ("us",), ("eu-objects",), ("eu",), "eu-logs"),
        content_class="tool_io",
    )
    pinned = with_source_pins(requested, source)
    assert pinned.authorization == source.authorization
    assert pinned.redaction == source.redaction
    assert pinned.placement == source.placement
    assert pinned.content_class == "tool_io"
    assert (pinned.stream_id, pinned.retention, pinned.limits, pinned.expiry) == (
        "f",
        requested.retention,
        requested.limits,
        requested.expiry,
    )
