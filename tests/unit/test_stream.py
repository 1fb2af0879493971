"""The Stream aggregate: decide returns events, apply is the only mutation."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest

from domain import errors
from domain import events as ev
from domain.objects import AuthorizationReceipt, ObjectIntent
from domain.state import decode_state, encode_state
from domain.stream import Stream
from tests.support.builders import NOW, definition, new_key, record


def stream(**limits: object) -> Stream:
    created, _ = Stream.create(new_key(), definition(**limits), NOW)
    return created


def appended(s: Stream, *payloads: bytes) -> Stream:
    for event in s.append([record(p) for p in payloads], NOW):
        s.apply(event)
    return s


def test_a_new_stream_has_head_zero_and_earliest_one() -> None:
    s = stream()
    assert (s.state.head, s.state.earliest, s.state.version) == (0, 1, 1)


def test_deciding_does_not_change_state_until_applied() -> None:
    s = stream()
    events = s.append([record(), record()], NOW)
    assert s.state.head == 0
    s.apply(events[0])
    assert s.state.head == 2 and s.state.total_items == 2


def test_an_append_gets_the_next_contiguous_sequences_and_offsets() -> None:
    s = appended(stream(), b"aaa", b"bb")
    [event] = s.append([record(b"c")], NOW)
    assert isinstance(event, ev.RecordsAppended)
    assert (event.first_sequence, event.last_sequence, event.first_offset) == (3, 3, 5)


def test_apply_refuses_an_event_that_does_not_follow_the_version() -> None:
    s = stream()
    [event] = s.append([record()], NOW)
    s.apply(event)
    with pytest.raises(ValueError):
        s.apply(event)


def test_credit_counts_everything_when_there_is_no_consumer() -> None:
    s = appended(stream(), b"12345", b"123")
    credit = s.credit()
    assert (credit.unread_items, credit.unread_bytes) == (2, 8)


def test_credit_counts_after_the_slowest_consumer() -> None:
    s = appended(stream(), b"12345", b"123", b"1")
    for e in s.acknowledge("fast", "p", 3, 9, NOW):
        s.apply(e)
    for e in s.acknowledge("slow", "p", 1, 5, NOW):
        s.apply(e)
    credit = s.credit()
    assert (credit.unread_items, credit.unread_bytes) == (2, 4)


def test_the_unread_item_ceiling_is_backpressure_with_a_retry_after() -> None:
    s = appended(stream(max_unread_items=2), b"1", b"2")
    with pytest.raises(errors.Backpressure) as refused:
        s.append([record()], NOW)
    assert refused.value.retry_after >= 1


def test_the_unread_byte_ceiling_is_backpressure() -> None:
    s = appended(stream(max_unread_bytes=10), b"12345678")
    with pytest.raises(errors.Backpressure):
        s.append([record(b"123")], NOW)


def test_a_batch_that_can_never_fit_the_unread_ceiling_is_invalid_input() -> None:
    s = stream(max_unread_items=2)
    with pytest.raises(errors.InvalidInput):
        s.append([record(), record(), record()], NOW)


def test_a_notification_is_not_held_back_by_the_unread_ceiling_but_by_the_total() -> None:
    """The service's own wake events (no one acknowledges a wake stream)."""
    s = appended(stream(max_unread_items=2, max_total_items=5), b"1", b"2")
    for e in s.append([record(), record()], NOW, flow_controlled=False):
        s.apply(e)
    assert s.head == 4
    with pytest.raises(errors.Backpressure):  # a caller's append still is
        s.append([record()], NOW)
    with pytest.raises(errors.QuotaExhausted):
        s.append([record(), record()], NOW, flow_controlled=False)


def test_the_total_ceiling_is_quota_exhausted_even_after_acks() -> None:
    s = appended(stream(max_total_items=2), b"1", b"2")
    for e in s.acknowledge("c", "p", 2, 2, NOW):
        s.apply(e)
    with pytest.raises(errors.QuotaExhausted):
        s.append([record()], NOW)


def test_the_total_byte_ceiling_is_quota_exhausted() -> None:
    s = appended(stream(max_total_bytes=4), b"123")
    with pytest.raises(errors.QuotaExhausted):
        s.append([record(b"12")], NOW)


def test_a_batch_larger_than_the_whole_total_ceiling_is_invalid_input_while_room_is_left() -> None:
    with pytest.raises(errors.InvalidInput, match="can never fit the stream's total ceiling"):
        stream(max_total_bytes=4).append([record(b"12345")], NOW)
    with pytest.raises(errors.InvalidInput, match="can never fit the stream's total ceiling"):
        stream(max_total_items=1).append([record(), record()], NOW)
    full = appended(stream(max_total_bytes=4), b"1234")
    with pytest.raises(errors.QuotaExhausted, match="is reached"):
        full.append([record(b"12345")], NOW)


def test_another_principals_intent_under_the_same_key_is_idempotency_key_reused() -> None:
    s = stream()
    intent = ObjectIntent(
        object_id="obj-1",
        idempotency_key="k",
        state="prepared",
        size=1,
        sha256="0" * 64,
        content_type="application/octet-stream",
        schema=None,
        storage_region="local",
        storage_key="t1/r/s/obj-1",
        receipt=AuthorizationReceipt(principal="alice", scopes=(), decided_at=NOW),
        expires_at=NOW + timedelta(hours=1),
        created_at=NOW,
    )
    for e in s.prepare_object(intent, NOW):
        s.apply(e)
    assert s.prepare_object(intent, NOW) == []
    bobs = msgspec.structs.replace(
        intent, receipt=AuthorizationReceipt(principal="bob", scopes=(), decided_at=NOW)
    )
    with pytest.raises(errors.IdempotencyKeyReused, match="in use on this stream by another"):
        s.prepare_object(bobs, NOW)


def test_a_closed_stream_refuses_appends_and_closing_again_is_a_no_op() -> None:
    s = stream()
    for e in s.close(NOW):
        s.apply(e)
    assert s.close(NOW) == []
    with pytest.raises(errors.StreamClosed):
        s.append([record()], NOW)


def test_acknowledgements_only_advance() -> None:
    s = appended(stream(), b"1", b"2")
    for e in s.acknowledge("c", "p", 2, 2, NOW):
        s.apply(e)
    assert s.acknowledge("c", "p", 2, 2, NOW) == []
    with pytest.raises(errors.AckRegression):
        s.acknowledge("c", "p", 1, 1, NOW)


def test_an_ack_above_the_head_is_refused() -> None:
    s = appended(stream(), b"1")
    with pytest.raises(errors.AckAheadOfHead):
        s.acknowledge("c", "p", 2, None, NOW)


def test_a_consumer_belongs_to_the_principal_that_first_acked() -> None:
    s = appended(stream(), b"1", b"2")
    for e in s.acknowledge("c", "alice", 1, 1, NOW):
        s.apply(e)
    with pytest.raises(errors.CrossScopeAck):
        s.acknowledge("c", "mallory", 2, 2, NOW)


def test_the_legal_hold_changes_only_when_asked_to_change() -> None:
    s = stream()
    [event] = s.set_legal_hold(True, "audit", NOW)
    s.apply(event)
    assert s.state.legal_hold.enabled and s.state.legal_hold.reason == "audit"
    assert s.set_legal_hold(True, "audit", NOW) == []


def test_pruning_moves_earliest_and_is_refused_under_a_legal_hold() -> None:
    s = appended(stream(), b"11", b"22", b"33")
    for e in s.prune(2, 4, "retention", NOW):
        s.apply(e)
    assert s.state.earliest == 3
    assert (s.credit().unread_items, s.credit().unread_bytes) == (1, 2)
    for e in s.set_legal_hold(True, None, NOW):
        s.apply(e)
    with pytest.raises(errors.LegalHoldActive):
        s.prune(3, 6, "retention", NOW)


def test_records_a_fork_inherits_are_never_pruned() -> None:
    s = appended(stream(), b"11", b"22", b"33")
    s.pinned_through = 1  # a fork reads record 1: pruning from the front cannot start
    assert s.prune(2, 4, "retention", NOW) == []
    assert s.state.earliest == 1
    for e in s.set_legal_hold(True, None, NOW):
        s.apply(e)
    with pytest.raises(errors.LegalHoldActive):  # the hold is still what it says
        s.prune(2, 4, "retention", NOW)
    for e in s.set_legal_hold(False, None, NOW):
        s.apply(e)
    s.pinned_through = 0  # its last fork is gone
    for e in s.prune(2, 4, "retention", NOW):
        s.apply(e)
    assert s.state.earliest == 3
    s.pinned_through = 2  # a fork whose prefix was already pruned holds nothing back
    [event] = s.prune(3, 6, "retention", NOW)
    assert isinstance(event, ev.RecordsPruned) and event.through_sequence == 3


def test_an_ack_of_a_pruned_record_counts_from_the_pruned_offset() -> None:
    s = appended(stream(), b"11", b"22", b"33")
    for e in s.prune(2, 4, "retention", NOW):
        s.apply(e)
    [event] = s.acknowledge("c", "p", 1, None, NOW)
    assert isinstance(event, ev.ConsumerAcknowledged) and event.offset == 4


def test_replaying_the_journal_rebuilds_the_same_state() -> None:
    s, created = Stream.create(new_key(), definition(), NOW)
    journal: list[ev.Event] = [created]
    for decide in (
        lambda: s.append([record(b"abc"), record(b"de")], NOW),
        lambda: s.acknowledge("c", "p", 1, 3, NOW),
        lambda: s.set_legal_hold(True, "x", NOW),
        lambda: s.close(NOW),
    ):
        for event in decide():
            s.apply(event)
            journal.append(ev.decode_event(ev.encode_event(event)))
    assert Stream.replay(s.key, journal).state == s.state


def test_a_snapshot_carries_the_state_and_definition_and_changes_nothing_but_the_version() -> None:
    s = appended(stream(), b"aaa", b"bb")
    for decide in (
        lambda: s.acknowledge("c", "alice", 1, 3, NOW),
        lambda: s.set_legal_hold(True, "audit", NOW),
    ):
        for event in decide():
            s.apply(event)
    before = encode_state(s.state)
    [snapshot] = s.snapshot(NOW)
    assert isinstance(snapshot, ev.StreamSnapshotted)
    s.apply(snapshot)
    assert snapshot.version == s.state.version == 5
    assert snapshot.definition == s.definition and snapshot.state == s.state
    after = decode_state(before)
    after.version = 5
    assert s.state == after
    s.state.consumers.clear()  # the journaled event is not the live state
    assert snapshot.state.consumers


def test_a_journal_may_start_at_a_snapshot_and_replays_what_follows_it() -> None:
    s = appended(stream(), b"aaa")
    [snapshot] = s.snapshot(NOW)
    s.apply(snapshot)
    journal: list[ev.Event] = [ev.decode_event(ev.encode_event(snapshot))]
    for decide in (lambda: s.append([record(b"bb")], NOW), lambda: s.close(NOW)):
        for event in decide():
            s.apply(event)
            journal.append(event)
    replayed = Stream.replay(s.key, journal)
    assert replayed.state == s.state and replayed.definition == s.definition
    with pytest.raises(ValueError):
        Stream.replay(s.key, journal[1:])  # neither a creation nor a snapshot


def test_a_snapshot_must_carry_the_state_at_its_own_version() -> None:
    s = appended(stream(), b"aaa")
    [snapshot] = s.snapshot(NOW)
    wrong = ev.StreamSnapshotted(
        version=snapshot.version,
        at=NOW,
        definition=s.definition,
        state=msgspec.structs.replace(snapshot.state, version=snapshot.version - 1),
    )
    with pytest.raises(ValueError):
        s.apply(wrong)


def test_delete_is_refused_while_a_legal_hold_is_on_and_nothing_follows_it() -> None:
    s = appended(stream(), b"1")
    for event in s.set_legal_hold(True, "case", NOW):
        s.apply(event)
    with pytest.raises(errors.LegalHoldActive):
        s.delete(NOW)
    for event in s.set_legal_hold(False, None, NOW):
        s.apply(event)
    [deleted] = s.delete(NOW)
    assert deleted == ev.StreamDeleted(version=s.state.version + 1, at=NOW, reason="deleted")
    assert ev.decode_event(ev.encode_event(deleted)) == deleted
    s.apply(deleted)
    assert s.state.deleted and s.delete(NOW) == []
    with pytest.raises(ValueError):
        s.apply(ev.StreamClosed(version=s.state.version + 1, at=NOW))
