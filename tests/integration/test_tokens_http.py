"""Tokens over HTTP against a real server (docs/http-api.md, "Tokens"): minted in the caller's
tenant, shown once and stored hashed, never wider than the minter (scopes, runs, life), always
expiring; listed without the token, a page at a time by creation; revoked everywhere within 2
seconds."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from tests.integration.test_http_auth import ADMIN, READ, WRITE, assert_problem, bearer
from tests.integration.test_token_lifecycle import tid

ALL = [READ, WRITE, ADMIN]


async def mint(api: httpx.AsyncClient, headers: dict[str, str] | None = None, **body: Any):
    body.setdefault("scopes", ALL)
    body.setdefault("expires_in_seconds", 600)
    return await api.post("/tokens", json=body, headers=headers)


async def minted(api: httpx.AsyncClient, headers: dict[str, str] | None = None, **body) -> dict:
    response = await mint(api, headers, **body)
    assert response.status_code == 201, response.text
    return response.json()


async def listed_tokens(
    api: httpx.AsyncClient, headers: dict[str, str] | None = None, limit: int = 1000
) -> list[dict[str, Any]]:
    """Every token the caller may list, page after page (the session's tenants collect more
    tokens than one page holds)."""
    tokens: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        response = await api.get("/tokens", params=params, headers=headers)
        assert response.status_code == 200, response.text
        page = response.json()
        tokens.extend(page["tokens"])
        if page["next_after"] is None:
            return tokens
        params["after"] = page["next_after"]


async def test_a_minted_token_is_shown_once_stored_hashed_and_works(
    api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str
) -> None:
    response = await mint(api, principal="browser", scopes=[READ, WRITE], expires_in_seconds=600)
    assert response.status_code == 201, response.text
    assert response.headers["cache-control"] == "no-store"
    answer = response.json()
    assert set(answer) == {"token", "id", "tenant", "principal", "scopes", "runs", "expires_at"}
    assert answer["tenant"] == "default" and answer["principal"] == "browser"
    assert answer["scopes"] == [READ, WRITE] and answer["runs"] is None
    expires_at = datetime.fromisoformat(answer["expires_at"])
    assert timedelta(seconds=590) < expires_at - datetime.now(UTC) < timedelta(seconds=610)
    token = answer["token"]
    digest = hashlib.sha256(token.encode()).digest()
    row = await pool.fetchrow("SELECT * FROM api_tokens WHERE token_id = $1", answer["id"])
    assert row["token_hash"] == digest and token.encode() not in b"".join(
        str(v).encode() for v in row.values()
    )
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={"stream_id": "s", "direction": "output"},
        headers=bearer(token),
    )
    assert created.status_code == 201, created.text
    listed = await listed_tokens(api)
    mine = next(t for t in listed if t["id"] == answer["id"])
    assert "token" not in mine and token not in str(listed)
    assert mine["principal"] == "browser" and mine["revoked_at"] is None


async def test_the_principal_defaults_to_the_minters(api: httpx.AsyncClient) -> None:
    assert (await minted(api))["principal"] == "bootstrap"


@pytest.mark.parametrize(
    "body",
    [
        {"expires_in_seconds": None},
        {"expires_in_seconds": 0},
        {"expires_in_seconds": 86_401},
        {"scopes": []},
        {"scopes": ["streams:everything"]},
        {"runs": []},
        {"runs": ["bad/run"]},
        {"runs": [f"r{i}" for i in range(101)]},
        {"principal": ""},
        {"principal": "a\nb"},
        {"tenant": "other"},
    ],
    ids=[
        "no-expiry",
        "zero-life",
        "past-the-cap",
        "no-scope",
        "unknown-scope",
        "no-run",
        "bad-run-id",
        "too-many-runs",
        "empty-principal",
        "control-in-principal",
        "a-tenant-field",
    ],
)
async def test_a_bad_mint_request_is_400_and_mints_nothing(
    api: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    before = len(await listed_tokens(api))
    request = {"scopes": ALL, "expires_in_seconds": 60, **body}
    request = {k: v for k, v in request.items() if v is not None}
    assert_problem(await api.post("/tokens", json=request), 400, "invalid-input")
    assert len(await listed_tokens(api)) == before


async def test_minting_needs_admin_and_never_widens_the_minter(api: httpx.AsyncClient) -> None:
    writer = bearer((await minted(api, scopes=[READ, WRITE]))["token"])
    assert_problem(await mint(api, writer, scopes=[READ]), 403, "forbidden")
    assert_problem(await api.get("/tokens", headers=writer), 403, "forbidden")
    admin = bearer((await minted(api, scopes=[READ, ADMIN], expires_in_seconds=300))["token"])
    # More scopes than its own.
    assert_problem(await mint(api, admin, scopes=[READ, WRITE]), 403, "forbidden")
    # A longer life than its own.
    assert_problem(await mint(api, admin, expires_in_seconds=400, scopes=[READ]), 403, "forbidden")
    ok = await minted(api, admin, scopes=[READ], expires_in_seconds=200)
    # Always in the minter's tenant.
    assert ok["tenant"] == "default"


async def test_a_minted_token_belongs_to_the_minters_tenant(
    api: httpx.AsyncClient, tokens: Any, run_id: str
) -> None:
    tenant = "tenant-" + secrets.token_hex(4)
    theirs = bearer(await tokens.create(tenant=tenant, principal="admin"))
    child = await minted(api, theirs, scopes=[READ, WRITE])
    assert child["tenant"] == tenant
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={"stream_id": "s", "direction": "output"},
        headers=bearer(child["token"]),
    )
    assert created.status_code == 201
    # The default tenant does not see it; the other tenant's listing is its own.
    assert_problem(await api.get(f"/runs/{run_id}/streams/s"), 404, "not-found")
    listed = await listed_tokens(api, theirs)
    assert {t["tenant"] for t in listed} == {tenant}
    assert child["id"] in {t["id"] for t in listed}
    assert child["id"] not in {t["id"] for t in await listed_tokens(api)}
    # Another tenant's token cannot be revoked: it is not found.
    assert_problem(await api.delete(f"/tokens/{child['id']}"), 404, "not-found")
    read = await api.get(f"/runs/{run_id}/streams/s", headers=bearer(child["token"]))
    assert read.status_code == 200


async def test_a_run_scoped_minter_mints_only_within_its_runs(api: httpx.AsyncClient) -> None:
    scoped = await minted(api, runs=["run-a", "run-b"], expires_in_seconds=1200)
    headers = bearer(scoped["token"])
    assert_problem(await mint(api, headers, runs=["run-a", "run-c"]), 403, "forbidden")
    assert (await minted(api, headers, runs=["run-a"]))["runs"] == ["run-a"]
    # Without runs, the child is restricted to the minter's runs, never to every run.
    assert (await minted(api, headers))["runs"] == ["run-a", "run-b"]
    # It lists only the tokens restricted to some of its runs (a wider one would tell of
    # other runs), and revokes no other.
    wide = await minted(api, runs=["run-a", "run-z"])
    visible = await listed_tokens(api, headers)
    listed = {t["id"] for t in visible}
    assert scoped["id"] in listed and wide["id"] not in listed
    assert all(set(t["runs"]) <= {"run-a", "run-b"} for t in visible)
    assert_problem(await api.delete(f"/tokens/{wide['id']}", headers=headers), 404, "not-found")


async def test_a_run_scoped_minter_names_its_tokens_below_its_own_principal(
    api: httpx.AsyncClient, run_id: str
) -> None:
    """An administrator of a run cannot mint a token acting as a principal a stream's pinned
    `authorization` lists (nor as a consumer's owner): a name it asks for is given below its
    own. A tenant's administrator names any principal."""
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={
            "stream_id": "private",
            "direction": "output",
            "authorization": {"readers": ["alice"], "writers": ["alice"]},
        },
    )
    assert created.status_code == 201, created.text
    alice = await minted(api, principal="alice", runs=[run_id])  # the tenant's administrator
    assert alice["principal"] == "alice"
    path = f"/runs/{run_id}/streams/private/records"
    written = await api.post(path, json={"records": [{"data": 1}]}, headers=bearer(alice["token"]))
    assert written.status_code == 201, written.text
    admin = await minted(api, principal="run-admin", runs=[run_id], expires_in_seconds=1200)
    assert_problem(await api.get(path, headers=bearer(admin["token"])), 403, "forbidden")
    named = await minted(api, bearer(admin["token"]), principal="alice", scopes=[READ])
    assert named["principal"] == "run-admin/alice"
    assert_problem(await api.get(path, headers=bearer(named["token"])), 403, "forbidden")
    # Its own name, and names already below it, are kept as they are.
    kept = [
        (await minted(api, bearer(admin["token"]), principal=p, scopes=[READ]))["principal"]
        for p in ("run-admin", "run-admin/agent-1")
    ]
    assert kept == ["run-admin", "run-admin/agent-1"]
    too_long = await mint(api, bearer(admin["token"]), principal="x" * 250, scopes=[READ])
    assert_problem(too_long, 400, "invalid-input")


async def test_revocation_over_http_is_felt_within_2_seconds(
    api: httpx.AsyncClient, api_b: httpx.AsyncClient, run_id: str
) -> None:
    token = await minted(api, scopes=[READ, WRITE])
    headers = bearer(token["token"])
    path = f"/runs/{run_id}/streams"
    assert (await api.post(path, json={"direction": "output"}, headers=headers)).status_code == 201
    assert (await api_b.get(path, headers=headers)).status_code == 200  # cached on both replicas
    assert (await api.delete(f"/tokens/{token['id']}")).status_code == 204
    assert (await api.delete(f"/tokens/{token['id']}")).status_code == 204  # again is fine
    deadline = time.monotonic() + 2.0
    for client in (api, api_b):
        while (await client.get(path, headers=headers)).status_code != 401:
            assert time.monotonic() < deadline, "a revoked token still works after 2 s"
            await asyncio.sleep(0.1)
    listed = await listed_tokens(api)
    assert next(t for t in listed if t["id"] == token["id"])["revoked_at"] is not None


async def test_revoking_a_token_revokes_what_it_minted_everywhere_within_2_seconds(
    api: httpx.AsyncClient, api_b: httpx.AsyncClient, run_id: str
) -> None:
    """A leaked administrator's token could mint children that outlast its revocation: the
    tokens it minted, and theirs, are revoked with it, on every replica. A token minted beside
    it (by the same minter) is not."""
    parent = await minted(api, expires_in_seconds=1200)
    child = await minted(api, bearer(parent["token"]), expires_in_seconds=900)
    grandchild = await minted(api, bearer(child["token"]), scopes=[READ], expires_in_seconds=600)
    sibling = await minted(api, scopes=[READ])
    held = [bearer(t["token"]) for t in (parent, child, grandchild, sibling)]
    for client in (api, api_b):
        for headers in held:
            assert (await client.get("/runs", headers=headers)).status_code == 200
    assert (await api.delete(f"/tokens/{parent['id']}")).status_code == 204
    deadline = time.monotonic() + 2.0
    for client in (api, api_b):
        for headers in held[:3]:
            while (await client.get("/runs", headers=headers)).status_code != 401:
                assert time.monotonic() < deadline, "a minted token outlived its minter"
                await asyncio.sleep(0.1)
        assert (await client.get("/runs", headers=held[3])).status_code == 200
    listed = {t["id"]: t for t in await listed_tokens(api)}
    for token in (parent, child, grandchild):
        assert listed[token["id"]]["revoked_at"] is not None
    assert listed[sibling["id"]]["revoked_at"] is None


async def test_a_mint_racing_its_minters_revocation_never_outlives_it(
    api: httpx.AsyncClient,
) -> None:
    """Mints by a token at the moment it is revoked: each is refused (401), or stored and
    revoked with it. None works afterwards."""
    for _ in range(5):
        parent = await minted(api, expires_in_seconds=1200)
        headers = bearer(parent["token"])
        assert (await api.get("/runs", headers=headers)).status_code == 200  # cached
        mints = [mint(api, headers, scopes=[READ]) for _ in range(8)]
        answers = await asyncio.gather(*mints, api.delete(f"/tokens/{parent['id']}"))
        assert answers[-1].status_code == 204
        for answer in answers[:-1]:
            assert answer.status_code in (201, 401), answer.text
            if answer.status_code == 201:
                child = bearer(answer.json()["token"])
                deadline = time.monotonic() + 2.0
                while (await api.get("/runs", headers=child)).status_code != 401:
                    assert time.monotonic() < deadline, "a child minted in the race works"
                    await asyncio.sleep(0.1)


async def test_a_minted_token_expires(api: httpx.AsyncClient, run_id: str) -> None:
    token = await minted(api, scopes=[READ], expires_in_seconds=1)
    headers = bearer(token["token"])
    assert (await api.get("/runs", headers=headers)).status_code == 200
    deadline = time.monotonic() + 4.0
    while (await api.get("/runs", headers=headers)).status_code != 401:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)


async def test_revoking_an_unknown_token_is_404(api: httpx.AsyncClient) -> None:
    assert_problem(await api.delete("/tokens/tok_0000000000000000"), 404, "not-found")


@pytest.mark.parametrize("token_id", ["nothing", "tok_XYZ", "tok_00000000000000001"])
async def test_revoking_what_is_not_a_token_id_is_400(api: httpx.AsyncClient, token_id) -> None:
    assert_problem(await api.delete(f"/tokens/{token_id}"), 400, "invalid-input")


# -- listing, a page at a time ---------------------------------------------------------------------


async def tenant_admin(tokens: Any) -> dict[str, str]:
    """The admin of a tenant of its own (whose listing holds only this test's tokens)."""
    return bearer(await tokens.create(tenant="pages-" + secrets.token_hex(4), principal="admin"))


async def test_250_tokens_page_by_100_each_once_in_creation_order(
    api: httpx.AsyncClient, tokens: Any
) -> None:
    admin = await tenant_admin(tokens)
    tenant = (await listed_tokens(api, admin))[0]["tenant"]
    created = [tid(await tokens.create(tenant=tenant, principal=f"p{i}")) for i in range(249)]
    everyone = [(await listed_tokens(api, admin))[0]["id"], *created]  # the admin's own first
    pages: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 100}
    while True:
        response = await api.get("/tokens", params=params, headers=admin)
        assert response.status_code == 200, response.text
        pages.append(page := response.json())
        assert set(page) == {"tokens", "next_after"}
        if page["next_after"] is None:
            break
        assert page["next_after"] == page["tokens"][-1]["id"]
        params["after"] = page["next_after"]
    assert [len(page["tokens"]) for page in pages] == [100, 100, 50]
    listed = [t for page in pages for t in page["tokens"]]
    assert [t["id"] for t in listed] == everyone
    assert [t["created_at"] for t in listed] == sorted(t["created_at"] for t in listed)
    assert {t["tenant"] for t in listed} == {tenant}
    # Without a limit, a page is 100; after the last token, an empty last page.
    assert (await api.get("/tokens", headers=admin)).json() == pages[0]
    last = await api.get("/tokens", params={"after": everyone[-1]}, headers=admin)
    assert last.json() == {"tokens": [], "next_after": None}


async def test_a_run_restricted_caller_pages_past_the_tokens_it_may_not_see(
    api: httpx.AsyncClient, tokens: Any
) -> None:
    admin = await tenant_admin(tokens)
    scoped = await minted(api, admin, runs=["run-a", "run-b"])
    shapes: list[list[str] | None] = [["run-a"], ["run-c"], None, None, ["run-a", "run-c"]]
    shapes += [["run-b"], None, None, None, None, None, ["run-a", "run-b"], ["run-z"]]
    made = [scoped] + [
        await minted(api, admin, **({} if runs is None else {"runs": runs})) for runs in shapes
    ]
    within = {"run-a", "run-b"}
    visible = [t["id"] for t in made if t["runs"] is not None and set(t["runs"]) <= within]
    headers = bearer(scoped["token"])
    for limit in (1, 2, 3, 5, 100):
        pages, listed = 0, []
        params: dict[str, Any] = {"limit": limit}
        while True:
            page = (await api.get("/tokens", params=params, headers=headers)).json()
            pages += 1
            listed += [t["id"] for t in page["tokens"]]
            if page["next_after"] is None:
                break
            params["after"] = page["next_after"]
        assert listed == visible, limit
        # Pages of the tokens it may see only: full while more follow (none cut short by the
        # tokens left out, none ending the listing early), each cursor one it may see.
        assert pages in (-(-len(visible) // limit), len(visible) // limit + 1), limit
    # Past tokens it may not see, a page is the next ones it may.
    params = {"limit": 1, "after": made[1]["id"]}
    page = (await api.get("/tokens", params=params, headers=headers)).json()
    assert [t["id"] for t in page["tokens"]] == [made[6]["id"]]
    assert page["next_after"] == made[6]["id"]
    # A token it may not see is no cursor: its existence is not told.
    refused = await api.get("/tokens", params={"after": made[3]["id"]}, headers=headers)
    assert refused.status_code == 400 and refused.json()["code"] == "cursor-unknown"


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"limit": 0}, "invalid-input"),
        ({"limit": 1001}, "invalid-input"),
        ({"limit": "many"}, "invalid-input"),
        ({"after": "nothing"}, "invalid-input"),
        ({"after": "tok_XYZ"}, "invalid-input"),
        ({"after": "tok_00000000000000001"}, "invalid-input"),
        ({"after": "tok_0000000000000000"}, "cursor-unknown"),
    ],
    ids=[
        "limit-0",
        "limit-1001",
        "limit-not-a-number",
        "after-no-id",
        "after-not-hex",
        "after-too-long",
        "after-unknown",
    ],
)
async def test_a_bad_page_is_400(api: httpx.AsyncClient, params: dict[str, Any], code: str) -> None:
    assert_problem(await api.get("/tokens", params=params), 400, code)


async def test_another_tenants_token_is_no_cursor(api: httpx.AsyncClient, tokens: Any) -> None:
    theirs = (await listed_tokens(api, await tenant_admin(tokens)))[0]["id"]
    assert_problem(await api.get("/tokens", params={"after": theirs}), 400, "cursor-unknown")
