"""Stateful property test: the Stream aggregate against a deliberately naive model.

The model keeps every record's size in a list and computes credit by scanning, the opposite of
the aggregate's O(1) running totals and kept credit floor; only the consumers created as holding
credit count, a tracking one (created by a principal that may only read) holds nothing back, and
an admin may remove any consumer (whatever it held is released, also under a legal hold). Every
step both must agree on the outcome, and the journal
must always replay into the same state: the whole journal, and the compacted one (the latest
snapshot and what follows it; a legal hold keeps what came before until it is lifted), with
snapshots taken every few versions so that a history crosses several."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from application.deciding import snapshot_if_due
from domain import errors
from domain import events as ev
from domain.state import copy_state, slowest_holding
from domain.stream import Stream, tracking_share
from tests.support.builders import NOW, definition, new_key, record

MAX_UNREAD_ITEMS = 8
MAX_UNREAD_BYTES = 40
MAX_TOTAL_ITEMS = 30
MAX_CONSUMERS = 2  # of each kind
SNAPSHOT_EVERY = 5

consumers = st.sampled_from(["c1", "c2", "c3", "c4"])
principals = st.sampled_from(["alice", "bob"])


class StreamMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.stream, created = Stream.create(
            new_key(),
            definition(
                max_unread_items=MAX_UNREAD_ITEMS,
                max_unread_bytes=MAX_UNREAD_BYTES,
                max_total_items=MAX_TOTAL_ITEMS,
            ),
            NOW,
        )
        self.journal: list[ev.Event] = [created]  # every event ever
        self.compacted: list[ev.Event] = [created]  # what a stream's journal holds
        self.snapshots = 0
        # the model
        self.sizes: list[int] = []  # sizes[i] is the size of sequence i + 1
        self.earliest = 1
        self.acks: dict[str, tuple[str, int]] = {}
        self.holding: dict[str, bool] = {}  # whether each consumer holds credit
        self.closed = False
        self.hold = False

    def _apply(self, events: list[ev.Event]) -> None:
        before = self.stream.state.version
        for event in events:
            self.stream.apply(event)
        if events:
            unsnapshotted = copy_state(self.stream.state)
            snapshot = snapshot_if_due(self.stream, before, SNAPSHOT_EVERY, NOW)
            if snapshot is not None:
                # A snapshot changes nothing but the version, and carries exactly the state.
                unsnapshotted.version += 1
                assert self.stream.state == unsnapshotted == snapshot.state
                events = [*events, snapshot]
                self.snapshots += 1
        for event in events:
            stored = ev.decode_event(ev.encode_event(event))
            self.journal.append(stored)
            self.compacted.append(stored)
        if not self.stream.state.legal_hold.enabled:
            latest = max(
                (i for i, e in enumerate(self.compacted) if isinstance(e, ev.StreamSnapshotted)),
                default=0,
            )
            del self.compacted[:latest]

    def _model_unread(self) -> tuple[int, int]:
        floor = min((seq for c, (_, seq) in self.acks.items() if self.holding[c]), default=0)
        floor = max(floor, self.earliest - 1)
        return len(self.sizes) - floor, sum(self.sizes[floor:])

    @rule(sizes=st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=4))
    def append(self, sizes: list[int]) -> None:
        batch = [record(b"x" * n) for n in sizes]
        items, size = self._model_unread()
        try:
            events = self.stream.append(batch, NOW)
        except errors.StreamClosed:
            assert self.closed
            return
        except errors.QuotaExhausted:
            assert len(self.sizes) + len(sizes) > MAX_TOTAL_ITEMS
            return
        except errors.InvalidInput:
            assert len(sizes) > MAX_UNREAD_ITEMS or sum(sizes) > MAX_UNREAD_BYTES
            return
        except errors.Backpressure:
            assert items + len(sizes) > MAX_UNREAD_ITEMS or size + sum(sizes) > MAX_UNREAD_BYTES
            return
        assert not self.closed
        assert items + len(sizes) <= MAX_UNREAD_ITEMS and size + sum(sizes) <= MAX_UNREAD_BYTES
        [appended] = events
        assert isinstance(appended, ev.RecordsAppended)
        assert appended.first_sequence == len(self.sizes) + 1
        self._apply(events)
        self.sizes.extend(sizes)

    @rule(consumer=consumers, principal=principals, holds=st.booleans(), data=st.data())
    def acknowledge(self, consumer: str, principal: str, holds: bool, data: st.DataObject) -> None:
        head = len(self.sizes)
        sequence = data.draw(st.integers(min_value=0, max_value=head + 2))
        offset = sum(self.sizes[:sequence]) if self.earliest <= sequence <= head else None
        owner = self.acks.get(consumer)
        room_full = sum(h == holds for h in self.holding.values()) >= MAX_CONSUMERS
        # A principal's own consumers that only track: at most its share of their room.
        mine = sum(1 for c, (p, _) in self.acks.items() if p == principal and not self.holding[c])
        share_full = not holds and mine >= tracking_share(MAX_CONSUMERS)
        try:
            events = self.stream.acknowledge(
                consumer,
                principal,
                sequence,
                offset,
                NOW,
                holds_credit=holds,
                max_consumers=MAX_CONSUMERS,
            )
        except errors.CrossScopeAck:
            assert owner is not None and owner[0] != principal
            return
        except errors.TooManyConsumers:
            assert owner is None
            assert room_full or share_full
            return
        except errors.AckAheadOfHead:
            assert sequence > head
            return
        except errors.AckRegression:
            assert owner is not None and sequence < owner[1]
            return
        assert owner is None or (owner[0] == principal and sequence >= owner[1])
        assert owner is not None or not (room_full or share_full)
        assert sequence <= head
        self._apply(events)
        self.acks[consumer] = (principal, sequence)
        self.holding.setdefault(consumer, holds)  # decided when it is created

    @rule(consumer=consumers)
    def remove_consumer(self, consumer: str) -> None:
        try:
            events = self.stream.remove_consumer(consumer, NOW)
        except errors.UnknownConsumer:
            assert consumer not in self.acks
            return
        self._apply(events)  # a legal hold does not refuse it
        del self.acks[consumer], self.holding[consumer]

    @rule()
    def close(self) -> None:
        self._apply(self.stream.close(NOW))
        self.closed = True

    @rule(enabled=st.booleans())
    def legal_hold(self, enabled: bool) -> None:
        self._apply(self.stream.set_legal_hold(enabled, None, NOW))
        self.hold = enabled

    @precondition(lambda self: self.sizes)
    @rule(data=st.data())
    def prune(self, data: st.DataObject) -> None:
        through = data.draw(st.integers(min_value=self.earliest - 1, max_value=len(self.sizes)))
        try:
            events = self.stream.prune(through, sum(self.sizes[:through]), "retention", NOW)
        except errors.LegalHoldActive:
            assert self.hold
            return
        assert not self.hold
        self._apply(events)
        self.earliest = max(self.earliest, through + 1)

    @invariant()
    def state_matches_the_model(self) -> None:
        s = self.stream.state
        assert s.head == len(self.sizes)
        assert s.total_items == len(self.sizes) and s.total_bytes == sum(self.sizes)
        assert s.earliest == self.earliest and s.closed == self.closed
        assert s.legal_hold.enabled == self.hold
        credit = self.stream.credit()
        assert (credit.unread_items, credit.unread_bytes) == self._model_unread()
        assert {c: (v.principal, v.acked_sequence) for c, v in s.consumers.items()} == self.acks
        assert {c: v.holds_credit for c, v in s.consumers.items()} == self.holding
        assert s.consumer_count == len(self.acks)
        assert s.holding_count == sum(self.holding.values())
        # The floor kept by acks and removals is the one a scan of the consumers gives.
        assert s.credit_floor == slowest_holding(s.consumers)

    @invariant()
    def the_journal_replays_into_the_same_state(self) -> None:
        assert Stream.replay(self.stream.key, self.journal).state == self.stream.state

    @invariant()
    def the_compacted_journal_replays_into_the_same_state_and_stays_bounded(self) -> None:
        assert isinstance(self.compacted[0], ev.StreamCreated | ev.StreamSnapshotted)
        assert Stream.replay(self.stream.key, self.compacted).state == self.stream.state
        if not self.hold:
            assert len(self.compacted) <= SNAPSHOT_EVERY
        if self.snapshots:
            assert isinstance(self.compacted[0], ev.StreamSnapshotted) or self.hold
        # Replay from the latest snapshot (what a held stream's journal is read from) too.
        latest = max(
            i
            for i, e in enumerate(self.compacted)
            if isinstance(e, ev.StreamSnapshotted | ev.StreamCreated)
        )
        assert Stream.replay(self.stream.key, self.compacted[latest:]).state == self.stream.state


StreamMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, derandomize=True
)
TestStreamAgainstModel = StreamMachine.TestCase
