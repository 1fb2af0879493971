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
