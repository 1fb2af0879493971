"""The OpenAPI document: what each route answers, declared next to it.

Litestar generates the paths, operation ids and path and query parameters from the handlers.
What it cannot see is declared on each route with `operation_class=documented(...)` (Litestar's
hook for an operation it cannot infer): every answer the route gives (status, body type, media
type, headers, links), the problem codes it may answer, the request body it decodes itself and
the request headers it reads from the scope. Body schemas come from msgspec, the library that
encodes and decodes them, so the document cannot drift from the wire: `WireDocument`, the render
plugin that serves `/schema/openapi.json`, gives the document msgspec's component schemas
(Litestar's own describe its pipeline, not msgspec's wire form, and it keeps no component set
from the configuration)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
from litestar import Request
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import (
    Components,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    Operation,
    Parameter,
    Reference,
    Schema,
    SecurityScheme,
)
from litestar.openapi.spec import Link as OpenAPILink
from litestar.openapi.spec import (
    RequestBody as OpenAPIRequestBody,
)

from domain.ids import ID_PATTERN
from domain.text import JSON_TEXT, TEXT_PATTERN
from entrypoints.edge.problems import PROBLEM_JSON, PROBLEM_TYPE_BASE, STATUS_OF_CODE

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
    # Each media type the answer may carry, with its schema, when there are several.
    content: tuple[tuple[str, dict[str, Any]], ...] = ()


@dataclass(frozen=True)
class RequestBody:
    media_type: str
    body: Any = None
    schema: dict[str, Any] | None = None
    # Each media type the route accepts, with its schema, when there are several.
    content: tuple[tuple[str, dict[str, Any]], ...] = ()


@dataclass(frozen=True)
class Documented:
    answers: tuple[Answer, ...]
    problems: tuple[str, ...] = ()
    request_body: RequestBody | None = None
    request_headers: tuple[Header, ...] = ()
    authenticated: bool = True
    query: tuple[Header, ...] = ()  # query parameters a route parses itself


# Every declaration made, so that the document's component schemas cover every type they name.
_DECLARED: list[Documented] = []


def documented(
    *answers: Answer,
    problems: tuple[str, ...] = (),
    request_body: RequestBody | type | None = None,
    request_headers: tuple[Header, ...] = (),
    authenticated: bool = True,
    query: tuple[Header, ...] = (),
) -> type[Operation]:
    """The `operation_class=` of a route handler: a JSON request body may be given as its type
    alone."""
    unknown = set(problems) - set(STATUS_OF_CODE)
    if unknown:
        raise ValueError(f"unknown problem codes {sorted(unknown)}")
    if isinstance(request_body, type):
        request_body = RequestBody("application/json", request_body)
    declaration = Documented(answers, problems, request_body, request_headers, authenticated, query)
    _DECLARED.append(declaration)
    wire_schemas.cache_clear()

    @dataclass
    class DocumentedOperation(Operation):
        def __post_init__(self) -> None:
            _apply(self, declaration)

    return DocumentedOperation


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


def decimal_pattern(maximum: int, *, minimum: int = 0) -> str:
    """A pattern for the decimal integers `minimum` (0 or 1) to `maximum` written without sign
    or leading zero: exactly those, so that the document refuses what the service refuses."""
    top = str(maximum)
    shorter = [f"[1-9][0-9]{{0,{len(top) - 2}}}"] if len(top) > 1 else []
    same_length = []
    for i, digit in enumerate(top):
        low = 1 if i == 0 else 0
        if int(digit) > low:
            rest = len(top) - i - 1
            same_length.append(
                f"{top[:i]}[{low}-{int(digit) - 1}]" + (f"[0-9]{{{rest}}}" if rest else "")
            )
    alternatives = (["0"] if minimum == 0 else []) + shorter + same_length + [top]
    if minimum == 1 and top == "1":
        alternatives = ["1"]
    return "^(?:" + "|".join(alternatives) + ")$"


# Path parameters that are IDs: each is checked against the one ID pattern (400 otherwise).
ID_PARAMETERS = frozenset({"run_id", "stream_id", "consumer_id", "object_id", "subscription_id"})
_ID = ID_PATTERN.removeprefix("^").removesuffix("$")
# A Durable Streams stream path in a path parameter (a subscription's link): `stream` or
# `run/stream`, each an ID.
STREAM_PATH_PATTERN = f"^(?:{_ID}/)?{_ID}$"
PATH_PATTERNS = {**dict.fromkeys(ID_PARAMETERS, ID_PATTERN), "stream_path": STREAM_PATH_PATTERN}


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


@dataclass
class JsonSchema(Schema):
    """A JSON Schema as msgspec or a route's declaration gives it, written into the document as
    it is (Litestar's `Schema` names each keyword; these use keywords it has no field for)."""

    raw: dict[str, Any] = field(default_factory=dict)

    def to_schema(self) -> dict[str, Any]:
        return self.raw


def _headers(headers: tuple[Header, ...]) -> dict[str, OpenAPIHeader | Reference] | None:
    return {
        h.name: OpenAPIHeader(
            description=h.description, required=h.required, schema=JsonSchema(raw=h.schema)
        )
        for h in headers
    } or None


def _media(schema: dict[str, Any]) -> OpenAPIMediaType:
    return OpenAPIMediaType(schema=JsonSchema(raw=schema))


def _problem_answers(codes: tuple[str, ...]) -> dict[str, OpenAPIResponse | Reference]:
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(STATUS_OF_CODE[code], []).append(code)
    answers: dict[str, OpenAPIResponse | Reference] = {}
    for status, of_status in sorted(by_status.items()):
        schema = {
            "allOf": [{"$ref": "#/components/schemas/Problem"}],
            "properties": {"status": {"const": status}, "code": {"enum": of_status}},
        }
        answers[str(status)] = OpenAPIResponse(
            description=", ".join(of_status),
            content={PROBLEM_JSON: _media(schema)},
            headers=_headers(PROBLEM_HEADERS.get(status, ())),
        )
    return answers


@functools.cache
def wire_schemas() -> tuple[dict[type, Any], dict[str, Any]]:
    """Each declared body type's schema (a reference, mostly), and the component schemas they
    reference: msgspec's, for every type at once, so that names are given once."""
    types = sorted(
        {
            part.body
            for d in _DECLARED
            for part in (*d.answers, d.request_body)
            if part is not None and part.body is not None
        },
        key=lambda t: getattr(t, "__name__", str(t)),  # a union of structs has no name
    )
    (schemas, components) = msgspec.json.schema_components(
        types, schema_hook=_any_value, ref_template="#/components/schemas/{name}"
    )
    _refs_stand_alone(schemas)
    _refs_stand_alone(components)
    every = {"Problem": problem_schema(), JSON_TEXT: json_text_schema(), **components}
    return dict(zip(types, schemas, strict=True)), every


def _refs_stand_alone(node: Any) -> None:
    """msgspec puts a field's extra schema beside its `$ref`; tools that read OpenAPI 3.0 ignore
    a `$ref`'s siblings, so each such pair becomes an `allOf`."""
    if isinstance(node, list | tuple):  # msgspec gives the body types' schemas as a tuple
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


def _apply(operation: Operation, d: Documented) -> None:
    """What the route declared, in the operation Litestar gives it (its id, tags, summary and
    the parameters of its path and query)."""
    schema_of, _ = wire_schemas()
    responses: dict[str, OpenAPIResponse | Reference] = {}
    for answer in d.answers:
        content = None
        if answer.body is not None:
            content = {answer.media_type: _media(schema_of[answer.body])}
        elif answer.schema is not None:
            content = {answer.media_type: _media(answer.schema)}
        elif answer.content:
            content = {kind: _media(schema) for kind, schema in answer.content}
        responses[str(answer.status)] = OpenAPIResponse(
            description=answer.description,
            headers=_headers(answer.headers),
            content=content,
            links={
                link.operation_id: OpenAPILink(
                    operation_id=link.operation_id, parameters=link.parameters
                )
                for link in answer.links
            }
            or None,
        )
    responses.update(_problem_answers(d.problems))
    operation.responses = responses
    if d.request_body is not None:
        body = d.request_body
        if body.content:
            accepted = {kind: _media(schema) for kind, schema in body.content}
        elif body.body is not None:
            accepted = {body.media_type: _media(schema_of[body.body])}
        else:
            accepted = {body.media_type: _media(body.schema or {})}
        operation.request_body = OpenAPIRequestBody(required=True, content=accepted)
    parameters = [
        replace(p, schema=JsonSchema(raw={"type": "string", "pattern": PATH_PATTERNS[p.name]}))
        if isinstance(p, Parameter) and p.param_in == "path" and p.name in PATH_PATTERNS
        else p
        for p in operation.parameters or ()
    ]
    parameters += [
        Parameter(
            name=h.name,
            param_in="header",
            description=h.description,
            required=h.required,
            schema=JsonSchema(raw=h.schema),
        )
        for h in d.request_headers
    ]
    parameters += [
        Parameter(
            name=q.name,
            param_in="query",
            description=q.description,
            required=q.required,
            schema=JsonSchema(raw=q.schema),
        )
        for q in d.query
    ]
    operation.parameters = parameters or None
    operation.security = [{BEARER: []}] if d.authenticated else []


SECURITY = Components(security_schemes={BEARER: SecurityScheme(type="http", scheme="bearer")})


class WireDocument(JsonRenderPlugin):
    """`/schema/openapi.json`: the document Litestar builds, with msgspec's component schemas
    (those of the types the routes declare) in place of Litestar's."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        components = {**openapi_schema.get("components", {}), "schemas": wire_schemas()[1]}
        return self.render_json(request, {**openapi_schema, "components": components})
