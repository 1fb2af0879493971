"""The per-principal cap on live connections: a token restricted to runs counts apart from its
principal's other tokens."""

from __future__ import annotations

import pytest

from application.access import Caller
from application.live_slots import LiveSlots, TooManySubscriptions

ADMIN = Caller(tenant="t", principal="ops", scopes=frozenset({"streams:read"}))
# A token an administrator of run r1 alone minted with the tenant administrator's principal name.
MINTED = Caller(
    tenant="t", principal="ops", scopes=frozenset({"streams:read"}), runs=frozenset({"r1"})
)


def test_a_token_restricted_to_runs_takes_no_slot_of_its_principals_other_tokens() -> None:
    slots = LiveSlots(2)
    held = [slots.admit(MINTED), slots.admit(MINTED)]
    with pytest.raises(TooManySubscriptions):
        slots.admit(MINTED)
    assert slots.held_by(ADMIN) == 0
    admitted = [slots.admit(ADMIN), slots.admit(ADMIN)]  # its own cap, untouched
    for slot in held:
        slots.release(MINTED, slot)
    assert slots.held_by(MINTED) == 0 and slots.held_by(ADMIN) == 2
    for slot in admitted:
        slots.release(ADMIN, slot)
    assert slots.count() == 0


def test_tokens_restricted_to_a_run_hold_at_most_its_share_whatever_their_principals() -> None:
    slots = LiveSlots(2, max_per_tenant=10, max_per_run=3)
    minted = [
        Caller(tenant="t", principal=f"p{i}", scopes=frozenset(), runs=frozenset({"r1"}))
        for i in range(3)
    ]
    held = [(c, slots.admit(c)) for c in minted]
    with pytest.raises(TooManySubscriptions, match="run 'r1'"):
        slots.admit(minted[1])  # its principal holds one: the run's share is what is taken
    both = Caller(tenant="t", principal="p9", scopes=frozenset(), runs=frozenset({"r1", "r2"}))
    with pytest.raises(TooManySubscriptions):
        slots.admit(both)  # counted under each of its runs
    other = Caller(tenant="t", principal="p9", scopes=frozenset(), runs=frozenset({"r2"}))
    mine = slots.admit(other)
    unrestricted = slots.admit(ADMIN)
    caller, slot = held.pop()
    slots.release(caller, slot)
    both_slot = slots.admit(both)  # a place came back under r1
    for caller, slot in [*held, (other, mine), (ADMIN, unrestricted), (both, both_slot)]:
        slots.release(caller, slot)
    assert slots.count() == 0
    assert slots.held_by(both) == 0
