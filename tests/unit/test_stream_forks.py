"""The aggregate's part in forks: a fork's state starts past its inherited prefix, a stream
with forks is soft-deleted (not erased) by a delete or an expiry, and then answers StreamGone to
every direct command until its last fork releases it."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest

from domain import errors
from domain import events as ev
from domain.definition import Expiry, Fork
from domain.state import decode_state, encode_state
from domain.stream import Stream
from tests.support.builders import NOW, definition, new_key, record


def fork_of(through: int, **limits: object) -> Stream:
    fork = Fork(run_id="r", stream_id="src", source_created_at=NOW, through=through, offset=through)
    created, _ = Stream.create(
        new_key(), msgspec.structs.replace(definition(**limits), fork=fork), NOW
    )
    return created


def applied(s: Stream, events: list[ev.Event]) -> Stream:
    for event in events:
        s.apply(event)
    return s


def test_a_fork_starts_at_its_fork_point_with_nothing_of_its_own() -> None:
    s = fork_of(3)
    assert (s.head, s.state.earliest, s.state.total_items, s.state.total_bytes) == (3, 4, 0, 0)
    applied(s, s.append([record(), record()], NOW))
    assert (s.head, s.state.total_items) == (5, 2)
    # Credit counts only its own records: the three inherited ones are not unread here.
    assert s.credit().unread_items == 2


def test_a_forks_quota_counts_only_its_own_records() -> None:
    s = fork_of(10, max_total_items=2)
    applied(s, s.append([record(), record()], NOW))
    with pytest.raises(errors.QuotaExhausted):
        s.append([record()], NOW)


def test_an_acknowledgement_inside_the_inherited_prefix_frees_no_credit_of_its_own() -> None:
    s = fork_of(3)
    applied(s, s.append([record()], NOW))
    applied(s, s.acknowledge("c", "p", 2, None, NOW))
    assert s.credit().unread_items == 1
    assert s.state.consumers["c"].acked_offset == 0


def test_a_fork_replays_into_the_same_state() -> None:
    s = fork_of(4)
    journal = [ev.StreamCreated(version=1, at=NOW, definition=s.definition)]
    events = s.append([record()], NOW)
    applied(s, events)
    again = Stream.replay(s.key, [*journal, *events])
    assert encode_state(again.state) == encode_state(s.state)


def test_delete_without_forks_erases_and_with_forks_soft_deletes() -> None:
    plain, _ = Stream.create(new_key(), definition(), NOW)
    [erased] = plain.delete(NOW)
    assert isinstance(erased, ev.StreamDeleted)
    forked, _ = Stream.create(new_key(), definition(), NOW)
    forked.forked = True
    [soft] = forked.delete(NOW)
    assert isinstance(soft, ev.StreamSoftDeleted) and soft.reason == "deleted"
    applied(forked, [soft])
    assert forked.state.soft_deleted and not forked.state.deleted
    assert decode_state(encode_state(forked.state)).soft_deleted


def test_a_soft_deleted_stream_refuses_every_direct_command_with_stream_gone() -> None:
    s, _ = Stream.create(new_key(), definition(), NOW)
    applied(s, s.append([record()], NOW))
    s.forked = True
    applied(s, s.delete(NOW))
    for command in (
        lambda: s.append([record()], NOW),
        lambda: s.acknowledge("c", "p", 1, 7, NOW),
        lambda: s.close(NOW),
        lambda: s.set_legal_hold(True, "case", NOW),
        lambda: s.delete(NOW),
        s.require_live,
    ):
        with pytest.raises(errors.StreamGone):
            command()


def test_a_legal_hold_still_refuses_the_delete_of_a_forked_stream() -> None:
    s, _ = Stream.create(new_key(), definition(), NOW)
    applied(s, s.set_legal_hold(True, "case", NOW))
    s.forked = True
    with pytest.raises(errors.LegalHoldActive):
        s.delete(NOW)


def test_expiry_of_a_forked_stream_soft_deletes_it_once() -> None:
    expiring = msgspec.structs.replace(definition(), expiry=Expiry(idle_seconds=10))
    s, _ = Stream.create(new_key(), expiring, NOW)
    s.forked = True
    later = NOW + timedelta(seconds=60)
    [soft] = s.expire(later, NOW)
    assert isinstance(soft, ev.StreamSoftDeleted) and soft.reason == "expired"
    applied(s, [soft])
    assert s.expire(later + timedelta(days=1), NOW) == []


def test_release_erases_only_a_soft_deleted_stream_no_fork_reads_any_more() -> None:
    s, _ = Stream.create(new_key(), definition(), NOW)
    assert s.release(NOW) == []  # not soft-deleted: a live source stays
    s.forked = True
    applied(s, s.delete(NOW))
    assert s.release(NOW) == []  # another fork still reads it
    s.forked = False
    [erased] = s.release(NOW)
    assert isinstance(erased, ev.StreamDeleted)
