"""Schemathesis hooks for tests/integration/test_openapi.py (loaded through schemathesis.toml).

A generated request that the document calls valid can still be refused for what no schema can
say: the state it meets (a cursor past the stream's head or behind its retention, a stream
deleted under its forks, bytes that do not match the prepared digest or size, an idempotency
key used before with another request, a deletion under a legal hold, a batch over the stream's
own unread ceiling), the clock (an `expires_at` already past) or this deployment (a stream
homed in another region). Those refusals, and only those, are not counted against the
document."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import schemathesis
from schemathesis.specs.openapi.checks import RejectedPositiveData

DEPENDS_ON_STATE = frozenset(
    {
        "cursor-ahead-of-head",
        "cursor-unknown",  # a page's `after` naming no object of the stream
        "cursor-expired",  # a cursor behind what retention removed from the stream it names
        "stream-gone",  # a stream deleted while forks still read it
        "ack-ahead-of-head",
        "digest-mismatch",
        "size-mismatch",
        "idempotency-key-reused",
        "misdirected",
        "legal-hold-active",
    }
)
# An upload's bytes are held to the size its intent was prepared with.
DEPENDS_ON_THE_INTENT = {"uploadObjectBody": frozenset({"object-too-large"})}
# The records of an input stream cannot hold U+0000 (the wait service cannot carry it); the
# document describes an append to any stream.
INPUT_STREAM_ONLY = "which an input stream cannot deliver"
# A batch larger than the stream's own unread or total ceiling (a definition may set either to a
# few bytes) can never be appended to that stream; the document describes an append to any stream.
NEVER_FITS = ("can never fit the unread ceiling", "can never fit the stream's total ceiling")
# A definition whose expires_at has passed could only ever answer 404: refused at create.
ALREADY_PASSED = "has already passed"
# Rules between parameters, which OpenAPI cannot state (each parameter has a schema of its own):
# the document says them in words, on the Durable Streams routes. Refusals citing them are not
# the document's fault, but neither are they state: listed apart (docs/http-api.md).
BETWEEN_PARAMETERS = (
    "Stream-TTL and Stream-Expires-At exclude each other",
    "need Stream-Forked-From",
    "Stream-Fork-Sub-Offset needs Stream-Fork-Offset",
    "Producer-Id, Producer-Epoch and Producer-Seq go together",
    "needs an offset",  # live=long-poll or live=sse without an offset
)
WHERE = {"header": "headers", "query": "query", "path": "path_parameters"}
# The service honours `wait` up to 60 s; a bounded run cannot spend that on every read.
LONGEST_WAIT = 0.2


def _problem(response: Any) -> dict[str, Any]:
    if not response.headers.get("content-type", [""])[0].startswith("application/problem+json"):
        return {}
    try:
        return json.loads(response.content)
    except ValueError:
        return {}


def _outside_the_document(case: Any) -> bool:
    """Whether a parameter of a case called valid breaks its own schema in the document: the
    coverage phase sometimes seeds an optional header from elsewhere (a value seen in an
    answer, say), and such a request is not a schema-valid one."""
    for parameter in case.operation.definition.raw.get("parameters", ()):
        values = getattr(case, WHERE.get(parameter.get("in"), ""), None) or {}
        if parameter["name"] not in values or "schema" not in parameter:
            continue
        validator = jsonschema.Draft202012Validator(
            parameter["schema"], format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
        if not validator.is_valid(values[parameter["name"]]):
            return True
    body = case.body
    accepted = case.operation.definition.raw.get("requestBody", {}).get("content", {})
    schema = accepted.get(case.media_type) or accepted.get("*/*")
    if schema and schema.get("format") == "binary":  # fewer bytes than the document allows
        return (len(body) if isinstance(body, bytes | str) else 0) < schema.get("minLength", 0)
    return False


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    if not isinstance(failure, RejectedPositiveData):
        return True
    problem = _problem(response)
    operation = case.operation.definition.raw.get("operationId")
    detail = problem.get("detail", "")
    if _outside_the_document(case) or any(rule in detail for rule in BETWEEN_PARAMETERS):
        return False
    if operation == "appendRecords" and (
        INPUT_STREAM_ONLY in detail or any(never in detail for never in NEVER_FITS)
    ):
        return False
    if operation in ("createStream", "dsCreate", "dsCreateInRun") and ALREADY_PASSED in detail:
        return False
    code = problem.get("code")
    return code not in DEPENDS_ON_STATE | DEPENDS_ON_THE_INTENT.get(operation, frozenset())


@schemathesis.hook
def map_query(context: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:
    wait = (query or {}).get("wait")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 <= wait <= 60:
        query = {**query, "wait": min(wait, LONGEST_WAIT)}  # type: ignore[dict-item]
    return query
