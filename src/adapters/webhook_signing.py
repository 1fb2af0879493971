"""Webhook signing keys (Ed25519, with `cryptography`) and the wake-token secret, kept in
PostgreSQL (migration 0496) or in memory. The newest key whose `sign_after` has come signs;
every key not yet retired is published in the JWKS, one that signs later included, so a
rotation can publish its key before it signs (for receivers that keep the key set), and the old
key stays verifiable until its signatures are out of any receiver's replay window."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import secrets
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import asyncpg
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# How long a retired key stays published: past the five-minute replay window receivers use.
RETIRED_KEY_SECONDS = 600.0
# What each process reloads its keys after at the latest; a rotation is also announced on
# KEYS_CHANNEL, and every process listening there (the wake bus) reloads at its next use.
RELOAD_SECONDS = 30.0
KEYS_CHANNEL = "ductor_streams_signing_keys"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def public_jwk(private: bytes) -> dict[str, str]:
    key = Ed25519PrivateKey.from_private_bytes(private)
    x = _b64(
        key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    # RFC 7638 thumbprint: the required members, sorted, without spaces.
    thumb = hashlib.sha256(
        json.dumps(
            {"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"), sort_keys=True
        ).encode()
    )
    kid = "ds_" + _b64(thumb.digest())[:22]
    return {"kty": "OKP", "crv": "Ed25519", "kid": kid, "use": "sig", "alg": "EdDSA", "x": x}


class KeyRow(NamedTuple):
    private: bytes
    retire_after: float | None  # Unix seconds: published until then (None: not retired)
    sign_after: float | None  # Unix seconds: signs from then (None: at once)


class KeyRows(Protocol):
    async def keys(self) -> list[KeyRow]:
        """Every key, oldest first."""

    async def add(self, private: bytes, kid: str, sign_after: float | None = None) -> None: ...

    async def retire_all_but(self, kid: str, at: float) -> None: ...

    async def secret(self, name: str) -> bytes: ...


class WebhookKeys:
    """Signs webhook bodies (`Webhook-Signature: t=<unix>,kid=<kid>,ed25519=<base64url>`, over
    `<t>.<body>`) and answers the JWKS."""

    def __init__(self, rows: KeyRows, clock: Callable[[], float] = time.time) -> None:
        self._rows = rows
        self._clock = clock  # Unix seconds
        self._loaded_at = -RELOAD_SECONDS
        self._switch_at = math.inf  # when a key published ahead starts signing (Unix seconds)
        self._signing: tuple[str, Ed25519PrivateKey] | None = None
        self._jwks: list[dict[str, str]] = []

    async def _fresh(self) -> None:
        if (
            time.monotonic() - self._loaded_at < RELOAD_SECONDS
            and self._signing is not None
            and self._clock() < self._switch_at
        ):
            return
        rows = await self._rows.keys()
        if not rows:
            await self._rows.add(_new_private(), "")
            rows = await self._rows.keys()
        now = self._clock()
        live = [k for k in rows if k.retire_after is None or k.retire_after > now]
        signing = [k for k in live if k.sign_after is None or k.sign_after <= now]
        newest = (signing or live or rows)[-1].private  # the newest that may sign
        self._signing = (public_jwk(newest)["kid"], Ed25519PrivateKey.from_private_bytes(newest))
        self._jwks = [public_jwk(k.private) for k in live] or [public_jwk(newest)]
        ahead = [k.sign_after for k in live if k.sign_after is not None and k.sign_after > now]
        self._switch_at = min(ahead, default=math.inf)
        self._loaded_at = time.monotonic()

    async def kid(self) -> str:
        await self._fresh()
        assert self._signing is not None
        return self._signing[0]

    async def jwks(self) -> dict[str, Any]:
        await self._fresh()
        return {"keys": list(self._jwks)}

    async def signature(self, body: bytes, now: float) -> str:
        await self._fresh()
        assert self._signing is not None
        kid, key = self._signing
        t = str(int(now))
        return f"t={t},kid={kid},ed25519={_b64(key.sign(t.encode() + b'.' + body))}"

    def forget(self) -> None:
        """The keys changed (a rotation announced): read them again at the next use."""
        self._loaded_at = -RELOAD_SECONDS

    async def rotate(self, publish_ahead: float = 0.0) -> str:
        """A new signing key, published at once and signing `publish_ahead` seconds from now;
        the others keep signing until then and are retired RETIRED_KEY_SECONDS after. Every
        process hears of it (KEYS_CHANNEL), publishes it from its next use, and signs with it
        from its first use past that time."""
        private = _new_private()
        kid = public_jwk(private)["kid"]
        now = self._clock()
        sign_after = now + publish_ahead if publish_ahead > 0 else None
        await self._rows.add(private, kid, sign_after)
        await self._rows.retire_all_but(kid, (sign_after or now) + RETIRED_KEY_SECONDS)
        self.forget()
        return kid


def _new_private() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )


class PostgresKeyRows:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def keys(self) -> list[KeyRow]:
        rows = await self._pool.fetch(
            """SELECT private_key, extract(epoch FROM retire_after)::float8,
                      extract(epoch FROM sign_after)::float8
               FROM ds_signing_keys ORDER BY created_at, kid"""
        )
        return [KeyRow(bytes(r[0]), r[1], r[2]) for r in rows]

    async def add(self, private: bytes, kid: str, sign_after: float | None = None) -> None:
        await self._pool.execute(
            "INSERT INTO ds_signing_keys (kid, private_key, sign_after)"
            " VALUES ($1, $2, to_timestamp($3)) ON CONFLICT DO NOTHING",
            kid or public_jwk(private)["kid"],
            private,
            sign_after,
        )

    async def retire_all_but(self, kid: str, at: float) -> None:
        """Retire the others, and announce the change on KEYS_CHANNEL (delivered at commit)."""
        await self._pool.execute(
            f"""WITH retired AS (
                   UPDATE ds_signing_keys SET retire_after = to_timestamp($2)
                   WHERE kid <> $1 AND (retire_after IS NULL OR retire_after > to_timestamp($2))
               )
               SELECT pg_notify('{KEYS_CHANNEL}', $1)""",
            kid,
            at,
        )

    async def secret(self, name: str) -> bytes:
        await self._pool.execute(
            "INSERT INTO ds_secrets (name, secret) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            name,
            secrets.token_bytes(32),
        )
        return bytes(
            await self._pool.fetchval("SELECT secret FROM ds_secrets WHERE name = $1", name)
        )


class MemoryKeyRows:
    def __init__(self) -> None:
        self._keys: list[KeyRow] = []
        self._secrets: dict[str, bytes] = {}

    async def keys(self) -> list[KeyRow]:
        return list(self._keys)

    async def add(self, private: bytes, kid: str, sign_after: float | None = None) -> None:
        self._keys.append(KeyRow(private, None, sign_after))

    async def retire_all_but(self, kid: str, at: float) -> None:
        self._keys = [
            k
            if public_jwk(k.private)["kid"] == kid
            or (k.retire_after is not None and k.retire_after <= at)
            else k._replace(retire_after=at)
            for k in self._keys
        ]

    async def secret(self, name: str) -> bytes:
        return self._secrets.setdefault(name, secrets.token_bytes(32))
