"""Stream definitions over HTTP: create, list, get, close and legal hold (docs/http-api.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import pytest

PROBLEM_JSON = "application/problem+json"

DEFAULT_LIMITS = {
    "max_unread_items": 10_000,
    "max_unread_bytes": 67_108_864,
    "max_total_items": None,
    "max_total_bytes": None,
    "unread_policy": "reject",
    "block_timeout_seconds": 30,
}
DEFAULT_PLACEMENT = {
    "metadata_home": "local",
    "metadata_replicas": [],
    "object_regions": ["local"],
    "client_egress_regions": ["local"],
    "log_region": "local",
}
DEFINITION_FIELDS = {
    "stream_id",
    "direction",
    "content_class",
    "schema",
    "limits",
    "retention",
    "redaction",
    "placement",
    "authorization",
}
STATE_FIELDS = {
    "head",
    "earliest",
    "closed",
    "closed_at",
    "legal_hold",
    "total_items",
    "total_bytes",
    "consumer_count",
    "consumers",
    "credit",
}


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body = response.json()
    for field in ("type", "title", "status", "detail", "code"):
        assert field in body, body
    assert body["status"] == status
    assert body["code"] == code, body
    return body


def stream_documents(listing: Any) -> list[dict[str, Any]]:
    """The contract does not pin the list envelope: accept a bare array or {"streams": [...]}."""
    if isinstance(listing, dict):
        listing = listing["streams"]
    assert isinstance(listing, list)
    return listing


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def create(api: httpx.AsyncClient, run_id: str, **definition: Any) -> dict[str, Any]:
    response = await api.post(f"/runs/{run_id}/streams", json={"direction": "output", **definition})
    assert response.status_code == 201, response.text
    return response.json()


async def append(api: httpx.AsyncClient, run_id: str, stream_id: str, *data: Any) -> httpx.Response:
    return await api.post(
        f"/runs/{run_id}/streams/{stream_id}/records",
        json={"records": [{"data": d} for d in data]},
    )


async def document(api: httpx.AsyncClient, run_id: str, stream_id: str) -> dict[str, Any]:
    response = await api.get(f"/runs/{run_id}/streams/{stream_id}")
    assert response.status_code == 200, response.text
    return response.json()


# -- create ---------------------------------------------------------------------------------------


async def test_create_answers_201_with_location_and_the_document(
    api: httpx.AsyncClient, run_id: str
) -> None:
    response = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "tokens", "direction": "output"}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["stream_id"] == "tokens"
    assert body["run_id"] == run_id
    location = response.headers["location"]
    assert location.endswith(f"/api/workflow-streams/runs/{run_id}/streams/tokens")
    fetched = await api.get(str(api.base_url.join(location)))
    assert fetched.status_code == 200
    assert fetched.json() == body


async def test_create_without_stream_id_generates_a_valid_one(
    api: httpx.AsyncClient, run_id: str
) -> None:
    first = await create(api, run_id)
    second = await create(api, run_id)
    for body in (first, second):
        stream_id = body["stream_id"]
        assert isinstance(stream_id, str)
        assert 1 <= len(stream_id) <= 128
        assert stream_id[0].isalnum()
    assert first["stream_id"] != second["stream_id"]
    assert (await document(api, run_id, first["stream_id"])) == first


async def test_create_fills_in_the_contract_defaults(api: httpx.AsyncClient, run_id: str) -> None:
    body = await create(api, run_id, stream_id="defaults")
    assert DEFINITION_FIELDS | {"run_id", "created_at", "state"} <= set(body)
    assert body["direction"] == "output"
    assert body["content_class"] == "application_data"
    assert body["schema"] is None
    assert body["limits"] == DEFAULT_LIMITS
    assert body["retention"] == {"max_age_seconds": None, "max_records": None}
    assert body["redaction"] == {"json_pointers": []}
    assert body["placement"] == DEFAULT_PLACEMENT
    assert body["authorization"] == {"readers": ["*"], "writers": ["*"]}
    parse_time(body["created_at"])


async def test_create_keeps_every_field_given(api: httpx.AsyncClient, run_id: str) -> None:
    definition = {
        "stream_id": "custom",
        "direction": "input",
        "content_class": "tool_io",
        "schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "limits": {
            "max_unread_items": 5,
            "max_unread_bytes": 1000,
            "max_total_items": 50,
            "max_total_bytes": 100_000,
            "unread_policy": "block",
            "block_timeout_seconds": 2,
        },
        "retention": {"max_age_seconds": 3600, "max_records": 10},
        "redaction": {"json_pointers": ["/secret"]},
        "placement": {
            "metadata_home": "local",
            "metadata_replicas": [],
            "object_regions": ["local"],
            "client_egress_regions": ["local"],
            "log_region": "local",
        },
        "authorization": {"readers": ["alice", "bootstrap"], "writers": ["bootstrap"]},
    }
    body = await create(api, run_id, **definition)
    for field, value in definition.items():
        assert body[field] == value, field


async def test_identical_create_again_is_200_with_the_same_document(
    api: httpx.AsyncClient, run_id: str
) -> None:
    definition = {"stream_id": "again", "direction": "output", "limits": {"max_unread_items": 7}}
    first = await api.post(f"/runs/{run_id}/streams", json=definition)
    assert first.status_code == 201
    second = await api.post(f"/runs/{run_id}/streams", json=definition)
    assert second.status_code == 200, second.text
    assert second.json() == first.json()


async def test_create_again_answers_the_document_only_to_a_writer_and_reader_of_its_pins(
    api: httpx.AsyncClient, run_id: str
) -> None:
    """A repeated create answers the stream's document (its head, consumers, legal hold): a
    principal its pinned authorization does not let write it and read it gets 403, and learns
    neither the document nor whether its definition matched (409)."""
    pins = {"readers": ["alice", "bootstrap"], "writers": ["bob", "bootstrap"]}
    definition = {"stream_id": "pinned", "direction": "output", "authorization": pins}
    first = await api.post(f"/runs/{run_id}/streams", json=definition)
    assert first.status_code == 201, first.text
    for principal in ("alice", "bob", "carol"):
        minted = await api.post(
            "/tokens",
            json={
                "principal": principal,
                "scopes": ["streams:read", "streams:write"],
                "expires_in_seconds": 600,
            },
        )
        assert minted.status_code == 201, minted.text
        token = {"Authorization": f"Bearer {minted.json()['token']}"}
        for body in (definition, {**definition, "content_class": "logs"}):
            again = await api.post(f"/runs/{run_id}/streams", json=body, headers=token)
            assert_problem(again, 403, "forbidden")
            assert "head" not in again.text
    again = await api.post(f"/runs/{run_id}/streams", json=definition)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()


async def test_create_spelling_out_the_defaults_is_the_identical_definition(
    api: httpx.AsyncClient, run_id: str
) -> None:
    first = await create(api, run_id, stream_id="spelled")
    explicit = {
        "stream_id": "spelled",
        "direction": "output",
        "content_class": "application_data",
        "schema": None,
        "limits": DEFAULT_LIMITS,
        "retention": {"max_age_seconds": None, "max_records": None},
        "redaction": {"json_pointers": []},
        "placement": DEFAULT_PLACEMENT,
        "authorization": {"readers": ["*"], "writers": ["*"]},
    }
    again = await api.post(f"/runs/{run_id}/streams", json=explicit)
    assert again.status_code == 200, again.text
    assert again.json() == first


@pytest.mark.parametrize(
    "change",
    [
        {"direction": "input"},
        {"content_class": "logs"},
        {"schema": {"type": "string"}},
        {"limits": {"max_unread_items": 9}},
        {"retention": {"max_records": 3}},
        {"redaction": {"json_pointers": ["/x"]}},
        {"authorization": {"readers": ["alice"]}},
    ],
    ids=lambda c: next(iter(c)),
)
async def test_create_with_another_definition_is_409_definition_conflict(
    api: httpx.AsyncClient, run_id: str, change: dict[str, Any]
) -> None:
    original = await create(api, run_id, stream_id="fixed")
    response = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "fixed", "direction": "output", **change}
    )
    assert_problem(response, 409, "definition-conflict")
    assert (await document(api, run_id, "fixed")) == original


# -- list -----------------------------------------------------------------------------------------


async def test_list_returns_the_runs_streams(api: httpx.AsyncClient, run_id: str) -> None:
    a = await create(api, run_id, stream_id="a")
    b = await create(api, run_id, stream_id="b", direction="input")
    other_run = run_id + "-other"
    await create(api, other_run, stream_id="c")
    response = await api.get(f"/runs/{run_id}/streams")
    assert response.status_code == 200, response.text
    listed = {d["stream_id"]: d for d in stream_documents(response.json())}
    assert set(listed) == {"a", "b"}
    assert listed["a"] == a
    assert listed["b"]["direction"] == "input"
    assert listed["b"]["stream_id"] == b["stream_id"]
    assert all(d["run_id"] == run_id for d in listed.values())


async def test_list_of_an_unknown_run_is_404(api: httpx.AsyncClient, run_id: str) -> None:
    assert_problem(await api.get(f"/runs/{run_id}/streams"), 404, "not-found")
    assert_problem(await api.get(f"/runs/{run_id}/streams?after=a"), 404, "not-found")


async def listing(api: httpx.AsyncClient, run_id: str, **params: Any) -> dict[str, Any]:
    response = await api.get(f"/runs/{run_id}/streams", params=params)
    assert response.status_code == 200, response.text
    return response.json()


async def test_the_stream_listing_is_paged_by_stream_id_with_next_after(
    api: httpx.AsyncClient, run_id: str
) -> None:
    ids = [f"s-{n:03d}" for n in range(7)]
    for stream_id in reversed(ids):
        await create(api, run_id, stream_id=stream_id)
    first = await listing(api, run_id, limit=3)
    assert [d["stream_id"] for d in first["streams"]] == ids[:3]
    assert first["next_after"] == "s-002"
    second = await listing(api, run_id, limit=3, after=first["next_after"])
    assert [d["stream_id"] for d in second["streams"]] == ids[3:6]
    last = await listing(api, run_id, limit=3, after=second["next_after"])
    assert [d["stream_id"] for d in last["streams"]] == ids[6:]
    assert last["next_after"] is None
    exact = await listing(api, run_id, limit=7)
    assert len(exact["streams"]) == 7 and exact["next_after"] is None
    assert (await listing(api, run_id, after="s-006")) == {"streams": [], "next_after": None}
    whole = await listing(api, run_id)
    assert [d["stream_id"] for d in whole["streams"]] == ids and whole["next_after"] is None
    for bad in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"after": "no/such id"}):
        assert_problem(await api.get(f"/runs/{run_id}/streams", params=bad), 400, "invalid-input")


async def test_the_default_stream_page_holds_100_and_says_where_to_go_on(
    api: httpx.AsyncClient, run_id: str
) -> None:
    ids = [f"s-{n:03d}" for n in range(105)]
    for stream_id in ids:
        await create(api, run_id, stream_id=stream_id)
    first = await listing(api, run_id)
    assert [d["stream_id"] for d in first["streams"]] == ids[:100]
    assert first["next_after"] == "s-099"
    rest = await listing(api, run_id, after=first["next_after"])
    assert [d["stream_id"] for d in rest["streams"]] == ids[100:]
    assert rest["next_after"] is None
    assert len((await listing(api, run_id, limit=1000))["streams"]) == 105


async def test_streams_the_caller_may_not_read_are_passed_over_without_short_pages(
    server: Any, tokens: Any, api: httpx.AsyncClient, run_id: str
) -> None:
    from tests.conftest import api_client

    hidden = {"readers": ["someone-else"], "writers": ["*"]}
    for n in range(9):
        pinned = {"authorization": hidden} if n % 3 else {}
        await create(api, run_id, stream_id=f"s-{n}", **pinned)
    reader = await tokens.create(principal="reader")
    async with api_client(server, reader) as client:
        first = await listing(client, run_id, limit=2)
        assert [d["stream_id"] for d in first["streams"]] == ["s-0", "s-3"]
        assert first["next_after"] == "s-3"
        rest = await listing(client, run_id, limit=2, after="s-3")
        assert [d["stream_id"] for d in rest["streams"]] == ["s-6"]
        assert rest["next_after"] is None


# -- get ------------------------------------------------------------------------------------------


async def test_a_new_streams_document_has_every_state_field(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, stream_id="fresh", limits={"max_unread_items": 12})
    body = await document(api, run_id, "fresh")
    assert DEFINITION_FIELDS | {"run_id", "created_at", "state"} <= set(body)
    assert body["run_id"] == run_id
    state = body["state"]
    assert set(state) >= STATE_FIELDS
    assert state["head"] == 0
    assert state["earliest"] == 1
    assert state["closed"] is False
    assert state["closed_at"] is None
    assert state["legal_hold"] == {"enabled": False, "reason": None, "updated_at": None}
    assert state["total_items"] == 0
    assert state["total_bytes"] == 0
    assert state["consumers"] == []
    assert state["credit"] == {
        "unread_items": 0,
        "unread_bytes": 0,
        "max_unread_items": 12,
        "max_unread_bytes": 67_108_864,
    }


async def test_the_document_follows_appends_and_acks(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id, stream_id="busy")
    assert (await append(api, run_id, "busy", 1, "ab", {"k": [1, 2]})).status_code == 201
    ack = await api.post(f"/runs/{run_id}/streams/busy/consumers/c1/ack", json={"sequence": 1})
    assert ack.status_code == 200, ack.text
    state = (await document(api, run_id, "busy"))["state"]
    assert state["head"] == 3
    assert state["earliest"] == 1
    assert state["total_items"] == 3
    # 1 -> "1" (1 byte), "ab" -> "\"ab\"" (4), {"k":[1,2]} (11)
    assert state["total_bytes"] == 16
    assert state["consumers"] == [{"consumer_id": "c1", "acked_sequence": 1, "holds_credit": True}]
    assert state["credit"]["unread_items"] == 2
    assert state["credit"]["unread_bytes"] == 15


async def test_get_of_an_unknown_stream_is_404(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id, stream_id="known")
    assert_problem(await api.get(f"/runs/{run_id}/streams/unknown"), 404, "not-found")
    assert_problem(await api.get(f"/runs/{run_id}-nope/streams/known"), 404, "not-found")


# -- close ----------------------------------------------------------------------------------------


async def test_close_answers_the_closed_document_and_again_is_a_no_op(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, stream_id="done")
    assert (await append(api, run_id, "done", "x")).status_code == 201
    closed = await api.post(f"/runs/{run_id}/streams/done/close")
    assert closed.status_code == 200, closed.text
    body = closed.json()
    assert body["stream_id"] == "done"
    assert body["state"]["closed"] is True
    assert body["state"]["head"] == 1
    closed_at = parse_time(body["state"]["closed_at"])
    assert closed_at >= parse_time(body["created_at"])

    again = await api.post(f"/runs/{run_id}/streams/done/close")
    assert again.status_code == 200, again.text
    assert again.json() == body
    assert (await document(api, run_id, "done")) == body

    page = (await api.get(f"/runs/{run_id}/streams/done/records")).json()
    assert page["closed"] is True


async def test_append_after_close_is_409_stream_closed(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id, stream_id="shut")
    assert (await append(api, run_id, "shut", 1, 2)).status_code == 201
    assert (await api.post(f"/runs/{run_id}/streams/shut/close")).status_code == 200
    assert_problem(await append(api, run_id, "shut", 3), 409, "stream-closed")
    state = (await document(api, run_id, "shut"))["state"]
    assert state["head"] == 2
    assert state["total_items"] == 2


async def test_close_of_an_unknown_stream_is_404(api: httpx.AsyncClient, run_id: str) -> None:
    assert_problem(await api.post(f"/runs/{run_id}/streams/nope/close"), 404, "not-found")


# -- legal hold -----------------------------------------------------------------------------------


async def test_legal_hold_answers_the_legal_hold_object(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, stream_id="held")
    on = await api.put(
        f"/runs/{run_id}/streams/held/legal-hold", json={"enabled": True, "reason": "case 42"}
    )
    assert on.status_code == 200, on.text
    hold = on.json()
    assert set(hold) == {"enabled", "reason", "updated_at"}
    assert hold["enabled"] is True
    assert hold["reason"] == "case 42"
    parse_time(hold["updated_at"])
    assert (await document(api, run_id, "held"))["state"]["legal_hold"] == hold

    off = await api.put(f"/runs/{run_id}/streams/held/legal-hold", json={"enabled": False})
    assert off.status_code == 200, off.text
    assert off.json()["enabled"] is False
    assert (await document(api, run_id, "held"))["state"]["legal_hold"]["enabled"] is False


async def test_legal_hold_needs_the_admin_scope(
    api: httpx.AsyncClient, run_id: str, tokens: Any
) -> None:
    await create(api, run_id, stream_id="guarded")
    token = await tokens.create(principal="bootstrap", scopes=("streams:read", "streams:write"))
    response = await api.put(
        f"/runs/{run_id}/streams/guarded/legal-hold",
        json={"enabled": True, "reason": "no"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert_problem(response, 403, "forbidden")
    hold = (await document(api, run_id, "guarded"))["state"]["legal_hold"]
    assert hold == {"enabled": False, "reason": None, "updated_at": None}


async def test_legal_hold_of_an_unknown_stream_is_404(api: httpx.AsyncClient, run_id: str) -> None:
    response = await api.put(f"/runs/{run_id}/streams/nope/legal-hold", json={"enabled": True})
    assert_problem(response, 404, "not-found")


# -- one representation, documented maximums, ceilings ------------------------------------------


def typed(value: Any) -> Any:
    """JSON values with their JSON number kind: 30 and 30.0 are told apart, as a client does."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, 30), (2, 2), (0.5, 0.5), (10.0, 10.0)],
    ids=["default", "integer", "fraction", "integral-float"],
)
async def test_block_timeout_reads_back_the_same_in_every_answer(
    api: httpx.AsyncClient, run_id: str, given: Any, expected: Any
) -> None:
    limits = {} if given is None else {"block_timeout_seconds": given}
    created = await create(api, run_id, stream_id="t", limits=limits)
    assert typed(created["limits"]["block_timeout_seconds"]) == typed(expected)
    got = await document(api, run_id, "t")
    listing = stream_documents((await api.get(f"/runs/{run_id}/streams")).json())
    closed = (await api.post(f"/runs/{run_id}/streams/t/close")).json()
    for answer in (got, listing[0], closed):
        assert typed(answer["limits"]) == typed(created["limits"])


MAX_EXACT_INTEGER = 2**53 - 1
MAX_RETENTION_AGE_SECONDS = 100 * 365 * 86_400


async def test_the_documented_maximums_are_accepted_and_the_stream_works(
    api: httpx.AsyncClient, run_id: str
) -> None:
    limits = {
        "max_unread_items": MAX_EXACT_INTEGER,
        "max_unread_bytes": MAX_EXACT_INTEGER,
        "max_total_items": MAX_EXACT_INTEGER,
        "max_total_bytes": MAX_EXACT_INTEGER,
        "block_timeout_seconds": 300,
    }
    retention = {"max_age_seconds": MAX_RETENTION_AGE_SECONDS, "max_records": MAX_EXACT_INTEGER}
    created = await create(api, run_id, stream_id="big", limits=limits, retention=retention)
    assert created["limits"] == {**limits, "unread_policy": "reject"}
    assert created["retention"] == retention
    assert (await append(api, run_id, "big", 1, 2)).status_code == 201
    state = (await document(api, run_id, "big"))["state"]
    assert (state["head"], state["earliest"]) == (2, 1)


async def test_a_batch_that_can_never_fit_the_total_ceiling_is_400(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, stream_id="small", limits={"max_total_bytes": 100})
    body = assert_problem(await append(api, run_id, "small", "x" * 120), 400, "invalid-input")
    assert "can never fit the stream's total ceiling of 100 bytes" in body["detail"], body
    state = (await document(api, run_id, "small"))["state"]
    assert (state["head"], state["total_bytes"]) == (0, 0)

    await create(api, run_id, stream_id="few", limits={"max_total_items": 2})
    body = assert_problem(await append(api, run_id, "few", 1, 2, 3), 400, "invalid-input")
    assert "can never fit the stream's total ceiling of 2 records" in body["detail"], body


async def test_a_batch_that_would_pass_the_total_ceiling_is_409_with_what_is_used(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id, stream_id="part", limits={"max_total_bytes": 100})
    assert (await append(api, run_id, "part", "x" * 58)).status_code == 201  # 60 bytes
    body = assert_problem(await append(api, run_id, "part", "y" * 58), 409, "quota-exhausted")
    assert "would pass the stream's total ceiling of 100 bytes: 60 are used" in body["detail"]
    assert (body["total_bytes"], body["max_total_bytes"]) == (60, 100)
    assert (await append(api, run_id, "part", "z" * 38)).status_code == 201  # exactly 100
    # Used up: even a batch bigger than the whole ceiling is told the ceiling is reached.
    for data in ("w", "w" * 200):
        body = assert_problem(await append(api, run_id, "part", data), 409, "quota-exhausted")
        assert "the stream's total ceiling of 100 bytes is reached" in body["detail"], body
        assert body["total_bytes"] == 100


def _schema(document: dict[str, Any], name: str) -> dict[str, Any]:
    schemas = document["components"]["schemas"]
    [key] = [k for k in schemas if k == name or k.endswith("." + name) or k.endswith("_" + name)]
    return schemas[key]


def test_the_openapi_document_shows_the_definition_bounds(server: Any) -> None:
    document = httpx.get(server.base_url + "/schema/openapi.json", timeout=30).json()
    limits = _schema(document, "Limits")["properties"]
    retention = _schema(document, "Retention")["properties"]
    authorization = _schema(document, "Authorization")["properties"]

    def maximum(prop: dict[str, Any]) -> Any:
        found = [p.get("maximum") for p in prop.get("oneOf", prop.get("anyOf", [prop]))]
        return {m for m in found if m is not None}

    for name in ("max_unread_items", "max_unread_bytes", "max_total_items", "max_total_bytes"):
        assert maximum(limits[name]) == {MAX_EXACT_INTEGER}, limits[name]
    assert maximum(limits["block_timeout_seconds"]) == {300}, limits["block_timeout_seconds"]
    assert maximum(retention["max_age_seconds"]) == {MAX_RETENTION_AGE_SECONDS}, retention
    assert maximum(retention["max_records"]) == {MAX_EXACT_INTEGER}, retention
    for name in ("readers", "writers"):
        assert authorization[name].get("minItems") == 1, authorization[name]
