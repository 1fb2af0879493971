"""Minting, run restriction and JWT callers on the memory adapters: no database, no network."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from adapters.memory.tokens import MemoryTokens
from application.access import SCOPES, Caller
from application.errors import Forbidden, NotFound, Unauthenticated
from application.jwts import (
    LAST_EXP,
    LEEWAY_SECONDS,
    REVERIFY_SECONDS,
    JwtCallers,
    caller_from_claims,
    is_jwt,
)
from application.tenant_limits import TokenLimit
from application.tokens import (
    Authenticate,
    IssueToken,
    MintToken,
    TenantTokens,
    TokenCache,
    TokenRequest,
)
from domain.errors import InvalidInput, QuotaExhausted

ADMIN = Caller(tenant="t", principal="admin", scopes=frozenset(SCOPES))


def request(**given) -> TokenRequest:
    given.setdefault("scopes", ["streams:read"])
    given.setdefault("expires_in_seconds", 60)
    return TokenRequest(**given)


async def test_a_minted_token_authenticates_as_what_was_minted() -> None:
    store = MemoryTokens()
    minted = await MintToken(store)(ADMIN, request(runs=["r1"], principal="viewer"))
    caller = await Authenticate(store, TokenCache())(f"Bearer {minted.token}")
    assert (caller.tenant, caller.principal, caller.scopes, caller.runs) == (
        "t",
        "viewer",
        frozenset({"streams:read"}),
        frozenset({"r1"}),
    )
    assert caller.token_deadline is not None


@pytest.mark.parametrize(
    ("minter", "asked", "error"),
    [
        (Caller(tenant="t", principal="w", scopes=frozenset({"streams:write"})), {}, Forbidden),
        (
            Caller(tenant="t", principal="a", scopes=frozenset({"streams:admin"})),
            {"scopes": ["streams:read"]},
            Forbidden,
        ),
        (ADMIN, {"expires_in_seconds": 86_401}, InvalidInput),
        (
            Caller(tenant="t", principal="a", scopes=frozenset(SCOPES), token_deadline=30.0),
            {"expires_in_seconds": 60},
            Forbidden,
        ),
        (
            Caller(tenant="t", principal="a", scopes=frozenset(SCOPES), runs=frozenset({"r1"})),
            {"runs": ["r1", "r2"]},
            Forbidden,
        ),
    ],
    ids=["no-admin", "wider-scope", "past-the-cap", "outliving-its-minter", "another-run"],
)
async def test_a_mint_never_widens_its_minter(minter: Caller, asked: dict, error: type) -> None:
    store = MemoryTokens()
    with pytest.raises(error):
        await MintToken(store, clock=lambda: 0.0)(minter, request(**asked))
    assert await store.list() == []


async def test_a_tenant_mints_no_more_tokens_than_its_limit_until_some_are_forgotten() -> None:
    """DUCTOR_STREAMS_MAX_TOKENS_PER_TENANT: every token kept counts, revoked or expired, until
    the workers forget it; mints at once count against each other; another tenant's are its
    own. A token the operator issues (`token create`, the bootstrap token) is not refused."""
    now = [datetime(2026, 12, 7, tzinfo=UTC)]
    store = MemoryTokens(clock=lambda: now[0])
    limit = TokenLimit(store, 3, fresh_seconds=0)
    mint = MintToken(store, limit=limit)
    first = await mint(ADMIN, request(expires_in_seconds=1))
    await TenantTokens(store).revoke(ADMIN, first.id)
    at_once = [mint(ADMIN, request()) for _ in range(4)]
    outcomes = await asyncio.gather(*at_once, return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, QuotaExhausted)]
    assert len(refused) == 2 and refused[0].extra == {"max_tokens": 3}
    assert await store.tenant_tokens("t") == 3
    other = Caller(tenant="u", principal="admin", scopes=frozenset(SCOPES))
    await mint(other, request())
    # The first has expired; once forgotten, it no longer counts.
    now[0] += timedelta(seconds=10)
    assert await store.forget_ended(timedelta(seconds=5)) == 1
    await mint(ADMIN, request())
    with pytest.raises(QuotaExhausted):
        await mint(ADMIN, request())
    await IssueToken(store)(Caller(tenant="t", principal="operator", scopes=frozenset(SCOPES)))
    assert await store.tenant_tokens("t") == 4


async def test_mints_in_flight_count_when_the_count_is_read_again_meanwhile() -> None:
    """A mint is counted from its check until it is stored: a read of the count while it is
    in flight (the second-old view gone stale) does not find it in the rows yet, and must not
    take it off (it did, and all of 5 mints against a limit of 3 were stored)."""
    store = MemoryTokens()
    stored, put = asyncio.Event(), store.put

    async def slow_put(*args, **kwargs):
        await stored.wait()
        return await put(*args, **kwargs)

    store.put = slow_put  # type: ignore[method-assign]
    now = [0.0]
    mint = MintToken(store, limit=TokenLimit(store, 3, clock=lambda: now[0]))
    minting = [asyncio.ensure_future(mint(ADMIN, request())) for _ in range(2)]
    await asyncio.sleep(0.01)  # both checked, both being stored
    now[0] += 5  # the view is stale: the next mints read the count again
    minting += [asyncio.ensure_future(mint(ADMIN, request())) for _ in range(3)]
    await asyncio.sleep(0.01)
    stored.set()
    outcomes = await asyncio.gather(*minting, return_exceptions=True)
    assert sum(isinstance(o, QuotaExhausted) for o in outcomes) == 2
    assert await store.tenant_tokens("t") == 3


async def test_a_run_scoped_caller_sees_and_revokes_only_tokens_within_its_runs() -> None:
    store = MemoryTokens()
    mint = MintToken(store)
    wide = await mint(ADMIN, request(runs=["r1", "r2"]))
    narrow = await mint(ADMIN, request(runs=["r1"]))
    everything = await mint(ADMIN, request())
    scoped = Caller(tenant="t", principal="a", scopes=frozenset(SCOPES), runs=frozenset({"r1"}))
    tokens = TenantTokens(store)
    assert [t.id for t in (await tokens.list(scoped)).tokens] == [narrow.id]
    for hidden in (wide.id, everything.id):
        with pytest.raises(NotFound):
            await tokens.revoke(scoped, hidden)
    other_tenant = Caller(tenant="u", principal="a", scopes=frozenset(SCOPES))
    with pytest.raises(NotFound):
        await tokens.revoke(other_tenant, narrow.id)
    await tokens.revoke(scoped, narrow.id)
    assert (await tokens.list(ADMIN)).tokens[1].revoked_at is not None


def test_a_run_scoped_caller_does_not_find_other_runs() -> None:
    scoped = Caller(tenant="t", principal="a", scopes=frozenset(SCOPES), runs=frozenset({"r1"}))
    assert scoped.key("r1", "s").run_id == "r1"
    with pytest.raises(NotFound):
        scoped.key("r2", "s")
    with pytest.raises(NotFound):
        scoped.run("r2")
    with pytest.raises(InvalidInput):  # a bad ID is still 400 first
        scoped.key("bad/run", "s")


class CountingVerifier:
    def __init__(self, claims: dict) -> None:
        self.claims = claims
        self.calls = 0

    async def verify(self, token: str) -> dict:
        self.calls += 1
        return self.claims


async def test_a_verified_jwt_is_remembered_until_it_expires() -> None:
    now = [1000.0]
    verifier = CountingVerifier({"sub": "s", "tenant": "t", "scope": "streams:read", "exp": 1010})
    jwts = JwtCallers(verifier, clock=lambda: now[0], wall_clock=lambda: now[0])
    first = await jwts("eyJ.a.b")
    assert await jwts("eyJ.a.b") is first and verifier.calls == 1
    assert first.token_deadline == 1010 + LEEWAY_SECONDS
    now[0] = 1010 + LEEWAY_SECONDS  # past its exp and the leeway: verified again, and refused
    with pytest.raises(Unauthenticated):
        await jwts("eyJ.a.b")
    assert verifier.calls == 2


async def test_a_jwt_mints_no_token_outliving_its_exp_though_the_leeway_admits_it() -> None:
    """The leeway forgives a clock behind the provider's; a token minted from the JWT is bound
    by the JWT's own `exp`."""
    now = [1000.0]
    claims = {"sub": "s", "tenant": "t", "scope": " ".join(SCOPES), "exp": 1010}
    jwts = JwtCallers(CountingVerifier(claims), clock=lambda: now[0], wall_clock=lambda: now[0])
    mint = MintToken(MemoryTokens(), clock=lambda: now[0])
    await mint(await jwts("eyJ.a.b"), request(expires_in_seconds=10))
    with pytest.raises(Forbidden, match="outlive"):
        await mint(await jwts("eyJ.a.b"), request(expires_in_seconds=11))
    now[0] = 1015  # past its exp, within the leeway: it still authenticates, and mints nothing
    caller = await jwts("eyJ.a.c")
    with pytest.raises(Forbidden, match="outlive"):
        await mint(caller, request(expires_in_seconds=1))


async def test_a_minter_restricted_to_runs_names_its_tokens_below_its_own_principal() -> None:
    minter = Caller(tenant="t", principal="ops", scopes=frozenset(SCOPES), runs=frozenset({"r1"}))
    mint = MintToken(MemoryTokens())
    named = [
        (await mint(minter, request(principal=p))).principal
        for p in ("alice", "ops", "ops/agent", "opsx")
    ]
    assert named == ["ops/alice", "ops", "ops/agent", "ops/opsx"]
    assert (await mint(ADMIN, request(principal="alice"))).principal == "alice"
    with pytest.raises(InvalidInput):
        await mint(minter, request(principal="a" * 253))


@pytest.mark.parametrize("exp", [10**309, 2**1024, 1.7e308])
async def test_a_jwt_expiring_past_any_clock_is_taken_as_expiring_in_9999(exp: float) -> None:
    """An `exp` of hundreds of digits overflowed the float arithmetic of its deadline (500)."""
    now = [1000.0]
    verifier = CountingVerifier({"sub": "s", "tenant": "t", "exp": exp})
    jwts = JwtCallers(verifier, clock=lambda: now[0], wall_clock=lambda: now[0])
    caller = await jwts("eyJ.a.b")
    assert caller.token_deadline == LAST_EXP + LEEWAY_SECONDS


async def test_a_remembered_jwt_is_verified_again_and_refused_once_its_key_is_gone() -> None:
    """A provider that stops publishing a key (retired after a compromise): a JWT signed with
    it, remembered for hours of `exp`, is refused once `REVERIFY_SECONDS` have passed."""
    now = [1000.0]
    verifier = CountingVerifier({"sub": "s", "tenant": "t", "exp": 1000 + 8 * 3600})
    jwts = JwtCallers(verifier, clock=lambda: now[0], wall_clock=lambda: now[0])
    first = await jwts("eyJ.a.b")
    now[0] += REVERIFY_SECONDS - 1
    assert await jwts("eyJ.a.b") is first and verifier.calls == 1
    now[0] += 1
    assert (await jwts("eyJ.a.b")).principal == "s" and verifier.calls == 2

    async def gone(token: str) -> dict:
        raise Unauthenticated("the JWT's key (kid) is not one the identity provider publishes")

    verifier.verify = gone  # type: ignore[method-assign]
    now[0] += REVERIFY_SECONDS
    with pytest.raises(Unauthenticated):
        await jwts("eyJ.a.b")


async def test_authenticate_sends_jwts_to_the_verifier_and_the_rest_to_the_store() -> None:
    verifier = CountingVerifier({"sub": "s", "tenant": "t", "exp": 10**10})
    authenticate = Authenticate(MemoryTokens(), TokenCache(), JwtCallers(verifier))
    caller = await authenticate("Bearer eyJhbGciOiJFUzI1NiJ9.e30.c2ln")
    assert caller.scopes == frozenset() and verifier.calls == 1
    with pytest.raises(Unauthenticated):
        await authenticate("Bearer dst_unknown")
    with pytest.raises(Unauthenticated, match="over 8192 characters"):  # its reason, named
        await authenticate("Bearer eyJ" + "A" * 9000 + ".e30.c2ln")
    assert verifier.calls == 1


@pytest.mark.parametrize(
    "claims",
    [
        {"tenant": "t"},
        {"sub": "", "tenant": "t"},
        {"sub": 7, "tenant": "t"},
        {"sub": "s"},
        {"sub": "s", "tenant": 1},
        {"sub": "s", "tenant": "a/b"},
        {"sub": "s", "tenant": "t", "runs": "r1"},
        {"sub": "s", "tenant": "t", "runs": [1]},
        {"sub": "s", "tenant": "t", "runs": [f"r{i}" for i in range(101)]},
        {"sub": "s", "tenant": "t", "runs": []},  # no run at all: a minted token never is so
        {"sub": "s", "tenant": "t", "scope": 3},
        {"sub": "s", "tenant": "t", "scp": [1]},
    ],
)
def test_claims_that_do_not_make_a_caller_are_401(claims: dict) -> None:
    with pytest.raises(Unauthenticated):
        caller_from_claims(claims, "tenant")


def test_claims_map_onto_a_caller() -> None:
    caller = caller_from_claims(
        {"sub": "s", "org": "t", "scp": "openid streams:write", "runs": ["r"]}, "org"
    )
    assert (caller.tenant, caller.principal, caller.scopes, caller.runs) == (
        "t",
        "s",
        frozenset({"streams:write"}),
        frozenset({"r"}),
    )


def test_what_counts_as_a_jwt() -> None:
    assert is_jwt("eyJhbGciOiJSUzI1NiJ9.e30.c2ln")
    assert not is_jwt("dst_abc") and not is_jwt("eyJ.a") and not is_jwt("x.y.z")


async def test_a_connection_admitted_with_a_jwt_ends_when_the_jwt_expires() -> None:
    import asyncio
    import time

    cache = TokenCache()
    caller = Caller(
        tenant="t", principal="s", scopes=frozenset(SCOPES), token_deadline=time.monotonic() + 0.05
    )
    lease = cache.hold(caller)  # no token id: nothing to revoke, but it expires
    ended = asyncio.Event()
    lease.on_end(ended.set)
    await asyncio.wait_for(ended.wait(), 2)
    assert lease.ended
    cache.release(lease)
    assert cache.held() == 0


@pytest.mark.parametrize(
    "given",
    [
        {"JWT_JWKS_URL": "https://idp.example/jwks.json"},
        {"JWT_JWKS_URL": "https://idp.example/jwks.json", "JWT_ISSUER": "https://idp.example"},
        {"JWT_ISSUER": "i", "JWT_AUDIENCE": "a"},
        {"JWT_JWKS_URL": "file:///etc/jwks.json", "JWT_ISSUER": "i", "JWT_AUDIENCE": "a"},
        {"MAX_TOKEN_SECONDS": "0"},
        {"JWT_JWKS_TIMEOUT_SECONDS": "61"},
    ],
)
def test_identity_settings_that_cannot_work_stop_the_process(given: dict[str, str]) -> None:
    from entrypoints.config import InvalidSetting, Settings

    with pytest.raises(InvalidSetting):
        Settings.from_env({f"DUCTOR_STREAMS_{k}": v for k, v in given.items()})


def test_identity_settings() -> None:
    from entrypoints.config import Settings

    settings = Settings.from_env(
        {
            "DUCTOR_STREAMS_JWT_JWKS_URL": "https://idp.example/jwks.json",
            "DUCTOR_STREAMS_JWT_ISSUER": "https://idp.example",
            "DUCTOR_STREAMS_JWT_AUDIENCE": "streams",
            "DUCTOR_STREAMS_MAX_TOKEN_SECONDS": "600",
        }
    )
    assert settings.accepts_jwts and settings.max_token_seconds == 600
    assert settings.jwt_tenant_claim == "tenant" and settings.jwt_jwks_refetch_seconds == 30
    assert not Settings.from_env({}).accepts_jwts
    assert Settings.from_env({}).max_token_seconds == 86_400


async def test_a_connection_admitted_with_a_jwt_ends_once_the_jwt_no_longer_verifies() -> None:
    """A key the provider stops publishing ends the open connections its JWTs admitted: each
    lease verifies its JWT again every `reverify_seconds`, and never once released."""
    import asyncio

    verifier = CountingVerifier({"sub": "s", "tenant": "t", "exp": 10**10})
    jwts = JwtCallers(verifier, reverify_seconds=0.05)
    cache = TokenCache(jwts=jwts)
    caller = await jwts("eyJ.a.b")
    assert caller.token_id is not None and "eyJ" not in caller.token_id
    kept, lease, other = cache.hold(caller), cache.hold(caller), cache.hold(caller)
    cache.release(kept)
    await asyncio.sleep(0.3)
    assert not lease.ended and verifier.calls >= 3  # verified again, and still valid
    calls = verifier.calls

    async def gone(token: str) -> dict:
        raise Unauthenticated("the JWT's key (kid) is not one the identity provider publishes")

    verifier.verify = gone  # type: ignore[method-assign]
    ended, other_ended = asyncio.Event(), asyncio.Event()
    lease.on_end(ended.set)
    other.on_end(other_ended.set)
    await asyncio.wait_for(ended.wait(), 2)
    await asyncio.wait_for(other_ended.wait(), 2)  # every connection it admitted, not the first
    cache.release(lease)
    cache.release(other)
    await asyncio.sleep(0.2)
    assert verifier.calls == calls  # nothing verifies for a released or ended lease


class SlowTokens(MemoryTokens):
    """A store whose lookups take a while, counted, noting whom each acts for."""

    def __init__(self) -> None:
        super().__init__()
        self.finds = 0
        self.acting: list[str | None] = []

    async def find(self, token_hash: bytes):  # type: ignore[no-untyped-def]
        import asyncio

        from application.waiting import acting_for

        self.finds += 1
        self.acting.append(acting_for())
        await asyncio.sleep(0.05)
        return await super().find(token_hash)


async def test_a_token_is_looked_up_once_however_many_requests_carry_it() -> None:
    """A hundred requests with a token the cache does not trust wait for one lookup, which acts
    for TOKEN_LOOKUPS (the lookups' one share of the pool, not the whole of it); a token the
    store does not know is looked up once per wave too, and refused for each."""
    import asyncio

    from application.tokens import TOKEN_LOOKUPS, token_hash

    store = SlowTokens()
    await store.put(token_hash("dst_known"), Caller(tenant="t", principal="p", scopes=SCOPES))
    authenticate = Authenticate(store, TokenCache())
    callers = await asyncio.gather(*(authenticate("Bearer dst_known") for _ in range(100)))
    assert {c.tenant for c in callers} == {"t"}
    assert store.finds == 1 and store.acting == [TOKEN_LOOKUPS]
    refused = await asyncio.gather(
        *(authenticate("Bearer dst_unknown") for _ in range(100)), return_exceptions=True
    )
    assert all(isinstance(r, Unauthenticated) for r in refused)
    assert store.finds == 2


def test_the_gate_knows_a_tokens_tenant_while_revocations_are_not_heard() -> None:
    """Not trusted any more (revocations not heard, its second past; or forgotten as the bus
    came back), a token's tenant is still known for the gate to count its requests on."""
    from application.tokens import token_hash

    now = [0.0]
    cache = TokenCache(clock=lambda: now[0])
    digest = token_hash("dst_known")
    cache.remember(digest, Caller(tenant="t", principal="p", scopes=SCOPES), None, 0)
    now[0] = 60.0
    assert cache.get(digest) is None and cache.tenant_of(digest) == "t"
    cache.listening()  # forgets what it trusted
    assert cache.get(digest) is None and cache.tenant_of(digest) == "t"
    assert cache.tenant_of(token_hash("dst_other")) is None
