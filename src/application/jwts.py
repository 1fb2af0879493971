"""Tokens from an identity provider: a Bearer value that is a JWT, verified by a `JwtVerifier`
(signature against the provider's JWKS, algorithm, `exp`/`nbf`/`iat`, `iss`, `aud`), then its
claims mapped onto a caller:

- `sub` is the principal (1 to 256 printable characters);
- the tenant claim (`DUCTOR_STREAMS_JWT_TENANT_CLAIM`, default `tenant`) the tenant, a string
  that is a valid ID;
- `scope` (space-separated) or `scp` (a list, or space-separated) the scopes: those of ours it
  names (an identity provider's others, `openid` and the like, are ignored; none of ours
  leaves a caller that is refused every route with 403);
- `runs`, optional, a list of run IDs the caller is restricted to, as a minted token's.

Anything else about a JWT that does not hold is 401, with a reason that names no tenant and no
run. A verified JWT is remembered, by its exact text, until it expires (its `exp` plus the
leeway the verification allowed) or for `reverify_seconds`, whichever comes first: the append
path pays one dictionary lookup per request, and a JWT whose key the provider stops publishing
(a key retired after a compromise) is refused once it is verified again, with the key set
refreshed meanwhile. A JWT cannot be revoked; an open connection admitted with one ends when it
expires, or when it no longer verifies: the connection asks again every `reverify_seconds`
(`still_valid`), so a key the provider stops publishing ends the connections it admitted too.
The key set out of reach changes nothing (the verifier keeps the keys it knows)."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from application.access import SCOPES, Caller
from application.errors import Unauthenticated
from application.ports import JwtVerifier
from domain.ids import ID_PATTERN

_ID = re.compile(ID_PATTERN)

# Clock skew allowed on `exp`, `nbf` and `iat`, both ways.
LEEWAY_SECONDS = 30
LAST_EXP = 253_402_300_799  # 9999-12-31T23:59:59Z, the last expiry a JWT is taken to have
# Beyond this many remembered JWTs, the memory starts over (a flood of distinct ones).
MAX_REMEMBERED = 10_000
# A remembered JWT is verified again after this long (its signature against the key set as
# then refreshed), so that one signed with a key the provider no longer publishes is refused.
REVERIFY_SECONDS = 60.0
# A caller admitted with a JWT has a token ID of this prefix (never a minted token's `tok_`).
JWT_ID_PREFIX = "jwt-"
# How many runs a JWT's `runs` claim may list.
MAX_RUNS = 100


def jwt_id(token: str) -> str:
    """The ID a JWT's open connections are held under (its digest: never the JWT itself)."""
    return JWT_ID_PREFIX + hashlib.sha256(token.encode()).hexdigest()[:32]


def is_jwt(token: str) -> bool:
    """A JWS in compact form: three dot-separated parts, the first a JSON object's base64url
    (which always begins `eyJ`, `{"`). Anything else is looked up as an opaque token."""
    return token.startswith("eyJ") and token.count(".") == 2


def _scopes(claims: Mapping[str, Any]) -> frozenset[str]:
    given = claims.get("scope", claims.get("scp"))
    if given is None:
        return frozenset()
    if isinstance(given, str):
        names = given.split()
    elif isinstance(given, list) and all(isinstance(s, str) for s in given):
        names = given
    else:
        raise Unauthenticated("the JWT's scope claim is neither a string nor a list of strings")
    return frozenset(names) & frozenset(SCOPES)


def _runs(claims: Mapping[str, Any]) -> frozenset[str] | None:
    runs = claims.get("runs")
    if runs is None:
        return None
    if (
        not isinstance(runs, list)
        or not 1 <= len(runs) <= MAX_RUNS  # ([] would be a token that sees no run at all)
        or not all(isinstance(r, str) and _ID.fullmatch(r) for r in runs)
    ):
        raise Unauthenticated(f"the JWT's runs claim is not a list of 1 to {MAX_RUNS} run IDs")
    return frozenset(runs)


def caller_from_claims(claims: Mapping[str, Any], tenant_claim: str) -> Caller:
    principal = claims.get("sub")
    if not isinstance(principal, str) or not 1 <= len(principal) <= 256:
        raise Unauthenticated("the JWT's sub claim is missing or not a principal")
    if not principal.isprintable():
        raise Unauthenticated("the JWT's sub claim is missing or not a principal")
    tenant = claims.get(tenant_claim)
    if not isinstance(tenant, str) or not _ID.fullmatch(tenant):
        raise Unauthenticated(f"the JWT's {tenant_claim} claim is missing or not a tenant ID")
    return Caller(tenant=tenant, principal=principal, scopes=_scopes(claims), runs=_runs(claims))


class JwtCallers:
    """JWT -> caller, remembered until the JWT expires."""

    def __init__(
        self,
        verifier: JwtVerifier,
        tenant_claim: str = "tenant",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        reverify_seconds: float = REVERIFY_SECONDS,
    ) -> None:
        self._verifier = verifier
        self._reverify = reverify_seconds
        self._tenant_claim = tenant_claim
        self._clock = clock
        self._wall_clock = wall_clock
        # token -> (its caller, when it is verified again)
        self._known: dict[str, tuple[Caller, float]] = {}
        # jwt_id -> the JWT, for `still_valid`; at most MAX_REMEMBERED, least recently verified
        # first out
        self._by_id: dict[str, str] = {}

    @property
    def reverify_seconds(self) -> float:
        return self._reverify

    is_jwt = staticmethod(is_jwt)

    def remembered(self, token: str) -> Caller | None:
        """The caller of `token` as verified, while it is remembered: no verification here."""
        known = self._known.get(token)
        return known[0] if known is not None and self._clock() < known[1] else None

    async def __call__(self, token: str) -> Caller:
        known = self._known.get(token)
        if known is not None:
            if self._clock() < known[1]:
                return known[0]
            del self._known[token]
        claims = await self._verifier.verify(token)
        exp = claims.get("exp")
        if not isinstance(exp, int | float) or isinstance(exp, bool):
            raise Unauthenticated("the JWT has no exp claim")
        caller = caller_from_claims(claims, self._tenant_claim)
        # An expiry past the year 9999 is taken as then: an integer of hundreds of digits
        # overflowed the float arithmetic below (500 on every route).
        left = min(exp, LAST_EXP) + LEEWAY_SECONDS - self._wall_clock()
        if left <= 0:
            raise Unauthenticated("the JWT has expired")
        caller = Caller(
            tenant=caller.tenant,
            principal=caller.principal,
            scopes=caller.scopes,
            runs=caller.runs,
            token_id=jwt_id(token),
            token_deadline=self._clock() + left,
            # What it mints outlives neither the JWT nor the leeway's 30 s past it.
            mint_deadline=self._clock() + left - LEEWAY_SECONDS,
        )
        if len(self._known) >= MAX_REMEMBERED:
            self._known.clear()
        assert caller.token_deadline is not None and caller.token_id is not None
        self._known[token] = (caller, min(caller.token_deadline, self._clock() + self._reverify))
        # Most recently verified last: past the bound, the least recently verified goes.
        self._by_id.pop(caller.token_id, None)
        if len(self._by_id) >= MAX_REMEMBERED:
            del self._by_id[next(iter(self._by_id))]
        self._by_id[caller.token_id] = token
        return caller

    async def still_valid(self, token_id: str) -> bool:
        """Whether the JWT an open connection was admitted with still verifies: as a request
        with it would be (verified again once `reverify_seconds` have passed). One this process
        no longer remembers (a flood of more than `MAX_REMEMBERED` distinct JWTs since pushed it
        out) is taken as valid: its connection still ends at its `exp`."""
        token = self._by_id.get(token_id)
        if token is None:
            return True
        try:
            await self(token)
        except Unauthenticated:
            return False  # kept: every other connection it admitted asks too
        return True
