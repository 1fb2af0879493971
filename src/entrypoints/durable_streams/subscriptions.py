"""The reserved subscription APIs below `/api/durable-streams/v1/stream/__ds/` (PROTOCOL.md
sections 6 and 7), routed before the streams (a run ID never starts with `_`).

Errors are problem+json like everywhere else, carrying also the protocol's own shape,
`{"error": {"code": "FENCED", "message": ...}}`, which the protocol's clients read."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import unquote

import msgspec
from litestar import Controller, Request, delete, get, post, put
from litestar.params import FromPath
from litestar.types import ASGIApp

from application.access import Caller
from application.subscriptions import (
    WAKE_EVENT,
    WEBHOOK,
    AckRequest,
    Heads,
    offset_of,
    wire_status,
)
from application.waiting import at_work_for
from domain import errors
from domain.offsets import Offset
from domain.subscriptions import (
    MAX_DESCRIPTION,
    MAX_EXPLICIT_STREAMS,
    MAX_LEASE_TTL_MS,
    MAX_URL,
    MAX_WORKER,
    MIN_LEASE_TTL_MS,
    InvalidOffset,
    StreamPath,
    Subscription,
    SubscriptionRequest,
    check_subscription_id,
    configure,
    parse_path,
)
from domain.text import TEXT_PATTERN
from entrypoints.container import Services
from entrypoints.durable_streams import wire
from entrypoints.durable_streams.answers import Answer
from entrypoints.edge import problems as edge_problems
from entrypoints.edge.json_body import decode_json
from entrypoints.edge.paths import DURABLE_STREAMS_PREFIX, STREAM_PATH, subscription_parts
from entrypoints.edge.problems import PROBLEM_JSON
from entrypoints.edge.wake_links import DS, stream_root_url, wake_token
from entrypoints.openapi import STREAM_PATH_PATTERN, RequestBody, documented
from entrypoints.openapi import Answer as Documented

# The request bodies, as the handlers below and domain.subscriptions.configure check them.
_PATH_TEXT = {"type": "string", "pattern": "^/*" + STREAM_PATH_PATTERN[1:-1] + "/*$"}
_GENERATION = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
_WAKE_BODY = {
    "type": "object",
    "required": ["wake_id", "generation"],
    "properties": {
        "wake_id": {"type": "string"},
        "generation": _GENERATION,
        "acks": {
            "type": ["array", "null"],
            "items": {
                "type": "object",
                "description": "names its stream by `stream` or `path`; `offset` is the "
                "protocol's (an offset the stream has not reached is 409 invalid-offset)",
                "properties": {
                    "stream": _PATH_TEXT,
                    "path": _PATH_TEXT,
                    "offset": {"type": "string"},
                },
                "anyOf": [
                    {"required": ["stream"], "properties": {"stream": _PATH_TEXT}},
                    {"required": ["path"], "properties": {"path": _PATH_TEXT}},
                ],
            },
        },
        "done": {"type": "boolean"},
    },
}
_SEGMENT_GLOB = r"(?:\*\*|[A-Za-z0-9._:*-]{1,128})"
_SUBSCRIPTION_BODY = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"enum": ["webhook", "pull-wake"]},
        "pattern": {
            "type": ["string", "null"],
            "maxLength": 512,
            "pattern": f"^/*{_SEGMENT_GLOB}(?:/{_SEGMENT_GLOB}){{0,7}}/*$",
            "description": "`*` within a segment, `**` alone (zero or more segments)",
        },
        "streams": {
            "type": ["array", "null"],
            "maxItems": MAX_EXPLICIT_STREAMS,
            "items": _PATH_TEXT,
        },
        "webhook": {
            "type": ["object", "null"],
            "required": ["url"],
            "properties": {
                "url": {
                    "type": "string",
                    "maxLength": MAX_URL,
                    "description": "https, or http to loopback; checked against the addresses "
                    "its host resolves to (webhook-url-rejected)",
                }
            },
        },
        "wake_stream": {"oneOf": [_PATH_TEXT, {"type": "null"}]},
        "lease_ttl_ms": {
            "type": ["integer", "null"],
            "minimum": MIN_LEASE_TTL_MS,
            "maximum": MAX_LEASE_TTL_MS,
        },
        "description": {
            "type": ["string", "null"],
            "maxLength": MAX_DESCRIPTION,
            "pattern": TEXT_PATTERN,
        },
    },
    "allOf": [
        {  # a pattern, or at least one stream
            "anyOf": [
                {"required": ["pattern"], "properties": {"pattern": {"type": "string"}}},
                {
                    "required": ["streams"],
                    "properties": {"streams": {"type": "array", "minItems": 1}},
                },
            ]
        },
        {  # a webhook's URL, or a pull-wake's wake stream
            "oneOf": [
                {
                    "properties": {"type": {"const": "webhook"}, "webhook": {"type": "object"}},
                    "required": ["webhook"],
                },
                {
                    "properties": {
                        "type": {"const": "pull-wake"},
                        "wake_stream": {"type": "string"},
                    },
                    "required": ["wake_stream"],
                },
            ]
        },
    ],
}
SUBSCRIPTION_BODY = RequestBody("application/json", schema=_SUBSCRIPTION_BODY)
WAKE_BODY = RequestBody("application/json", schema=_WAKE_BODY)
CLAIM_BODY = RequestBody(
    "application/json",
    schema={
        "type": "object",
        "required": ["worker"],
        "properties": {
            "worker": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_WORKER,
                "pattern": TEXT_PATTERN,
            }
        },
    },
)
STREAMS_BODY = RequestBody(
    "application/json",
    schema={
        "type": "object",
        "required": ["streams"],
        "properties": {
            "streams": {"type": "array", "items": _PATH_TEXT, "maxItems": MAX_EXPLICIT_STREAMS}
        },
    },
)
ON_SUBSCRIPTION = ("unauthenticated", "invalid-input", "forbidden", "subscription-not-found")
_encode = msgspec.json.Encoder().encode


class Acks(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    stream: str | None = None
    path: str | None = None
    offset: str = ""


class CallbackBody(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    wake_id: str
    generation: int
    acks: list[Acks] | None = None
    done: bool = False


class ClaimBody(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    worker: str


class StreamsBody(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    streams: Annotated[list[str], msgspec.Meta(max_length=MAX_EXPLICIT_STREAMS)]


async def _authenticated(request: Request) -> tuple[Services, Caller]:
    services: Services = request.app.state.services
    return services, await services.authenticate(request.headers.get("authorization"))


def ds_problem(error: errors.DomainError) -> Answer:
    """The application's problem answer (entrypoints/edge/problems.py), which the protocol's
    subscription clients read as `error.code` (its upper-case spelling) and `error.message`."""
    problem = edge_problems.problem(
        error.code,
        error.detail,
        headers=edge_problems.of_domain_error(error).headers or None,
        **error.extra,
        error={
            "code": error.code.upper().replace("-", "_"),
            "message": error.detail,
            **error.extra,
        },
    )
    return Answer(problem.status, {"Content-Type": PROBLEM_JSON, **problem.headers}, problem.body)


def _json(status: int, value: Any, content_type: str = "application/json") -> Answer:
    return Answer(
        status, {"Content-Type": content_type, "Cache-Control": "no-store"}, _encode(value)
    )


async def _body(request: Request, type_: type[Any]) -> Any:
    return decode_json(await request.body(), type_)


def base_url(request: Request) -> str:
    return stream_root_url(
        request.app.state.public_url,
        request.scope.get("server"),
        request.scope.get("scheme", "http"),
    )


async def view(services: Services, sub: Subscription, heads: Heads) -> dict[str, Any]:
    config = sub.config
    statuses = sub.streams(heads)
    # Each link's offsets with its stream's incarnation as the store read it with the link; the
    # stream's own look-up (its chain) only where that is not known or a position shown is a
    # fork's inherited one (a subscription may link 20,000 streams: a look-up of each, each
    # time it is shown, would crowd every stream's definition out of the process's cache).
    chained = [s.path for s in statuses if s.needs_chain]
    mintings = await services.subscriptions.offsets(sub.tenant, chained) if chained else {}
    webhook = None
    if config.webhook_url is not None:
        webhook = {
            "url": config.webhook_url,
            "signing": {
                "alg": "ed25519",
                "kid": await services.webhook_keys.kid(),
                "jwks_url": f"{sub.base_url}{DS}/jwks.json",
            },
        }
    shown: dict[str, Any] = {
        "id": sub.id,
        "subscription_id": sub.id,
        "type": config.type,
        "pattern": config.pattern,
        "streams": [
            {
                "path": s.path.path,
                "link_type": s.link_type,
                "acked_offset": offset_of(s, s.acked, mintings.get(s.path)),
            }
            for s in statuses
        ],
        "webhook": webhook,
        "wake_stream": config.wake_stream.path if config.wake_stream else None,
        "lease_ttl_ms": config.lease_ttl_ms,
        "created_at": wire.rfc3339(datetime.fromtimestamp(sub.created_at, UTC)),
        "status": sub.status,
        "description": config.description,
    }
    if sub.last_error is not None:  # while failed, to those who configure subscriptions
        shown["last_error"] = sub.last_error
    return shown


async def _acks(services: Services, tenant: str, body: CallbackBody) -> list[AckRequest]:
    """The acks, each with its offset's sequence and the incarnation of the stream that issued
    it (domain/offsets.py), which the decision compares with the linked stream's: one another
    stream issued (one deleted since, whose path this stream now has) is refused there, never
    taken as a position of this one."""
    given: list[tuple[StreamPath, Offset]] = []
    for ack in body.acks or ():
        name = ack.stream if ack.stream is not None else ack.path
        if name is None:
            raise errors.InvalidInput("each ack names its stream", field="acks")
        if ack.offset == wire.START:
            raise _invalid_offset("an ack offset must not be -1")
        try:
            sequence = wire.parse_offset(ack.offset, field="acks.offset", also="")
        except errors.InvalidInput as error:
            raise _invalid_offset(error.detail) from None
        if sequence is None:
            raise _invalid_offset("an ack offset must not be `now`")
        given.append((parse_path(name, "acks.stream"), sequence))
    # Each offset is resolved against the stream now at its path (its chain: a fork's
    # inherited positions are its sources' offsets), and the ack carries the incarnation it was
    # resolved against, or the one it states when it was not (another stream's): the decision
    # compares it with the linked stream's, read in its transaction, after the wake's fence
    # and the link's checks. (Refused here, before them, it told a holder of any wake token
    # which paths hold a stream, and raced a deletion that landed before the decision.)
    mintings = await services.subscriptions.offsets(tenant, {path for path, _ in given})
    out = []
    for path, offset in given:
        minting = mintings.get(path)
        resolved = None if minting is None else minting.resolve(offset)
        if minting is not None and resolved is not None:
            out.append(AckRequest(path, resolved, minting.own))
        else:
            out.append(AckRequest(path, offset.sequence, offset.minted_by))
    return out


def _invalid_offset(detail: str) -> errors.DomainError:
    return InvalidOffset(detail)


async def _guarded(coro: Any) -> ASGIApp:
    try:
        result: ASGIApp = await coro
        return result
    except errors.DomainError as error:
        return ds_problem(error)


_PUT = documented(
    Documented(201, "Created"),
    Documented(200, "Re-confirmed: the same configuration"),
    problems=(*ON_SUBSCRIPTION, "subscription-conflict", "webhook-url-rejected", "quota-exhausted"),
    request_body=SUBSCRIPTION_BODY,
)
_GET = documented(Documented(200, "The subscription"), problems=ON_SUBSCRIPTION)
_DELETE = documented(Documented(204, "Deleted"), problems=ON_SUBSCRIPTION)
_WAKE = ("wake-token-invalid", "fenced", "invalid-offset", "wrong-subscription-type")
_CALLBACK = documented(
    Documented(200, "Applied: `{ok, next_wake}`"),
    problems=(*ON_SUBSCRIPTION, *_WAKE),
    request_body=WAKE_BODY,
)
_CLAIM = documented(
    Documented(200, "Claimed: the wake, its token and streams"),
    problems=(*ON_SUBSCRIPTION, "already-claimed", "no-pending-work", "wrong-subscription-type"),
    request_body=CLAIM_BODY,
)
_RELEASE = documented(
    Documented(204, "Released"),
    problems=(*ON_SUBSCRIPTION, *_WAKE),
    request_body=WAKE_BODY,
)
_JWKS = documented(Documented(200, "The webhook signing keys (JWKS)"), authenticated=False)
_STREAMS = documented(
    Documented(204, "Linked"),
    problems=(*ON_SUBSCRIPTION, "too-many-links"),
    request_body=STREAMS_BODY,
)

SUB = "/subscriptions/{subscription_id:str}"


def _as_sent(request: Request, stream_path: str) -> str:
    """The stream path of an unlink as its URL names it, decoded: the router's `stream_path`
    has `//` taken as `/`, so `ul%2F%2Fs1` unlinked `ul/s1`, which a link's body refuses."""
    parts = subscription_parts(request.scope.get("raw_path") or b"")
    if parts is None or not parts[1].startswith(b"streams/"):
        return stream_path
    sent = parts[1].removeprefix(b"streams/").decode("latin-1")
    return unquote(sent, encoding="utf-8", errors="replace")  # (refused by the path's pattern)


class SubscriptionsController(Controller):
    path = DURABLE_STREAMS_PREFIX + STREAM_PATH + DS
    tags = ["durable-streams"]

    @get("/jwks.json", operation_id="dsJwks", summary="Webhook signing keys", operation_class=_JWKS)
    async def jwks(self, request: Request) -> ASGIApp:
        services: Services = request.app.state.services
        keys = await services.webhook_keys.jwks()
        return Answer(
            200,
            {"Content-Type": "application/jwk-set+json", "Cache-Control": "public, max-age=300"},
            _encode(keys),
        )

    @put(
        SUB, operation_id="dsSubscriptionPut", summary="Create a subscription", operation_class=_PUT
    )
    async def put_subscription(self, request: Request, subscription_id: FromPath[str]) -> ASGIApp:
        async def run() -> Answer:
            services, caller = await _authenticated(request)
            caller.require("streams:admin")
            check_subscription_id(subscription_id)
            config = configure(await _body(request, SubscriptionRequest))
            sub, heads, created = await services.subscriptions.put(
                caller, subscription_id, config, base_url(request)
            )
            return _json(201 if created else 200, await view(services, sub, heads))

        return await _guarded(run())

    @get(SUB, operation_id="dsSubscriptionGet", summary="Read a subscription", operation_class=_GET)
    async def get_subscription(self, request: Request, subscription_id: FromPath[str]) -> ASGIApp:
        async def run() -> Answer:
            services, caller = await _authenticated(request)
            sub, heads = await services.subscriptions.get(caller, subscription_id)
            return _json(200, await view(services, sub, heads))

        return await _guarded(run())

    @delete(
        SUB,
        operation_id="dsSubscriptionDelete",
        summary="Delete a subscription",
        status_code=200,  # the answer is an ASGI app that sends its own 204
        operation_class=_DELETE,
    )
    async def delete_subscription(
        self, request: Request, subscription_id: FromPath[str]
    ) -> ASGIApp:
        async def run() -> Answer:
            services, caller = await _authenticated(request)
            await services.subscriptions.delete(caller, subscription_id)
            return Answer(204, {})

        return await _guarded(run())

    @post(
        SUB + "/streams",
        operation_id="dsSubscriptionLink",
        summary="Link streams",
        operation_class=_STREAMS,
    )
    async def add_streams(self, request: Request, subscription_id: FromPath[str]) -> ASGIApp:
        async def run() -> Answer:
            services, caller = await _authenticated(request)
            caller.require("streams:admin")
            body = await _body(request, StreamsBody)
            paths = tuple(sorted({parse_path(s) for s in body.streams}))
            await services.subscriptions.add_streams(caller, subscription_id, paths)
            return Answer(204, {})

        return await _guarded(run())

    @delete(
        SUB + "/streams/{stream_path:path}",
        operation_id="dsSubscriptionUnlink",
        summary="Unlink an explicit stream",
        status_code=200,  # the answer is an ASGI app that sends its own 204
        operation_class=_DELETE,
    )
    async def remove_stream(
        self, request: Request, subscription_id: FromPath[str], stream_path: FromPath[str]
    ) -> ASGIApp:
        async def run() -> Answer:
            services, caller = await _authenticated(request)
            path = parse_path(_as_sent(request, stream_path))
            await services.subscriptions.remove_stream(caller, subscription_id, path)
            return Answer(204, {})

        return await _guarded(run())

    @post(
        SUB + "/callback",
        operation_id="dsWebhookCallback",
        summary="Webhook callback",
        operation_class=_CALLBACK,
    )
    async def callback(self, request: Request, subscription_id: FromPath[str]) -> ASGIApp:
        return await _guarded(self._ack(request, subscription_id, WEBHOOK))

    @post(
        SUB + "/ack",
        operation_id="dsPullWakeAck",
        summary="Pull-wake ack",
        operation_class=_CALLBACK,
    )
    async def ack(self, request: Request, subscription_id: FromPath[str]) -> ASGIApp:
        return await _guarded(self._ack(request, subscription_id, WAKE_EVENT))

    async def _ack(self, request: Request, subscription_id: str, kind: str) -> Answer:
        services: Services = request.app.state.services
        token = wake_token(request.headers.get("authorization"))
        tenant = services.subscriptions.wake_tenant(token, subscription_id)
        await at_work_for(tenant)
        body = await _body(request, CallbackBody)
        acks = await _acks(services, tenant, body)
        next_wake = await services.subscriptions.callback(
            token, subscription_id, body.generation, body.wake_id, acks, body.done, kind
        )
        return _json(200, {"ok": True, "next_wake": next_wake})

    @post(
        SUB + "/claim",
        operation_id="dsPullWakeClaim",
        summary="Pull-wake claim",
        operation_class=_CLAIM,
    )
    async def claim(self, request: Request, subscription_id: FromPath[str]) -> ASGIApp:
        async def run() -> Answer:
            services, caller = await _authenticated(request)
            body = await _body(request, ClaimBody)
            sub, heads, token = await services.subscriptions.claim(
                caller, subscription_id, body.worker
            )
            assert sub.wake is not None
            statuses = sub.streams(heads)
            chained = [s.path for s in statuses if s.needs_chain]
            mintings = await services.subscriptions.offsets(sub.tenant, chained)
            return _json(
                200,
                {
                    "wake_id": sub.wake.wake_id,
                    "generation": sub.wake.generation,
                    "token": token,
                    "streams": [wire_status(s, mintings.get(s.path)) for s in statuses],
                    "lease_ttl_ms": sub.config.lease_ttl_ms,
                },
            )

        return await _guarded(run())

    @post(
        SUB + "/release",
        operation_id="dsPullWakeRelease",
        summary="Pull-wake release",
        operation_class=_RELEASE,
    )
    async def release(self, request: Request, subscription_id: FromPath[str]) -> ASGIApp:
        async def run() -> Answer:
            services: Services = request.app.state.services
            token = wake_token(request.headers.get("authorization"))
            await at_work_for(services.subscriptions.wake_tenant(token, subscription_id))
            body = await _body(request, CallbackBody)
            await services.subscriptions.release(
                token, subscription_id, body.generation, body.wake_id
            )
            return Answer(204, {})

        return await _guarded(run())
