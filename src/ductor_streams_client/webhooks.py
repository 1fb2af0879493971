"""Verifying a webhook's `Webhook-Signature` against the service's JWKS (Ed25519, with
`cryptography`): `t=<unix seconds>,kid=<key id>,ed25519=<base64url signature>` over
`<t>.<raw body>`. Verify the exact bytes received, before parsing them."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

_HEADER = re.compile(r"t=(\d{1,12}),kid=([^,]{1,200}),ed25519=([A-Za-z0-9_-]{1,200})")
REPLAY_WINDOW_SECONDS = 300


def _b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify_webhook(
    body: bytes,
    signature: str | None,
    jwks: Mapping[str, Any],
    *,
    now: float | None = None,
    tolerance_seconds: float = REPLAY_WINDOW_SECONDS,
) -> bool:
    """Whether `signature` (the `Webhook-Signature` header) signs `body` with a key of `jwks`
    (`StreamsClient.webhook_jwks()`), at most `tolerance_seconds` from `now`."""
    match = _HEADER.fullmatch(signature or "")
    if match is None:
        return False
    timestamp, kid, signed = match.groups()
    if abs((time.time() if now is None else now) - int(timestamp)) > tolerance_seconds:
        return False
    for key in jwks.get("keys", ()):
        if key.get("kid") == kid and key.get("kty") == "OKP" and key.get("crv") == "Ed25519":
            try:
                public = Ed25519PublicKey.from_public_bytes(_b64(str(key["x"])))
                public.verify(_b64(signed), timestamp.encode() + b"." + body)
            except (InvalidSignature, ValueError, KeyError):
                return False
            return True
    return False
