"""Schemathesis hooks for tests/integration/test_openapi.py (loaded through schemathesis.toml).

A generated request that the document calls valid can still be refused for what no schema can
say: the state it meets (a cursor past the stream's head or behind its retention, a stream
deleted under its forks, bytes that do not match the prepared digest or size, an idempotency
key used before with another request, a deletion under a legal hold, a batch over the stream's
own unread ceiling), the clock (an `expires_at` already past) or this deployment (a stream
homed in another region). Those refusals are not counted against the document (docs/http-api.md,
"How the document is held to the service", lists each and why it is state).

Two more are set aside, neither a refusal of a valid request: one citing a rule between two
parameters (OpenAPI gives each parameter its own schema and no way to relate them; the
document states those rules in words), and a request schemathesis calls valid that breaks its
own declared schema. And a created stream that one request erased through its other surface's
URL (a Durable Streams DELETE of a native stream) is not found by the next: schemathesis counts
only a DELETE at or above the URL it was created at, so the hooks record every create and
erasure and set such an `ST302` aside. The operations the run leaves out are listed in
schemathesis.toml."""

from __future__ import annotations

import itertools
import json
from typing import Any
from urllib.parse import unquote

import jsonschema
import schemathesis
from schemathesis.core.deserialization import deserialize_yaml
from schemathesis.core.media_types import YAML_MEDIA_TYPES
from schemathesis.openapi.checks import EnsureResourceAvailability
from schemathesis.specs.openapi.checks import RejectedPositiveData

DEPENDS_ON_STATE = frozenset(
    {
        "cursor-ahead-of-head",
        "cursor-unknown",  # a page's `after` naming no object of the stream, no token of the tenant
        "cursor-expired",  # a cursor behind what retention removed from the stream it names
        "stream-gone",  # a stream deleted while forks still read it
        "ack-ahead-of-head",
        "digest-mismatch",
        "size-mismatch",
        "idempotency-key-reused",
        "misdirected",
        "legal-hold-active",
        # Subscriptions: an existing one's configuration, its wake and its claim.
        "subscription-conflict",
        "already-claimed",
        "no-pending-work",
        "fenced",
        "invalid-offset",
        "wrong-subscription-type",
        # A webhook URL is refused for where its host is (a private address; DNS), which no
        # schema can say.
        "webhook-url-rejected",
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
    "the wake stream is one the subscription watches",  # a pattern or streams naming it
)
# One stream, two surfaces: a native stream `run/stream` is the Durable Streams stream
# `{run_id}/{stream_id}`, and `{stream_id}` alone names it in the run `default`.
DEFAULT_RUN = "default"
CREATES = frozenset({"createStream", "dsCreate", "dsCreateInRun"})
ERASES_A_STREAM = frozenset({"deleteStream", "dsDelete", "dsDeleteInRun"})
ERASES_A_RUN = "deleteRun"

# The service honours `wait` up to 60 s; a bounded run cannot spend that on every read.
LONGEST_WAIT = 0.2


# A Durable Streams read answers the stream's bytes labelled with the stream's own media type,
# whatever its creator chose (`*/*` in the document, bytes): JSON only for an application/json
# stream, which the service frames as an array. Schemathesis would decode any other body by its
# label (a stream of application/x-yaml, or of application/vnd.x+json, holding arbitrary bytes).
DURABLE_READS = frozenset({"dsRead", "dsReadInRun"})


def _stream_bytes(context: Any, response: Any) -> str | None:
    """The body as the document describes it, when it is a stream's own bytes."""
    operation = context.operation.definition.raw.get("operationId")
    kind = response.headers.get("content-type", [""])[0].split(";")[0].strip().lower()
    if operation in DURABLE_READS and response.status_code == 200 and kind != "application/json":
        return response.content.decode("latin-1")
    return None


@schemathesis.deserializer("application/json")
def _json(context: Any, response: Any) -> Any:
    found = _stream_bytes(context, response)
    return response.json() if found is None else found


@schemathesis.deserializer(*YAML_MEDIA_TYPES)
def _yaml(context: Any, response: Any) -> Any:
    found = _stream_bytes(context, response)
    if found is None:
        return deserialize_yaml(response.content.decode(response.encoding or "utf-8"))
    return found


def _problem(response: Any) -> dict[str, Any]:
    if not response.headers.get("content-type", [""])[0].startswith("application/problem+json"):
        return {}
    try:
        return json.loads(response.content)
    except ValueError:
        return {}


def _as_typed(value: Any, schema: dict[str, Any]) -> Any:
    """A header's text as the value its schema describes (a header is text on the wire)."""
    if isinstance(value, str) and schema.get("type") in ("integer", "number"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _outside_the_document(case: Any, response: Any) -> bool:
    """Whether a request called valid breaks its own schema in the document: the coverage phase
    sometimes seeds an optional header from elsewhere (a value seen in an answer, say), and a
    body serialized for a media type that cannot carry it may go out empty where the document
    asks for bytes. Such a request is not a schema-valid one."""
    for parameter in case.operation.definition.raw.get("parameters", ()):
        values = case.headers or {}
        if parameter.get("in") != "header" or parameter["name"] not in values:
            continue
        validator = jsonschema.Draft202012Validator(
            parameter["schema"], format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
        if not validator.is_valid(_as_typed(values[parameter["name"]], parameter["schema"])):
            return True
    accepted = case.operation.definition.raw.get("requestBody", {}).get("content", {})
    schema = (accepted.get(case.media_type) or accepted.get("*/*") or {}).get("schema", {})
    if schema.get("format") == "binary":  # fewer bytes than the document allows
        sent = response.request.body or b""
        return len(sent) < schema.get("minLength", 0)
    return False


def _stream_named(case: Any) -> tuple[str, str] | None:
    """The (run, stream) a request's path names, on either surface."""
    parameters = case.path_parameters or {}
    if "stream_id" not in parameters or "subscription_id" in parameters:
        return None
    run = parameters.get("run_id", DEFAULT_RUN)
    return unquote(str(run)), unquote(str(parameters["stream_id"]))


class Erasures:
    """When each stream was last created and last erased, through any route, in call order (the
    run has one worker). Schemathesis counts a stream as deleted only by a DELETE at or above the
    URL it was created at: a native stream erased through its Durable Streams URL (a link it
    infers from the request's `stream_id`), then used through a native link, looks to it like a
    created resource not found."""

    def __init__(self) -> None:
        self._clock = itertools.count(1)
        self._created: dict[tuple[str, str], int] = {}
        self._erased: dict[tuple[str, str], int] = {}
        self._runs_erased: dict[str, int] = {}

    def observe(self, case: Any, response: Any) -> None:
        if not 200 <= response.status_code < 300:
            return
        operation = case.operation.definition.raw.get("operationId")
        if operation == ERASES_A_RUN:
            self._runs_erased[unquote(str(case.path_parameters["run_id"]))] = next(self._clock)
            return
        stream = _stream_named(case)
        if operation == "createStream":  # the ID is the request's, or one the service chose
            try:
                stream_id = json.loads(response.content)["stream_id"]
            except (ValueError, KeyError, TypeError):
                return
            stream = (unquote(str(case.path_parameters["run_id"])), stream_id)
            self._created[stream] = next(self._clock)
        elif operation in CREATES and stream is not None:
            self._created[stream] = next(self._clock)
        elif operation in ERASES_A_STREAM and stream is not None:
            self._erased[stream] = next(self._clock)

    def erased_since_created(self, stream: tuple[str, str]) -> bool:
        erased = max(self._erased.get(stream, 0), self._runs_erased.get(stream[0], 0))
        return erased > self._created.get(stream, 0)


ERASURES = Erasures()


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    ERASURES.observe(case, response)


def _erased_elsewhere(failure: Any, case: Any, response: Any) -> bool:
    """A created stream not found because a call in between erased it (on either surface)."""
    if not isinstance(failure, EnsureResourceAvailability) or response.status_code != 404:
        return False
    stream = _stream_named(case)
    return (
        stream is not None
        and _problem(response).get("code") == "not-found"
        and ERASURES.erased_since_created(stream)
    )


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    if _erased_elsewhere(failure, case, response):
        return False
    if not isinstance(failure, RejectedPositiveData):
        return True
    problem = _problem(response)
    operation = case.operation.definition.raw.get("operationId")
    detail = problem.get("detail", "")
    if _outside_the_document(case, response) or any(rule in detail for rule in BETWEEN_PARAMETERS):
        return False
    # The same stream may be appended to on either surface.
    if operation in ("appendRecords", "dsAppend", "dsAppendInRun") and (
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
