"""The OpenAPI document tells the truth: schemathesis, with every check, against a real server,
over the whole document, every operation (the Durable Streams subscription routes below `__ds/`
included).

The default run is bounded (a fixed seed, 10 examples per operation: about a minute on two slow
cores); the `slow` run spends more examples per operation with a fixed seed of its own. Both
print the cases and failures per check."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from application.tokens import TOKEN_ID_PATTERN
from domain.definition import MAX_OBJECT_BYTES
from domain.ids import ID_PATTERN
from entrypoints.http.problems import PROBLEM_JSON, STATUS_OF_CODE
from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.postgres import create_test_database, drop_test_database
from tests.support.server import ROOT, ServerProcess

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CONFIG = ROOT / "tests" / "support" / "schemathesis.toml"
PHASES = "examples,coverage,fuzzing,stateful"


def document(server: ServerProcess) -> dict[str, Any]:
    answer = httpx.get(server.base_url + "/schema/openapi.json", timeout=10)
    assert answer.status_code == 200
    return answer.json()


def operations(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        op["operationId"]: {**op, "path": path}
        for path, item in doc["paths"].items()
        for op in item.values()
    }


def test_the_document_describes_problems_auth_and_media_types(server: ServerProcess) -> None:
    doc = document(server)
    ops = operations(doc)
    problem = doc["components"]["schemas"]["Problem"]
    assert problem["properties"]["code"]["enum"] == list(STATUS_OF_CODE)
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    for op in ops.values():
        public = op["operationId"] == "dsJwks"  # receivers fetch the webhook keys without a token
        if (
            op["path"].startswith(("/api/workflow-streams/", "/api/durable-streams/"))
            and not public
        ):
            assert op["security"] == [{"bearer": []}], op["operationId"]
            assert PROBLEM_JSON in op["responses"]["401"]["content"], op["operationId"]
            assert "WWW-Authenticate" in op["responses"]["401"]["headers"]
            for status, answer in op["responses"].items():
                if int(status) >= 400:
                    assert list(answer["content"]) == [PROBLEM_JSON], (op["operationId"], status)
            for parameter in op.get("parameters", ()):
                if parameter["name"] == "stream_path":  # a protocol stream path: `run/stream`
                    assert op["operationId"] == "dsSubscriptionUnlink"
                elif parameter["in"] == "path" and op["operationId"] != "revokeToken":
                    assert parameter["schema"]["pattern"] == ID_PATTERN
                elif parameter["in"] == "path":  # a token's id: tok_ and 16 hex digits
                    assert parameter["schema"]["pattern"] == TOKEN_ID_PATTERN
        else:
            assert op["security"] == []
    assert list(ops["subscribe"]["responses"]["200"]["content"]) == ["text/event-stream"]
    assert list(ops["metrics"]["responses"]["200"]["content"]) == ["text/plain"]
    upload = ops["uploadObjectBody"]["requestBody"]["content"]
    assert upload == {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
    }
    append = ops["appendRecords"]
    assert set(append["responses"]) >= {"200", "201", "409", "413", "422", "429"}
    assert "Idempotent-Replayed" in append["responses"]["200"]["headers"]
    assert "Retry-After" in append["responses"]["429"]["headers"]
    assert "Idempotency-Key" in [p["name"] for p in append["parameters"]]
    assert "Last-Event-ID" in [p["name"] for p in ops["subscribe"]["parameters"]]
    for replayed in ("createStream", "prepareObject", "commitObject"):
        assert {"200", "201"} <= set(ops[replayed]["responses"]), replayed
    assert "Location" in ops["createStream"]["responses"]["201"]["headers"]
    assert "Repr-Digest" in ops["getObjectBody"]["responses"]["200"]["headers"]
    query = {p["name"]: p["schema"] for p in ops["readRecords"]["parameters"] if p["in"] == "query"}
    assert (query["cursor"]["minimum"], query["cursor"]["maximum"]) == (0, 2**63 - 1)
    assert (query["limit"]["minimum"], query["limit"]["maximum"]) == (1, 1000)
    assert (query["wait"]["minimum"], query["wait"]["maximum"]) == (0, 60)
    assert {"201", "403", "409"} <= set(ops["mintToken"]["responses"])  # past the token limit
    for deletion in ("deleteStream", "deleteRun"):
        assert {"204", "403", "404", "409"} <= set(ops[deletion]["responses"]), deletion
        assert "content" not in ops[deletion]["responses"]["204"]
    runs = {p["name"]: p["schema"] for p in ops["listRuns"]["parameters"] if p["in"] == "query"}
    assert (runs["limit"]["minimum"], runs["limit"]["maximum"]) == (1, 1000)
    assert runs["after"].get("pattern") == ID_PATTERN or any(
        s.get("pattern") == ID_PATTERN for s in runs["after"].get("oneOf", [])
    )
    listed = {p["name"]: p["schema"] for p in ops["listTokens"]["parameters"] if p["in"] == "query"}
    assert (listed["limit"]["minimum"], listed["limit"]["maximum"]) == (1, 1000)
    assert listed["after"].get("pattern") == TOKEN_ID_PATTERN or any(
        s.get("pattern") == TOKEN_ID_PATTERN for s in listed["after"].get("oneOf", [])
    )
    bad_page = ops["listTokens"]["responses"]["400"]["content"][PROBLEM_JSON]["schema"]
    assert {"invalid-input", "cursor-unknown"} <= set(bad_page["properties"]["code"]["enum"])
    schemas = doc["components"]["schemas"]
    assert "next_after" in schemas["TokenList"]["required"]
    expiry = schemas["Expiry"]
    assert expiry["additionalProperties"] is False
    [idle, _] = expiry["properties"]["idle_seconds"]["anyOf"]
    assert (idle["minimum"], idle["maximum"]) == (1, 100 * 365 * 86_400)
    assert expiry["properties"]["expires_at"]["anyOf"][0]["format"] == "date-time"
    [sliding, absolute, never] = schemas["DefinitionRequest"]["properties"]["expiry"]["oneOf"]
    assert (sliding["required"], absolute["required"]) == (["idle_seconds"], ["expires_at"])
    assert never["properties"] == {"idle_seconds": {"type": "null"}, "expires_at": {"type": "null"}}
    document_expiry = schemas["StreamDocument"]["properties"]["expiry"]
    assert document_expiry == {"$ref": "#/components/schemas/Expiry"}


def test_an_input_streams_id_without_a_colon_is_in_the_create_schema(
    server: ServerProcess,
) -> None:
    """A rule between two fields of the create body (an input stream's ID holds no `:`, its
    events' ids' separator) is in its schema, so that a body the schema allows is one the
    service takes: a schema-valid create was refused (400)."""
    create = operations(document(server))["createStream"]
    schema = create["requestBody"]["content"]["application/json"]["schema"]
    assert schema["allOf"] == [{"$ref": "#/components/schemas/DefinitionRequest"}]
    assert schema["if"] == {
        "properties": {"direction": {"const": "input"}},
        "required": ["direction"],
    }
    assert schema["then"] == {"properties": {"stream_id": {"pattern": "^[^:]*$"}}}
    refused = httpx.post(
        f"{server.base_url}/api/workflow-streams/runs/colon/streams",
        json={"stream_id": "f:", "direction": "input"},
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
    )
    assert refused.status_code == 400 and refused.json()["code"] == "invalid-input"


def test_a_prepare_over_the_size_maximum_is_documented_as_its_413(server: ServerProcess) -> None:
    """A body field past its schema's bound is 400, but an object's `size` past 32 MiB is the
    contract's 413 object-too-large: the field's schema says so beside its `maximum`, and the
    operation lists that 413 among its answers."""
    doc = document(server)
    prepare = operations(doc)["prepareObject"]
    too_large = prepare["responses"]["413"]["content"][PROBLEM_JSON]["schema"]
    assert "object-too-large" in too_large["properties"]["code"]["enum"]
    size = doc["components"]["schemas"]["ObjectRequest"]["properties"]["size"]
    assert (size["minimum"], size["maximum"]) == (0, MAX_OBJECT_BYTES)
    assert "413 object-too-large" in size["description"]


def test_the_durable_streams_routes_are_documented(server: ServerProcess) -> None:
    """Media types, headers with their exact forms, statuses and links, as the protocol has them."""
    ops = operations(document(server))
    for suffix in ("", "InRun"):
        read = ops["dsRead" + suffix]
        assert set(read["responses"]["200"]["content"]) == {
            "application/json",
            "text/event-stream",
            "*/*",
        }
        assert {"200", "204", "304", "400", "401", "404"} <= set(read["responses"])
        query = {p["name"]: p["schema"] for p in read["parameters"] if p["in"] == "query"}
        assert query["live"] == {"enum": ["long-poll", "sse"]}
        offset = re.compile(query["offset"]["pattern"])
        minted = ("0000000000000000_0000000000000007", "1796635239391128_0000000000000007")
        assert all(offset.match(o) for o in ("-1", "now", *minted))
        assert not any(offset.match(o) for o in ("", "7", "-2", "0000000000000000_7"))
        create = ops["dsCreate" + suffix]
        assert set(create["requestBody"]["content"]) == {"application/json", "*/*"}
        assert set(create["responses"]["201"]["links"]) == {
            "dsRead" + suffix,
            "dsAppend" + suffix,
            "dsDelete" + suffix,
        }
        assert "Location" in create["responses"]["201"]["headers"]
        headers = {p["name"]: p["schema"] for p in create["parameters"] if p["in"] == "header"}
        ttl = re.compile(headers["Stream-TTL"]["pattern"])
        assert ttl.match("1") and ttl.match("3153600000") and ttl.match("999999999")
        assert not any(ttl.match(v) for v in ("0", "01", "3153600001", "9999999999", "-1"))
        append = ops["dsAppend" + suffix]
        assert append["requestBody"]["content"]["*/*"]["schema"]["minLength"] == 1
        headers = {p["name"]: p["schema"] for p in append["parameters"] if p["in"] == "header"}
        seq = re.compile(headers["Producer-Seq"]["pattern"])
        assert seq.match("0") and seq.match(str(2**53 - 1)) and not seq.match(str(2**53))
        producer = re.compile(headers["Producer-Id"]["pattern"])
        assert producer.match("a" * 255) and not producer.match("a" * 256)
        assert not producer.match(" a") and not producer.match("")
        assert {"200", "204", "409", "413", "429"} <= set(append["responses"])
        assert {"204", "404", "409"} <= set(ops["dsDelete" + suffix]["responses"])


@pytest.mark.parametrize(
    "path",
    [
        "/runs/{bad}/streams",
        "/runs/r/streams/{bad}",
        "/runs/r/streams/s/records",
        "/runs/r/streams/s/objects/{bad}",
    ],
)
@pytest.mark.parametrize("bad", ["-lead", "a" * 129, "sp%20ace", "%C3%A9t%C3%A9"])
def test_an_id_off_the_pattern_is_a_problem(server: ServerProcess, path: str, bad: str) -> None:
    """What the document's ID pattern refuses, the service refuses: 400, or 404 when no route has
    such a path, always as problem+json."""
    url = server.base_url + "/api/workflow-streams" + path.replace("{bad}", bad)
    if "{bad}" not in path:
        url = url.replace("/runs/r/", f"/runs/{bad}/")
    answer = httpx.get(url, headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}, timeout=10)
    assert answer.status_code in (400, 404), answer.text
    assert answer.headers["content-type"].startswith(PROBLEM_JSON)
    assert answer.json()["code"] in ("invalid-input", "not-found")


@pytest.mark.parametrize("value", [b"\xb2", b"1\xb9", b"-1", b"x"])
def test_a_last_event_id_that_is_not_ascii_digits_is_invalid_input(
    server: ServerProcess, value: bytes
) -> None:
    """The document says Last-Event-ID is a sequence; "²" passed str.isdigit and then failed
    int() as a 500."""
    answer = httpx.get(
        server.base_url + "/api/workflow-streams/runs/r/streams/s/subscribe",
        headers=[
            (b"Authorization", f"Bearer {BOOTSTRAP_TOKEN}".encode()),
            (b"Last-Event-ID", value),
        ],
        timeout=10,
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid-input"


def run_schemathesis(
    server: ServerProcess, report_dir: Path, *, max_examples: int, seed: int
) -> tuple[int, str, list[dict[str, Any]]]:
    command = [
        str(SCHEMATHESIS),
        "--config-file",
        str(CONFIG),
        "run",
        server.base_url + "/schema/openapi.json",
        "--checks",
        "all",
        "--phases",
        PHASES,
        "-H",
        f"Authorization: Bearer {BOOTSTRAP_TOKEN}",
        "--max-examples",
        str(max_examples),
        "--seed",
        str(seed),
        # One worker: CPython 3.11's parser is not safe to enter from several threads at once,
        # which hypothesis does when it describes a strategy.
        "--workers",
        "1",
        "--no-color",
        # Every run starts afresh: no examples carried over from an earlier one.
        "--generation-database",
        "none",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report_dir / "events.ndjson"),
    ]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    events = [
        json.loads(line)
        for line in (report_dir / "events.ndjson").read_text().splitlines()
        if line.strip()
    ]
    return done.returncode, done.stdout + done.stderr, events


def per_check(events: list[dict[str, Any]]) -> dict[str, Counter[str]]:
    """For each check: how many responses it judged, and how many it failed."""
    tally: dict[str, Counter[str]] = {}
    for event in events:
        for kind, body in event.items():
            if kind != "ScenarioFinished":
                continue
            for case in (body.get("recorder") or {}).get("checks", {}).values():
                for check in case:
                    counts = tally.setdefault(check["name"], Counter())
                    counts["cases"] += 1
                    counts[check["status"]] += 1
    return tally


def assert_no_failure(server: ServerProcess, tmp_path: Path, *, max_examples: int, seed: int):
    code, output, events = run_schemathesis(server, tmp_path, max_examples=max_examples, seed=seed)
    summary = output[output.rfind("= SUMMARY =") :] if "= SUMMARY =" in output else output
    print(f"schemathesis exit {code}, seed {seed}")
    for check, counts in sorted(per_check(events).items()):
        print(f"  {check}: {counts['cases']} cases, {counts.get('failure', 0)} failures")
    print(summary)
    assert code == 0, output[-20000:]


@pytest.fixture
def fresh_server(postgres_admin_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server on a database of its own: a schemathesis run with a fixed seed then meets the
    same state every time, whatever the tests before it left on the session's server."""
    url, name = asyncio.run(create_test_database(postgres_admin_url))
    (tmp_path / "server").mkdir()
    process = ServerProcess(database_url=url, data_dir=tmp_path / "server", env=SERVER_ENV)
    process.start()
    try:
        yield process
    finally:
        process.stop()
        asyncio.run(drop_test_database(postgres_admin_url, name))


def test_schemathesis_finds_nothing(fresh_server: ServerProcess, tmp_path: Path) -> None:
    assert_no_failure(fresh_server, tmp_path, max_examples=10, seed=12)


@pytest.mark.slow
def test_schemathesis_finds_nothing_with_a_larger_budget(
    fresh_server: ServerProcess, tmp_path: Path
) -> None:
    # A fixed seed like the default run's: the suite stays deterministic (a failure found with
    # another seed is reproduced by passing it here).
    assert_no_failure(fresh_server, tmp_path, max_examples=50, seed=2420612874)
