"""Tokens restricted to runs, against a real server: every other run of the tenant answers 404
on every route of both surfaces, exactly as another tenant's run does, and a fork whose source
is in such a run is as if it did not exist (docs/http-api.md, "Tokens")."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.integration.test_http_auth import (
    ADMIN,
    OPERATIONS,
    READ,
    WRITE,
    assert_problem,
    bearer,
    call,
    setup_stream,
    snapshot,
)
from tests.support.server import ServerProcess

BODY = b"an object body"
JSON = {"Content-Type": "application/json"}


def run() -> str:
    return "run-" + secrets.token_hex(6)


async def scoped_token(api: httpx.AsyncClient, runs: list[str], scopes=None) -> str:
    response = await api.post(
        "/tokens",
        json={
            "scopes": scopes or [READ, WRITE, ADMIN],
            "expires_in_seconds": 600,
            "runs": runs,
        },
    )
    assert response.status_code == 201, response.text
    return response.json()["token"]


@pytest.fixture
async def ds(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=server.base_url + "/api/durable-streams/v1/stream", timeout=30
    ) as client:
        yield client


@pytest.fixture
async def bootstrap_ds(server: ServerProcess, api: httpx.AsyncClient):
    async with httpx.AsyncClient(
        base_url=server.base_url + "/api/durable-streams/v1/stream",
        headers={"Authorization": api.headers["authorization"]},
        timeout=30,
    ) as client:
        yield client


# -- the native surface ---------------------------------------------------------------------------


@pytest.mark.parametrize("operation", OPERATIONS, ids=[o[0] for o in OPERATIONS])
async def test_every_native_route_of_another_run_is_404(
    api: httpx.AsyncClient, operation: tuple[str, str, str, Any]
) -> None:
    mine, theirs = run(), run()
    await setup_stream(api, theirs)
    before = await snapshot(api, theirs)
    token = bearer(await scoped_token(api, [mine]))
    _, method, path, body = operation
    hidden = await call(api, theirs, method, path, body, token)
    missing = await call(api, run(), method, path, body, bearer(await scoped_token(api, [mine])))
    assert_problem(hidden, 404, "not-found")
    # Exactly what a run that does not exist answers (but for the IDs the caller sent).
    assert hidden.json()["title"] == missing.json()["title"]
    assert hidden.json()["type"] == missing.json()["type"]
    assert (await snapshot(api, theirs)) == before
    assert (await api.get(f"/runs/{theirs}/streams/t")).status_code == 404


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("list", 200),
        ("get", 200),
        ("read", 200),
        ("append", 201),
        ("ack", 200),
        ("create", 201),
        ("close", 200),
        ("legal-hold", 200),
        ("delete", 204),
        ("delete-run", 204),
    ],
)
async def test_the_tokens_own_runs_answer_as_usual(
    api: httpx.AsyncClient, name: str, status: int
) -> None:
    mine = run()
    await setup_stream(api, mine)
    token = bearer(await scoped_token(api, [mine, run()]))
    _, method, path, body = next(o for o in OPERATIONS if o[0] == name)
    response = await call(api, mine, method, path, body, token)
    assert response.status_code == status, response.text


async def test_object_routes_of_another_run_are_404(api: httpx.AsyncClient) -> None:
    mine, theirs = run(), run()
    await setup_stream(api, theirs)
    path = f"/runs/{theirs}/streams/s/objects"
    prepare = {
        "idempotency_key": "k",
        "size": len(BODY),
        "sha256": hashlib.sha256(BODY).hexdigest(),
        "content_type": "application/octet-stream",
    }
    intent = (await api.post(path, json=prepare)).json()
    object_path = f"{path}/{intent['object_id']}"
    committed_path = None
    other = (await api.post(path, json={**prepare, "idempotency_key": "k2"})).json()
    assert (await api.put(f"{path}/{other['object_id']}/body", content=BODY)).status_code < 300
    assert (await api.post(f"{path}/{other['object_id']}/commit")).status_code < 300
    committed_path = f"{path}/{other['object_id']}"
    token = bearer(await scoped_token(api, [mine]))
    for method, url, body in [
        ("POST", path, prepare),
        ("GET", object_path, None),
        ("PUT", f"{object_path}/body", BODY),
        ("POST", f"{object_path}/commit", None),
        ("POST", f"{object_path}/abort", None),
        ("GET", committed_path, None),
        ("GET", f"{committed_path}/body", None),
    ]:
        if isinstance(body, bytes):
            response = await api.request(method, url, content=body, headers=token)
        else:
            response = await api.request(method, url, json=body, headers=token)
        assert_problem(response, 404, "not-found")
    assert (await api.get(object_path)).json()["state"] == "prepared"
    assert (await api.get(f"{committed_path}/body")).content == BODY


async def test_subscribe_to_another_run_is_404(api: httpx.AsyncClient) -> None:
    mine, theirs = run(), run()
    await setup_stream(api, theirs)
    token = bearer(await scoped_token(api, [mine]))
    response = await api.get(f"/runs/{theirs}/streams/s/subscribe", headers=token)
    assert_problem(response, 404, "not-found")


async def test_the_run_listing_lists_only_the_tokens_runs(api: httpx.AsyncClient) -> None:
    base = "scoped-" + secrets.token_hex(4)
    a, b, c = f"{base}-a", f"{base}-b", f"{base}-c"
    for run_id in (a, b, c):
        await setup_stream(api, run_id)
    token = bearer(await scoped_token(api, [a, c, f"{base}-nothing-here"], scopes=[READ]))
    listed = (await api.get("/runs", headers=token)).json()
    assert [r["run_id"] for r in listed["runs"]] == [a, c] and listed["next_after"] is None
    first = (await api.get("/runs", params={"limit": 1}, headers=token)).json()
    assert [r["run_id"] for r in first["runs"]] == [a] and first["next_after"] == a
    after = (await api.get("/runs", params={"after": a}, headers=token)).json()
    assert [r["run_id"] for r in after["runs"]] == [c]
    prefixed = (await api.get("/runs", params={"prefix": f"{base}-c"}, headers=token)).json()
    assert [r["run_id"] for r in prefixed["runs"]] == [c]
    everything = (await api.get("/runs", params={"prefix": base})).json()
    assert {a, b, c} <= {r["run_id"] for r in everything["runs"]}


# -- the Durable Streams surface ------------------------------------------------------------------


async def test_every_durable_streams_route_of_another_run_is_404(
    api: httpx.AsyncClient, ds: httpx.AsyncClient, bootstrap_ds: httpx.AsyncClient
) -> None:
    mine, theirs = run(), run()
    created = await bootstrap_ds.put(f"/{theirs}/s", content=b"[1]", headers=JSON)
    assert created.status_code == 201, created.text
    token = bearer(await scoped_token(api, [mine]))
    for method, body, headers in [
        ("GET", None, {}),
        ("HEAD", None, {}),
        ("POST", b"[2]", JSON),
        ("PUT", b"[3]", JSON),
        ("DELETE", None, {}),
        ("GET", None, {"Stream-Live": "long-poll"}),
    ]:
        response = await ds.request(
            method, f"/{theirs}/s", content=body, headers={**token, **headers}
        )
        assert response.status_code == 404, (method, response.text)
        if method != "HEAD":
            assert_problem(response, 404, "not-found")
    sse = await ds.get(f"/{theirs}/s", params={"offset": "-1", "live": "sse"}, headers=token)
    assert sse.status_code == 404
    assert (await bootstrap_ds.get(f"/{theirs}/s")).json() == [1]


async def test_the_default_run_path_is_another_run_too(
    api: httpx.AsyncClient, ds: httpx.AsyncClient, bootstrap_ds: httpx.AsyncClient
) -> None:
    stream = "s-" + secrets.token_hex(4)
    assert (await bootstrap_ds.put(f"/{stream}", content=b"[1]", headers=JSON)).status_code == 201
    outside = bearer(await scoped_token(api, [run()]))
    inside = bearer(await scoped_token(api, ["default"]))
    assert_problem(await ds.get(f"/{stream}", headers=outside), 404, "not-found")
    assert_problem(
        await ds.post(f"/{stream}", content=b"[2]", headers={**outside, **JSON}), 404, "not-found"
    )
    assert (await ds.get(f"/{stream}", headers=inside)).json() == [1]
    appended = await ds.post(f"/{stream}", content=b"[2]", headers={**inside, **JSON})
    assert appended.status_code == 204, appended.text


async def test_a_scoped_token_appends_to_its_run_through_the_append_front(
    api: httpx.AsyncClient, ds: httpx.AsyncClient
) -> None:
    mine, theirs = run(), run()
    await setup_stream(api, mine)
    await setup_stream(api, theirs)
    token = bearer(await scoped_token(api, [mine], scopes=[WRITE]))
    body = {"records": [{"data": "x"}]}
    ok = await api.post(f"/runs/{mine}/streams/s/records", json=body, headers=token)
    assert ok.status_code == 201, ok.text
    refused = await api.post(f"/runs/{theirs}/streams/s/records", json=body, headers=token)
    assert_problem(refused, 404, "not-found")
    protocol = await ds.post(f"/{theirs}/s", content=b'"x"', headers={**token, **JSON})
    assert_problem(protocol, 404, "not-found")
    assert (
        await ds.post(f"/{mine}/s", content=b'"y"', headers={**token, **JSON})
    ).status_code == 204
    assert (await snapshot(api, theirs))["state"]["head"] == 2


# -- forks ----------------------------------------------------------------------------------------


async def test_a_fork_of_a_stream_in_another_run_is_as_if_it_did_not_exist(
    api: httpx.AsyncClient, ds: httpx.AsyncClient, bootstrap_ds: httpx.AsyncClient
) -> None:
    mine, theirs = run(), run()
    assert (
        await bootstrap_ds.put(f"/{theirs}/src", content=b'[{"secret":1}]', headers=JSON)
    ).status_code == 201
    forked = await bootstrap_ds.put(
        f"/{mine}/fork", headers={**JSON, "Stream-Forked-From": f"/v1/stream/{theirs}/src"}
    )
    assert forked.status_code == 201, forked.text
    # A fork of a fork, both in the token's run, still reaches the other run's records.
    again = await bootstrap_ds.put(
        f"/{mine}/fork2", headers={**JSON, "Stream-Forked-From": f"/v1/stream/{mine}/fork"}
    )
    assert again.status_code == 201, again.text
    await setup_stream(api, mine, "plain")
    token = bearer(await scoped_token(api, [mine]))
    for fork in ("fork", "fork2"):
        for response in (
            await api.get(f"/runs/{mine}/streams/{fork}", headers=token),
            await api.get(f"/runs/{mine}/streams/{fork}/records", headers=token),
            await api.get(f"/runs/{mine}/streams/{fork}/subscribe", headers=token),
            await api.post(
                f"/runs/{mine}/streams/{fork}/records",
                json={"records": [{"data": 1}]},
                headers=token,
            ),
            await api.post(
                f"/runs/{mine}/streams/{fork}/consumers/c/ack", json={"sequence": 1}, headers=token
            ),
            await api.get(f"/runs/{mine}/streams/{fork}/consumers", headers=token),
            await api.delete(f"/runs/{mine}/streams/{fork}/consumers/c", headers=token),
            await api.get(f"/runs/{mine}/streams/{fork}/objects", headers=token),
            await ds.get(f"/{mine}/{fork}", headers=token),
            await ds.post(f"/{mine}/{fork}", content=b"[9]", headers={**token, **JSON}),
            await ds.delete(f"/{mine}/{fork}", headers=token),
        ):
            assert_problem(response, 404, "not-found")
        assert (await ds.head(f"/{mine}/{fork}", headers=token)).status_code == 404
    listed = (await api.get(f"/runs/{mine}/streams", headers=token)).json()["streams"]
    assert [s["stream_id"] for s in listed] == ["plain"]
    assert "secret" not in str(listed) and theirs not in str(listed)
    # Forking the other run's stream (or the fork that reads it) is forking nothing.
    for source in (f"/v1/stream/{theirs}/src", f"/v1/stream/{mine}/fork"):
        refused = await ds.put(
            f"/{mine}/mine-" + secrets.token_hex(3),
            headers={**token, **JSON, "Stream-Forked-From": source},
        )
        assert_problem(refused, 404, "not-found")
    # The unrestricted token reads the fork as ever.
    assert (await bootstrap_ds.get(f"/{mine}/fork2")).json() == [{"secret": 1}]
