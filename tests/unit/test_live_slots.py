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
