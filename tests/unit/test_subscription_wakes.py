"""A wake's snapshot (domain/subscriptions.py, `Subscription.issue_wake`): the streams with
pending work, at most WAKE_STREAMS of them, each in its turn however often the others grow."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.subscriptions import (
    WAKE_STREAMS,
    InvalidOffset,
    Link,
    StreamPath,
    Subscription,
    SubscriptionConfig,
)

CONFIG = SubscriptionConfig(
    type="webhook",
    pattern="r/*",
    streams=(),
    webhook_url="http://127.0.0.1:9/h",
    wake_stream=None,
    lease_ttl_ms=30_000,
    description=None,
)


def subscription(count: int) -> Subscription:
    sub = Subscription(
        tenant="t", id="s", config=CONFIG, created_at=0.0, created_by="a", base_url="http://x"
    )
    paths = [StreamPath("r", f"s{i:05d}") for i in range(count)]
    return sub.with_links({p: Link(p, explicit=False, glob=True, acked=0) for p in paths})


def done(sub: Subscription) -> Subscription:
    """The wake's snapshot acknowledged, the wake ended."""
    assert sub.wake is not None
    heads = dict(sub.wake.tails)
    return sub.acknowledged(list(sub.wake.tails), heads).finished()


def test_a_wake_names_the_pending_streams_only() -> None:
    sub = subscription(5)
    heads = {StreamPath("r", "s00001"): 3, StreamPath("r", "s00003"): 1}
    woken = sub.issue_wake(heads)
    assert woken.wake is not None
    assert woken.wake.tails == ((StreamPath("r", "s00001"), 3), (StreamPath("r", "s00003"), 1))
    assert [s.path.stream_id for s in woken.wake_streams(heads)] == ["s00001", "s00003"]


def test_past_wake_streams_pending_each_stream_is_named_in_its_turn() -> None:
    """The first streams grow before every wake: the others are named all the same, the next
    wake after the last one the wake before named."""
    sub = subscription(WAKE_STREAMS + 500)
    heads = {link.path: 1 for link in sub.links}
    named: set[StreamPath] = set()
    for wake in range(2):
        sub = sub.issue_wake(heads)
        assert sub.wake is not None
        assert len(sub.wake.tails) == (WAKE_STREAMS, 500 + 10)[wake]
        assert list(sub.wake.tails) == sorted(sub.wake.tails)
        named.update(path for path, _ in sub.wake.tails)
        sub = done(sub)
        # The first ten streams have new records before the next wake.
        for link in sub.links[:10]:
            heads[link.path] += 1
    assert named == {link.path for link in sub.links}


@given(
    st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=40),
    st.integers(min_value=1, max_value=6),
    st.lists(st.integers(min_value=0, max_value=39), max_size=10),
)
def test_no_pending_stream_waits_longer_than_its_turn(
    heads_of: list[int], limit: int, growing: list[int]
) -> None:
    """A wake names at most `limit` pending streams. Done one after the other, whatever grows
    meanwhile (`growing`: the streams that get a record before each next wake, and so may be
    named before one pending since the start), every stream pending at the first wake is named
    within one turn over the links, ceil(links / limit) wakes: each wake names the next pending
    streams after the last one named, so passes `limit` of them or reaches it."""
    sub = subscription(len(heads_of))
    heads = {link.path: h for link, h in zip(sub.links, heads_of, strict=True)}
    pending = {p for p, h in heads.items() if h > 0}
    named: set[StreamPath] = set()
    for _ in range(-(-len(heads_of) // limit)):
        sub = sub.issue_wake(heads, limit)
        assert sub.wake is not None
        assert len(sub.wake.tails) <= limit
        named.update(path for path, _ in sub.wake.tails)
        sub = done(sub)
        for i in growing:
            if i < len(sub.links):
                heads[sub.links[i].path] += 1
    assert pending <= named


def test_the_state_keeps_where_the_last_wake_ended() -> None:
    sub = subscription(3).issue_wake({StreamPath("r", "s00002"): 1})
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(sub), type=Subscription)
    assert again.woken_up_to == StreamPath("r", "s00002")


def test_a_stream_deleted_and_created_again_is_another_for_an_ack_and_a_done() -> None:
    """A wake names stream `r/s00000` of incarnation 1; it is deleted and created again
    (incarnation 2, its link made anew at 0) and grows past the wake's tail. The wake's `done`
    acknowledges nothing of it, and an ack of an offset the old stream issued is refused: the
    new stream's records were never shown."""
    path = StreamPath("r", "s00000")
    sub = subscription(0).with_links({path: Link(path, False, True, acked=0, incarnation=1)})
    woken = sub.issue_wake({path: 5})
    assert woken.wake is not None and woken.wake.incarnations == ((path, 1),)
    again = woken.with_links({path: Link(path, False, True, acked=0, incarnation=2)})
    assert woken.wake.tails_of_the_same_streams(again.links) == []
    assert woken.wake.tails_of_the_same_streams(woken.links) == [(path, 5)]
    with pytest.raises(InvalidOffset):
        again.acknowledged([(path, 5)], {path: 9}, [1])
    assert again.acknowledged([(path, 5)], {path: 9}, [2]).links[0].acked == 5
    # Not stated (a native ack by sequence), or not known: as before.
    assert again.acknowledged([(path, 5)], {path: 9}).links[0].acked == 5


def test_each_ack_of_one_stream_is_checked_against_the_stream_it_names() -> None:
    """Two acks of one stream, the first of an offset another stream issued: refused, whatever
    the second says (acks are all or nothing)."""
    path = StreamPath("r", "s00000")
    sub = subscription(0).with_links({path: Link(path, False, True, acked=0, incarnation=2)})
    with pytest.raises(InvalidOffset):
        sub.acknowledged([(path, 3), (path, 3)], {path: 9}, [1, 2])
