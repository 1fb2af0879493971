"""JWTs from an identity provider, against a real server and a JWKS served by this test on
loopback (docs/configuration.md, "Tokens from an identity provider"): claims mapped onto the
caller, every attack and bad token a 401 problem (never a 500), key rotation, the JWKS endpoint
down or slow, and run-restricted JWTs through every kind of route."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.integration.test_http_auth import assert_problem, bearer, setup_stream
from tests.support.identity_provider import (
    IdentityProvider,
    Key,
    claims,
    hs256_with_public_key,
    unsigned,
)
from tests.support.pull_wake import claimed_pull_wake
from tests.support.server import ServerProcess

FETCH_TIMEOUT = 1.0
REFETCH = 2.0
REFRESH = 3.0
REVERIFY = 2.0
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def keys() -> dict[str, Key]:
    return {alg: Key(alg) for alg in ("RS256", "ES256", "EdDSA")}


@pytest.fixture(scope="module")
def provider(keys: dict[str, Key]) -> Iterator[IdentityProvider]:
    idp = IdentityProvider().start()
    idp.published = list(keys.values())
    yield idp
    idp.stop()


@pytest.fixture(scope="module")
def server(
    database_url: str, tmp_path_factory: pytest.TempPathFactory, provider: IdentityProvider
) -> Iterator[ServerProcess]:
    env = provider.env(
        DUCTOR_STREAMS_JWT_JWKS_TIMEOUT_SECONDS=str(FETCH_TIMEOUT),
        DUCTOR_STREAMS_JWT_JWKS_REFETCH_SECONDS=str(REFETCH),
        DUCTOR_STREAMS_JWT_JWKS_REFRESH_SECONDS=str(REFRESH),
        DUCTOR_STREAMS_JWT_REVERIFY_SECONDS=str(REVERIFY),
        DUCTOR_STREAMS_MAX_TOKEN_SECONDS="3600",
    )
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("server-jwt"),
        env={**SERVER_ENV, **env},
    ).start()
    yield process
    process.stop()


@pytest.fixture
async def anonymous(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        yield client


@pytest.fixture
async def api(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=server.base_url + "/api/workflow-streams",
        headers=bearer(BOOTSTRAP_TOKEN),
        timeout=30,
    ) as client:
        yield client


API = "/api/workflow-streams"
DS = "/api/durable-streams/v1/stream"


async def assert_refused(client: httpx.AsyncClient, token: str, run_id: str) -> None:
    """401 `unauthenticated` with a Bearer challenge on a Litestar route, on both append front
    routes and on a Durable Streams read."""
    headers = {"Authorization": f"Bearer {token}"}
    for response in (
        await client.get(f"{API}/runs", headers=headers),
        await client.post(
            f"{API}/runs/{run_id}/streams/s/records",
            json={"records": [{"data": 1}]},
            headers=headers,
        ),
        await client.post(f"{DS}/{run_id}/s", content=b"[1]", headers={**headers, **JSON}),
        await client.get(f"{DS}/{run_id}/s", headers=headers),
    ):
        assert_problem(response, 401, "unauthenticated")
        assert response.headers["www-authenticate"].lower().startswith("bearer")


# -- it works -------------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
async def test_a_jwt_of_each_algorithm_is_a_caller(
    anonymous: httpx.AsyncClient, api: httpx.AsyncClient, keys: dict[str, Key], run_id: str, alg
) -> None:
    tenant = "idp-" + alg.lower()
    token = bearer(keys[alg].sign(claims(tenant=tenant)))
    created = await anonymous.post(
        f"{API}/runs/{run_id}/streams",
        json={"stream_id": "s", "direction": "output"},
        headers=token,
    )
    assert created.status_code == 201, created.text
    appended = await anonymous.post(
        f"{API}/runs/{run_id}/streams/s/records", json={"records": [{"data": 1}]}, headers=token
    )
    assert appended.status_code == 201, appended.text
    protocol = await anonymous.post(f"{DS}/{run_id}/s", content=b"[2]", headers={**token, **JSON})
    assert protocol.status_code == 204, protocol.text
    read = await anonymous.get(f"{API}/runs/{run_id}/streams/s/records", headers=token)
    assert [r["data"] for r in read.json()["records"]] == [1, 2]
    # The JWT's tenant is its own: the bootstrap token (tenant default) does not see it.
    assert_problem(await api.get(f"/runs/{run_id}/streams/s"), 404, "not-found")


async def test_opaque_tokens_keep_working_beside_jwts(api: httpx.AsyncClient, run_id: str) -> None:
    await setup_stream(api, run_id)
    minted = await api.post("/tokens", json={"scopes": ["streams:read"], "expires_in_seconds": 60})
    assert minted.status_code == 201, minted.text
    read = await api.get(f"/runs/{run_id}/streams/s", headers=bearer(minted.json()["token"]))
    assert read.status_code == 200


async def test_scopes_come_from_scope_or_scp_and_others_are_ignored(
    anonymous: httpx.AsyncClient, keys: dict[str, Key], run_id: str
) -> None:
    key = keys["ES256"]
    writer = bearer(key.sign(claims(tenant="idp-scopes", scope="openid streams:write")))
    create = {"stream_id": "s", "direction": "output"}
    response = await anonymous.post(f"{API}/runs/{run_id}/streams", json=create, headers=writer)
    assert response.status_code == 201, response.text
    reader = bearer(key.sign(claims(tenant="idp-scopes", scope=None, scp=["streams:read"])))
    assert (await anonymous.get(f"{API}/runs/{run_id}/streams/s", headers=reader)).is_success
    refused = await anonymous.post(
        f"{API}/runs/{run_id}/streams/s/records", json={"records": [{"data": 1}]}, headers=reader
    )
    assert_problem(refused, 403, "forbidden")
    nothing = bearer(key.sign(claims(tenant="idp-scopes", scope="openid profile")))
    assert_problem(await anonymous.get(f"{API}/runs", headers=nothing), 403, "forbidden")


async def test_a_jwt_with_runs_sees_only_those_runs(
    anonymous: httpx.AsyncClient, keys: dict[str, Key]
) -> None:
    key = keys["RS256"]
    full = bearer(key.sign(claims(tenant="idp-runs")))
    mine, theirs = "run-mine-" + str(time.time_ns()), "run-theirs-" + str(time.time_ns())
    for run_id in (mine, theirs):
        created = await anonymous.post(
            f"{API}/runs/{run_id}/streams",
            json={"stream_id": "s", "direction": "output"},
            headers=full,
        )
        assert created.status_code == 201
    scoped = bearer(key.sign(claims(tenant="idp-runs", runs=[mine])))
    body = {"records": [{"data": 1}]}
    ok = await anonymous.post(f"{API}/runs/{mine}/streams/s/records", json=body, headers=scoped)
    assert ok.status_code == 201, ok.text
    for response in (
        await anonymous.post(f"{API}/runs/{theirs}/streams/s/records", json=body, headers=scoped),
        await anonymous.get(f"{API}/runs/{theirs}/streams/s", headers=scoped),
        await anonymous.get(f"{API}/runs/{theirs}/streams", headers=scoped),
        await anonymous.post(f"{DS}/{theirs}/s", content=b"[1]", headers={**scoped, **JSON}),
        await anonymous.get(f"{DS}/{theirs}/s", headers=scoped),
    ):
        assert_problem(response, 404, "not-found")
    listed = (await anonymous.get(f"{API}/runs", headers=scoped)).json()["runs"]
    assert [r["run_id"] for r in listed] == [mine]


async def test_a_pull_wake_claimed_with_a_jwt_is_acked_with_its_token(
    anonymous: httpx.AsyncClient, keys: dict[str, Key]
) -> None:
    """A claim's token was checked against the API token store by the claimer's ID, where a
    JWT has no row: every ack and heartbeat of a worker signed in by its identity provider was
    401, and its wake could never end."""
    key = keys["RS256"]
    for restricted in (False, True):
        run_id = "run-claim-" + str(time.time_ns())
        scoped = [run_id] if restricted else None
        worker = bearer(key.sign(claims(tenant="idp-claims", runs=scoped)))
        name = "sub-" + str(time.time_ns())
        async with httpx.AsyncClient(
            base_url=anonymous.base_url, headers=worker, timeout=30
        ) as signed_in:
            claimed = await claimed_pull_wake(signed_in, API, run_id, name)
        done = await anonymous.post(
            f"{API}/subscriptions/{name}/ack",
            json={
                "wake_id": claimed["wake_id"],
                "generation": claimed["generation"],
                "acks": [{"run_id": run_id, "stream_id": "e1", "sequence": 1}],
                "done": True,
            },
            headers={"authorization": f"Bearer {claimed['token']}"},
        )
        assert done.status_code == 200, done.text
        assert done.json() == {"ok": True, "next_wake": False}


async def test_a_jwt_mints_tokens_no_wider_and_no_longer_lived_than_itself(
    anonymous: httpx.AsyncClient, keys: dict[str, Key]
) -> None:
    jwt_token = keys["EdDSA"].sign(
        claims(tenant="idp-mint", scope="streams:read streams:admin", lifetime=120, runs=["r1"])
    )
    headers = bearer(jwt_token)

    async def mint(**body: Any) -> httpx.Response:
        return await anonymous.post(f"{API}/tokens", json=body, headers=headers)

    assert_problem(await mint(scopes=["streams:write"], expires_in_seconds=60), 403, "forbidden")
    # Its life is its exp and the 30 s of leeway: about 150 s.
    assert_problem(await mint(scopes=["streams:read"], expires_in_seconds=300), 403, "forbidden")
    assert_problem(
        await mint(scopes=["streams:read"], expires_in_seconds=60, runs=["r2"]), 403, "forbidden"
    )
    assert_problem(
        await mint(scopes=["streams:read"], expires_in_seconds=3601), 400, "invalid-input"
    )
    ok = await mint(scopes=["streams:read"], expires_in_seconds=60)
    assert ok.status_code == 201, ok.text
    assert ok.json()["tenant"] == "idp-mint" and ok.json()["runs"] == ["r1"]


# -- bad tokens and attacks: 401 ------------------------------------------------------------------


def _attacks(keys: dict[str, Key]) -> dict[str, str]:
    rs = keys["RS256"]
    now = int(time.time())
    good = rs.sign(claims())
    return {
        "alg-none": unsigned({"alg": "none", "typ": "JWT", "kid": rs.kid}, claims()),
        "alg-none-signed": unsigned({"alg": "none", "kid": rs.kid}, claims(), b"sig"),
        "hs256-key-confusion": hs256_with_public_key(rs, claims()),
        "es256-header-on-rsa-key": unsigned({"alg": "ES256", "kid": rs.kid}, claims(), b"x" * 64),
        "rs384": unsigned({"alg": "RS384", "kid": rs.kid}, claims(), b"x" * 256),
        "expired": rs.sign(claims(exp=now - 60)),
        "no-exp": rs.sign({k: v for k, v in claims().items() if k != "exp"}),
        "nbf-in-the-future": rs.sign(claims(nbf=now + 120)),
        "iat-in-the-future": rs.sign(claims(iat=now + 120)),
        "wrong-issuer": rs.sign(claims(iss="https://evil.test")),
        "no-issuer": rs.sign({k: v for k, v in claims().items() if k != "iss"}),
        "wrong-audience": rs.sign(claims(aud="someone-else")),
        "no-audience": rs.sign({k: v for k, v in claims().items() if k != "aud"}),
        "signed-by-another-key": Key("RS256", kid=rs.kid).sign(claims()),
        "no-kid": unsigned({"alg": "RS256"}, claims(), b"x" * 256),
        "malformed": "eyJhbGciOiJSUzI1NiJ9.not-base64!.x",
        "not-json-header": "eyJub3QganNvbg.e30.c2ln",
        "truncated": good[:-12],
        "signature-flipped": good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB"),
        "64-kib": "eyJ" + "A" * (64 * 1024) + ".e30.c2ln",
        "tenant-missing": rs.sign(claims(tenant=None)),
        "tenant-not-a-string": rs.sign(claims(tenant=123)),
        "tenant-a-list": rs.sign(claims(tenant=["default"])),
        "tenant-not-an-id": rs.sign(claims(tenant="a/b")),
        "sub-missing": rs.sign(claims(sub=None)),
        "sub-not-a-string": rs.sign(claims(sub=42)),
        "runs-not-a-list": rs.sign(claims(runs="r1")),
        "runs-bad-id": rs.sign(claims(runs=["a/b"])),
        "scope-not-a-string": rs.sign(claims(scope=7)),
    }


ATTACKS = list(_attacks({alg: Key(alg) for alg in ("RS256",)}))


@pytest.mark.parametrize("name", ATTACKS)
async def test_every_bad_jwt_is_401_never_500(
    anonymous: httpx.AsyncClient,
    api: httpx.AsyncClient,
    keys: dict[str, Key],
    server: ServerProcess,
    run_id: str,
    name: str,
) -> None:
    await setup_stream(api, run_id)
    token = _attacks(keys)[name]
    await assert_refused(anonymous, token, run_id)
    head = (await api.get(f"/runs/{run_id}/streams/s")).json()["state"]["head"]
    assert head == 2  # nothing was appended


async def test_clock_leeway_is_30_seconds(
    anonymous: httpx.AsyncClient, keys: dict[str, Key]
) -> None:
    now = int(time.time())
    key = keys["RS256"]
    for given in (claims(exp=now - 10), claims(nbf=now + 10), claims(iat=now + 10)):
        response = await anonymous.get(f"{API}/runs", headers=bearer(key.sign(given)))
        assert response.status_code == 200, (given, response.text)


async def test_nothing_of_another_tenant_or_run_is_in_a_refusal(
    anonymous: httpx.AsyncClient, keys: dict[str, Key], server: ServerProcess
) -> None:
    secret_tenant = "tenant-secret-xyz"
    token = keys["RS256"].sign(claims(tenant=secret_tenant, aud="someone-else", runs=["run-sec"]))
    response = await anonymous.get(f"{API}/runs", headers=bearer(token))
    assert_problem(response, 401, "unauthenticated")
    assert secret_tenant not in response.text and "run-sec" not in response.text
    bad_tenant = keys["RS256"].sign(claims(tenant="a/" + secret_tenant))
    response = await anonymous.get(f"{API}/runs", headers=bearer(bad_tenant))
    assert_problem(response, 401, "unauthenticated")
    assert secret_tenant not in response.text
    assert secret_tenant not in server.log() and "run-sec" not in server.log()


# -- the key set: unknown kid, rotation, outages --------------------------------------------------


async def test_an_unknown_kid_refetches_once_then_is_401(
    anonymous: httpx.AsyncClient, provider: IdentityProvider
) -> None:
    await asyncio.sleep(REFETCH)  # past the last fetch's interval
    stranger = Key("ES256")  # never published
    before = provider.fetches
    await assert_refused(anonymous, stranger.sign(claims()), "run-x")
    assert provider.fetches == before + 1
    # A flood of unknown kids inside the interval fetches no more than once more.
    flood = [Key("ES256", kid=f"unknown-{i}").sign(claims()) for i in range(20)]
    answers = await asyncio.gather(
        *(anonymous.get(f"{API}/runs", headers=bearer(t)) for t in flood)
    )
    assert {a.status_code for a in answers} == {401}
    assert provider.fetches <= before + 2


async def test_key_rotation(
    anonymous: httpx.AsyncClient, provider: IdentityProvider, keys: dict[str, Key]
) -> None:
    old = keys["RS256"]
    new = Key("RS256")
    provider.published = [*keys.values(), new]
    try:
        await asyncio.sleep(REFETCH)
        # A JWT signed with the new key: its kid is unknown, the set is fetched again.
        response = await anonymous.get(f"{API}/runs", headers=bearer(new.sign(claims())))
        assert response.status_code == 200, response.text
        # The old key is still published: it still verifies.
        remembered = bearer(old.sign(claims()))  # verified now, then remembered
        response = await anonymous.get(f"{API}/runs", headers=remembered)
        assert response.status_code == 200, response.text
        # The provider stops publishing the old key: once the set is refreshed (in the
        # background, after REFRESH seconds), a JWT signed with it is refused.
        provider.published = [keys["ES256"], keys["EdDSA"], new]
        deadline = time.monotonic() + REFRESH + REFETCH + 10
        while True:
            token = bearer(old.sign(claims()))  # a new JWT each time: none from memory
            status = (await anonymous.get(f"{API}/runs", headers=token)).status_code
            if status == 401:
                break
            assert status == 200
            assert time.monotonic() < deadline, "a key no longer published still verifies"
            await asyncio.sleep(0.5)
        response = await anonymous.get(f"{API}/runs", headers=bearer(new.sign(claims())))
        assert response.status_code == 200
        # The one remembered since it verified (its exp an hour away) is verified again
        # within REVERIFY seconds, and refused.
        await asyncio.sleep(REVERIFY)
        response = await anonymous.get(f"{API}/runs", headers=remembered)
        assert_problem(response, 401, "unauthenticated")
    finally:
        provider.published = [*keys.values(), new]


async def test_an_open_connection_ends_once_its_jwts_key_is_withdrawn(
    anonymous: httpx.AsyncClient,
    api: httpx.AsyncClient,
    provider: IdentityProvider,
    keys: dict[str, Key],
) -> None:
    """A JWT cannot be revoked, but its key can be withdrawn (after a compromise): the native
    and Durable Streams live connections it admitted are verified again every REVERIFY
    seconds, and end once it no longer verifies, not at its `exp` an hour away."""
    withdrawn = Key("ES256")
    provider.published = [*keys.values(), withdrawn]
    try:
        await asyncio.sleep(REFETCH)
        run_id = "jwt-live-" + str(time.time_ns())
        await setup_stream(api, run_id)
        token = bearer(withdrawn.sign(claims(lifetime=3600)))

        async def follow(url: str, first: asyncio.Event) -> None:
            async with anonymous.stream("GET", url, headers=token) as answer:
                assert answer.status_code == 200
                async for line in answer.aiter_lines():
                    if line.startswith("data:"):
                        first.set()

        native, protocol = asyncio.Event(), asyncio.Event()
        followers = [
            asyncio.create_task(follow(f"{API}/runs/{run_id}/streams/s/subscribe", native)),
            asyncio.create_task(follow(f"{DS}/{run_id}/s?offset=-1&live=sse", protocol)),
        ]
        async with asyncio.timeout(10):
            await native.wait()
            await protocol.wait()
        provider.published = list(keys.values())
        # The key set is refreshed in the background by a verification past REFRESH, which
        # still passes; the next one, REVERIFY later, is refused.
        async with asyncio.timeout(REFRESH + REFETCH + 3 * REVERIFY + 5):
            await asyncio.gather(*followers)
    finally:
        provider.published = list(keys.values())


async def test_the_jwks_endpoint_down(
    anonymous: httpx.AsyncClient, provider: IdentityProvider, keys: dict[str, Key]
) -> None:
    provider.down = True
    try:
        await asyncio.sleep(REFETCH)
        # Keys already known keep verifying.
        known = await anonymous.get(f"{API}/runs", headers=bearer(keys["ES256"].sign(claims())))
        assert known.status_code == 200, known.text
        began = time.monotonic()
        await assert_refused(anonymous, Key("EdDSA").sign(claims()), "run-x")
        assert time.monotonic() - began < 5 * FETCH_TIMEOUT
    finally:
        provider.down = False


async def test_the_jwks_endpoint_slow(
    anonymous: httpx.AsyncClient, provider: IdentityProvider, keys: dict[str, Key]
) -> None:
    provider.delay = 4 * FETCH_TIMEOUT
    try:
        await asyncio.sleep(REFETCH)
        began = time.monotonic()
        unknown = await anonymous.get(f"{API}/runs", headers=bearer(Key("RS256").sign(claims())))
        waited = time.monotonic() - began
        assert_problem(unknown, 401, "unauthenticated")
        # The request waited for the fetch no longer than its timeout (and some slack for a
        # loaded machine), not for the provider's slow answer.
        assert FETCH_TIMEOUT * 0.5 < waited < FETCH_TIMEOUT + 1.5, waited
        known = await anonymous.get(f"{API}/runs", headers=bearer(keys["ES256"].sign(claims())))
        assert known.status_code == 200
    finally:
        provider.delay = 0.0
