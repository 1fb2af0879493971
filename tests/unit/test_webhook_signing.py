"""Webhook signing keys: signatures verify against the published JWKS (with the client's
helper), and a rotation keeps the old key published while a new one signs."""

from __future__ import annotations

import time

from adapters.webhook_signing import MemoryKeyRows, WebhookKeys
from ductor_streams_client import verify_webhook


async def test_a_signature_verifies_against_the_jwks_and_a_changed_body_does_not() -> None:
    keys = WebhookKeys(MemoryKeyRows())
    body = b'{"subscription_id":"s","generation":1}'
    header = await keys.signature(body, time.time())
    jwks = await keys.jwks()
    assert header.startswith("t=") and f"kid={await keys.kid()}," in header
    assert verify_webhook(body, header, jwks)
    assert not verify_webhook(body + b" ", header, jwks)
    assert not verify_webhook(body, header, jwks, now=time.time() + 301)  # outside the window


async def test_a_rotated_key_stays_published_while_the_new_one_signs() -> None:
    keys = WebhookKeys(MemoryKeyRows())
    body = b"{}"
    old_kid = await keys.kid()
    old = await keys.signature(body, time.time())
    new_kid = await keys.rotate()
    assert new_kid != old_kid and await keys.kid() == new_kid
    jwks = await keys.jwks()
    assert {k["kid"] for k in jwks["keys"]} == {old_kid, new_kid}
    assert verify_webhook(body, old, jwks)
    assert f"kid={new_kid}," in await keys.signature(body, time.time())


async def test_a_key_published_ahead_signs_only_from_its_time_and_the_old_one_until_then() -> None:
    """`rotate(publish_ahead)`: receivers that keep the key set hold the new key before it
    signs; the old key signs until then and stays published RETIRED_KEY_SECONDS more."""
    from adapters.webhook_signing import RETIRED_KEY_SECONDS

    now = [1_000_000.0]
    rows = MemoryKeyRows(clock=lambda: now[0])  # the store's clock decides; each process's
    keys = WebhookKeys(rows, clock=lambda: now[0] - 5_000)  # own is only counted from it
    other = WebhookKeys(rows, clock=lambda: now[0] + 7)
    old_kid = await keys.kid()
    assert await other.kid() == old_kid  # the other process has loaded its keys
    new_kid = await keys.rotate(publish_ahead=300)
    for process in (keys, other):
        other.forget()  # as the rotation's announcement does
        assert {k["kid"] for k in (await process.jwks())["keys"]} == {old_kid, new_kid}
        assert await process.kid() == old_kid
    now[0] += 299
    assert await other.kid() == old_kid
    now[0] += 1  # its time: every process switches at its next use, without a reload
    assert await keys.kid() == new_kid and await other.kid() == new_kid
    assert old_kid in {k["kid"] for k in (await other.jwks())["keys"]}
    now[0] += RETIRED_KEY_SECONDS
    keys.forget()
    assert {k["kid"] for k in (await keys.jwks())["keys"]} == {new_kid}


async def test_a_key_published_ahead_as_the_first_rotation_does_not_sign_before_its_time() -> None:
    """Rotated before any key was made (none signed yet): a key to sign until then is made."""
    now = [1_000_000.0]
    rows = MemoryKeyRows(clock=lambda: now[0])
    keys = WebhookKeys(rows, clock=lambda: now[0])
    new_kid = await keys.rotate(publish_ahead=300)
    published = {k["kid"] for k in (await keys.jwks())["keys"]}
    assert await keys.kid() != new_kid and published == {await keys.kid(), new_kid}
    now[0] += 300
    assert await keys.kid() == new_kid
