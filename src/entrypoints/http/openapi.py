"""The OpenAPI document: what each route answers, declared next to it, and applied here.

Litestar generates the paths, operation ids and path and query parameters from the handlers.
What it cannot see is declared on each route with `opt=documented(...)`: every answer the
route gives (status, body type, media type, headers), the problem codes it may answer, the
request body it decodes itself and the request headers it reads from the scope. `complete`
replaces each documented operation's answers with those declarations; body schemas come from
msgspec, the library that encodes and decodes them, so the document cannot drift from the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Litestar

from domain.ids import ID_PATTERN
from domain.text import JSON_TEXT, TEXT_PATTERN
from entrypoints.http.problems import PROBLEM_JSON, PROBLEM_TYPE_BASE, STATUS_OF_CODE

OPT_KEY = "documented"
BEARER = "bearer"


@dataclass(frozen=True)
class Header:
    name: str
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})
    required: bool = True


@dataclass(frozen=True)
class Link:
    """An operation this answer leads to, with parameters taken from the exchange (OpenAPI
    runtime expressions, e.g. `$response.body#/object_id`)."""

    operation_id: str
    parameters: dict[str, str]


@dataclass(frozen=True)
class Answer:
    status: int
    description: str
    body: Any = None  # a type encoded as JSON (its schema from msgspec), or None
    media_type: str = "application/json"
    schema: dict[str, Any] | None = None  # the body's schema when it is not a JSON type
    headers: tuple[Header, ...] = ()
    links: tuple[Link, ...] = ()


@dataclass(frozen=True)
class RequestBody:
    media_type: str
    body: Any = None
    schema: dict[str, Any] | None = None


@dataclass(frozen=True)
class Documented:
    answers: tuple[Answer, ...]
    problems: tuple[str, ...] = ()
    request_body: RequestBody | None = None
    request_headers: tuple[Header, ...] = ()
    authenticated: bool = True


def documented(
    *answers: Answer,
    problems: tuple[str, ...] = (),
    request_body: RequestBody | type | None = None,
    request_headers: tuple[Header, ...] = (),
    authenticated: bool = True,
) -> dict[str, Documented]:
    """The `opt=` of a route handler: a JSON request body may be given as its type alone."""
    unknown = set(problems) - set(STATUS_OF_CODE)
    if unknown:
        raise ValueError(f"unknown problem codes {sorted(unknown)}")
    if isinstance(request_body, type):
        request_body = RequestBody("application/json", request_body)
    return {OPT_KEY: Documented(answers, problems, request_body, request_headers, authenticated)}


# Headers the service sends with a status whatever the route (see problems.py and outages.py).
RETRY_AFTER = Header(
    "Retry-After", "Whole seconds to wait before retrying", {"type": "integer", "minimum": 0}
)
PROBLEM_HEADERS: dict[int, tuple[Header, ...]] = {
    401: (Header("WWW-Authenticate", "The Bearer challenge", {"type": "string"}),),
    416: (Header("Content-Range", "bytes */SIZE: the body's size"),),
    429: (RETRY_AFTER,),
    503: (RETRY_AFTER,),
}

# Path parameters that are IDs: each is checked against the one ID pattern (400 otherwise).
ID_PARAMETERS = frozenset({"run_id", "stream_id", "consumer_id", "object_id", "subscription_id"})


def problem_schema() -> dict[str, Any]:
    """RFC 9457 problem details, with the service's stable machine `code`."""
    return {
        "title": "Problem",
        "description": "An error (application/problem+json, RFC 9457); `code` is stable. Some "
        "codes add members, e.g. `field`, or `requested`/`earliest`/`latest`/`reason` for "
        "cursor-expired.",
        "type": "object",
        "properties": {
            "type": {"type": "string", "description": PROBLEM_TYPE_BASE + "<code>"},
            "title": {"type": "string"},
            "status": {"type": "integer", "enum": sorted(set(STATUS_OF_CODE.values()))},
            "detail": {"type": "string"},
            "code": {"type": "string", "enum": list(STATUS_OF_CODE)},
        },
        "required": ["type", "title", "status", "detail", "code"],
    }


def json_text_schema() -> dict[str, Any]:
    """Any JSON value whose strings and keys have no control character (a stored schema)."""
    itself = {"$ref": f"#/components/schemas/{JSON_TEXT}"}
    return {
        "anyOf": [
            {"type": ["null", "boolean", "number"]},
            {"type": "string", "pattern": TEXT_PATTERN},
            {"type": "array", "items": itself},
            {
                "type": "object",
                "propertyNames": {"pattern": TEXT_PATTERN},
                "additionalProperties": itself,
            },
        ]
    }


def _header_objects(headers: tuple[Header, ...]) -> dict[str, Any]:
    return {
        h.name: {"description": h.description, "required": h.required, "schema": h.schema}
        for h in headers
    }


def _problem_answers(codes: tuple[str, ...]) -> dict[str, Any]:
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(STATUS_OF_CODE[code], []).append(code)
    answers = {}
    for status, of_status in sorted(by_status.items()):
        schema = {
            "allOf": [{"$ref": "#/components/schemas/Problem"}],
            "properties": {"status": {"const": status}, "code": {"enum": of_status}},
        }
        answer: dict[str, Any] = {
            "description": ", ".join(of_status),
            "content": {PROBLEM_JSON: {"schema": schema}},
        }
        if status in PROBLEM_HEADERS:
            answer["headers"] = _header_objects(PROBLEM_HEADERS[status])
        answers[str(status)] = answer
    return answers


def _documented_operations(app: Litestar) -> dict[str, Documented]:
    found = {}
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            declaration = handler.opt.get(OPT_KEY)
            if declaration is not None:
                found[handler.operation_id] = declaration
    return found


def complete(app: Litestar, elsewhere: dict[str, dict[str, Documented]] | None = None) -> None:
    """Apply every route's declarations to the document Litestar generated (and caches).

    `elsewhere` documents, by operation id, handlers whose module cannot import this one."""
    document: dict[str, Any] = app.plugins.get("OpenAPIPlugin").provide_openapi_schema()
    declarations = _documented_operations(app)
    for operation_id, opt in (elsewhere or {}).items():
        declarations[operation_id] = opt[OPT_KEY]
    types = sorted(
        {
            part.body
            for d in declarations.values()
            for part in (*d.answers, d.request_body)
            if part is not None and part.body is not None
        },
        key=lambda t: getattr(t, "__name__", str(t)),  # a union of structs has no name
    )
    (schemas, components) = msgspec.json.schema_components(
        types, schema_hook=_any_value, ref_template="#/components/schemas/{name}"
    )
    schema_of = dict(zip(types, schemas, strict=True))
    # Litestar's own component schemas describe its pipeline, not msgspec's wire form: replaced.
    document["components"] = {
        "schemas": {"Problem": problem_schema(), JSON_TEXT: json_text_schema(), **components},
        "securitySchemes": {BEARER: {"type": "http", "scheme": "bearer"}},
    }
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict):
                continue
            declaration = declarations.get(operation.get("operationId", ""))
            if declaration is None:
                raise LookupError(f"operation {operation.get('operationId')} is not documented")
            _apply(operation, declaration, schema_of)
    _refs_stand_alone(document)


def _refs_stand_alone(node: Any) -> None:
    """msgspec puts a field's extra schema beside its `$ref`; tools that read OpenAPI 3.0 ignore
    a `$ref`'s siblings, so each such pair becomes an `allOf`."""
    if isinstance(node, list):
        for item in node:
            _refs_stand_alone(item)
    elif isinstance(node, dict):
        for value in node.values():
            _refs_stand_alone(value)
        if "$ref" in node and len(node) > 1:
            node["allOf"] = [{"$ref": node.pop("$ref")}, *node.pop("allOf", [])]


def _any_value(type_: type) -> dict[str, Any]:
    """A field typed `object` holds any JSON value (a caller's schema, say)."""
    if type_ is object:
        return {"description": "any JSON value"}
    raise TypeError(f"no JSON schema for {type_!r}")


def _apply(operation: dict[str, Any], d: Documented, schema_of: dict[type, Any]) -> None:
    responses = {}
    for answer in d.answers:
        content = None
        if answer.body is not None or answer.schema is not None:
            schema = schema_of[answer.body] if answer.body is not None else answer.schema
            content = {answer.media_type: {"schema": schema}}
        response: dict[str, Any] = {"description": answer.description}
        if answer.headers:
            response["headers"] = _header_objects(answer.headers)
        if content is not None:
            response["content"] = content
        if answer.links:
            response["links"] = {
                link.operation_id: {"operationId": link.operation_id, "parameters": link.parameters}
                for link in answer.links
            }
        responses[str(answer.status)] = response
    responses.update(_problem_answers(d.problems))
    operation["responses"] = responses
    if d.request_body is not None:
        body = d.request_body
        schema = schema_of[body.body] if body.body is not None else body.schema
        operation["requestBody"] = {
            "required": True,
            "content": {body.media_type: {"schema": schema}},
        }
    parameters = operation.setdefault("parameters", [])
    for parameter in parameters:
        if parameter.get("in") == "path" and parameter["name"] in ID_PARAMETERS:
            parameter["schema"] = {"type": "string", "pattern": ID_PATTERN}
    for header in d.request_headers:
        parameters.append(
            {
                "name": header.name,
                "in": "header",
                "description": header.description,
                "required": header.required,
                "schema": header.schema,
            }
        )
    if not parameters:
        del operation["parameters"]
    operation["security"] = [{BEARER: []}] if d.authenticated else []
