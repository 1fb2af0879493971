"""Webhook signing keys (Ed25519, with `cryptography`) and the wake-token secret, kept in
PostgreSQL (migration 0496) or in memory. The newest key signs; every key not yet retired is
published in the JWKS, so after a rotation the old key stays verifiable until its signatures are
out of any receiver's replay window."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from typing import Any, Protocol

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


class KeyRows(Protocol):
    async def keys(self) -> list[tuple[bytes, float | None]]:
        """(private key, retire_after as Unix seconds or None), oldest first."""

    async def add(self, private: bytes, kid: str) -> None: ...

    async def retire_all_but(self, kid: str, at: float) -> None: ...

    async def secret(self, name: str) -> bytes: ...


class WebhookKeys:
    """Signs webhook bodies (`Webhook-Signature: t=<unix>,kid=<kid>,ed25519=<base64url>`, over
    `<t>.<body>`) and answers the JWKS."""

    def __init__(self, rows: KeyRows) -> None:
        self._rows = rows
        self._loaded_at = -RELOAD_SECONDS
        self._signing: tuple[str, Ed25519PrivateKey] | None = None
        self._jwks: list[dict[str, str]] = []

    async def _fresh(self) -> None:
        if time.monotonic() - self._loaded_at < RELOAD_SECONDS and self._signing is not None:
            return
        rows = await self._rows.keys()
        if not rows:
            private = Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.Raw,
                serialization.PrivateFormat.Raw,
                serialization.NoEncryption(),
            )
            await self._rows.add(private, public_jwk(private)["kid"])
            rows = await self._rows.keys()
        now = time.time()
        live = [(p, r) for p, r in rows if r is None or r > now]
        newest = live[-1][0] if live else rows[-1][0]
        self._signing = (public_jwk(newest)["kid"], Ed25519PrivateKey.from_private_bytes(newest))
        self._jwks = [public_jwk(p) for p, _ in live] or [public_jwk(newest)]
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

    async def rotate(self) -> str:
        """A new signing key; the others are retired after RETIRED_KEY_SECONDS. Every process
        hears of it (KEYS_CHANNEL) and signs with it from its next use."""
        private = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        kid = public_jwk(private)["kid"]
        await self._rows.add(private, kid)
        await self._rows.retire_all_but(kid, time.time() + RETIRED_KEY_SECONDS)
        self.forget()
        return kid


class PostgresKeyRows:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def keys(self) -> list[tuple[bytes, float | None]]:
        rows = await self._pool.fetch(
            """SELECT private_key, extract(epoch FROM retire_after)::float8
               FROM ds_signing_keys ORDER BY created_at, kid"""
        )
        return [(bytes(r[0]), r[1]) for r in rows]

    async def add(self, private: bytes, kid: str) -> None:
        await self._pool.execute(
            "INSERT INTO ds_signing_keys (kid, private_key) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            kid,
            private,
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
        self._keys: list[tuple[bytes, float | None]] = []
        self._secrets: dict[str, bytes] = {}

    async def keys(self) -> list[tuple[bytes, float | None]]:
        return list(self._keys)

    async def add(self, private: bytes, kid: str) -> None:
        self._keys.append((private, None))

    async def retire_all_but(self, kid: str, at: float) -> None:
        self._keys = [
            (p, r if public_jwk(p)["kid"] == kid or r is not None else at) for p, r in self._keys
        ]

    async def secret(self, name: str) -> bytes:
        return self._secrets.setdefault(name, secrets.token_bytes(32))
