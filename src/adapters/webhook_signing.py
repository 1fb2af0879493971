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

from adapters.postgres.bounded import bounded_on

# How long a retired key stays published: past the five-minute replay window receivers use.
RETIRED_KEY_SECONDS = 600.0
# What each process reloads its keys after at the latest; a rotation is also announced on
# KEYS_CHANNEL, and every process listening there (the wake bus) reloads at its next use.
RELOAD_SECONDS = 30.0
KEYS_CHANNEL = "ductor_streams_signing_keys"
# Rotations one at a time, across processes and hosts.
_ROTATING = "SELECT pg_advisory_xact_lock(hashtextextended('ductor-streams:signing-keys', 0))"


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
    """The keys, on the clock of where they are kept (PostgreSQL's, for every process and the
    rotating command alike): no host's own clock decides when a key signs or retires."""

    async def keys(self) -> tuple[list[KeyRow], float]:
        """Every key, oldest first, and the store's time now (Unix seconds)."""

    async def add(self, private: bytes, kid: str) -> None:
        """The first key, signing at once (nothing if there is one already)."""

    async def rotate(self, private: bytes, kid: str, ahead: float, retired_after: float) -> None:
        """At once, one rotation at a time: add the key, signing `ahead` seconds from now (0:
        at once); retire the others `retired_after` seconds after it starts signing (one
        retiring sooner keeps its time); announce the change (KEYS_CHANNEL)."""

    async def secret(self, name: str) -> bytes: ...


class WebhookKeys:
    """Signs webhook bodies (`Webhook-Signature: t=<unix>,kid=<kid>,ed25519=<base64url>`, over
    `<t>.<body>`) and answers the JWKS."""

    def __init__(self, rows: KeyRows, clock: Callable[[], float] = time.monotonic) -> None:
        self._rows = rows
        self._clock = clock
        self._offset = 0.0  # the store's time (Unix seconds) minus `clock`, at the last load
        self._loaded_at = -RELOAD_SECONDS
        self._switch_at = math.inf  # when a key published ahead starts signing (store time)
        self._signing: tuple[str, Ed25519PrivateKey] | None = None
        self._jwks: list[dict[str, str]] = []

    def _now(self) -> float:
        return self._clock() + self._offset

    async def _fresh(self) -> None:
        if (
            self._clock() - self._loaded_at < RELOAD_SECONDS
            and self._signing is not None
            and self._now() < self._switch_at
        ):
            return
        rows, now = await self._rows.keys()
        if not rows:
            await self._rows.add(*_new_key())
            rows, now = await self._rows.keys()
        self._offset = now - self._clock()
        live = [k for k in rows if k.retire_after is None or k.retire_after > now]
        signing = [k for k in live if k.sign_after is None or k.sign_after <= now]
        newest = (signing or live or rows)[-1].private  # the newest that may sign
        self._signing = (public_jwk(newest)["kid"], Ed25519PrivateKey.from_private_bytes(newest))
        self._jwks = [public_jwk(k.private) for k in live] or [public_jwk(newest)]
        ahead = [k.sign_after for k in live if k.sign_after is not None and k.sign_after > now]
        self._switch_at = min(ahead, default=math.inf)
        self._loaded_at = self._clock()

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
        if publish_ahead > 0 and not (await self._rows.keys())[0]:
            # The key the service would have made at its first use, to sign until then.
            await self._rows.add(*_new_key())
        private, kid = _new_key()
        await self._rows.rotate(private, kid, publish_ahead, RETIRED_KEY_SECONDS)
        self.forget()
        return kid


def _new_key() -> tuple[bytes, str]:
    private = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    return private, public_jwk(private)["kid"]


class PostgresKeyRows:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def keys(self) -> tuple[list[KeyRow], float]:
        return await bounded_on(self._pool, self._keys())

    async def _keys(self) -> tuple[list[KeyRow], float]:
        async with self._pool.acquire() as conn, conn.transaction():  # one snapshot, one now()
            rows = await conn.fetch(
                """SELECT private_key, extract(epoch FROM retire_after)::float8,
                          extract(epoch FROM sign_after)::float8
                   FROM ds_signing_keys ORDER BY created_at, kid"""
            )
            now = await conn.fetchval("SELECT extract(epoch FROM now())::float8")
        return [KeyRow(bytes(r[0]), r[1], r[2]) for r in rows], now

    async def add(self, private: bytes, kid: str) -> None:
        await self._pool.execute(
            "INSERT INTO ds_signing_keys (kid, private_key) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            kid,
            private,
        )

    async def rotate(self, private: bytes, kid: str, ahead: float, retired_after: float) -> None:
        """One transaction, one rotation at a time (two at once each retired the other's key:
        none was left to sign), its times on PostgreSQL's clock; the announcement is delivered
        at its commit."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(_ROTATING)
            await conn.execute(
                """INSERT INTO ds_signing_keys (kid, private_key, sign_after)
                   VALUES ($1, $2, CASE WHEN $3::float8 > 0
                                        THEN now() + make_interval(secs => $3) END)""",
                kid,
                private,
                ahead,
            )
            await conn.execute(
                f"""WITH retiring AS (
                       SELECT coalesce(sign_after, now()) + make_interval(secs => $2) AS at
                       FROM ds_signing_keys WHERE kid = $1
                   ), retired AS (
                       UPDATE ds_signing_keys k SET retire_after = r.at FROM retiring r
                       WHERE k.kid <> $1 AND (k.retire_after IS NULL OR k.retire_after > r.at)
                   )
                   SELECT pg_notify('{KEYS_CHANNEL}', $1)""",
                kid,
                retired_after,
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
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock  # Unix seconds: the store's time
        self._keys: list[KeyRow] = []
        self._secrets: dict[str, bytes] = {}

    async def keys(self) -> tuple[list[KeyRow], float]:
        return list(self._keys), self._clock()

    async def add(self, private: bytes, kid: str) -> None:
        if not self._keys:
            self._keys.append(KeyRow(private, None, None))

    async def rotate(self, private: bytes, kid: str, ahead: float, retired_after: float) -> None:
        now = self._clock()
        sign_after = now + ahead if ahead > 0 else None
        at = (sign_after or now) + retired_after
        self._keys = [
            k
            if k.retire_after is not None and k.retire_after <= at
            else k._replace(retire_after=at)
            for k in self._keys
        ]
        self._keys.append(KeyRow(private, None, sign_after))

    async def secret(self, name: str) -> bytes:
        return self._secrets.setdefault(name, secrets.token_bytes(32))
