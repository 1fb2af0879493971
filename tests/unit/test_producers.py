"""Durable Streams writes on the Stream aggregate: idempotent producers (PROTOCOL.md §5.2.1),
the writer sequence (`Stream-Seq`), append-and-close and close-only, decided by
`Stream.produce` and kept in the state only through events."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from application.deciding import snapshot_if_due
from domain import errors
from domain import events as ev
from domain import producers as producers_module
from domain.definition import MAX_EXACT_INTEGER
from domain.producers import ProducerClaim
from domain.state import copy_state
from domain.stream import Stream
from tests.support.builders import NOW, definition, new_key, record


def stream(**limits: object) -> Stream:
    created, _ = Stream.create(new_key(), definition(**limits), NOW)
    return created


def claim(seq: int, epoch: int = 0, producer_id: str = "p") -> ProducerClaim:
    return ProducerClaim(producer_id=producer_id, epoch=epoch, seq=seq)


def produce(s: Stream, *payloads: bytes, at=NOW, **options: object) -> list[ev.Event]:
    """Decide and apply, as a port does; the events returned."""
    events = s.produce([record(p) for p in payloads], at, **options)
    for event in events:
        s.apply(event)
    return events


def test_a_new_producer_starts_at_sequence_0_in_any_epoch() -> None:
    s = stream()
    [appended] = produce(s, b"1", producer=claim(0, epoch=3))
    assert isinstance(appended, ev.RecordsAppended) and appended.producer == claim(0, epoch=3)
    known = s.state.producers["p"]
    assert (known.epoch, known.last_seq, known.updated_at) == (3, 0, NOW)


def test_a_new_producer_that_does_not_start_at_0_is_a_gap_expecting_0() -> None:
    with pytest.raises(errors.ProducerSequenceGap) as gap:
        stream().produce([record()], NOW, producer=claim(2))
    assert gap.value.extra == {"expected_seq": 0, "received_seq": 2}


def test_sequences_follow_one_another_and_a_retry_is_a_duplicate_that_appends_nothing() -> None:
    s = stream()
    for seq in range(3):
        assert produce(s, b"x", producer=claim(seq))
    version = s.state.version
    for seq in (0, 1, 2):
        assert s.produce([record()], NOW, producer=claim(seq)) == []
    assert s.state.version == version and s.head == 3
    assert s.state.producers["p"].last_seq == 2


def test_a_skipped_sequence_is_a_gap_with_the_expected_and_received_sequence() -> None:
    s = stream()
    produce(s, b"x", producer=claim(0))
    with pytest.raises(errors.ProducerSequenceGap) as gap:
        s.produce([record()], NOW, producer=claim(2))
    assert gap.value.extra == {"expected_seq": 1, "received_seq": 2}
    assert s.head == 1 and s.state.producers["p"].last_seq == 0


def test_a_new_epoch_starts_again_at_0_and_fences_the_old_one_off() -> None:
    s = stream()
    produce(s, b"a", producer=claim(0))
    produce(s, b"b", producer=claim(1))
    produce(s, b"c", producer=claim(0, epoch=1))
    assert (s.state.producers["p"].epoch, s.state.producers["p"].last_seq) == (1, 0)
    with pytest.raises(errors.ProducerEpochStale) as stale:
        s.produce([record()], NOW, producer=claim(2))
    assert stale.value.extra == {"current_epoch": 1}
    with pytest.raises(errors.ProducerEpochStale):
        s.produce([record()], NOW, producer=claim(0))  # even what epoch 0 already wrote


def test_a_new_epoch_that_does_not_start_at_0_is_invalid_input() -> None:
    s = stream()
    produce(s, b"a", producer=claim(0))
    with pytest.raises(errors.InvalidInput, match="new producer epoch starts at sequence 0"):
        s.produce([record()], NOW, producer=claim(5, epoch=1))
    assert s.state.producers["p"].epoch == 0


def test_producers_are_independent() -> None:
    s = stream()
    produce(s, b"a0", producer=claim(0, producer_id="a"))
    produce(s, b"b0", producer=claim(0, producer_id="b"))
    produce(s, b"a1", producer=claim(1, producer_id="a"))
    produce(s, b"b1", producer=claim(1, producer_id="b"))
    assert {p: v.last_seq for p, v in s.state.producers.items()} == {"a": 1, "b": 1}
    assert s.head == 4


@pytest.mark.parametrize(
    "bad",
    [
        claim(0, producer_id=""),
        claim(0, producer_id="x" * 256),
        claim(0, producer_id="tab\there"),
        claim(-1),
        claim(0, epoch=-1),
        claim(MAX_EXACT_INTEGER + 1),
        claim(0, epoch=MAX_EXACT_INTEGER + 1),
    ],
)
def test_a_malformed_claim_is_invalid_input(bad: ProducerClaim) -> None:
    with pytest.raises(errors.InvalidInput):
        stream().produce([record()], NOW, producer=bad)


def test_stream_seq_must_increase_byte_wise() -> None:
    s = stream()
    produce(s, b"1", writer_seq="10")
    with pytest.raises(errors.WriterSequenceRegression) as regression:
        s.produce([record()], NOW, writer_seq="10")
    assert regression.value.extra == {"last_seq": "10"}
    with pytest.raises(errors.WriterSequenceRegression):
        s.produce([record()], NOW, writer_seq="09")
    produce(s, b"2", writer_seq="9")  # "9" > "10" byte-wise
    produce(s, b"3", writer_seq="9\u00e9")  # UTF-8 0xC3 0xA9 sorts after every ASCII byte
    with pytest.raises(errors.WriterSequenceRegression):
        s.produce([record()], NOW, writer_seq="9z")
    assert s.state.writer_seq == "9\u00e9" and s.head == 3


def test_a_write_without_stream_seq_leaves_the_last_one_in_place() -> None:
    s = stream()
    produce(s, b"1", writer_seq="b")
    produce(s, b"2")
    assert s.state.writer_seq == "b"
    with pytest.raises(errors.WriterSequenceRegression):
        s.produce([record()], NOW, writer_seq="a")


def test_an_empty_or_overlong_stream_seq_is_invalid_input() -> None:
    for bad in ("", "x" * 256):
        with pytest.raises(errors.InvalidInput):
            stream().produce([record()], NOW, writer_seq=bad)


def test_a_producer_retry_with_its_stream_seq_is_a_duplicate_not_a_regression() -> None:
    s = stream()
    produce(s, b"1", producer=claim(0), writer_seq="app-001")
    assert s.produce([record()], NOW, producer=claim(0), writer_seq="app-001") == []


def test_a_refused_write_changes_no_writer_state() -> None:
    s = stream(max_unread_items=1)
    produce(s, b"1", producer=claim(0), writer_seq="a")
    with pytest.raises(errors.Backpressure):
        s.produce([record()], NOW, producer=claim(1), writer_seq="b")
    assert s.state.producers["p"].last_seq == 0 and s.state.writer_seq == "a"
    with pytest.raises(errors.WriterSequenceRegression):
        s.produce([record()], NOW, producer=claim(1), writer_seq="a")
    assert s.state.producers["p"].last_seq == 0  # the regression came after the claim: kept


def test_an_append_without_records_is_invalid_unless_it_closes() -> None:
    with pytest.raises(errors.InvalidInput):
        stream().produce([], NOW)


def test_append_and_close_is_one_decision_and_its_retry_is_a_duplicate() -> None:
    s = stream()
    produce(s, b"first")
    appended, closed = produce(s, b"final", producer=claim(0), close=True)
    assert isinstance(appended, ev.RecordsAppended) and isinstance(closed, ev.StreamClosed)
    assert closed.version == appended.version + 1 and closed.producer == claim(0)
    assert s.state.closed and s.state.closed_by == claim(0) and s.head == 2
    assert s.produce([record(b"other body")], NOW, producer=claim(0), close=True) == []
    assert s.produce([record()], NOW, producer=claim(0)) == []  # with or without the close


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"close": True},
        {"producer": claim(1), "close": True},  # the closing producer's next sequence
        {"producer": claim(0, producer_id="other"), "close": True},
        {"producer": claim(0, epoch=1)},
        {"writer_seq": "z"},
    ],
)
def test_a_closed_stream_refuses_every_append_with_its_head(options: dict) -> None:
    s = stream()
    produce(s, b"1", producer=claim(0), close=True)
    with pytest.raises(errors.StreamClosed) as refused:
        s.produce([record()], NOW, **options)
    assert refused.value.extra == {"head": 1}


def test_a_closed_stream_refuses_even_a_stale_epoch_as_closed() -> None:
    s = stream()
    produce(s, b"1", producer=claim(0))
    produce(s, b"final", producer=claim(0, epoch=1), close=True)
    with pytest.raises(errors.StreamClosed):
        s.produce([record()], NOW, producer=claim(1), close=True)


def test_close_only_closes_and_again_is_a_duplicate() -> None:
    s = stream()
    produce(s, b"1")
    [closed] = produce(s, close=True)
    assert isinstance(closed, ev.StreamClosed) and closed.producer is None
    assert s.state.closed and s.state.closed_by is None and s.head == 1
    assert s.produce([], NOW, close=True) == []


def test_close_only_with_a_claim_advances_the_producer_and_its_retry_is_a_duplicate() -> None:
    s = stream()
    produce(s, b"1", producer=claim(0))
    [closed] = produce(s, producer=claim(1), close=True)
    assert closed.producer == claim(1)
    assert s.state.producers["p"].last_seq == 1 and s.state.closed_by == claim(1)
    assert s.produce([], NOW, producer=claim(1), close=True) == []
    assert s.produce([], NOW, close=True) == []
    with pytest.raises(errors.StreamClosed):
        s.produce([], NOW, producer=claim(0, producer_id="other"), close=True)


def test_close_only_with_a_duplicate_claim_does_nothing_not_even_close() -> None:
    s = stream()
    produce(s, b"1", producer=claim(0))
    assert s.produce([], NOW, producer=claim(0), close=True) == []
    assert not s.state.closed


def test_close_only_with_a_stream_seq_keeps_it() -> None:
    s = stream()
    produce(s, close=True, writer_seq="5")
    assert s.state.writer_seq == "5" and s.state.closed


def test_a_native_close_of_a_producer_closed_stream_is_a_no_op() -> None:
    s = stream()
    produce(s, b"1", producer=claim(0), close=True)
    assert s.close(NOW) == []


def test_a_native_append_to_a_closed_stream_carries_the_head() -> None:
    s = stream()
    produce(s, b"1", b"2")
    for event in s.close(NOW):
        s.apply(event)
    with pytest.raises(errors.StreamClosed) as refused:
        s.append([record()], NOW)
    assert refused.value.extra == {"head": 2}


def test_native_events_are_journaled_as_before() -> None:
    s = stream()
    [appended] = s.append([record()], NOW)
    assert b"producer" not in ev.encode_event(appended)
    assert b"writer_seq" not in ev.encode_event(appended)
    s.apply(appended)
    [closed] = s.close(NOW)
    assert ev.encode_event(closed) == (
        b'{"type":"stream_closed","version":3,"at":"2026-01-01T00:00:00Z"}'
    )


def test_past_the_producer_bound_the_least_recent_producer_is_forgotten(monkeypatch) -> None:
    monkeypatch.setattr("domain.stream.MAX_PRODUCERS", 3)
    s = stream()
    journal = []
    for n, producer_id in enumerate(["a", "b", "c"]):
        journal += produce(
            s, b"x", at=NOW + timedelta(seconds=n), producer=claim(0, producer_id=producer_id)
        )
    journal += produce(s, b"x", at=NOW + timedelta(seconds=5), producer=claim(1, producer_id="a"))
    journal += produce(s, b"x", at=NOW + timedelta(seconds=6), producer=claim(0, producer_id="d"))
    assert list(s.state.producers) == ["a", "c", "d"]  # b wrote least recently
    with pytest.raises(errors.ProducerSequenceGap):  # b is new again
        s.produce([record()], NOW, producer=claim(1, producer_id="b"))
    created = Stream.create(s.key, s.definition, NOW)[1]
    assert Stream.replay(s.key, [created, *journal]).state == s.state
    assert producers_module.MAX_PRODUCERS == 1000


def test_writer_state_survives_replay_and_snapshots() -> None:
    s, created = Stream.create(new_key(), definition(), NOW)
    journal: list[ev.Event] = [created]
    journal += produce(s, b"a", producer=claim(0, producer_id="a"), writer_seq="1")
    journal += produce(s, b"b", producer=claim(0, producer_id="b", epoch=2))
    [snapshot] = s.snapshot(NOW)
    s.apply(snapshot)
    journal.append(snapshot)
    journal += produce(s, b"c", producer=claim(1, producer_id="a"), writer_seq="2", close=True)
    stored = [ev.decode_event(ev.encode_event(e)) for e in journal]
    for start in (0, stored.index(next(e for e in stored if isinstance(e, ev.StreamSnapshotted)))):
        replayed = Stream.replay(s.key, stored[start:])
        assert replayed.state == s.state
    assert s.state.closed_by == claim(1, producer_id="a")
    assert (s.state.producers["b"].epoch, s.state.writer_seq) == (2, "2")
    assert copy_state(s.state) == s.state


# -- a stateful model: the protocol's rules written out plainly --------------------------------

producer_ids = st.sampled_from(["a", "b"])


class ProducerMachine(RuleBasedStateMachine):
    SNAPSHOT_EVERY = 4

    def __init__(self) -> None:
        super().__init__()
        self.stream, created = Stream.create(new_key(), definition(max_unread_items=12), NOW)
        self.journal: list[ev.Event] = [created]
        self.producers: dict[str, tuple[int, int]] = {}
        self.writer_seq: str | None = None
        self.closed_by: ProducerClaim | None = None
        self.closed = False
        self.head = 0

    def _apply(self, events: list[ev.Event]) -> None:
        before = self.stream.state.version
        for event in events:
            self.stream.apply(event)
        snapshot = (
            snapshot_if_due(self.stream, before, self.SNAPSHOT_EVERY, NOW) if events else None
        )
        for event in [*events, *([snapshot] if snapshot else [])]:
            self.journal.append(ev.decode_event(ev.encode_event(event)))

    def _expect(self, items: int, producer: ProducerClaim | None, seq: str | None, close: bool):
        """What the protocol says: ("dup"|"ok", None) or (None, the error class)."""
        if self.closed:
            if producer is None and items == 0:
                return "dup", None
            if producer is not None and producer == self.closed_by:
                return "dup", None
            return None, errors.StreamClosed
        if producer is not None:
            known = self.producers.get(producer.producer_id)
            if known is None:
                if producer.seq != 0:
                    return None, errors.ProducerSequenceGap
            elif producer.epoch < known[0]:
                return None, errors.ProducerEpochStale
            elif producer.epoch > known[0]:
                if producer.seq != 0:
                    return None, errors.InvalidInput
            elif producer.seq <= known[1]:
                return "dup", None
            elif producer.seq > known[1] + 1:
                return None, errors.ProducerSequenceGap
        if seq is not None and self.writer_seq is not None and seq <= self.writer_seq:
            return None, errors.WriterSequenceRegression
        if items and self.head + items > 12:
            return None, (errors.Backpressure, errors.InvalidInput)
        return "ok", None

    # Closing ends a history (everything after it is refused), so it is drawn rarely.
    @rule(
        items=st.integers(min_value=0, max_value=2),
        producer_id=st.none() | producer_ids,
        # Drawn relative to what the model knows, so that histories go deep into each rule.
        epoch_choice=st.sampled_from(["same"] * 6 + ["bump", "stale", "jump"]),
        seq_choice=st.sampled_from(["next"] * 5 + ["repeat", "earlier", "gap", "zero"]),
        writer_seq=st.none() | st.sampled_from(["1", "2", "3", "10", "20"]),
        action=st.sampled_from(["append"] * 12 + ["close", "native close"]),
    )
    def write(
        self,
        items: int,
        producer_id: str | None,
        epoch_choice: str,
        seq_choice: str,
        writer_seq: str | None,
        action: str,
    ) -> None:
        if action == "native close":
            self._apply(self.stream.close(NOW))
            self.closed = True
            return
        close = action == "close"
        items = items or (0 if close else 1)
        producer = None
        if producer_id is not None:
            epoch, last = self.producers.get(producer_id, (0, -1))
            epoch = {"same": epoch, "bump": epoch + 1, "stale": epoch - 1, "jump": epoch + 2}[
                epoch_choice
            ]
            seq = {"next": last + 1, "repeat": last, "earlier": last - 1, "gap": last + 2}.get(
                seq_choice, 0
            )
            producer = claim(max(seq, 0), max(epoch, 0), producer_id)
        outcome, error = self._expect(items, producer, writer_seq, close)
        try:
            events = self.stream.produce(
                [record()] * items, NOW, producer=producer, writer_seq=writer_seq, close=close
            )
        except errors.DomainError as refused:
            assert error is not None and isinstance(refused, error), (refused, error)
            return
        assert error is None, error
        assert (events == []) == (outcome == "dup")
        self._apply(events)
        if outcome == "dup":
            return
        if producer is not None:
            self.producers[producer.producer_id] = (producer.epoch, producer.seq)
        if writer_seq is not None:
            self.writer_seq = writer_seq
        self.head += items
        if close:
            self.closed, self.closed_by = True, producer

    @invariant()
    def state_matches_the_model(self) -> None:
        s = self.stream.state
        assert {p: (v.epoch, v.last_seq) for p, v in s.producers.items()} == self.producers
        assert (s.writer_seq, s.closed, s.closed_by, s.head) == (
            self.writer_seq,
            self.closed,
            self.closed_by,
            self.head,
        )

    @invariant()
    def the_journal_and_its_latest_snapshot_replay_into_the_same_state(self) -> None:
        assert Stream.replay(self.stream.key, self.journal).state == self.stream.state
        latest = max(
            i
            for i, e in enumerate(self.journal)
            if isinstance(e, ev.StreamSnapshotted | ev.StreamCreated)
        )
        assert Stream.replay(self.stream.key, self.journal[latest:]).state == self.stream.state


ProducerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None, derandomize=True
)
TestProducersAgainstModel = ProducerMachine.TestCase


def test_a_soft_deleted_stream_refuses_a_durable_streams_write_as_gone() -> None:
    s = stream()
    produce(s, b"1", producer=claim(0), close=True)
    s.forked = True
    for event in s.delete(NOW):
        s.apply(event)
    assert s.state.soft_deleted
    for options in ({"producer": claim(0), "close": True}, {"close": True}, {}):
        with pytest.raises(errors.StreamGone):
            s.produce([] if options.get("close") else [record()], NOW, **options)
