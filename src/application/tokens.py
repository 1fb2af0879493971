"""API tokens: stored only as SHA-256 hashes; each belongs to one tenant and one principal.

A token has a public id (`tok_` and the hex of its hash's first 8 bytes) that names it in
`token list` and `token revoke` without revealing it. A revoked or expired token is refused.

Each process remembers the tokens it resolved (`TokenCache`) so the hot path does not pay a
query per request. A revocation reaches the other processes as a notification: the wake bus
hands it to `TokenCache.forget`, and forgets the whole cache whenever it (re)connects, since a
notification may have been missed meanwhile. While the bus is not listening, a remembered token
is trusted for at most `UNCONFIRMED_TTL_SECONDS`, so a revocation still takes effect everywhere
within 2 seconds.

A connection that stays open (an SSE follower, a long-poll) holds a `Lease` on its token from
the cache: when the token is forgotten as revoked, or reaches its expiry, each of its leases
ends and wakes its connection, which then ends too. Nothing is looked up per delivery: a
follower only reads its lease's `ended` flag.

Tokens are also minted over HTTP (`MintToken`): always in the minting caller's tenant, never
with a scope, a run or a life the minter does not have itself, always expiring. A token may be
restricted to some runs (`Caller.runs`). And a Bearer value that is a JWT, when an identity
provider is configured, is verified instead (`application.jwts`); its result is remembered
until the JWT expires."""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
import time
from collections.abc import Callable
from datetime import datetime
from typing import Annotated

import msgspec

from application import tracing
from application.access import SCOPES, Caller, Scope
from application.errors import Forbidden, NotFound, Unauthenticated
from application.jwts import JWT_ID_PREFIX, JwtCallers
from application.ports import FoundToken, TokenRecord, TokenStore
from application.tenant_limits import TokenLimit
from application.waiting import act_for, take_turn, within_allowance
from domain.definition import Principal
from domain.errors import InvalidInput, QuotaExhausted
from domain.ids import ID_PATTERN, check_id
from domain.text import check_text

TOKEN_PREFIX = "dst_"
TOKEN_ID_PREFIX = "tok_"
TOKEN_ID_PATTERN = r"^tok_[0-9a-f]{16}$"
TOKEN_ID = re.compile(TOKEN_ID_PATTERN)

# `GET /tokens` answers a page of at most this many tokens (`limit`, default 100).
DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1_000

# The longest `--expires-in`: ten years.
MAX_EXPIRES_IN_SECONDS = 10 * 365 * 86400

# How long a remembered token is trusted while revocations are not being heard (the wake bus is
# disconnected, or there is none): below the 2 seconds a revocation may take to be felt.
UNCONFIRMED_TTL_SECONDS = 1.0

# The default (and the operator's cap, `DUCTOR_STREAMS_MAX_TOKEN_SECONDS`) of a minted token's
# life: a day. A token minted over HTTP always expires.
DEFAULT_MAX_TOKEN_SECONDS = 86_400
# How many runs a token may be restricted to: a run-restricted token is for a few runs (a
# browser following one); listing its runs costs a lookup per run.
MAX_TOKEN_RUNS = 100
# A Bearer value longer than this is no token of ours, nor a JWT worth verifying: refused
# before it is hashed or parsed.
MAX_TOKEN_CHARS = 8_192

# Beyond this many remembered tokens, the cache starts over (a flood of distinct tokens).
MAX_CACHED = 10_000
# How many of the latest revocations a cache keeps in mind for leases taken just after them.
MAX_REVOKED = 1_024


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def token_id(digest: bytes) -> str:
    """The public id of the token with this hash."""
    return TOKEN_ID_PREFIX + digest[:8].hex()


def check_principal(principal: str) -> str:
    if not 1 <= len(principal) <= 256 or not principal.isprintable():
        raise InvalidInput("a principal is 1 to 256 printable characters", field="principal")
    return principal


def check_runs(runs: list[str] | tuple[str, ...] | None) -> frozenset[str] | None:
    """The runs a token is restricted to (None: every run of its tenant)."""
    if runs is None:
        return None
    if not 1 <= len(runs) <= MAX_TOKEN_RUNS:
        raise InvalidInput(f"runs lists 1 to {MAX_TOKEN_RUNS} run IDs", field="runs")
    return frozenset(check_id("runID", run) for run in runs)


def make_caller(
    tenant: str,
    principal: str,
    scopes: list[str] | tuple[str, ...],
    runs: list[str] | tuple[str, ...] | None = None,
) -> Caller:
    check_id("tenant", tenant)
    check_principal(principal)
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise InvalidInput(f"scopes must be some of {', '.join(SCOPES)}; got {unknown or 'none'}")
    return Caller(
        tenant=tenant, principal=principal, scopes=frozenset(scopes), runs=check_runs(runs)
    )


def check_expires_in(seconds: int | None) -> None:
    if seconds is not None and not 1 <= seconds <= MAX_EXPIRES_IN_SECONDS:
        raise InvalidInput(f"a token expires in 1 to {MAX_EXPIRES_IN_SECONDS} seconds")


class IssueToken:
    def __init__(self, tokens: TokenStore) -> None:
        self._tokens = tokens

    async def __call__(
        self, caller: Caller, token: str | None = None, expires_in_seconds: int | None = None
    ) -> str:
        """Store a token for `caller`: a new random one, or exactly `token` (bootstrap)."""
        check_expires_in(expires_in_seconds)
        token = token or TOKEN_PREFIX + secrets.token_urlsafe(32)
        await self._tokens.put(token_hash(token), caller, expires_in_seconds)
        return token


class RevokeToken:
    """Revoke a token named by itself or by its id, and the tokens minted from it; returns its
    id. Revoking twice is fine."""

    def __init__(self, tokens: TokenStore, cache: TokenCache | None = None) -> None:
        self._tokens = tokens
        self._cache = cache

    @tracing.use_case("revoke token")
    async def __call__(self, token_or_id: str) -> str:
        # The token itself first: a configured bootstrap token could look like an id.
        candidates = [token_id(token_hash(token_or_id))]
        if TOKEN_ID.match(token_or_id):
            candidates.append(token_or_id)
        for candidate in candidates:
            revoked = await self._tokens.revoke(candidate)
            if revoked:
                if self._cache is not None:
                    for each in revoked:
                        self._cache.forget(each)
                return candidate
        raise NotFound("no token is known by that value or id")


class ListTokens:
    def __init__(self, tokens: TokenStore) -> None:
        self._tokens = tokens

    @tracing.use_case("list tokens")
    async def __call__(self, tenant: str | None = None) -> list[TokenRecord]:
        if tenant is not None:
            check_id("tenant", tenant)
        return await self._tokens.list(tenant)


RunId = Annotated[str, msgspec.Meta(pattern=ID_PATTERN)]


class TokenRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What `POST /tokens` takes. `principal` defaults to the caller's; `runs` to the caller's
    runs (every run, for a caller that is not restricted). `expires_in_seconds` is documented
    with the default cap; the configured one decides."""

    scopes: Annotated[list[Scope], msgspec.Meta(min_length=1)]
    expires_in_seconds: Annotated[
        int, msgspec.Meta(ge=1, extra_json_schema={"maximum": DEFAULT_MAX_TOKEN_SECONDS})
    ]
    principal: Principal | None = None
    runs: Annotated[list[RunId], msgspec.Meta(min_length=1, max_length=MAX_TOKEN_RUNS)] | None = (
        None
    )


class TokenView(msgspec.Struct, frozen=True):
    """A token as listed: never the token or its hash."""

    id: str
    tenant: str
    principal: str
    scopes: list[str]
    runs: list[str] | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class MintedToken(msgspec.Struct, frozen=True):
    """The answer to a mint: the only time the token itself is shown."""

    token: str
    id: str
    tenant: str
    principal: str
    scopes: list[str]
    runs: list[str] | None
    expires_at: datetime | None


class TokenList(msgspec.Struct, frozen=True):
    tokens: list[TokenView]
    # The last token listed when more follow (the next page's `after`), or null.
    next_after: str | None


def token_view(record: TokenRecord) -> TokenView:
    runs = record.caller.runs
    return TokenView(
        id=record.token_id,
        tenant=record.caller.tenant,
        principal=record.caller.principal,
        scopes=sorted(record.caller.scopes),
        runs=None if runs is None else sorted(runs),
        created_at=record.created_at,
        expires_at=record.expires_at,
        revoked_at=record.revoked_at,
    )


def _within(caller: Caller, record: TokenRecord) -> bool:
    """Whether a token is the caller's to see: in its tenant and, for a run-restricted caller,
    restricted to some of its runs (a token that sees more would tell of other runs)."""
    if record.caller.tenant != caller.tenant:
        return False
    if caller.runs is None:
        return True
    return record.caller.runs is not None and record.caller.runs <= caller.runs


def below(caller: Caller, principal: str) -> str:
    """The principal a token `caller` mints is given, asked for `principal`. An administrator of
    some runs names it below its own principal (`{its own}/{principal}`; its own, or a name
    already below it, as it is): under any name it liked it could act as that name, read the
    streams whose pinned `authorization` lists it and ack its consumers. A tenant's
    administrator (restricted to no run) names any principal of its tenant."""
    if caller.runs is None or principal == caller.principal:
        return principal
    if principal.startswith(caller.principal + "/"):
        return principal
    named = f"{caller.principal}/{principal}"
    if len(named) > 256:
        raise InvalidInput(
            f"a token restricted to runs names the tokens it mints below its own principal "
            f"({caller.principal!r}/...), and that name would be longer than 256 characters",
            field="principal",
        )
    return named


class MintToken:
    """`POST /tokens` (streams:admin): a token never wider than its minter, in scope, runs or
    life. `clock` is the monotonic clock a caller's `token_deadline` is on."""

    def __init__(
        self,
        tokens: TokenStore,
        max_seconds: int = DEFAULT_MAX_TOKEN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        limit: TokenLimit | None = None,
    ) -> None:
        self._tokens = tokens
        self._max = max_seconds
        self._clock = clock
        self._limit = limit

    @tracing.use_case("mint token")
    async def __call__(self, caller: Caller, request: TokenRequest) -> MintedToken:
        caller.require("streams:admin")
        unknown = sorted(set(request.scopes) - set(SCOPES))
        if unknown:
            raise InvalidInput(f"scopes must be some of {', '.join(SCOPES)}", field="scopes")
        scopes = frozenset(request.scopes)
        if not scopes <= caller.scopes:
            raise Forbidden("a token cannot be given a scope its minter does not have")
        seconds = request.expires_in_seconds
        if not 1 <= seconds <= self._max:
            raise InvalidInput(
                f"expires_in_seconds is 1 to {self._max}", field="expires_in_seconds"
            )
        deadline = caller.token_deadline if caller.mint_deadline is None else caller.mint_deadline
        if deadline is not None and seconds > deadline - self._clock():
            raise Forbidden("a token cannot outlive the token that mints it")
        runs = check_runs(request.runs)
        if caller.runs is not None:
            if runs is None:
                runs = caller.runs
            elif not runs <= caller.runs:
                raise Forbidden("a token cannot be given a run its minter is not restricted to")
        principal = caller.principal
        if request.principal is not None:
            principal = below(caller, check_text("principal", request.principal))
        minted = Caller(
            tenant=caller.tenant,
            principal=principal,
            scopes=scopes,
            runs=runs,
        )
        limit = self._limit
        # Taken before it is stored, so that mints at once count against each other.
        if limit is not None and not await limit.take(caller.tenant):
            raise QuotaExhausted(
                f"the tenant holds its limit of {limit.limit} tokens (revoked and expired"
                " ones count until they are forgotten): none is minted until some are",
                max_tokens=limit.limit,
            )
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        digest = token_hash(token)
        stored = False
        try:
            # A stored minter's revocation revokes what it minted (a JWT is never stored).
            minter = caller.token_id
            stored_minter = minter if minter is not None and TOKEN_ID.match(minter) else None
            expires_at = await self._tokens.put(digest, minted, seconds, minted_by=stored_minter)
            stored = True
        except asyncio.CancelledError:
            stored = True  # not known: counted until the next read, rather than missed
            raise
        finally:
            if limit is not None:
                limit.made(caller.tenant, stored)
        return MintedToken(
            token=token,
            id=token_id(digest),
            tenant=minted.tenant,
            principal=minted.principal,
            scopes=sorted(scopes),
            runs=None if runs is None else sorted(runs),
            expires_at=expires_at,
        )


class TenantTokens:
    """`GET /tokens` and `DELETE /tokens/{id}` (streams:admin): the caller's tenant's tokens
    (for a run-restricted caller, only those restricted to some of its runs); any other is not
    found."""

    def __init__(self, tokens: TokenStore, cache: TokenCache | None = None) -> None:
        self._tokens = tokens
        self._cache = cache

    async def list(
        self, caller: Caller, after: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> TokenList:
        """A keyset page by creation: the `limit` tokens after the token `after` (exclusive)
        that the caller may see (for a run-restricted caller, those restricted to some of its
        runs, chosen by the store's read: `next_after`, the last token listed, never names one
        it may not see, nor does a page stop short of `limit` while more follow)."""
        caller.require("streams:admin")
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidInput(f"limit must be 1 to {MAX_LIST_LIMIT}", field="limit")
        if after is not None and not TOKEN_ID.match(after):
            raise InvalidInput("after is a token id: tok_ and 16 hex digits", field="after")
        # One more than asked says whether another page follows.
        records = await self._tokens.page(caller.tenant, after, limit + 1, caller.runs)
        listed = records[:limit]
        return TokenList(
            tokens=[token_view(r) for r in listed],
            next_after=listed[-1].token_id if len(records) > limit else None,
        )

    async def revoke(self, caller: Caller, token_id: str) -> None:
        caller.require("streams:admin")
        record = await self._tokens.get(token_id) if TOKEN_ID.match(token_id) else None
        if record is None or not _within(caller, record):
            raise NotFound(f"no token {token_id[:40]!r}")
        revoked = await self._tokens.revoke(token_id)
        if self._cache is not None:
            for each in revoked or [token_id]:
                self._cache.forget(each)


class Lease:
    """An open connection's hold on the token it was admitted with. `ended` turns true once the
    token is revoked or expires; `on_end` names what wakes the connection then."""

    __slots__ = ("_check", "_checking", "_timer", "_wake", "ended", "token_id")

    def __init__(self, token_id: str | None) -> None:
        self.token_id = token_id
        self.ended = False
        self._wake: Callable[[], None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        # A JWT's: the next time it is verified again, and that verification while it runs.
        self._check: asyncio.TimerHandle | None = None
        self._checking: asyncio.Task[None] | None = None

    def _stop(self) -> None:
        for handle in (self._timer, self._check):
            if handle is not None:
                handle.cancel()
        if self._checking is not None and self._checking is not asyncio.current_task():
            self._checking.cancel()

    def on_end(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        if self.ended:
            wake()

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        self._stop()
        if self._wake is not None:
            self._wake()


# Whom a token's lookup acts for (no tenant's ID has parentheses): the lookups of tokens the
# process does not trust yet share one tenant's share of the pool's connections, so that a
# flood of unknown tokens, or of known ones while revocations are not heard, cannot take them all.
TOKEN_LOOKUPS = "(token lookups)"


class TokenCache:
    """Tokens this process resolved, by id: trusted for `ttl_seconds` (never past the token's
    expiry) while revocations are heard, and for at most `UNCONFIRMED_TTL_SECONDS` otherwise."""

    def __init__(
        self,
        ttl_seconds: float = 10.0,
        unconfirmed_ttl_seconds: float = UNCONFIRMED_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        jwts: JwtCallers | None = None,
    ) -> None:
        self._ttl = ttl_seconds
        self._jwts = jwts  # the JWTs a connection admitted with one is verified again by
        self._unconfirmed_ttl = min(unconfirmed_ttl_seconds, ttl_seconds)
        self._clock = clock
        # token id -> (hash, caller, when it was looked up, when it must be looked up again)
        self._known: dict[str, tuple[bytes, Caller, float, float]] = {}
        # token id -> (hash, tenant): whose turns a request of the token takes at the gate. Kept
        # through `forget_all` and revocations (a token's tenant never changes; a revoked
        # token's requests are refused as they authenticate, on its tenant's turns).
        self._tenants: dict[str, tuple[bytes, str]] = {}
        self._generation = 0  # moves on every forget: a lookup begun before is not remembered
        self.live = False  # revocations are being heard (set by the wake bus)
        self._leases: dict[str, set[Lease]] = {}  # token id -> the open connections holding it
        # The latest revocations heard: a connection authenticated just before one, and holding
        # its lease only just after, ends at once instead of missing it.
        self._revoked: dict[str, None] = {}

    def now(self) -> float:
        return self._clock()

    def hold(self, caller: Caller) -> Lease:
        """A lease for a connection that stays open on `caller`'s token; `release` it."""
        lease = Lease(caller.token_id)
        if caller.token_id is None:
            return self._until_deadline(caller, lease)
        if caller.token_id.startswith(JWT_ID_PREFIX):
            # A JWT cannot be revoked, but it expires, and stops verifying once the provider
            # stops publishing its key.
            if self._jwts is not None:
                self._recheck_later(lease, self._jwts)
            return self._until_deadline(caller, lease)
        self._leases.setdefault(caller.token_id, set()).add(lease)
        if caller.token_id in self._revoked:
            lease.end()
        return self._until_deadline(caller, lease)

    def _until_deadline(self, caller: Caller, lease: Lease) -> Lease:
        if caller.token_deadline is not None:
            delay = caller.token_deadline - self._clock()
            if delay <= 0:
                lease.end()
            else:
                lease._timer = asyncio.get_running_loop().call_later(delay, lease.end)
        return lease

    def _recheck_later(self, lease: Lease, jwts: JwtCallers) -> None:
        async def check(token_id: str) -> None:
            if not await jwts.still_valid(token_id):
                lease.end()
            elif not lease.ended:
                self._recheck_later(lease, jwts)

        def start() -> None:
            assert lease.token_id is not None
            lease._checking = asyncio.get_running_loop().create_task(check(lease.token_id))

        lease._check = asyncio.get_running_loop().call_later(jwts.reverify_seconds, start)

    def release(self, lease: Lease) -> None:
        lease._stop()
        held = self._leases.get(lease.token_id or "")
        if held is not None:
            held.discard(lease)
            if not held:
                del self._leases[lease.token_id or ""]

    def held_ids(self) -> list[str]:
        """The ids of the tokens open connections hold."""
        return list(self._leases)

    def held(self) -> int:
        """How many open connections hold a lease."""
        return sum(len(h) for h in self._leases.values())

    @property
    def generation(self) -> int:
        return self._generation

    def get(self, digest: bytes) -> Caller | None:
        entry = self._known.get(token_id(digest))
        if entry is None or entry[0] != digest:
            return None
        _, caller, looked_up, until = entry
        now = self._clock()
        if now >= until or (not self.live and now >= looked_up + self._unconfirmed_ttl):
            return None
        return caller

    def tenant_of(self, digest: bytes) -> str | None:
        """The tenant of a token this process has resolved, trusted or not any more: the gate's
        (entrypoints/edge/turns.py) to count the request on its tenant's turns before it
        authenticates. Only the tenant: whether the token is still valid is authentication's.
        (Through `get`, the gate knew no token while revocations were not heard and a second
        had passed: under a flood that delayed the wake bus's heartbeats, every request was let
        through to look its token up, and the lookups took the pool from every tenant.)"""
        entry = self._tenants.get(token_id(digest))
        return entry[1] if entry is not None and entry[0] == digest else None

    def jwt_caller(self, token: str) -> Caller | None:
        """The caller of a JWT verified and remembered by this process, if it is (and not due to
        be verified again); None otherwise, or when the process takes no JWTs."""
        return None if self._jwts is None else self._jwts.remembered(token)

    def remember(
        self, digest: bytes, caller: Caller, expires_in: float | None, generation: int
    ) -> None:
        """Remember a lookup that began at `generation`, unless something was forgotten since
        (the answer may predate that revocation)."""
        if generation != self._generation or self._ttl <= 0:
            return
        if len(self._known) >= MAX_CACHED:
            self._known.clear()
        now = self._clock()
        ttl = self._ttl if expires_in is None else min(self._ttl, expires_in)
        self._known[token_id(digest)] = (digest, caller, now, now + ttl)
        if len(self._tenants) >= MAX_CACHED:
            self._tenants.clear()
        self._tenants[token_id(digest)] = (digest, caller.tenant)

    def forget(self, token_id: str) -> None:
        """The token was revoked: forget it, and end every open connection that holds it."""
        self._generation += 1
        self._known.pop(token_id, None)
        self._revoked[token_id] = None
        if len(self._revoked) > MAX_REVOKED:
            del self._revoked[next(iter(self._revoked))]
        for lease in self._leases.pop(token_id, ()):
            lease.end()

    def forget_all(self) -> None:
        self._generation += 1
        self._known.clear()

    def listening(self) -> None:
        """Revocations are heard from now on: whatever was remembered before may have missed
        one, so it is all forgotten."""
        self.forget_all()
        self.live = True

    def not_listening(self) -> None:
        self.live = False


class Authenticate:
    """Resolve a bearer token, through the process's TokenCache; a JWT, when an identity
    provider is configured, through `jwts`. A token the cache does not trust is looked up once
    at a time however many requests carry it (they wait for the one lookup), acting for
    TOKEN_LOOKUPS."""

    def __init__(
        self, tokens: TokenStore, cache: TokenCache, jwts: JwtCallers | None = None
    ) -> None:
        self._tokens = tokens
        self._cache = cache
        self._jwts = jwts
        self._finding: dict[bytes, asyncio.Future[FoundToken | None]] = {}

    async def __call__(self, authorization: str | None) -> Caller:
        caller = await self._resolve(authorization)
        act_for(caller.tenant)
        await take_turn(caller.tenant)
        return caller

    async def _resolve(self, authorization: str | None) -> Caller:
        if not authorization:
            raise Unauthenticated("an Authorization: Bearer <token> header is required")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("the Authorization header must be `Bearer <token>`")
        if len(token) > MAX_TOKEN_CHARS:
            raise Unauthenticated(
                f"the token is over {MAX_TOKEN_CHARS} characters: no token or JWT this service "
                "accepts is that long"
            )
        if self._jwts is not None and self._jwts.is_jwt(token):
            return await self._jwts(token)
        digest = token_hash(token)
        caller = self._cache.get(digest)
        if caller is not None:
            return caller
        generation = self._cache.generation
        found = await self._find(digest)
        if found is None:
            raise Unauthenticated("unknown, revoked or expired token")
        expires_in = found.expires_in_seconds
        caller = msgspec.structs.replace(
            found.caller,
            token_id=token_id(digest),
            token_deadline=None if expires_in is None else self._cache.now() + expires_in,
        )
        self._cache.remember(digest, caller, expires_in, generation)
        return caller

    async def _find(self, digest: bytes) -> FoundToken | None:
        finding = self._finding.get(digest)
        if finding is None:
            finding = asyncio.ensure_future(self._lookup(digest))
            self._finding[digest] = finding
            finding.add_done_callback(lambda done: self._found(digest, done))
        return await within_allowance(asyncio.shield(finding), "the database (the token's lookup)")

    async def _lookup(self, digest: bytes) -> FoundToken | None:
        act_for(TOKEN_LOOKUPS)
        return await self._tokens.find(digest)

    def _found(self, digest: bytes, done: asyncio.Future[FoundToken | None]) -> None:
        if self._finding.get(digest) is done:
            del self._finding[digest]
        if not done.cancelled():
            done.exception()  # (retrieved: every request waiting for it may have given up)
