"""The per-process token cache: the hot path asks the store once per TTL, and a revocation,
an expiry or a deaf wake bus all bound how long a remembered token is trusted."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from adapters.memory.tokens import MemoryTokens
from application.access import SCOPES, Caller
from application.errors import Unauthenticated
from application.ports import FoundToken
from application.tokens import (
    UNCONFIRMED_TTL_SECONDS,
    Authenticate,
    IssueToken,
    RevokeToken,
    TokenCache,
    make_caller,
    token_hash,
    token_id,
)

ALICE = make_caller("acme", "alice", list(SCOPES))


def who(caller: Caller) -> Caller:
    """The caller without the token that authenticated it."""
    return msgspec.structs.replace(caller, token_id=None, token_deadline=None)


class Counting(MemoryTokens):
    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    async def find(self, digest: bytes) -> FoundToken | None:
        self.lookups += 1
        return await super().find(digest)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store() -> Counting:
    return Counting()


def live_cache(clock: Clock, ttl: float = 10.0) -> TokenCache:
    cache = TokenCache(ttl, clock=clock)
    cache.listening()
    return cache


def bearer(token: str) -> str:
    return f"Bearer {token}"


async def test_two_authentications_within_the_ttl_make_one_store_lookup(store, clock) -> None:
    token = await IssueToken(store)(ALICE)
    authenticate = Authenticate(store, live_cache(clock))
    assert who(await authenticate(bearer(token))) == ALICE
    clock.now += 9.5
    assert who(await authenticate(bearer(token))) == ALICE
    assert store.lookups == 1
    clock.now += 1
    assert who(await authenticate(bearer(token))) == ALICE
    assert store.lookups == 2


async def test_a_forgotten_token_is_looked_up_again_and_refused(store, clock) -> None:
    token, other = await IssueToken(store)(ALICE), await IssueToken(store)(ALICE)
    cache = live_cache(clock)
    authenticate = Authenticate(store, cache)
    await authenticate(bearer(token))
    await authenticate(bearer(other))
    await store.revoke(token_id(token_hash(token)))  # in another process: only the bus tells
    assert who(await authenticate(bearer(token))) == ALICE  # still remembered here
    cache.forget(token_id(token_hash(token)))  # what the wake bus does on the notification
    with pytest.raises(Unauthenticated):
        await authenticate(bearer(token))
    assert who(await authenticate(bearer(other))) == ALICE
    assert store.lookups == 3  # the other token was still served from the cache


async def test_revoking_in_this_process_forgets_at_once(store, clock) -> None:
    token = await IssueToken(store)(ALICE)
    cache = live_cache(clock)
    authenticate = Authenticate(store, cache)
    await authenticate(bearer(token))
    await RevokeToken(store, cache)(token)
    with pytest.raises(Unauthenticated):
        await authenticate(bearer(token))


async def test_a_remembered_token_stops_at_its_expiry_without_a_query(store, clock) -> None:
    token = await IssueToken(store)(ALICE, expires_in_seconds=3)
    authenticate = Authenticate(store, live_cache(clock))
    await authenticate(bearer(token))
    clock.now += 2.9
    await authenticate(bearer(token))
    assert store.lookups == 1
    clock.now += 0.2  # past the 3 s the store gave: looked up again
    await authenticate(bearer(token))
    assert store.lookups == 2


async def test_while_revocations_are_not_heard_a_token_is_trusted_briefly(store, clock) -> None:
    token = await IssueToken(store)(ALICE)
    cache = live_cache(clock)
    authenticate = Authenticate(store, cache)
    await authenticate(bearer(token))
    cache.not_listening()  # the wake bus lost its connection
    clock.now += UNCONFIRMED_TTL_SECONDS - 0.1
    await authenticate(bearer(token))
    assert store.lookups == 1
    clock.now += 0.2
    await authenticate(bearer(token))
    assert store.lookups == 2
    assert UNCONFIRMED_TTL_SECONDS < 2  # a revocation is felt within 2 s even so
    # A cache that never heard the bus (no bus at all) is just as careful.
    never = Authenticate(store, TokenCache(10.0, clock=clock))
    await never(bearer(token))
    clock.now += UNCONFIRMED_TTL_SECONDS
    await never(bearer(token))
    assert store.lookups == 4


async def test_reconnecting_forgets_everything(store, clock) -> None:
    token = await IssueToken(store)(ALICE)
    cache = live_cache(clock)
    authenticate = Authenticate(store, cache)
    await authenticate(bearer(token))
    cache.not_listening()
    await store.revoke(token_id(token_hash(token)))  # its notification is missed
    cache.listening()  # the bus is back
    with pytest.raises(Unauthenticated):
        await authenticate(bearer(token))


async def test_a_lookup_overtaken_by_a_revocation_is_not_remembered(store, clock) -> None:
    token = await IssueToken(store)(ALICE)
    cache = live_cache(clock)
    started, finish = asyncio.Event(), asyncio.Event()

    class Slow(Counting):
        async def find(self, digest: bytes) -> FoundToken | None:
            found = await store.find(digest)  # read before the revocation commits
            started.set()
            await finish.wait()
            return found

    authenticate = Authenticate(Slow(), cache)
    lookup = asyncio.create_task(authenticate(bearer(token)))
    await started.wait()
    await store.revoke(token_id(token_hash(token)))
    cache.forget(token_id(token_hash(token)))  # its notification arrives meanwhile
    finish.set()
    assert who(await lookup) == ALICE  # that answer was already on its way
    with pytest.raises(Unauthenticated):  # but it was not remembered
        await authenticate(bearer(token))


async def test_a_zero_ttl_remembers_nothing(store, clock) -> None:
    token = await IssueToken(store)(ALICE)
    authenticate = Authenticate(store, live_cache(clock, ttl=0))
    await authenticate(bearer(token))
    await authenticate(bearer(token))
    assert store.lookups == 2


async def test_revoking_a_token_ends_the_leases_of_its_open_connections_and_no_others() -> None:
    store, cache = MemoryTokens(), TokenCache()
    authenticate = Authenticate(store, cache)
    doomed, kept = await IssueToken(store)(ALICE), await IssueToken(store)(ALICE)
    doomed_caller = await authenticate(bearer(doomed))
    assert doomed_caller.token_id == token_id(token_hash(doomed))
    woken: list[str] = []
    leases = [cache.hold(doomed_caller), cache.hold(await authenticate(bearer(kept)))]
    leases[0].on_end(lambda: woken.append("doomed"))
    leases[1].on_end(lambda: woken.append("kept"))
    await RevokeToken(store, cache)(doomed)
    assert [lease.ended for lease in leases] == [True, False]
    assert woken == ["doomed"]
    for lease in leases:
        cache.release(lease)
    assert cache.held() == 0


async def test_a_lease_ends_when_its_token_expires() -> None:
    store, cache = MemoryTokens(), TokenCache()
    token = await IssueToken(store)(ALICE, expires_in_seconds=1)
    lease = cache.hold(await Authenticate(store, cache)(bearer(token)))
    ended = asyncio.Event()
    lease.on_end(ended.set)
    assert not lease.ended
    async with asyncio.timeout(3):
        await ended.wait()
    cache.release(lease)


async def test_a_caller_not_authenticated_by_a_token_holds_a_lease_that_never_ends() -> None:
    cache = TokenCache()
    lease = cache.hold(ALICE)
    cache.forget_all()
    assert not lease.ended and cache.held() == 0


async def test_a_lease_taken_just_after_its_token_was_revoked_ends_at_once() -> None:
    store, cache = MemoryTokens(), TokenCache()
    token = await IssueToken(store)(ALICE)
    caller = await Authenticate(store, cache)(bearer(token))
    await RevokeToken(store, cache)(token)  # between the authentication and the lease
    lease = cache.hold(caller)
    assert lease.ended
    cache.release(lease)
