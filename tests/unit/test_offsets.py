"""Durable Streams offsets: each names the incarnation that minted it, so an offset of a stream
deleted since is never read as a position of the stream that now has its ID."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from domain.offsets import START, UNSTATED, Minting, Offset, incarnation, parse

FIRST = datetime(2026, 12, 7, 9, 0, 0, 123456, tzinfo=UTC)
AGAIN = FIRST + timedelta(seconds=5)  # the same ID, deleted and created again


def test_an_offset_states_its_stream_s_creation_time_and_sorts_as_the_stream() -> None:
    minting = Minting(FIRST)
    texts = [minting.text(n) for n in (0, 1, 9, 10, 99, 12345)]
    assert texts == sorted(texts)
    assert texts[1] == f"{incarnation(FIRST):016d}_0000000000000001"
    assert incarnation(FIRST) == int(FIRST.timestamp()) * 1_000_000 + 123456
    assert [minting.resolve(parse(t) or START) for t in texts] == [0, 1, 9, 10, 99, 12345]


def test_an_offset_of_a_stream_deleted_since_is_another_stream_s() -> None:
    old, new = Minting(FIRST), Minting(AGAIN)
    kept = parse(old.text(40))
    assert kept is not None
    assert new.resolve(kept) is None  # not position 40 of the new stream
    assert old.resolve(kept) == 40
    # It sorts before every offset the new stream mints: a read from it is a read from the
    # start, as its order says.
    assert old.text(40) < new.text(0)


def test_an_offset_minted_before_incarnations_were_stated_is_taken_as_it_always_was() -> None:
    legacy = parse("0000000000000000_0000000000000007")
    assert legacy == Offset(UNSTATED, 7)
    assert Minting(AGAIN).resolve(legacy) == 7
    assert Minting(AGAIN).resolve(START) == 0


def test_a_fork_s_inherited_positions_are_its_sources_offsets() -> None:
    root = FIRST
    middle = FIRST + timedelta(seconds=1)  # forked from root at 10
    fork = FIRST + timedelta(seconds=2)  # forked from middle at 15
    chain = [(middle, 15), (root, 10)]
    minting = Minting(fork, chain)
    assert minting.minter(3) == incarnation(root)
    assert minting.minter(10) == incarnation(root)  # the fork point is the source's offset
    assert minting.minter(11) == incarnation(middle)
    assert minting.minter(15) == incarnation(middle)
    assert minting.minter(16) == incarnation(fork)
    # The same text as the source mints for the same position.
    assert minting.text(12) == Minting(middle, [(root, 10)]).text(12)
    assert minting.text(7) == Minting(root).text(7)
    # Offsets of the sources within the inherited prefix resolve; past it, they do not.
    assert minting.resolve(Offset(incarnation(middle), 15)) == 15
    assert minting.resolve(Offset(incarnation(middle), 16)) is None
    assert minting.resolve(Offset(incarnation(root), 12)) is None


@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=20),
    st.integers(0, 10**9),
    st.integers(1, 10**9),
)
def test_offsets_of_one_stream_sort_as_their_positions(
    positions: list[int], micros: int, later: int
) -> None:
    created = FIRST + timedelta(microseconds=micros)
    minting = Minting(created)
    texts = sorted(minting.text(n) for n in positions)
    assert [minting.resolve(parse(t) or START) for t in texts] == sorted(positions)
    # Another incarnation, created later, never resolves them, and mints above them all.
    other = Minting(created + timedelta(microseconds=later))
    assert all(other.resolve(parse(t) or START) is None for t in texts)
    assert max(texts) < other.text(0)
