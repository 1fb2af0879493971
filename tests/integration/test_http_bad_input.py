"""Bad input over HTTP: each is refused with problem JSON and its contract code, and changes
nothing (docs/http-api.md "Errors", "Stream definition", "Records", "Consumers and credit")."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import select
import socket
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import pytest

PROBLEM_JSON = "application/problem+json"
MAX_RECORD = 65_536
UNSET: Any = object()


@dataclass(frozen=True)
class Case:
    id: str
    method: str
    path: str  # below /runs/{run}; "{run}" may be replaced by a bad run ID
    status: int = 400
    codes: tuple[str, ...] = ("invalid-input",)
    json: Any = UNSET
    content: bytes | None = None
    params: dict[str, Any] = field(default_factory=dict)
    run: str | None = None  # a replacement run ID for the path


def assert_problem(response: httpx.Response, status: int, codes: tuple[str, ...]) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON), response.headers
    body = response.json()
    assert isinstance(body, dict), body
    for name in ("type", "title", "status", "detail", "code"):
        assert name in body, body
    assert isinstance(body["type"], str)
    assert isinstance(body["title"], str)
    assert isinstance(body["detail"], str)
    assert body["status"] == status
    assert body["code"] in codes, body
    return body


async def snapshot(api: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """Every stream of the run (definition and state) and every record of stream "s"."""
    listing = await api.get(f"/runs/{run_id}/streams")
    assert listing.status_code == 200, listing.text
    documents = listing.json()
    if isinstance(documents, dict):
        documents = documents["streams"]
    records = await api.get(f"/runs/{run_id}/streams/s/records", params={"limit": 1000})
    assert records.status_code == 200, records.text
    return {
        "streams": sorted(documents, key=lambda d: d["stream_id"]),
        "records": records.json()["records"],
    }


@pytest.fixture
async def world(api: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """Run `run_id` with stream "s": two records, consumer "c0" at 1; answers its snapshot."""
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
    )
    assert created.status_code == 201, created.text
    appended = await api.post(
        f"/runs/{run_id}/streams/s/records", json={"records": [{"data": 1}, {"data": 2}]}
    )
    assert appended.status_code == 201, appended.text
    acked = await api.post(f"/runs/{run_id}/streams/s/consumers/c0/ack", json={"sequence": 1})
    assert acked.status_code == 200, acked.text
    return await snapshot(api, run_id)


async def send(api: httpx.AsyncClient, run_id: str, case: Case) -> httpx.Response:
    path = f"/runs/{case.run if case.run is not None else run_id}{case.path}"
    kwargs: dict[str, Any] = {"params": case.params or None}
    if case.json is not UNSET:
        kwargs["json"] = case.json
    elif case.content is not None:
        kwargs["content"] = case.content
        kwargs["headers"] = {"Content-Type": "application/json"}
    return await api.request(case.method, path, **kwargs)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- create ---------------------------------------------------------------------------------------

CREATE = "/streams"
OK = {"direction": "output"}


def create(case_id: str, body: Any = UNSET, **kwargs: Any) -> Case:
    return Case("create-" + case_id, "POST", CREATE, json=body, **kwargs)


def bad_limits(case_id: str, limits: dict[str, Any]) -> Case:
    return create("limits-" + case_id, {"stream_id": "new", **OK, "limits": limits})


CREATE_CASES = [
    create("malformed-json", content=b'{"stream_id": "new", "direction": "output",'),
    create("not-json", content=b"direction=output"),
    create("empty-body", content=b""),
    create("json-array", [{"stream_id": "new", **OK}]),
    create("json-string", "output"),
    create("json-null", None),
    create("missing-direction", {"stream_id": "new"}),
    create("direction-5", {"stream_id": "new", "direction": 5}),
    create("direction-null", {"stream_id": "new", "direction": None}),
    create("direction-unknown", {"stream_id": "new", "direction": "sideways"}),
    create("unknown-top-level-field", {"stream_id": "new", **OK, "colour": "blue"}),
    create("unknown-limits-field", {"stream_id": "new", **OK, "limits": {"foo": 1}}),
    create("unknown-retention-field", {"stream_id": "new", **OK, "retention": {"foo": 1}}),
    create("unknown-redaction-field", {"stream_id": "new", **OK, "redaction": {"foo": []}}),
    create("unknown-placement-field", {"stream_id": "new", **OK, "placement": {"foo": "x"}}),
    create(
        "unknown-authorization-field",
        {"stream_id": "new", **OK, "authorization": {"admins": ["x"]}},
    ),
    create("stream-id-number", {"stream_id": 5, **OK}),
    create("stream-id-leading-dash", {"stream_id": "-new", **OK}),
    create("stream-id-leading-dot", {"stream_id": ".new", **OK}),
    create("stream-id-space", {"stream_id": "new one", **OK}),
    create("stream-id-slash", {"stream_id": "new/one", **OK}),
    create("stream-id-non-ascii", {"stream_id": "né", **OK}),
    create("stream-id-129-chars", {"stream_id": "n" * 129, **OK}),
    create("stream-id-200-chars", {"stream_id": "n" * 200, **OK}),
    create("stream-id-empty", {"stream_id": "", **OK}),
    create("content-class-unknown", {"stream_id": "new", **OK, "content_class": "poetry"}),
    create("content-class-number", {"stream_id": "new", **OK, "content_class": 5}),
    create(
        "content-class-model-reasoning-raw",
        {"stream_id": "new", **OK, "content_class": "model_reasoning_raw"},
        status=422,
        codes=("content-class-forbidden",),
    ),
    create(
        "redaction-pointer-without-slash",
        {"stream_id": "new", **OK, "redaction": {"json_pointers": ["secret"]}},
    ),
    create(
        "redaction-pointers-not-a-list",
        {"stream_id": "new", **OK, "redaction": {"json_pointers": "/secret"}},
    ),
    create("limits-not-an-object", {"stream_id": "new", **OK, "limits": 5}),
    bad_limits("max-unread-items-0", {"max_unread_items": 0}),
    bad_limits("max-unread-items-negative", {"max_unread_items": -1}),
    bad_limits("max-unread-items-fraction", {"max_unread_items": 1.5}),
    bad_limits("max-unread-items-string", {"max_unread_items": "10"}),
    bad_limits("max-unread-bytes-0", {"max_unread_bytes": 0}),
    bad_limits("max-unread-bytes-negative", {"max_unread_bytes": -100}),
    bad_limits("max-total-items-0", {"max_total_items": 0}),
    bad_limits("max-total-items-negative", {"max_total_items": -1}),
    bad_limits("max-total-bytes-0", {"max_total_bytes": 0}),
    bad_limits("max-total-bytes-negative", {"max_total_bytes": -1}),
    bad_limits("block-timeout-negative", {"block_timeout_seconds": -1}),
    bad_limits("unread-policy-maybe", {"unread_policy": "maybe"}),
    bad_limits("unread-policy-number", {"unread_policy": 1}),
    create("retention-max-records-0", {"stream_id": "new", **OK, "retention": {"max_records": 0}}),
    create(
        "retention-max-age-negative",
        {"stream_id": "new", **OK, "retention": {"max_age_seconds": -1}},
    ),
    create(
        "authorization-readers-not-a-list",
        {"stream_id": "new", **OK, "authorization": {"readers": "alice"}},
    ),
    create(
        "authorization-empty-principal",
        {"stream_id": "new", **OK, "authorization": {"writers": [""]}},
    ),
    # A stream no one could ever read or write: "*" is how to name everyone.
    create(
        "authorization-no-readers-no-writers",
        {"stream_id": "new", **OK, "authorization": {"readers": [], "writers": []}},
    ),
    create("authorization-no-readers", {**OK, "authorization": {"readers": []}}),
    create("authorization-no-writers", {**OK, "authorization": {"writers": []}}),
    # Beyond the documented maximums: each would be stored, then break the workers or a client.
    create(
        "retention-max-age-beyond-100-years",
        {"stream_id": "new", **OK, "retention": {"max_age_seconds": 100 * 365 * 86_400 + 1}},
    ),
    create(
        "retention-max-age-315360000000",
        {"stream_id": "new", **OK, "retention": {"max_age_seconds": 315_360_000_000}},
    ),
    create(
        "retention-max-age-1e15",
        {"stream_id": "new", **OK, "retention": {"max_age_seconds": 10**15}},
    ),
    create(
        "retention-max-records-beyond-2-53",
        {"stream_id": "new", **OK, "retention": {"max_records": 2**53}},
    ),
    bad_limits("max-unread-items-beyond-2-53", {"max_unread_items": 2**53}),
    bad_limits("max-unread-bytes-beyond-2-53", {"max_unread_bytes": 2**53}),
    bad_limits("max-total-items-beyond-2-53", {"max_total_items": 2**53}),
    bad_limits("max-total-bytes-beyond-2-53", {"max_total_bytes": 2**53}),
    bad_limits("max-total-bytes-beyond-int64", {"max_total_bytes": 2**64}),
    bad_limits("block-timeout-301", {"block_timeout_seconds": 301}),
    bad_limits("block-timeout-1e400", {"block_timeout_seconds": 10**400}),
]


# -- append ---------------------------------------------------------------------------------------

RECORDS = "/streams/s/records"


def append(case_id: str, body: Any = UNSET, **kwargs: Any) -> Case:
    return Case("append-" + case_id, "POST", RECORDS, json=body, **kwargs)


APPEND_CASES = [
    append("malformed-json", content=b'{"records": [{"data": 3}'),
    append("not-json", content=b"records=3"),
    append("empty-body", content=b""),
    append("json-array", [{"data": 3}]),
    append("missing-records", {}),
    append("records-null", {"records": None}),
    append("records-not-a-list", {"records": {"data": 3}}),
    append("record-not-an-object", {"records": [3]}),
    append("unknown-top-level-field", {"records": [{"data": 3}], "extra": 1}),
    append("unknown-record-field", {"records": [{"data": 3, "extra": 1}]}),
    append("empty-records", {"records": []}),
    append("1001-records", {"records": [{"data": i} for i in range(1001)]}),
    append("both-data-and-base64", {"records": [{"data": 3, "data_base64": b64(b"3")}]}),
    append("neither-data-nor-base64", {"records": [{"data": 3}, {}]}),
    append("only-content-type", {"records": [{"content_type": "text/plain"}]}),
    append("invalid-base64", {"records": [{"data": 3}, {"data_base64": "!!!not base64!!!"}]}),
    append("base64-bad-padding", {"records": [{"data_base64": "abc"}]}),
    append("base64-not-a-string", {"records": [{"data_base64": 5}]}),
    append("content-type-not-a-string", {"records": [{"data": 3, "content_type": 5}]}),
    # Numbers no IEEE double holds: most clients would read them as Infinity or fail.
    append("data-1e400", content=b'{"records": [{"data": 1e400}]}'),
    append("data-minus-1e400", content=b'{"records": [{"data": [1, {"x": -1E+400}]}]}'),
    append("data-2e400-second", content=b'{"records": [{"data": 1}, {"data": 2e400}]}'),
    append("data-310-digit-fraction", content=b'{"records": [{"data": 1%s.5}]}' % (b"0" * 309)),
    append("data-1e99-times-10-250", content=b'{"records": [{"data": 1%se99}]}' % (b"0" * 250)),
    append(
        "inline-record-65537-bytes",
        {"records": [{"data": 3}, {"data": "x" * (MAX_RECORD - 1)}, {"data": 4}]},
        status=413,
        codes=("record-too-large",),
    ),
    append(
        "base64-record-65537-bytes",
        {"records": [{"data": 3}, {"data_base64": b64(b"\x00" * (MAX_RECORD + 1))}]},
        status=413,
        codes=("record-too-large",),
    ),
]


# -- read -----------------------------------------------------------------------------------------


def read(case_id: str, codes: tuple[str, ...] = ("invalid-input",), **params: Any) -> Case:
    return Case("read-" + case_id, "GET", RECORDS, params=params, codes=codes)


READ_CASES = [
    read("cursor-negative", cursor=-1),
    read("cursor-not-a-number", cursor="abc"),
    read("cursor-fraction", cursor="1.5"),
    read("cursor-empty", cursor=""),
    read("cursor-huge", codes=("invalid-input", "cursor-ahead-of-head"), cursor=str(10**30)),
    read("cursor-ahead-of-head", codes=("cursor-ahead-of-head",), cursor=3),
    read("limit-0", limit=0),
    read("limit-1001", limit=1001),
    read("limit-negative", limit=-1),
    read("limit-not-a-number", limit="x"),
    read("wait-61", wait=61),
    read("wait-negative", wait=-1),
    read("wait-not-a-number", wait="soon"),
]


# -- ack ------------------------------------------------------------------------------------------


def ack(case_id: str, body: Any = UNSET, consumer: str = "c0", **kwargs: Any) -> Case:
    return Case(
        "ack-" + case_id, "POST", f"/streams/s/consumers/{consumer}/ack", json=body, **kwargs
    )


ACK_CASES = [
    ack("negative-sequence", {"sequence": -1}),
    ack("negative-sequence-new-consumer", {"sequence": -1}, consumer="c9"),
    ack("missing-sequence", {}),
    ack("missing-sequence-new-consumer", {}, consumer="c9"),
    ack("sequence-string", {"sequence": "2"}),
    ack("sequence-fraction", {"sequence": 1.5}),
    ack("sequence-true", {"sequence": True}),
    ack("sequence-null", {"sequence": None}),
    ack("sequence-huge", {"sequence": 10**30}),
    ack("unknown-field", {"sequence": 2, "extra": 1}),
    ack("malformed-json", content=b'{"sequence": 2'),
    ack("empty-body", content=b""),
    ack("json-array", [2]),
]


# -- legal hold -----------------------------------------------------------------------------------


def hold(case_id: str, body: Any = UNSET, **kwargs: Any) -> Case:
    return Case("legal-hold-" + case_id, "PUT", "/streams/s/legal-hold", json=body, **kwargs)


HOLD_CASES = [
    hold("missing-enabled", {"reason": "audit"}),
    hold("empty-object", {}),
    hold("enabled-string", {"enabled": "yes"}),
    hold("enabled-number", {"enabled": 1}),
    hold("reason-number", {"enabled": True, "reason": 5}),
    hold("reason-too-long", {"enabled": True, "reason": "r" * 1001}),
    hold("unknown-field", {"enabled": True, "until": "forever"}),
    hold("malformed-json", content=b'{"enabled": true'),
    hold("json-array", [True]),
]


# -- bad IDs in the path --------------------------------------------------------------------------

BAD_IDS = {
    "leading-dash": "-bad",
    "leading-underscore": "_bad",
    "200-chars": "i" * 200,
    "129-chars": "i" * 129,
    "space": "has space",
    "non-ascii": "näme",
}
ROUTES = [
    # (name, method, path with {run}/{stream}/{consumer} placeholders, body)
    ("list", "GET", "/runs/{run}/streams", UNSET),
    ("create", "POST", "/runs/{run}/streams", {"stream_id": "new", **OK}),
    ("get", "GET", "/runs/{run}/streams/{stream}", UNSET),
    ("read", "GET", "/runs/{run}/streams/{stream}/records", UNSET),
    ("append", "POST", "/runs/{run}/streams/{stream}/records", {"records": [{"data": 3}]}),
    ("ack", "POST", "/runs/{run}/streams/{stream}/consumers/{consumer}/ack", {"sequence": 2}),
    ("close", "POST", "/runs/{run}/streams/{stream}/close", UNSET),
    ("legal-hold", "PUT", "/runs/{run}/streams/{stream}/legal-hold", {"enabled": True}),
    ("delete", "DELETE", "/runs/{run}/streams/{stream}", UNSET),
    ("delete-run", "DELETE", "/runs/{run}", UNSET),
]


def path_cases() -> list[Any]:
    cases = []
    for name, method, template, body in ROUTES:
        for placeholder in ("run", "stream", "consumer"):
            if "{" + placeholder + "}" not in template:
                continue
            for bad_name, bad in BAD_IDS.items():
                cases.append(
                    pytest.param(
                        placeholder,
                        bad,
                        method,
                        template,
                        body,
                        id=f"{name}-{placeholder}-{bad_name}",
                    )
                )
    return cases


# -- the tests ------------------------------------------------------------------------------------

ALL_CASES = CREATE_CASES + APPEND_CASES + READ_CASES + ACK_CASES + HOLD_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
async def test_bad_input_is_refused_and_changes_nothing(
    api: httpx.AsyncClient, run_id: str, world: dict[str, Any], case: Case
) -> None:
    response = await send(api, run_id, case)
    assert_problem(response, case.status, case.codes)
    assert (await snapshot(api, run_id)) == world


@pytest.mark.parametrize(("placeholder", "bad", "method", "template", "body"), path_cases())
async def test_a_bad_id_in_the_path_is_400_and_changes_nothing(
    api: httpx.AsyncClient,
    run_id: str,
    world: dict[str, Any],
    placeholder: str,
    bad: str,
    method: str,
    template: str,
    body: Any,
) -> None:
    ids = {"run": run_id, "stream": "s", "consumer": "c0", placeholder: bad}
    path = template.format(**ids)
    kwargs = {} if body is UNSET else {"json": body}
    response = await api.request(method, path, **kwargs)
    assert_problem(response, 400, ("invalid-input",))
    assert (await snapshot(api, run_id)) == world


# -- sizes ----------------------------------------------------------------------------------------


async def test_a_record_of_exactly_65536_bytes_is_accepted(
    api: httpx.AsyncClient, run_id: str, world: dict[str, Any]
) -> None:
    inline = "x" * (MAX_RECORD - 2)  # its compact JSON has two quotes: 65,536 bytes
    binary = b"\xff" * MAX_RECORD
    response = await api.post(
        f"/runs/{run_id}/streams/s/records",
        json={"records": [{"data": inline}, {"data_base64": b64(binary)}]},
    )
    assert response.status_code == 201, response.text
    assert (response.json()["first_sequence"], response.json()["last_sequence"]) == (3, 4)
    # Whitespace around the value is not part of the record: still 65,536 bytes.
    padded = b'{"records": [{"data":    "' + inline.encode() + b'"    }]}'
    response = await api.post(
        f"/runs/{run_id}/streams/s/records",
        content=padded,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
    page = (await api.get(f"/runs/{run_id}/streams/s/records", params={"cursor": 2})).json()
    assert [r["size"] for r in page["records"]] == [MAX_RECORD, MAX_RECORD, MAX_RECORD]
    assert page["records"][0]["data"] == inline
    assert base64.b64decode(page["records"][1]["data_base64"]) == binary


def post_reading_early(
    api: httpx.AsyncClient, path: str, body: bytes, extra_headers: str = ""
) -> tuple[int, dict[str, str], bytes]:
    """POST like a careful client (curl does this): stop sending and read as soon as an answer
    arrives, since a server may answer 413 and close before it has read the whole body.
    `extra_headers`: raw header lines (each ending in CRLF) sent too, as no client would."""
    url = api.base_url.join(path.lstrip("/"))
    head = (
        f"POST {url.raw_path.decode()} HTTP/1.1\r\n"
        f"Host: {url.host}:{url.port}\r\n{extra_headers}"
        f"Authorization: {api.headers['authorization']}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((url.host, url.port), timeout=30) as sock:
        sock.sendall(head)
        view = memoryview(body)
        while view:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            try:
                sent = sock.send(view[:65_536])
            except OSError:
                break
            view = view[sent:]
        received = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65_536):
                received += chunk
    raw_head, _, content = received.partition(b"\r\n\r\n")
    lines = raw_head.decode().split("\r\n")
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in lines[1:])
    }
    return int(lines[0].split()[1]), headers, content[: int(headers["content-length"])]


async def test_a_request_body_over_8_mib_is_413_and_appends_nothing(
    api: httpx.AsyncClient, run_id: str, world: dict[str, Any]
) -> None:
    # 200 records of 45,002 bytes each: every record is allowed, the request (~9 MB) is not.
    body = json.dumps({"records": [{"data": "y" * 45_000}] * 200}).encode()
    assert len(body) > 8 * 1024 * 1024
    status, headers, content = await asyncio.to_thread(
        post_reading_early, api, f"/runs/{run_id}/streams/s/records", body
    )
    assert status == 413, content
    assert headers["content-type"].startswith(PROBLEM_JSON)
    problem = json.loads(content)
    for name in ("type", "title", "status", "detail", "code"):
        assert name in problem, problem
    assert problem["status"] == 413
    assert isinstance(problem["code"], str)
    assert problem["code"]
    assert (await snapshot(api, run_id)) == world


async def test_a_request_body_over_8_mib_is_413_for_an_ordinary_client(
    api: httpx.AsyncClient, run_id: str, world: dict[str, Any]
) -> None:
    """httpx (like most clients) reads the answer only once the body is sent: the server must
    not reset the connection before such a client can read its 413."""
    body = json.dumps({"records": [{"data": "y" * 45_000}] * 200}).encode()
    response = await api.post(
        f"/runs/{run_id}/streams/s/records",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 413, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    assert (await snapshot(api, run_id)) == world


async def test_a_request_body_just_under_8_mib_is_accepted(
    api: httpx.AsyncClient, run_id: str, world: dict[str, Any]
) -> None:
    body = json.dumps({"records": [{"data": "z" * 45_000}] * 185}).encode()
    assert 8_000_000 < len(body) < 8 * 1024 * 1024
    response = await api.post(
        f"/runs/{run_id}/streams/s/records",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
    assert response.json()["last_sequence"] == 2 + 185


async def test_ids_of_128_characters_are_accepted(api: httpx.AsyncClient, run_id: str) -> None:
    long_run = ("r" + run_id + "x" * 128)[:128]
    long_stream = "S" + "s.:_-" * 25 + "st"
    assert len(long_run) == len(long_stream) == 128
    created = await api.post(
        f"/runs/{long_run}/streams", json={"stream_id": long_stream, "direction": "output"}
    )
    assert created.status_code == 201, created.text
    consumer = "C" + "c" * 127
    base = f"/runs/{long_run}/streams/{long_stream}"
    assert (await api.post(base + "/records", json={"records": [{"data": 1}]})).status_code == 201
    assert (
        await api.post(f"{base}/consumers/{consumer}/ack", json={"sequence": 1})
    ).status_code == 200
    assert (await api.get(base)).json()["state"]["consumers"] == [
        {"consumer_id": consumer, "acked_sequence": 1, "holds_credit": True}
    ]


# -- text that must never reach storage -----------------------------------------------------------
# Each of these was a 500 or, worse, stored: a body that is not UTF-8 or nests past 64 levels, a
# control character in stored text, a content type that is not an RFC 9110 media type.

SHA = "0" * 64
JSON = {"Content-Type": "application/json"}


def nested(levels: int) -> bytes:
    """An append body nesting exactly `levels` deep (the body's own {"records": [{...}]} is 3)."""
    inner = levels - 3
    return b'{"records":[{"data":' + b"[" * inner + b"1" + b"]" * inner + b"}]}"


async def stored(pool: asyncpg.Pool, run_id: str) -> dict[str, int]:
    """Rows of the run in every table a request could have written."""
    counts = {}
    for table in (
        "streams",
        "stream_events",
        "stream_records",
        "append_receipts",
        "stream_consumers",
        "object_intents",
        "input_deliveries",
    ):
        counts[table] = await pool.fetchval(
            f"SELECT count(*) FROM {table} WHERE tenant = 'default' AND run_id = $1", run_id
        )
    return counts


TEXT_CASES = [
    append("nested-100000-deep", content=nested(100_000)),
    append("nested-65-deep", content=nested(65)),
    append("data-not-utf8", content=b'{"records": [{"data": "a\xff\xfeb"}]}'),
    append("data-key-not-utf8", content=b'{"records": [{"data": {"k\xc0\xaf": 1}}]}'),
    append("data-utf8-encoded-surrogate", content=b'{"records": [{"data": "\xed\xa0\x80"}]}'),
    append("content-type-nul", {"records": [{"data": 1, "content_type": "text/plain\x00"}]}),
    append(
        "content-type-crlf",
        {"records": [{"data": 1}, {"data": 2, "content_type": "text/plain\r\nX-Injected: 1"}]},
    ),
    append("content-type-tab", {"records": [{"data": 1, "content_type": "text/plain;\tq=1"}]}),
    append("content-type-no-subtype", {"records": [{"data": 1, "content_type": "text"}]}),
    append("content-type-space", {"records": [{"data": 1, "content_type": "text /plain"}]}),
    append("content-type-non-ascii", {"records": [{"data": 1, "content_type": "text/plän"}]}),
    append(
        "base64-content-type-bad-parameter",
        {"records": [{"data_base64": b64(b"x"), "content_type": "a/b; charset"}]},
    ),
    create(
        "nested-65-deep",
        content=b'{"direction": "output", "schema": ' + b"[" * 64 + b"]" * 64 + b"}",
    ),
    create(
        "schema-not-utf8", content=b'{"stream_id": "new", "direction": "output", "schema": "\xff"}'
    ),
    create("schema-nul", {"stream_id": "new", **OK, "schema": {"title": "a\x00b"}}),
    # What every request on the stream and every cache carries is bounded.
    create("schema-over-64-kib", {"stream_id": "new", **OK, "schema": {"title": "x" * 65_536}}),
    create(
        "redaction-65-pointers",
        {"stream_id": "new", **OK, "redaction": {"json_pointers": [f"/p{n}" for n in range(65)]}},
    ),
    create(
        "redaction-pointer-1025-chars",
        {"stream_id": "new", **OK, "redaction": {"json_pointers": ["/" + "p" * 1024]}},
    ),
    create(
        "authorization-101-readers",
        {"stream_id": "new", **OK, "authorization": {"readers": [f"r{n}" for n in range(101)]}},
    ),
    create("schema-key-control", {"stream_id": "new", **OK, "schema": {"a\x1b": 1}}),
    create(
        "authorization-reader-nul",
        {"stream_id": "new", **OK, "authorization": {"readers": ["alice\x00"]}},
    ),
    create(
        "authorization-writer-newline",
        {"stream_id": "new", **OK, "authorization": {"writers": ["bob\n"]}},
    ),
    create(
        "redaction-pointer-control",
        {"stream_id": "new", **OK, "redaction": {"json_pointers": ["/a\x00"]}},
    ),
    create(
        "region-trailing-newline",
        {"stream_id": "new", **OK, "placement": {"object_regions": ["local\n"]}},
    ),
    hold("reason-nul", {"enabled": True, "reason": "audit\x00"}),
    hold("reason-newline", {"enabled": True, "reason": "line one\nline two"}),
    hold("nested-65-deep", content=b'{"enabled": true, "x": ' + b"[" * 64 + b"]" * 64 + b"}"),
    ack("not-utf8", content=b'{"sequence": 2, "\xff": 1}'),
    ack("nested-65-deep", content=b'{"sequence": ' + b"[" * 65 + b"]" * 65 + b"}"),
]

PREPARE = "/streams/s/objects"


def prepare(case_id: str, **fields: Any) -> Case:
    body = {"idempotency_key": "k-" + case_id, "size": 1, "sha256": SHA, **fields}
    return Case("prepare-" + case_id, "POST", PREPARE, json=body)


PREPARE_CASES = [
    prepare("key-nul", idempotency_key="k\x00"),
    prepare("key-newline", idempotency_key="k\n"),
    prepare("content-type-nul", content_type="application/pdf\x00"),
    prepare("content-type-crlf", content_type="text/plain\r\nX-Injected: 1"),
    prepare("content-type-not-a-media-type", content_type="pdf"),
    prepare("content-type-unterminated-quote", content_type='text/plain; a="b'),
    prepare("schema-nul", schema={"title": "\x00"}),
    prepare("schema-over-4-kib", schema={"title": "x" * 4_096}),
    prepare("sha256-trailing-newline", sha256=SHA + "\n"),
    Case(
        "prepare-not-utf8",
        "POST",
        PREPARE,
        content=b'{"idempotency_key": "k\xff", "size": 1, "sha256": "' + SHA.encode() + b'"}',
    ),
    Case(
        "prepare-nested-65-deep",
        "POST",
        PREPARE,
        content=b'{"idempotency_key": "k", "size": 1, "sha256": "'
        + SHA.encode()
        + b'", "schema": '
        + b"[" * 64
        + b"]" * 64
        + b"}",
    ),
]


@pytest.mark.parametrize(
    "case", TEXT_CASES + PREPARE_CASES, ids=[c.id for c in TEXT_CASES + PREPARE_CASES]
)
async def test_bad_text_is_refused_and_stores_nothing(
    api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str, world: dict[str, Any], case: Case
) -> None:
    before = await stored(pool, run_id)
    response = await send(api, run_id, case)
    assert_problem(response, 400, ("invalid-input",))
    assert (await stored(pool, run_id)) == before
    assert (await snapshot(api, run_id)) == world


async def test_an_idempotency_key_with_a_tab_is_refused_and_no_receipt_is_kept(
    api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str, world: dict[str, Any]
) -> None:
    before = await stored(pool, run_id)
    response = await api.post(
        f"/runs/{run_id}/streams/s/records",
        json={"records": [{"data": 3}]},
        headers={"Idempotency-Key": "key\twith-tab"},
    )
    assert_problem(response, 400, ("invalid-input",))
    assert (await stored(pool, run_id)) == before


async def test_a_header_of_one_value_sent_twice_is_refused_on_both_surfaces(
    api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str, world: dict[str, Any]
) -> None:
    """Which of two credentials, keys or producer ids would count is not the service's to
    guess (a proxy in front may have checked the other one): 400, and nothing is stored."""
    before = await stored(pool, run_id)
    token = api.headers["authorization"]
    body = json.dumps({"records": [{"data": 3}]}).encode()
    records = f"/runs/{run_id}/streams/s/records"
    for twice in (
        [("authorization", token), ("authorization", "Bearer someone-else")],
        [("idempotency-key", "a"), ("idempotency-key", "b")],
        [("content-type", "application/json"), ("content-type", "text/plain")],
    ):
        headers = [("authorization", token), ("content-type", "application/json")]
        headers = [h for h in headers if h[0] != twice[0][0]] + twice
        # The append front, and Litestar's routes (a read).
        for method, path, content in (("POST", records, body), ("GET", records, None)):
            response = await api.request(method, path, content=content, headers=headers)
            problem = assert_problem(response, 400, ("invalid-input",))
            assert twice[0][0] in problem["detail"], problem
    assert (await stored(pool, run_id)) == before
    ds = str(api.base_url).replace("/api/workflow-streams", "/api/durable-streams/v1/stream")
    answer = await api.post(
        f"{ds}/{run_id}/s",
        content=b"[1]",
        headers=[
            ("content-type", "application/json"),
            ("producer-id", "p"),
            ("producer-id", "q"),
            ("producer-epoch", "0"),
            ("producer-seq", "0"),
        ],
    )
    assert answer.status_code == 400, answer.text
    assert (await stored(pool, run_id)) == before
    # Two Host headers (RFC 9112 3.2: 400), which clients refuse to send: by hand.
    status, _, content = post_reading_early(api, records, body, "Host: example.com\r\n")
    assert status == 400, content[:300]
    assert (await stored(pool, run_id)) == before


async def test_a_body_nested_exactly_64_deep_is_accepted_and_reads_back(
    api: httpx.AsyncClient, run_id: str, world: dict[str, Any]
) -> None:
    response = await api.post(f"/runs/{run_id}/streams/s/records", content=nested(64), headers=JSON)
    assert response.status_code == 201, response.text
    page = (await api.get(f"/runs/{run_id}/streams/s/records", params={"cursor": 2})).json()
    data = page["records"][0]["data"]
    depth = 0
    while isinstance(data, list):
        data, depth = data[0], depth + 1
    assert (depth, data) == (61, 1)


async def test_brackets_and_utf8_inside_strings_are_data(
    api: httpx.AsyncClient, run_id: str, world: dict[str, Any]
) -> None:
    text = "[{" * 500 + ' \\"[ é€😀'
    response = await api.post(
        f"/runs/{run_id}/streams/s/records",
        json={"records": [{"data": text}, {"data": {"nul": "a\x00b"}}]},
    )
    assert response.status_code == 201, response.text
    page = (await api.get(f"/runs/{run_id}/streams/s/records", params={"cursor": 2})).json()
    assert [r["data"] for r in page["records"]] == [text, {"nul": "a\x00b"}]


async def test_media_types_with_parameters_are_kept_as_given(
    api: httpx.AsyncClient, run_id: str, world: dict[str, Any]
) -> None:
    given = ["application/json; charset=utf-8", 'text/plain;format="a b;c"', "application/x+y"]
    response = await api.post(
        f"/runs/{run_id}/streams/s/records",
        json={"records": [{"data": i, "content_type": c} for i, c in enumerate(given)]},
    )
    assert response.status_code == 201, response.text
    page = (await api.get(f"/runs/{run_id}/streams/s/records", params={"cursor": 2})).json()
    assert [r["content_type"] for r in page["records"]] == given


@pytest.mark.parametrize(
    "content_type",
    ['application/x-report; version="1 2"', 'text/plain; charset="utf-8"', "text/csv"],
)
async def test_an_objects_media_type_comes_back_on_its_download(
    api: httpx.AsyncClient, run_id: str, world: dict[str, Any], content_type: str
) -> None:
    """As it was given: a text type gains no second (or first) charset on the way out."""
    body = b"hello"
    prepared = await api.post(
        f"/runs/{run_id}/streams/s/objects",
        json={
            "idempotency_key": "k",
            "size": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "content_type": content_type,
        },
    )
    assert prepared.status_code == 201, prepared.text
    base = f"/runs/{run_id}/streams/s/objects/{prepared.json()['object_id']}"
    assert (await api.put(base + "/body", content=body)).status_code == 200
    assert (await api.post(base + "/commit")).status_code == 201
    download = await api.get(base + "/body")
    assert download.status_code == 200, download.text
    assert (download.headers["content-type"], download.content) == (content_type, body)


async def test_an_input_streams_record_with_nul_is_refused_and_stores_nothing(
    api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str
) -> None:
    """Its records reach the wait service's jsonb, which cannot hold U+0000: one such record
    stopped the stream's delivery for good."""
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "in", "direction": "input"}
    )
    assert created.status_code == 201, created.text
    before = await stored(pool, run_id)
    response = await api.post(
        f"/runs/{run_id}/streams/in/records",
        json={"records": [{"data": 1}, {"data": {"k": "a\x00b"}}]},
    )
    body = assert_problem(response, 400, ("invalid-input",))
    assert "records[1]" in body["detail"]
    assert (await stored(pool, run_id)) == before
    literal = await api.post(
        f"/runs/{run_id}/streams/in/records", json={"records": [{"data": "\\u0000"}]}
    )
    assert literal.status_code == 201, literal.text


async def test_an_input_streams_record_with_an_integer_python_cannot_decode_is_refused(
    api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str
) -> None:
    """An engine's client (DBOS's) decodes each record in Python, which refuses an integer of
    over 4,300 digits: one such record would stop the stream's delivery for good."""
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "in", "direction": "input"}
    )
    assert created.status_code == 201, created.text
    before = await stored(pool, run_id)
    response = await api.post(
        f"/runs/{run_id}/streams/in/records",
        content=b'{"records": [{"data": 1}, {"data": [%s]}]}' % (b"7" * 4301),
        headers={"Content-Type": "application/json"},
    )
    body = assert_problem(response, 400, ("invalid-input",))
    assert "records[1]" in body["detail"] and "4,300 digits" in body["detail"]
    assert (await stored(pool, run_id)) == before


async def test_numbers_a_double_holds_and_long_integers_are_kept_verbatim(
    api: httpx.AsyncClient, run_id: str
) -> None:
    created = await api.post(f"/runs/{run_id}/streams", json={"stream_id": "n", **OK})
    assert created.status_code == 201, created.text
    long_integer = b"9" * 5000
    values = [b"1.7976931348623157e308", b"-1e308", b"1e-400", b'"1e400"', long_integer]
    for value in values:
        appended = await api.post(
            f"/runs/{run_id}/streams/n/records",
            content=b'{"records": [{"data": %s}]}' % value,
            headers={"Content-Type": "application/json"},
        )
        assert appended.status_code == 201, appended.text
    page = await api.get(f"/runs/{run_id}/streams/n/records")
    assert page.status_code == 200, page.text
    for value in values:
        assert b'"data":' + value in page.content
