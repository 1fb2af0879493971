"""API tokens: stored only as SHA-256 hashes; each belongs to one tenant and one principal."""

from __future__ import annotations

import hashlib
import secrets
import time

from application.access import SCOPES, Caller
from application.errors import Unauthenticated
from application.ports import TokenStore
from domain.errors import InvalidInput
from domain.ids import check_id

TOKEN_PREFIX = "dst_"


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def make_caller(tenant: str, principal: str, scopes: list[str] | tuple[str, ...]) -> Caller:
    check_id("tenant", tenant)
    if not 1 <= len(principal) <= 256 or not principal.isprintable():
        raise InvalidInput("a principal is 1 to 256 printable characters")
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise InvalidInput(f"scopes must be some of {', '.join(SCOPES)}; got {unknown or 'none'}")
    return Caller(tenant=tenant, principal=principal, scopes=frozenset(scopes))


class IssueToken:
    def __init__(self, tokens: TokenStore) -> None:
        self._tokens = tokens

    async def __call__(self, caller: Caller, token: str | None = None) -> str:
        """Store a token for `caller`: a new random one, or exactly `token` (bootstrap)."""
        token = token or TOKEN_PREFIX + secrets.token_urlsafe(32)
        await self._tokens.put(token_hash(token), caller)
        return token


class Authenticate:
    """Resolve a bearer token. Known tokens are remembered for a few seconds per process so the
    hot path does not pay a query per request."""

    def __init__(self, tokens: TokenStore, ttl_seconds: float = 10.0) -> None:
        self._tokens = tokens
        self._ttl = ttl_seconds
        self._known: dict[bytes, tuple[float, Caller]] = {}

    async def __call__(self, authorization: str | None) -> Caller:
        if not authorization:
            raise Unauthenticated("an Authorization: Bearer <token> header is required")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("the Authorization header must be `Bearer <token>`")
        digest = token_hash(token)
        now = time.monotonic()
        known = self._known.get(digest)
        if known is not None and known[0] > now:
            return known[1]
        caller = await self._tokens.find(digest)
        if caller is None:
            raise Unauthenticated("unknown token")
        if len(self._known) > 10_000:
            self._known.clear()
        self._known[digest] = (now + self._ttl, caller)
        return caller
