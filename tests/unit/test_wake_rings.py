"""Rings of pull-wake subscriptions, each watching the wake stream of the one before it: the
search through one (`wake_cycle`) against reachability worked out the long way."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.errors import InvalidInput
from domain.subscriptions import StreamPath, Watcher, refuse_wake_cycles, wake_cycle

PATHS = [StreamPath("r", f"s{i}") for i in range(6)]


def watcher(i: int, wake: int, streams: set[int], pattern: str | None = None) -> Watcher:
    return Watcher(f"w{i}", PATHS[wake], pattern, frozenset(PATHS[s] for s in streams))


def reaches_itself(watchers: list[Watcher], start: str) -> bool:
    by_id = {w.id: w for w in watchers}
    edges = {w.id: {v.id for v in watchers if v.watches(w.wake_stream)} for w in watchers}
    seen: set[str] = set()
    todo = list(edges[start])
    while todo:
        at = todo.pop()
        if at == start:
            return True
        if at not in seen:
            seen.add(at)
            todo.extend(edges[at])
    return start not in by_id


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.sets(st.integers(0, 5), max_size=3)),
        min_size=1,
        max_size=6,
    )
)
def test_a_ring_is_found_exactly_when_the_start_reaches_itself(
    shapes: list[tuple[int, set[int]]],
) -> None:
    watchers = [watcher(i, wake, streams) for i, (wake, streams) in enumerate(shapes)]
    ring = wake_cycle(watchers, "w0")
    assert (ring is not None) == reaches_itself(watchers, "w0")
    if ring is not None:
        by_id = {w.id: w for w in watchers}
        assert ring[0] == "w0" and len(set(ring)) == len(ring)
        # Each watches the wake stream of the one before it, and the start the last one's.
        for before, after in zip(ring, [*ring[1:], "w0"], strict=True):
            assert by_id[after].watches(by_id[before].wake_stream)


def test_patterns_count_as_watching_and_the_answer_names_the_ring_or_not() -> None:
    a = watcher(0, 0, set(), pattern="r/s1")
    b = watcher(1, 1, set(), pattern="r/s0")
    assert wake_cycle([a, b], "w0") == ["w0", "w1"]
    with pytest.raises(InvalidInput, match="'w1' → 'w0' → 'w1'"):
        refuse_wake_cycles([a], b, named=True)
    with pytest.raises(InvalidInput) as refused:
        refuse_wake_cycles([a], b, named=False, field="streams")
    assert "w0" not in str(refused.value) and "1 other" in str(refused.value)
    refuse_wake_cycles([a], watcher(1, 1, {2}), named=True)  # a chain: served


def test_a_search_past_its_budget_refuses_the_change_rather_than_hold_the_loop() -> None:
    """Thousands of pattern pull-wakes each waking the next: the search stops at RING_CHECKS
    pattern matches, with a 400, instead of holding the event loop for seconds."""
    many = [
        Watcher(f"w{i:05d}", StreamPath("r", f"wake{i}"), f"r/wake{i - 1}", frozenset())
        for i in range(1, 400)
    ]
    with pytest.raises(InvalidInput, match="too many ways"):
        wake_cycle(many, "w00001")
