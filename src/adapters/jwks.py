"""JWTs verified against an identity provider's JWKS (PyJWT, with `cryptography` for the keys).

The key set is fetched over HTTP with a timeout that bounds the whole fetch, and kept:

- a JWT whose `kid` is not in it makes it fetched again, at most once per `refetch_seconds`
  (30): a flood of JWTs naming unknown keys costs the provider one request per 30 s, and the
  JWT is refused (401) once that fetch has answered or timed out;
- a key set older than `refresh_seconds` is fetched again in the background while the keys it
  holds keep verifying, so a key the provider stops publishing stops verifying;
- a fetch that fails (the endpoint down, slow, or answering something that is not a key set)
  changes nothing: the keys already known keep verifying. A successful one replaces the set
  with what is published (old keys are kept exactly as long as they are still published).

A request never waits for a fetch longer than `fetch_timeout_seconds`: one fetch is in flight
at a time, and every request needing it waits for that one, bounded.

Only RS256, ES256 and EdDSA are accepted, and only with a key of the matching type (an RSA key
for RS256, a P-256 key for ES256, an OKP key for EdDSA): `alg: none`, HS256 (the key confusion
that signs with the public key as an HMAC secret) and any other are refused before a key is
looked at. `exp`, `iss` and `aud` are required; `exp`, `nbf` and `iat` are checked with 30 s of
leeway."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import httpx
import jwt
import msgspec

from application.errors import Unauthenticated
from application.jwts import LEEWAY_SECONDS

log = logging.getLogger("ductor_streams.jwks")

ALGORITHMS = ("RS256", "ES256", "EdDSA")
# The key type (and curve) each algorithm must be used with.
_KEY_TYPES = {"RS256": ("RSA", None), "ES256": ("EC", "P-256"), "EdDSA": ("OKP", None)}
# A key set larger than this is not one (a provider publishes a few keys).
MAX_JWKS_BYTES = 1 << 20


class _Key(NamedTuple):
    key: Any  # the cryptography public key
    kty: str
    crv: str | None
    alg: str | None


# Where a key without a `kid` is kept: no JWT's header can name it (a kid is a string).
_NO_KID = None


def _parse(body: bytes) -> dict[str | None, _Key]:
    """The usable signing keys of a JWKS document, by kid (one without a kid under `_NO_KID`,
    if it is the only such key). Raises ValueError if the document is not a key set at all."""
    document = msgspec.json.decode(body)
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError("not a JWK set")
    keys: dict[str | None, _Key] = {}
    without_kid = 0
    for jwk in document["keys"]:
        if not isinstance(jwk, dict):
            continue
        kid, kty = jwk.get("kid"), jwk.get("kty")
        if kid is None:
            without_kid += 1
        if not isinstance(kid, str | None) or not isinstance(kty, str):
            continue
        if jwk.get("use", "sig") != "sig":
            continue
        try:
            parsed = jwt.PyJWK(jwk)
        except Exception:
            continue  # a key type or curve we do not verify with
        crv, alg = jwk.get("crv"), jwk.get("alg")
        keys[kid] = _Key(
            parsed.key,
            kty,
            crv if isinstance(crv, str) else None,
            alg if isinstance(alg, str) else None,
        )
    if without_kid > 1:
        keys.pop(_NO_KID, None)  # which of them a JWT without a kid means cannot be told
    return keys


class JwksVerifier:
    def __init__(
        self,
        jwks_url: str,
        issuer: str,
        audience: str,
        *,
        fetch_timeout_seconds: float = 5.0,
        refetch_seconds: float = 30.0,
        refresh_seconds: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = jwks_url
        self._issuer = issuer
        self._audience = audience
        self._timeout = fetch_timeout_seconds
        self._refetch = refetch_seconds
        self._refresh = refresh_seconds
        self._clock = clock
        self._keys: dict[str | None, _Key] = {}
        self._fetched_at = -math.inf  # the last fetch that succeeded
        self._attempted_at = -math.inf  # the last fetch begun
        self._fetch: asyncio.Task[None] | None = None
        self.fetches = 0  # how many fetches were begun (tests and metrics read it)

    async def verify(self, token: str) -> Mapping[str, Any]:
        # Whatever a client sends is at worst a 401: every failure of the library on a token is
        # caught, not only the ones it documents.
        try:
            header = jwt.get_unverified_header(token)
        except Exception:
            raise Unauthenticated("the JWT is malformed") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise Unauthenticated(f"a JWT's algorithm must be one of {', '.join(ALGORITHMS)}")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise Unauthenticated("the JWT's kid is not a string")
        key = self._key(kid)
        if key is None:
            await self._fetch_now()
            key = self._key(kid)
            if key is None and kid is None:
                raise Unauthenticated(
                    "the JWT names no key (kid), and the identity provider does not publish "
                    "exactly one"
                )
            if key is None:
                raise Unauthenticated(
                    "the JWT's key (kid) is not one the identity provider publishes"
                )
        elif self._clock() - self._fetched_at >= self._refresh:
            self._begin_fetch()  # in the background: the keys known keep verifying meanwhile
        kty, crv = _KEY_TYPES[alg]
        if key.kty != kty or (crv is not None and key.crv != crv) or key.alg not in (None, alg):
            raise Unauthenticated("the JWT's algorithm does not match its key")
        try:
            return jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=self._audience,
                issuer=self._issuer,
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the JWT has expired") from None
        except jwt.ImmatureSignatureError:
            raise Unauthenticated("the JWT is not valid yet (nbf or iat)") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated("the JWT's issuer is not the one this service trusts") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated("the JWT's audience is not this service") from None
        except jwt.MissingRequiredClaimError as error:
            raise Unauthenticated(f"the JWT has no {error.claim} claim") from None
        except Exception:
            raise Unauthenticated("the JWT does not verify") from None

    def _key(self, kid: str | None) -> _Key | None:
        """The key a JWT's `kid` names; a JWT without one means the key set's only key (RFC
        7515 makes the kid optional; a provider with one key may leave it out): the only key
        without a kid, or the only key at all."""
        if kid is not None or _NO_KID in self._keys:
            return self._keys.get(kid)
        if len(self._keys) == 1:
            return next(iter(self._keys.values()))
        return None

    async def _fetch_now(self) -> None:
        """Fetch the key set (unless one was begun less than `refetch_seconds` ago and is
        done), and wait for it at most the fetch timeout."""
        task = self._begin_fetch()
        if task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), self._timeout)

    def _begin_fetch(self) -> asyncio.Task[None] | None:
        if self._fetch is not None and not self._fetch.done():
            return self._fetch
        if self._clock() - self._attempted_at < self._refetch:
            return None
        self._attempted_at = self._clock()
        self.fetches += 1
        self._fetch = asyncio.get_running_loop().create_task(self._load())
        return self._fetch

    async def _load(self) -> None:
        try:
            async with (
                asyncio.timeout(self._timeout),
                httpx.AsyncClient(timeout=self._timeout) as client,
                client.stream("GET", self._url) as response,
            ):
                if response.status_code != 200:
                    raise ValueError(f"status {response.status_code}")
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_JWKS_BYTES:
                        raise ValueError("larger than a key set")
            keys = _parse(bytes(body))
        except Exception as error:  # the provider out of reach, slow, or answering nonsense
            log.warning(
                "the identity provider's key set could not be fetched (%s); the keys known "
                "keep verifying",
                type(error).__name__,
            )
            return
        self._keys = keys
        self._fetched_at = self._clock()
