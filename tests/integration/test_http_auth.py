"""Authentication, tenancy and permission over HTTP (docs/http-api.md "Tenancy and permission")."""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

PROBLEM_JSON = "application/problem+json"
READ, WRITE, ADMIN = "streams:read", "streams:write", "streams:admin"


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body = response.json()
    for field in ("type", "title", "status", "detail", "code"):
        assert field in body, body
    assert body["status"] == status
    assert body["code"] == code, body
    return body


@pytest.fixture
async def anonymous(api: httpx.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    """A client on the same API prefix with no Authorization header."""
    async with httpx.AsyncClient(base_url=api.base_url, timeout=30) as client:
        yield client


@pytest.fixture
async def root(api: httpx.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    """A client on the server root (outside the API prefix), with no Authorization header."""
    base = str(api.base_url).removesuffix("/").removesuffix("/api/workflow-streams")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def setup_stream(api: httpx.AsyncClient, run_id: str, stream_id: str = "s", **extra: Any):
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "output", **extra}
    )
    assert created.status_code == 201, created.text
    appended = await api.post(
        f"/runs/{run_id}/streams/{stream_id}/records",
        json={"records": [{"data": 1}, {"data": 2}]},
    )
    assert appended.status_code == 201, appended.text
    acked = await api.post(
        f"/runs/{run_id}/streams/{stream_id}/consumers/c0/ack", json={"sequence": 1}
    )
    assert acked.status_code == 200, acked.text


async def snapshot(api: httpx.AsyncClient, run_id: str, stream_id: str = "s") -> dict[str, Any]:
    response = await api.get(f"/runs/{run_id}/streams/{stream_id}")
    assert response.status_code == 200, response.text
    return response.json()


# (name, method, path below /runs/{run}, JSON body)
OPERATIONS = [
    ("list", "GET", "/streams", None),
    ("get", "GET", "/streams/s", None),
    ("create", "POST", "/streams", {"stream_id": "t", "direction": "output"}),
    ("read", "GET", "/streams/s/records", None),
    ("append", "POST", "/streams/s/records", {"records": [{"data": 3}]}),
    ("ack", "POST", "/streams/s/consumers/c0/ack", {"sequence": 2}),
    ("consumers", "GET", "/streams/s/consumers", None),
    ("delete-consumer", "DELETE", "/streams/s/consumers/c0", None),
    ("close", "POST", "/streams/s/close", None),
    ("legal-hold", "PUT", "/streams/s/legal-hold", {"enabled": True}),
    ("delete", "DELETE", "/streams/s", None),
    ("delete-run", "DELETE", "", None),
]


async def call(
    client: httpx.AsyncClient,
    run_id: str,
    method: str,
    path: str,
    body: Any,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return await client.request(method, f"/runs/{run_id}{path}", json=body, headers=headers)


# -- 401 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer dst_this-token-does-not-exist",
        "Bearer",
        "Basic dXNlcjpwYXNzd29yZA==",
        "Token whatever",
        "garbage",
    ],
    ids=["none", "unknown", "scheme-only", "basic", "other-scheme", "garbage"],
)
@pytest.mark.parametrize("operation", OPERATIONS, ids=[o[0] for o in OPERATIONS])
async def test_no_or_bad_token_is_401_with_www_authenticate(
    api: httpx.AsyncClient,
    anonymous: httpx.AsyncClient,
    run_id: str,
    authorization: str | None,
    operation: tuple[str, str, str, Any],
) -> None:
    await setup_stream(api, run_id)
    before = await snapshot(api, run_id)
    _, method, path, body = operation
    headers = {"Authorization": authorization} if authorization is not None else None
    response = await call(anonymous, run_id, method, path, body, headers)
    assert_problem(response, 401, "unauthenticated")
    assert response.headers["www-authenticate"].lower().startswith("bearer")
    assert (await snapshot(api, run_id)) == before
    assert (await api.get(f"/runs/{run_id}/streams/t")).status_code == 404


async def test_a_valid_bearer_token_is_accepted(
    anonymous: httpx.AsyncClient, run_id: str, tokens: Any
) -> None:
    token = await tokens.create(principal="someone")
    response = await anonymous.post(
        f"/runs/{run_id}/streams", json={"direction": "output"}, headers=bearer(token)
    )
    assert response.status_code == 201, response.text


# -- other tenant: 404, never 403 -----------------------------------------------------------------


@pytest.mark.parametrize(
    "operation", [o for o in OPERATIONS if o[0] != "create"], ids=lambda o: o[0]
)
async def test_another_tenants_run_or_stream_is_404(
    api: httpx.AsyncClient,
    run_id: str,
    tokens: Any,
    operation: tuple[str, str, str, Any],
) -> None:
    await setup_stream(api, run_id)
    before = await snapshot(api, run_id)
    stranger = await tokens.create(
        tenant="other-" + secrets.token_hex(4), principal="bootstrap", scopes=(READ, WRITE, ADMIN)
    )
    _, method, path, body = operation
    response = await call(api, run_id, method, path, body, bearer(stranger))
    assert_problem(response, 404, "not-found")
    assert (await snapshot(api, run_id)) == before


async def test_another_tenants_404_looks_like_a_missing_stream(
    api: httpx.AsyncClient, run_id: str, tokens: Any
) -> None:
    await setup_stream(api, run_id)
    stranger = await tokens.create(tenant="other-" + secrets.token_hex(4), principal="bootstrap")
    theirs = await api.get(f"/runs/{run_id}/streams/s", headers=bearer(stranger))
    missing = await api.get(f"/runs/{run_id}/streams/nosuch", headers=bearer(stranger))
    nowhere = await api.get(f"/runs/{run_id}-x/streams/s", headers=bearer(stranger))
    for response in (theirs, missing, nowhere):
        assert_problem(response, 404, "not-found")
    assert theirs.json()["title"] == missing.json()["title"] == nowhere.json()["title"]
    assert theirs.json()["type"] == missing.json()["type"] == nowhere.json()["type"]


async def test_tenants_with_the_same_run_and_stream_ids_stay_apart(
    api: httpx.AsyncClient, run_id: str, tokens: Any
) -> None:
    await setup_stream(api, run_id)
    other = bearer(await tokens.create(tenant="other-" + secrets.token_hex(4), principal="x"))
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "input"}, headers=other
    )
    assert created.status_code == 201, created.text
    assert created.json()["state"]["head"] == 0
    appended = await api.post(
        f"/runs/{run_id}/streams/s/records", json={"records": [{"data": "theirs"}]}, headers=other
    )
    assert appended.json()["first_sequence"] == 1
    ours = (await api.get(f"/runs/{run_id}/streams/s/records")).json()
    assert [r["data"] for r in ours["records"]] == [1, 2]
    theirs = (await api.get(f"/runs/{run_id}/streams/s/records", headers=other)).json()
    assert [r["data"] for r in theirs["records"]] == ["theirs"]


# -- missing scope: 403 ---------------------------------------------------------------------------

SCOPE_DENIALS = [
    # (scopes the token has, operation it may not perform)
    ((READ,), "create"),
    ((READ,), "append"),
    ((READ,), "close"),
    ((READ,), "legal-hold"),
    ((READ,), "delete-consumer"),
    ((WRITE,), "list"),
    ((WRITE,), "get"),
    ((WRITE,), "read"),
    ((WRITE,), "ack"),
    ((WRITE,), "consumers"),
    ((WRITE,), "delete-consumer"),
    ((WRITE,), "legal-hold"),
    ((READ, WRITE), "legal-hold"),
    ((READ, WRITE), "delete"),
    ((READ, WRITE), "delete-run"),
    ((READ, WRITE), "delete-consumer"),
    ((ADMIN,), "read"),
    ((ADMIN,), "append"),
]


@pytest.mark.parametrize(
    ("scopes", "name"),
    SCOPE_DENIALS,
    ids=[f"{'+'.join(s.split(':')[1] for s in scopes)}-{name}" for scopes, name in SCOPE_DENIALS],
)
async def test_a_missing_scope_is_403(
    api: httpx.AsyncClient, run_id: str, tokens: Any, scopes: tuple[str, ...], name: str
) -> None:
    await setup_stream(api, run_id)
    before = await snapshot(api, run_id)
    token = await tokens.create(principal="bootstrap", scopes=scopes)
    _, method, path, body = next(o for o in OPERATIONS if o[0] == name)
    response = await call(api, run_id, method, path, body, bearer(token))
    assert_problem(response, 403, "forbidden")
    assert (await snapshot(api, run_id)) == before
    assert (await api.get(f"/runs/{run_id}/streams/t")).status_code == 404


@pytest.mark.parametrize(
    ("scopes", "name", "status"),
    [
        ((READ,), "list", 200),
        ((READ,), "get", 200),
        ((READ,), "read", 200),
        ((READ,), "ack", 200),
        ((READ,), "consumers", 200),
        ((ADMIN,), "delete-consumer", 204),
        ((WRITE,), "append", 201),
        ((WRITE,), "create", 201),
        ((WRITE,), "close", 200),
        ((ADMIN,), "legal-hold", 200),
        ((ADMIN,), "delete", 204),
        ((ADMIN,), "delete-run", 204),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
async def test_the_right_scope_is_enough(
    api: httpx.AsyncClient,
    run_id: str,
    tokens: Any,
    scopes: tuple[str, ...],
    name: str,
    status: int,
) -> None:
    await setup_stream(api, run_id)
    token = await tokens.create(principal="bootstrap", scopes=scopes)
    _, method, path, body = next(o for o in OPERATIONS if o[0] == name)
    response = await call(api, run_id, method, path, body, bearer(token))
    assert response.status_code == status, response.text


# -- pinned authorization -------------------------------------------------------------------------


async def test_pinned_readers_and_writers(api: httpx.AsyncClient, run_id: str, tokens: Any) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={
            "stream_id": "pinned",
            "direction": "output",
            "authorization": {"readers": ["alice"], "writers": ["bob"]},
        },
    )
    assert created.status_code == 201, created.text
    alice = bearer(await tokens.create(principal="alice", scopes=(READ, WRITE, ADMIN)))
    bob = bearer(await tokens.create(principal="bob", scopes=(READ, WRITE, ADMIN)))
    records = f"/runs/{run_id}/streams/pinned/records"
    body = {"records": [{"data": "from bob"}]}

    by_bob = await api.post(records, json=body, headers=bob)
    assert by_bob.status_code == 201, by_bob.text
    assert_problem(await api.post(records, json=body, headers=alice), 403, "forbidden")
    assert_problem(await api.get(records, headers=bob), 403, "forbidden")
    read = await api.get(records, headers=alice)
    assert read.status_code == 200, read.text
    assert [r["data"] for r in read.json()["records"]] == ["from bob"]
    # bootstrap is neither a reader nor a writer.
    assert_problem(await api.post(records, json=body), 403, "forbidden")
    assert_problem(await api.get(records), 403, "forbidden")
    ack = f"/runs/{run_id}/streams/pinned/consumers/c/ack"
    assert_problem(await api.post(ack, json={"sequence": 1}, headers=bob), 403, "forbidden")
    assert (await api.post(ack, json={"sequence": 1}, headers=alice)).status_code == 200
    state = (await api.get(f"/runs/{run_id}/streams/pinned", headers=alice)).json()["state"]
    assert state["head"] == 1
    assert state["consumers"] == [{"consumer_id": "c", "acked_sequence": 1, "holds_credit": True}]


async def test_no_principal_that_may_only_read_reduces_a_writers_credit(
    api: httpx.AsyncClient, run_id: str, tokens: Any
) -> None:
    """Whatever a read-only principal acknowledges, and however many consumers it creates, the
    writers' credit stays where the consumers of writers and admins put it."""
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={"stream_id": "s", "direction": "output", "limits": {"max_unread_items": 4}},
    )
    assert created.status_code == 201, created.text
    path = f"/runs/{run_id}/streams/s"
    assert (await api.post(f"{path}/records", json={"records": [{"data": 1}]})).status_code == 201
    for scopes in [(READ,), (READ, WRITE)]:  # write scope, but not a writer of this stream?
        principal = "reader-" + secrets.token_hex(3)
        token = bearer(await tokens.create(principal=principal, scopes=scopes))
        for consumer, sequence in [(f"{principal}-a", 0), (f"{principal}-b", 1)]:
            response = await api.post(
                f"{path}/consumers/{consumer}/ack", json={"sequence": sequence}, headers=token
            )
            assert response.status_code == 200, response.text
            if scopes == (READ,):
                assert response.json()["credit"]["unread_items"] == 1
        # The reader cannot remove anyone, nor acknowledge anyone else's.
        assert_problem(
            await api.delete(f"{path}/consumers/{principal}-a", headers=token), 403, "forbidden"
        )
    credit = (await snapshot(api, run_id))["state"]["credit"]
    # Only the second principal (streams:write, and a writer: "*") holds credit: at 0.
    assert credit["unread_items"] == 1


# -- unauthenticated routes -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/schema/openapi.json"])
async def test_operational_routes_need_no_token(root: httpx.AsyncClient, path: str) -> None:
    response = await root.get(path)
    assert response.status_code == 200, response.text


async def test_the_openapi_document_lists_the_operations(root: httpx.AsyncClient) -> None:
    document = (await root.get("/schema/openapi.json")).json()
    assert document["openapi"].startswith("3.")
    paths = {re.sub(r"\{[^}]*\}", "{}", p): item for p, item in document["paths"].items()}
    prefix = "/api/workflow-streams/runs/{}/streams"
    expected = {
        (prefix, "post"),
        (prefix, "get"),
        (prefix + "/{}", "get"),
        (prefix + "/{}/records", "post"),
        (prefix + "/{}/records", "get"),
        (prefix + "/{}/consumers/{}/ack", "post"),
        (prefix + "/{}/consumers", "get"),
        (prefix + "/{}/consumers/{}", "delete"),
        (prefix + "/{}/close", "post"),
        (prefix + "/{}/legal-hold", "put"),
        (prefix + "/{}", "delete"),
        ("/api/workflow-streams/runs/{}", "delete"),
        ("/api/workflow-streams/runs", "get"),
    }
    for path, method in expected:
        assert path in paths, sorted(paths)
        assert method in paths[path], (path, method)
    operations = {
        op["operationId"]: op
        for item in document["paths"].values()
        for op in item.values()
        if isinstance(op, dict) and "operationId" in op
    }
    schemas = document.get("components", {}).get("schemas", {})
    for operation_id, field in (("createStream", "direction"), ("appendRecords", "records")):
        assert operation_id in operations, sorted(operations)
        schema = operations[operation_id]["requestBody"]["content"]["application/json"]["schema"]
        # A reference, or one beside rules between its fields (`allOf` with if/then).
        ref = schema.get("$ref") or schema.get("allOf", [{}])[0].get("$ref")
        if ref is not None:
            schema = schemas[ref.rsplit("/", 1)[-1]]
        assert field in schema["properties"], schema
