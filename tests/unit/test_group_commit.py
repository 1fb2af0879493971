"""Append coalescing: concurrent commands on one stream share transactions, and stay isolated."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import pytest

from adapters.memory.streams import MemoryStreams
from application.errors import NotFound
from application.group_commit import GroupCommit
from application.ports import Command, Done, Failed, Outcome
from application.waiting import Unanswered, request_budget
from domain import errors
from domain.stream import StreamKey
from tests.support.builders import NOW, append, definition, new_key, record


class SlowStreams(MemoryStreams):
    """Each transaction takes a moment, as a WAL flush does, and groups are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[int] = []
        self.fail_next = False

    async def update(self, key: StreamKey, commands: Sequence[Command]) -> list[Outcome]:
        self.groups.append(len(commands))
        await asyncio.sleep(0.01)
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("database went away")
        return await super().update(key, commands)


async def test_concurrent_appends_are_committed_in_far_fewer_transactions() -> None:
    streams = SlowStreams()
    key = new_key()
    await streams.create(key, definition(), NOW)
    commits = GroupCommit(streams)
    outcomes = await asyncio.gather(*(commits.submit(key, append()) for _ in range(100)))
    assert sorted(o.answer.first_sequence for o in outcomes) == list(range(1, 101))
    assert sum(streams.groups) == 100
    assert len(streams.groups) <= 3  # one lone leader, then everything that queued meanwhile


async def test_a_refused_request_does_not_fail_or_reorder_its_group() -> None:
    streams = SlowStreams()
    key = new_key()
    await streams.create(key, definition(max_unread_items=5), NOW)
    commits = GroupCommit(streams)
    first = asyncio.ensure_future(commits.submit(key, append()))
    await asyncio.sleep(0)  # the lone leader starts with `first`; the rest queue behind it
    batch = [
        append(),
        append([record() for _ in range(5)]),  # passes the unread ceiling: refused alone
        append(),
    ]
    outcomes = await asyncio.gather(*(commits.submit(key, c) for c in batch))
    assert isinstance((await first), Done)
    assert isinstance(outcomes[0], Done) and outcomes[0].answer.first_sequence == 2
    assert isinstance(outcomes[1], Failed) and isinstance(outcomes[1].error, errors.Backpressure)
    assert isinstance(outcomes[2], Done) and outcomes[2].answer.first_sequence == 3


async def test_a_failed_transaction_fails_its_group_and_the_next_group_still_commits() -> None:
    streams = SlowStreams()
    key = new_key()
    await streams.create(key, definition(), NOW)
    commits = GroupCommit(streams)
    streams.fail_next = True
    with pytest.raises(ConnectionError):
        await commits.submit(key, append())
    outcome = await commits.submit(key, append())
    assert isinstance(outcome, Done) and outcome.answer.first_sequence == 1


async def test_a_caller_that_gives_up_does_not_cancel_the_groups_commit() -> None:
    streams = SlowStreams()
    key = new_key()
    await streams.create(key, definition(), NOW)
    commits = GroupCommit(streams)
    waiter = asyncio.ensure_future(commits.submit(key, append()))
    await asyncio.sleep(0.001)
    waiter.cancel()
    await commits.drain()
    position, _ = await streams.page(key, 0, 10)
    assert position.head == 1


class CountingStreams(MemoryStreams):
    """Each batch takes a moment, as a WAL flush does; batches are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    async def update_many(
        self, groups: Sequence[tuple[StreamKey, Sequence[Command]]]
    ) -> list[list[Outcome] | Exception]:
        self.batches.append(len(groups))
        await asyncio.sleep(0.01)
        return await super().update_many(groups)


async def test_appends_waiting_for_many_streams_share_one_batch() -> None:
    streams = CountingStreams()
    keys = [new_key() for _ in range(100)]
    for key in keys:
        await streams.create(key, definition(), NOW)
    commits = GroupCommit(streams)
    outcomes = await asyncio.gather(*(commits.submit(k, append()) for k in keys for _ in range(2)))
    assert all(isinstance(o, Done) for o in outcomes)
    assert sum(streams.batches) <= 200 and len(streams.batches) <= 3
    for key in keys:
        _, records = await streams.page(key, 0, 10)
        assert [r.sequence for r in records] == [1, 2]


async def test_a_missing_stream_in_a_batch_fails_only_its_own_requests() -> None:
    streams = CountingStreams()
    here, gone = new_key(), new_key()
    await streams.create(here, definition(), NOW)
    commits = GroupCommit(streams)
    first = asyncio.ensure_future(commits.submit(here, append()))
    await asyncio.sleep(0)
    results = await asyncio.gather(
        commits.submit(gone, append()), commits.submit(here, append()), return_exceptions=True
    )
    assert isinstance(await first, Done)
    assert isinstance(results[0], NotFound)
    assert isinstance(results[1], Done) and results[1].answer.first_sequence == 2
    assert streams.batches[-1] == 2


async def test_a_batch_is_bounded_in_streams_and_the_rest_follow_in_order() -> None:
    streams = CountingStreams()
    keys = [new_key() for _ in range(10)]
    for key in keys:
        await streams.create(key, definition(), NOW)
    commits = GroupCommit(streams, max_batch_streams=3)
    outcomes = await asyncio.gather(*(commits.submit(k, append()) for k in keys))
    assert all(isinstance(o, Done) for o in outcomes)
    assert max(streams.batches) <= 3 and sum(streams.batches) == 10
    assert not commits._queues and not commits._ready  # nothing kept once idle


class SizedStreams(MemoryStreams):
    """A batch takes longer the more records it holds (1 ms per 100), as COPY and the WAL do;
    each batch's streams are recorded in commit order."""

    def __init__(self) -> None:
        super().__init__()
        self.committed: list[list[StreamKey]] = []

    async def update_many(
        self, groups: Sequence[tuple[StreamKey, Sequence[Command]]]
    ) -> list[list[Outcome] | Exception]:
        records = sum(len(c.records) for _, commands in groups for c in commands)
        await asyncio.sleep(0.005 + records / 100_000)
        self.committed.append([key for key, _ in groups])
        return await super().update_many(groups)


def _large(n: int = 20_000) -> Command:
    return append([record() for _ in range(n)])


async def test_a_large_batch_commits_aside_and_other_streams_do_not_wait_for_it() -> None:
    streams = SizedStreams()
    big, small = new_key(), new_key()
    for key in (big, small):
        await streams.create(key, definition(max_unread_items=100_000), NOW)
    commits = GroupCommit(streams, aside_records=1_000)
    large = asyncio.ensure_future(commits.submit(big, _large()))  # 0.2 s to commit
    await asyncio.sleep(0.01)
    for n in range(1, 6):  # one after the other, each its own batch: 5 batches meanwhile
        outcome = await commits.submit(small, append())
        assert isinstance(outcome, Done) and outcome.answer.first_sequence == n
    assert not large.done()
    assert isinstance(await large, Done)
    assert streams.committed[-1] == [big]


async def test_a_stream_committing_aside_keeps_its_order() -> None:
    streams = SizedStreams()
    key = new_key()
    await streams.create(key, definition(max_unread_items=100_000), NOW)
    commits = GroupCommit(streams, aside_records=1_000)
    large = asyncio.ensure_future(commits.submit(key, _large()))
    await asyncio.sleep(0.01)  # committing aside now
    later = await asyncio.gather(*(commits.submit(key, append()) for _ in range(3)))
    assert isinstance(await large, Done)
    assert [o.answer.first_sequence for o in later] == [20_001, 20_002, 20_003]
    _, records = await streams.page(key, 20_000, 10)
    assert [r.sequence for r in records] == [20_001, 20_002, 20_003]
    assert not commits._queues and not commits._ready and not commits._aside_streams


async def test_at_most_max_aside_batches_commit_aside_and_drain_waits_for_them() -> None:
    streams = SizedStreams()
    keys = [new_key() for _ in range(3)]
    for key in keys:
        await streams.create(key, definition(max_unread_items=100_000), NOW)
    commits = GroupCommit(streams, aside_records=1_000, max_aside=2)
    large = [asyncio.ensure_future(commits.submit(k, _large())) for k in keys]
    await asyncio.sleep(0.01)
    assert len(commits._aside) == 2  # the third waits for a slot, never in the leader's turn
    assert not large[2].done() and keys[2] in commits._queues
    await commits.drain()
    assert all(f.done() and isinstance(f.result(), Done) for f in large)
    assert not commits._aside and not commits._aside_streams


# Found by a review of the change that made large batches commit aside.


async def test_a_leader_waiting_for_an_aside_still_commits_other_streams() -> None:
    """`big` commits aside and a small append to `big` queues behind it, so the leader finds
    only `big` ready and waits for the aside: an append to another stream arriving then is
    committed at once, not after the aside."""
    streams = SizedStreams()
    big, small = new_key(), new_key()
    for key in (big, small):
        await streams.create(key, definition(max_unread_items=100_000), NOW)
    commits = GroupCommit(streams, aside_records=1_000)
    large = asyncio.ensure_future(commits.submit(big, _large()))  # 0.2 s aside
    await asyncio.sleep(0.01)
    behind = asyncio.ensure_future(commits.submit(big, append()))  # waits for the aside
    await asyncio.sleep(0.01)  # the leader waits for the aside now
    outcome = await commits.submit(small, append())
    assert isinstance(outcome, Done)
    assert not large.done()  # it did not wait for the aside
    await asyncio.gather(large, behind)
    assert isinstance(behind.result(), Done) and behind.result().answer.first_sequence == 20_001


async def test_a_slot_freed_by_an_aside_that_ended_is_used_by_the_next_large_batch() -> None:
    """When an aside ends, the leader sees its slot free: the next large batch commits aside
    too, not in the leader's own turn (the ended task was still counted when the leader woke,
    and every other stream waited for the large batch)."""
    streams = SizedStreams()
    a, b, c = new_key(), new_key(), new_key()
    for key in (a, b, c):
        await streams.create(key, definition(max_unread_items=200_000), NOW)
    commits = GroupCommit(streams, aside_records=1_000)
    first = asyncio.ensure_future(commits.submit(a, _large(5_000)))  # 0.055 s aside
    other = asyncio.ensure_future(commits.submit(b, _large(40_000)))  # 0.405 s aside
    await asyncio.sleep(0.01)
    assert len(commits._aside) == 2
    second = asyncio.ensure_future(commits.submit(a, _large(20_000)))  # 0.205 s, behind `first`
    await first
    await asyncio.sleep(0.01)  # the leader has taken `second`
    outcome = await commits.submit(c, append())
    assert isinstance(outcome, Done)
    assert not second.done()  # `second` commits aside: `c` did not wait for it
    await asyncio.gather(second, other)


async def test_an_aside_cancelled_before_it_starts_leaves_nothing_behind() -> None:
    """A task cancelled before its first step never runs its coroutine: its streams must not
    stay passed over, nor its requests unanswered (the next append to such a stream made the
    leader spin without awaiting, freezing the event loop)."""
    streams = SizedStreams()
    key = new_key()
    await streams.create(key, definition(max_unread_items=200_000), NOW)
    commits = GroupCommit(streams, aside_records=1_000)
    original = commits._commit_aside

    def cancelled_at_once(batch: Any) -> None:
        original(batch)
        for task in commits._aside:
            task.cancel()  # as a cancelled drain()'s gather would, in the same tick

    commits._commit_aside = cancelled_at_once  # type: ignore[method-assign]
    large = asyncio.ensure_future(commits.submit(key, _large(2_000)))
    await asyncio.sleep(0.05)
    assert not commits._aside_streams
    assert large.done() and isinstance(large.exception(), RuntimeError)
    commits._commit_aside = original  # type: ignore[method-assign]
    outcome = await commits.submit(key, append())
    assert isinstance(outcome, Done) and outcome.answer.first_sequence == 1


async def test_a_leader_waits_for_an_aside_only_when_every_ready_stream_is_aside() -> None:
    """A batch is empty also when the streams `_take_batches` looked at held only expired
    requests; the leader waits for an aside only when no ready stream may be taken (shown with
    `max_batch_streams=1`; by default it takes 256 such streams, as in a database slowdown)."""
    streams = SizedStreams()
    x, w, y, z = (new_key() for _ in range(4))
    for key in (x, w, y, z):
        await streams.create(key, definition(max_unread_items=200_000), NOW)
    commits = GroupCommit(streams, aside_records=30_000, max_aside=1, max_batch_streams=1)
    x_large, w_many = _large(100_000), _large(20_000)  # (built before: building takes time)
    aside = asyncio.ensure_future(commits.submit(x, x_large))  # 1 s aside
    await asyncio.sleep(0.01)
    inline = asyncio.ensure_future(commits.submit(w, w_many))  # 0.2 s in the leader (small)
    await asyncio.sleep(0.01)
    with pytest.raises(Unanswered) as expired, request_budget(0.02):
        await commits.submit(y, append())  # expires queued: y's queue is left empty, ready
    assert not expired.value.outcome_unknown
    late = asyncio.ensure_future(commits.submit(z, append()))
    await inline
    assert isinstance(await late, Done)
    assert not aside.done()  # `z` did not wait for x's aside
    await aside


def _recording_asides(commits: GroupCommit) -> list[list[StreamKey]]:
    """The streams of each batch `commits` commits aside, in order, as it commits them."""
    aside: list[list[StreamKey]] = []
    original = commits._commit_aside

    def recorded(batch: Any) -> None:
        aside.append([key for key, _ in batch])
        original(batch)

    commits._commit_aside = recorded  # type: ignore[method-assign]
    return aside


async def test_a_batch_of_megabytes_in_few_records_commits_aside() -> None:
    streams = SizedStreams()
    big, small = new_key(), new_key()
    for key in (big, small):
        await streams.create(key, definition(max_unread_items=100_000), NOW)
    commits = GroupCommit(streams, aside_records=1_000, aside_bytes=64_000)
    aside = _recording_asides(commits)
    outcome = await commits.submit(big, append([record(b"1" * 1_000)] * 100))  # 100 KB
    assert isinstance(outcome, Done) and aside == [[big]]  # 100 records, under 1,000
    outcome = await commits.submit(small, append([record()] * 100))  # 100 records, 700 bytes
    assert isinstance(outcome, Done) and aside == [[big]]


# Large work beside small appends: a hostile tenant's 8 MB appends, with both aside slots busy,
# committed in the leader's own turn, and another tenant's one-record appends waited behind
# them (p50 1.6 s); a small request taken into a large batch waited for all of it too.


class HeldStreams(MemoryStreams):
    """Each batch is recorded (per stream, its commands); a batch holding a request of `large`
    records or more waits for `gate`, as a large transaction holds its connection, and every
    batch takes 1 ms per 1,000 records."""

    def __init__(self, large: int = 1_000) -> None:
        super().__init__()
        self.large = large
        self.gate = asyncio.Event()
        self.calls: list[list[tuple[StreamKey, list[Command]]]] = []

    async def update_many(
        self, groups: Sequence[tuple[StreamKey, Sequence[Command]]]
    ) -> list[list[Outcome] | Exception]:
        self.calls.append([(key, list(commands)) for key, commands in groups])
        sizes = [len(c.records) for _, commands in groups for c in commands]
        if max(sizes) >= self.large:
            await self.gate.wait()
        await asyncio.sleep(0.001 + sum(sizes) / 1_000_000)
        return await super().update_many(groups)

    def keys(self) -> list[list[StreamKey]]:
        return [[key for key, _ in call] for call in self.calls]

    def large_alone(self) -> bool:
        """Every batch that held a large request held its stream alone."""
        return all(
            len(call) == 1
            for call in self.calls
            if any(len(c.records) >= self.large for _, cs in call for c in cs)
        )


async def _streams(streams: MemoryStreams, n: int) -> list[StreamKey]:
    keys = [new_key() for _ in range(n)]
    for key in keys:
        await streams.create(key, definition(max_unread_items=1_000_000), NOW)
    return keys


async def _slots_busy(commits: GroupCommit, keys: list[StreamKey]) -> list[asyncio.Future[Any]]:
    """A large request on each of `keys`, one after the other: each commits aside, held."""
    held = []
    for key in keys:
        held.append(asyncio.ensure_future(commits.submit(key, _large(2_000))))
        await asyncio.sleep(0.01)
    assert len(commits._aside) == len(keys)
    return held


async def test_with_both_aside_slots_busy_a_small_append_does_not_wait_for_a_large_one() -> None:
    streams = HeldStreams()
    l1, l2, l3, small = await _streams(streams, 4)
    commits = GroupCommit(streams, aside_records=1_000)
    held = await _slots_busy(commits, [l1, l2])
    third = asyncio.ensure_future(commits.submit(l3, _large(2_000)))  # no slot: passed over
    await asyncio.sleep(0.01)  # (the leader waits for a slot now)
    outcome = await asyncio.wait_for(commits.submit(small, append()), 2)
    assert isinstance(outcome, Done) and outcome.answer.first_sequence == 1
    assert not third.done() and not any(f.done() for f in held)
    streams.gate.set()
    assert all(isinstance(o, Done) for o in await asyncio.gather(third, *held))
    assert streams.keys() == [[l1], [l2], [small], [l3]]  # l3 aside once a slot was free
    assert not commits._queues and not commits._ready and not commits._aside_streams


async def test_a_large_request_shares_its_transaction_with_no_other_stream() -> None:
    streams = HeldStreams()
    streams.gate.set()
    big, big2, mixed, s1, s2 = await _streams(streams, 5)
    commits = GroupCommit(streams, aside_records=1_000)
    aside = _recording_asides(commits)
    # All queued before the leader looks (one batch of them all, aside, before).
    outcomes = await asyncio.gather(
        commits.submit(s1, append()),
        commits.submit(big, _large(2_000)),
        commits.submit(big, append()),  # behind its own stream's large one: may go with it
        commits.submit(mixed, append()),
        commits.submit(mixed, _large(2_000)),  # behind a small one: a batch of its own
        commits.submit(s2, append()),
        commits.submit(big2, _large(2_000)),  # another large one: aside apart from `big`
    )
    assert all(isinstance(o, Done) for o in outcomes)
    assert [o.answer.first_sequence for o in outcomes] == [1, 1, 2_001, 1, 2, 1, 1]
    assert streams.large_alone()
    assert sorted(aside) == sorted([[big], [big2], [mixed]])  # the small ones together, inline
    assert sorted(map(sorted, streams.keys())) == sorted(
        [[big], [big2], sorted([s1, mixed, s2]), [mixed]]
    )


async def test_a_stream_with_a_large_request_then_small_ones_keeps_its_order() -> None:
    """With every slot busy its large request is passed over, and the small ones behind it
    with it (a stream is taken from its oldest request); another stream's commits meanwhile."""
    streams = HeldStreams()
    l1, l2, key, other = await _streams(streams, 4)
    commits = GroupCommit(streams, aside_records=1_000)
    held = await _slots_busy(commits, [l1, l2])
    large = asyncio.ensure_future(commits.submit(key, _large(2_000)))
    behind = [asyncio.ensure_future(commits.submit(key, append())) for _ in range(3)]
    await asyncio.sleep(0.01)
    outcome = await asyncio.wait_for(commits.submit(other, append()), 2)
    assert isinstance(outcome, Done)
    assert not large.done() and not any(f.done() for f in behind)
    streams.gate.set()
    await asyncio.gather(*held)
    assert (await large).answer.first_sequence == 1
    assert [(await f).answer.first_sequence for f in behind] == [2_001, 2_002, 2_003]
    _, records = await streams.page(key, 1_999, 10)
    assert [r.sequence for r in records] == [2_000, 2_001, 2_002, 2_003]
    assert streams.large_alone()


async def test_with_slots_busy_small_requests_commit_in_batches_below_the_thresholds() -> None:
    """And many small requests that together reach the thresholds commit aside while a slot is
    free (batched appends' throughput)."""
    streams = HeldStreams()
    l1, l2, *keys = await _streams(streams, 12)
    commits = GroupCommit(streams, aside_records=1_000)
    aside = _recording_asides(commits)
    outcomes = await asyncio.gather(*(commits.submit(k, append([record()] * 600)) for k in keys))
    assert all(isinstance(o, Done) for o in outcomes)
    assert aside == [keys]  # 6,000 records in one batch, aside
    held = await _slots_busy(commits, [l1, l2])
    calls = len(streams.calls)
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(commits.submit(k, append([record()] * 600)) for k in keys)), 2
    )
    assert all(isinstance(o, Done) and o.answer.first_sequence == 601 for o in outcomes)
    assert len(streams.calls) - calls == 10  # 600 records each: one a batch, below 1,000
    streams.gate.set()
    await asyncio.gather(*held)


async def test_a_large_head_expiring_while_passed_over_lets_the_requests_behind_it_commit() -> None:
    """Its leader waits for a slot while the stream's head is large; when that request's wait
    ends (withdrawn, never to commit), the small one behind it is taken at once."""
    streams = HeldStreams()
    l1, l2, key = await _streams(streams, 3)
    commits = GroupCommit(streams, aside_records=1_000)
    held = await _slots_busy(commits, [l1, l2])

    async def bounded() -> Outcome:
        with request_budget(0.05):
            return await commits.submit(key, _large(2_000))

    expiring = asyncio.ensure_future(bounded())
    behind = asyncio.ensure_future(commits.submit(key, append()))
    with pytest.raises(Unanswered) as expired:
        await expiring
    assert not expired.value.outcome_unknown  # withdrawn: it was never taken
    outcome = await asyncio.wait_for(behind, 2)
    assert isinstance(outcome, Done) and outcome.answer.first_sequence == 1
    streams.gate.set()
    await asyncio.gather(*held)
    assert streams.keys() == [[l1], [l2], [key]]


async def test_a_leader_with_nothing_it_may_take_waits_without_spinning() -> None:
    streams = HeldStreams()
    l1, l2, l3, small = await _streams(streams, 4)
    commits = GroupCommit(streams, aside_records=1_000)
    looks = 0
    original = commits._take_batches

    def counted(ready: Any) -> Any:
        nonlocal looks
        looks += 1
        return original(ready)

    commits._take_batches = counted  # type: ignore[method-assign]
    held = await _slots_busy(commits, [l1, l2])
    third = asyncio.ensure_future(commits.submit(l3, _large(2_000)))
    behind = asyncio.ensure_future(commits.submit(l3, append()))  # queued behind: no wake-up
    before = looks
    for _ in range(20):
        await asyncio.sleep(0.005)
    assert looks - before <= 1  # one look, then a wait for a slot
    assert isinstance(await commits.submit(small, append()), Done)
    assert looks - before <= 3 and len(streams.calls) == 3
    streams.gate.set()
    assert all(isinstance(o, Done) for o in await asyncio.gather(third, behind, *held))


async def test_mixed_large_and_small_appends_are_each_committed_once_in_order() -> None:
    """Many streams, each a random run of large and small requests arriving over time, with
    large transactions held a while: every request is committed exactly once, each stream's in
    arrival order, and no batch holds a large request and another stream."""
    rng = random.Random(7)
    streams = HeldStreams()
    keys = await _streams(streams, 12)
    commits = GroupCommit(streams, aside_records=1_000)
    plans = {key: [rng.choice([1, 1, 5, 300, 1_500]) for _ in range(8)] for key in keys}
    sent: list[tuple[StreamKey, Command, asyncio.Future[Outcome]]] = []

    async def gate() -> None:
        while True:  # held a while, let go, held again
            await asyncio.sleep(0.02)
            streams.gate.set()
            await asyncio.sleep(0.002)
            streams.gate.clear()

    opening = asyncio.ensure_future(gate())
    for step in range(8):
        for key in rng.sample(keys, len(keys)):
            command = append([record()] * plans[key][step])
            sent.append((key, command, asyncio.ensure_future(commits.submit(key, command))))
        await asyncio.sleep(rng.choice([0, 0.001, 0.01]))
    await asyncio.gather(*(f for _, _, f in sent))
    opening.cancel()
    committed = [id(c) for call in streams.calls for _, commands in call for c in commands]
    assert sorted(committed) == sorted(id(c) for _, c, _ in sent)  # each once, none lost
    for key in keys:
        mine = [f.result() for k, _, f in sent if k == key]
        firsts = [o.answer.first_sequence for o in mine]
        assert firsts == sorted(firsts) and firsts[0] == 1
        assert [o.answer.last_sequence for o in mine][-1] == sum(plans[key])
    assert streams.large_alone()
    assert not commits._queues and not commits._ready and not commits._aside_streams


async def test_a_small_append_to_a_stream_whose_large_head_expired_waits_for_no_aside() -> None:
    """With both aside slots busy, a stream's lone large request is passed over and expires:
    its queue is left empty, and the stream's next request is its head. It once woke nobody,
    and a one-record append waited for a large transaction to end."""

    streams = HeldStreams()
    l1, l2, key = await _streams(streams, 3)
    commits = GroupCommit(streams, aside_records=1_000)
    held = await _slots_busy(commits, [l1, l2])

    async def bounded():
        with request_budget(0.05):
            return await commits.submit(key, _large(2_000))

    with pytest.raises(Unanswered):
        await bounded()
    try:
        outcome = await asyncio.wait_for(commits.submit(key, append()), 1)
        assert outcome.answer.first_sequence == 1
    finally:
        streams.gate.set()
        await asyncio.gather(*held)
