"""The JWKS verifier (adapters/jwks.py) on its own, against the test's identity provider on
loopback: what a fetch keeps and drops, one fetch for many waiting requests, and a provider
answering nonsense."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import jwt
import pytest

from adapters.jwks import JwksVerifier
from application.errors import Unauthenticated
from tests.support.identity_provider import AUDIENCE, ISSUER, IdentityProvider, Key, claims


@pytest.fixture
def provider() -> Iterator[IdentityProvider]:
    idp = IdentityProvider().start()
    yield idp
    idp.stop()


def verifier(provider: IdentityProvider, **given: float) -> JwksVerifier:
    return JwksVerifier(provider.url, ISSUER, AUDIENCE, fetch_timeout_seconds=1.0, **given)


async def test_requests_waiting_for_a_key_share_one_fetch(provider: IdentityProvider) -> None:
    key = Key("ES256")
    provider.published = [key]
    provider.delay = 0.2
    jwks = verifier(provider)
    answers = await asyncio.gather(*(jwks.verify(key.sign(claims())) for _ in range(20)))
    assert all(a["sub"] == "someone" for a in answers)
    assert provider.fetches == jwks.fetches == 1


async def test_a_key_set_that_is_not_one_changes_nothing(provider: IdentityProvider) -> None:
    key = Key("EdDSA")
    provider.published = [key]
    jwks = verifier(provider, refetch_seconds=0.01, refresh_seconds=0.01)
    assert (await jwks.verify(key.sign(claims())))["tenant"] == "default"
    # Keys that cannot be used are skipped, not the set: a bad one beside a good one.
    broken = Key("RS256")
    broken.jwk = {**broken.jwk, "n": "!!not base64!!"}
    other = Key("ES256")
    provider.published = [key, broken, other]
    await asyncio.sleep(0.02)
    assert (await jwks.verify(other.sign(claims())))["sub"] == "someone"
    with pytest.raises(Unauthenticated):
        await jwks.verify(broken.sign(claims()))
    # The provider answers 503, then times out: the keys known keep verifying.
    provider.down = True
    await asyncio.sleep(0.02)
    assert (await jwks.verify(key.sign(claims())))["sub"] == "someone"
    provider.down, provider.delay = False, 2.0
    await asyncio.sleep(0.02)
    assert (await jwks.verify(other.sign(claims())))["sub"] == "someone"
    with pytest.raises(Unauthenticated):
        await jwks.verify(Key("ES256").sign(claims()))


async def test_an_unreachable_provider_is_401_not_an_error() -> None:
    jwks = JwksVerifier("http://127.0.0.1:9/jwks.json", ISSUER, AUDIENCE, fetch_timeout_seconds=1)
    with pytest.raises(Unauthenticated):
        await jwks.verify(Key("RS256").sign(claims()))


async def test_a_jwt_without_a_kid_is_verified_by_the_only_key_published(
    provider: IdentityProvider,
) -> None:
    """RFC 7515 makes `kid` optional: a provider with one key may leave it out of its JWTs
    (and out of its key set). With several keys, which one it means cannot be told."""
    key = Key("ES256")
    provider.published = [key]
    without_kid = jwt.encode(claims(), key.private, algorithm="ES256")
    assert "kid" not in jwt.get_unverified_header(without_kid)
    assert (await verifier(provider).verify(without_kid))["sub"] == "someone"

    bare = Key("RS256")
    bare.jwk = {name: value for name, value in bare.jwk.items() if name != "kid"}
    provider.published = [bare]
    jwks = verifier(provider)
    assert (await jwks.verify(jwt.encode(claims(), bare.private, algorithm="RS256")))["sub"]
    with pytest.raises(Unauthenticated, match="kid"):
        await jwks.verify(bare.sign(claims()))  # names a kid the set does not have
    with pytest.raises(Unauthenticated):
        await jwks.verify(without_kid)  # another key's signature

    provider.published = [key, Key("ES256")]
    with pytest.raises(Unauthenticated, match="exactly one"):
        await verifier(provider).verify(without_kid)
