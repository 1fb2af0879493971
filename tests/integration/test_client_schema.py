"""The client's answer Structs against the server's OpenAPI document: every field each answer
schema declares is in the client's Struct with a compatible type, the client invents none and
requires none the server may leave out. It fails as soon as the two drift apart."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

from ductor_streams_client import models
from entrypoints.http.problems import STATUS_OF_CODE
from tests.support.server import ServerProcess

# The server's component name -> the client's Struct.
SHARED: dict[str, type[msgspec.Struct]] = {
    "StreamDocument": models.StreamDocument,
    "ForkView": models.ForkOrigin,
    "StreamStateView": models.StreamState,
    "Credit": models.Credit,
    "ConsumerView": models.Consumer,
    "LegalHoldView": models.LegalHold,
    "OpenObjectView": models.OpenObject,
    "InputDeliveryStatus": models.InputDelivery,
    "Limits": models.Limits,
    "Retention": models.Retention,
    "Redaction": models.Redaction,
    "Placement": models.Placement,
    "Authorization": models.Authorization,
    "Expiry": models.Expiry,
    "StreamList": models.StreamList,
    "AppendAnswer": models.AppendAnswer,
    "AckAnswer": models.AckAnswer,
    "RecordView": models.Record,
    "RecordsPage": models.RecordsPage,
    "ObjectView": models.ObjectIntent,
    "CommitAnswer": models.CommitAnswer,
    "RunList": models.RunsPage,
    "RunSummary": models.RunSummary,
    "MintedToken": models.MintedToken,
    "TokenView": models.TokenInfo,
    "TokenList": models.TokenList,
    "ObjectList": models.OpenObjectsPage,
    "SubscriptionView": models.Subscription,
    "SubscriptionList": models.SubscriptionList,
    "LinkView": models.SubscriptionLink,
    "PatternRef": models.SubscriptionPattern,
    "StreamRef": models.SubscriptionStream,
    "WebhookView": models.SubscriptionWebhook,
    "Signing": models.WebhookSigning,
    "WakeView": models.SubscriptionWake,
    "ClaimAnswer": models.WakeClaim,
    "WakeAnswer": models.WakeAnswer,
    "UsageView": models.Usage,
}
# Fields the server's schema leaves open (any JSON) that the client reads as a documented shape.
NARROWED = {
    # a record's `object`: the stored reference (object_id, size, sha256, content_type, schema),
    # each field as the object view has it (checked below)
    ("RecordView", "object"),
}
CLIENT_NAME = {server: struct.__name__ for server, struct in SHARED.items()}
# Operations whose 2xx JSON answer each Struct decodes.
ANSWERS = {
    "createStream": "StreamDocument",
    "getStream": "StreamDocument",
    "closeStream": "StreamDocument",
    "listStreams": "StreamList",
    "appendRecords": "AppendAnswer",
    "readRecords": "RecordsPage",
    "acknowledge": "AckAnswer",
    "setLegalHold": "LegalHoldView",
    "prepareObject": "ObjectView",
    "uploadObjectBody": "ObjectView",
    "getObject": "ObjectView",
    "abortObject": "ObjectView",
    "commitObject": "CommitAnswer",
    "listRuns": "RunList",
    "mintToken": "MintedToken",
    "listTokens": "TokenList",
    "listObjects": "ObjectList",
    "putSubscription": "SubscriptionView",
    "getSubscription": "SubscriptionView",
    "listStreamSubscriptions": "SubscriptionList",
    "claimSubscription": "ClaimAnswer",
    "ackSubscription": "WakeAnswer",
    "subscriptionCallback": "WakeAnswer",
}


def kinds(schema: dict[str, Any], rename: dict[str, str]) -> frozenset[str] | None:
    """The JSON kinds a schema allows ("ref:Name" for a component), None for any value."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return frozenset({"ref:" + rename.get(name, name)})
    for union in ("anyOf", "oneOf"):
        if union in schema:
            found: set[str] = set()
            for part in schema[union]:
                part_kinds = kinds(part, rename)
                if part_kinds is None:
                    return None
                found |= part_kinds
            return frozenset(found)
    if "allOf" in schema:
        for part in schema["allOf"]:
            if (part_kinds := kinds(part, rename)) is not None:
                return part_kinds
        return None
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return frozenset(types)
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        names = {"str": "string", "int": "integer", "bool": "boolean", "NoneType": "null"}
        return frozenset(names.get(type(v).__name__, "object") for v in values)
    return None


def compatible(server: dict[str, Any], client: dict[str, Any]) -> bool:
    """Whether every value the server's schema allows, the client's accepts."""
    theirs, ours = kinds(server, CLIENT_NAME), kinds(client, {})
    if ours is None:
        return True
    if theirs is None:
        return False
    if "number" in ours:
        ours = ours | {"integer"}
    if not theirs <= ours:
        return False
    if theirs == {"array"} and "items" in server:
        return compatible(server["items"], client.get("items", {}))
    return True


def server_document(server: ServerProcess) -> dict[str, Any]:
    answer = httpx.get(server.base_url + "/schema/openapi.json", timeout=10)
    assert answer.status_code == 200
    return answer.json()


def test_the_client_structs_match_the_servers_answer_schemas(server: ServerProcess) -> None:
    components = server_document(server)["components"]["schemas"]
    _, ours = msgspec.json.schema_components(
        list(SHARED.values()), ref_template="#/components/schemas/{name}"
    )
    problems: list[str] = []
    for server_name, struct in SHARED.items():
        assert server_name in components, f"the server no longer answers {server_name}"
        theirs = components[server_name]
        mine = ours[struct.__name__]
        for field, schema in theirs["properties"].items():
            if field not in mine["properties"]:
                problems.append(f"{struct.__name__} lacks {server_name}.{field}")
            elif (server_name, field) in NARROWED:
                continue
            elif not compatible(schema, mine["properties"][field]):
                problems.append(
                    f"{struct.__name__}.{field}: {mine['properties'][field]} does not take "
                    f"the server's {schema}"
                )
        for field in mine["properties"]:
            if field not in theirs["properties"]:
                problems.append(f"{struct.__name__}.{field} is not in the server's {server_name}")
        for field in mine.get("required", ()):
            if field not in theirs.get("required", ()):
                problems.append(
                    f"{struct.__name__}.{field} is required but the server may leave it out"
                )
    # The narrowed `object`: each of its fields is the object view's.
    view = components["ObjectView"]["properties"]
    for field, schema in ours["ObjectRef"]["properties"].items():
        if field not in view or not compatible(view[field], schema):
            problems.append(f"ObjectRef.{field} is not the server's ObjectView.{field}")
    assert problems == []


def test_each_operation_answers_the_struct_the_client_decodes(server: ServerProcess) -> None:
    document = server_document(server)
    seen = {}
    for item in document["paths"].values():
        for operation in item.values():
            if operation.get("operationId") in ANSWERS:
                for status, answer in operation["responses"].items():
                    if status.startswith("2") and "application/json" in answer.get("content", {}):
                        schema = answer["content"]["application/json"]["schema"]
                        seen[operation["operationId"]] = schema["$ref"].rsplit("/", 1)[-1]
    assert seen == ANSWERS


def test_the_client_knows_every_problem_code_the_document_lists(server: ServerProcess) -> None:
    from ductor_streams_client import CLASS_OF_CODE

    problem = server_document(server)["components"]["schemas"]["Problem"]
    codes = problem["properties"]["code"]["enum"]
    assert codes == list(STATUS_OF_CODE)
    assert [code for code in codes if code not in CLASS_OF_CODE] == []


def test_the_drift_check_itself_sees_a_drift() -> None:
    """A guard on the guard: a missing field, a wrong type, a required extra are caught."""
    assert not compatible({"type": "integer"}, {"type": "string"})
    assert compatible({"type": "integer"}, {"type": "number"})
    assert compatible({"anyOf": [{"type": "integer"}, {"type": "null"}]}, {})
    assert not compatible({"anyOf": [{"type": "integer"}, {"type": "null"}]}, {"type": "integer"})
    assert compatible(
        {"$ref": "#/components/schemas/RecordView"}, {"$ref": "#/components/schemas/Record"}
    )
    assert not compatible(
        {"type": "array", "items": {"$ref": "#/components/schemas/ConsumerView"}},
        {"type": "array", "items": {"$ref": "#/components/schemas/Credit"}},
    )
