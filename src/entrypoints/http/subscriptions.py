"""Subscriptions on the native API (docs/http-api.md, "Subscriptions"): the same objects as the
Durable Streams `__ds` routes, addressed by run and stream IDs, with sequences for offsets. A
webhook's notification is the protocol's (with offsets), and its callback URL is the protocol's
callback, which acknowledges by offset; the native `callback`/`ack` routes take sequences."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import msgspec
from litestar import Controller, Request, Response, delete, get, post, put
from litestar.params import FromPath

from application.subscriptions import WAKE_EVENT, WEBHOOK, AckRequest, Heads
from application.waiting import at_work_for
from domain.errors import InvalidInput
from domain.ids import ID_PATTERN, check_id
from domain.subscriptions import (
    DEFAULT_RUN,
    MAX_WORKER,
    StreamPath,
    Subscription,
    SubscriptionRequest,
    WebhookConfig,
    check_subscription_id,
    configure,
)
from domain.text import DOCUMENTED_TEXT
from entrypoints.container import Services
from entrypoints.edge.wake_links import DS, stream_root_url, wake_token
from entrypoints.http.body import decode_body
from entrypoints.http.streams import API_PREFIX, EVERY_ROUTE, WITH_A_BODY, authenticated
from entrypoints.openapi import Answer, RequestBody, documented

PROBLEMS = (*EVERY_ROUTE, "forbidden", "subscription-not-found")
WAKE_PROBLEMS = ("wake-token-invalid", "fenced", "invalid-offset", "wrong-subscription-type")


Id = Annotated[str, msgspec.Meta(pattern=ID_PATTERN)]
Glob = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._:*-]{1,128}$")]


class StreamRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    run_id: Id
    stream_id: Id


class PatternRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Globs over run IDs and stream IDs: `*` matches any part of one ID."""

    run_id: Glob
    stream_id: Glob


class WebhookRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]


class _Common(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="type"
):
    """A subscription's streams are the pattern's and those listed; it may start with neither
    and be given streams later."""

    pattern: PatternRef | None = None
    streams: Annotated[list[StreamRef], msgspec.Meta(max_length=1000)] | None = None
    lease_ttl_ms: Annotated[int, msgspec.Meta(ge=1000, le=600_000)] | None = None
    description: Annotated[str, msgspec.Meta(max_length=1000), DOCUMENTED_TEXT] | None = None


class WebhookSubscriptionRequest(_Common, frozen=True, tag="webhook"):
    webhook: WebhookRef


class PullWakeSubscriptionRequest(_Common, frozen=True, tag="pull-wake"):
    wake_stream: StreamRef


NativeSubscriptionRequest = WebhookSubscriptionRequest | PullWakeSubscriptionRequest


class Signing(msgspec.Struct, frozen=True):
    alg: str
    kid: str
    jwks_url: str


class WebhookView(msgspec.Struct, frozen=True):
    url: str
    signing: Signing


class LinkView(msgspec.Struct, frozen=True):
    run_id: str
    stream_id: str
    link_type: str
    acked_sequence: int
    head: int
    pending: bool


class WakeView(msgspec.Struct, frozen=True):
    generation: int
    wake_id: str
    holder: str | None


class SubscriptionView(msgspec.Struct, frozen=True):
    id: str
    type: str
    pattern: PatternRef | None
    # The pattern as the protocol writes it (`run/stream` globs, `**`): a pattern made on that
    # surface may not be a glob per ID (`**`, or more segments), and then `pattern` is null.
    path_pattern: str | None
    streams: list[LinkView]
    webhook: WebhookView | None
    wake_stream: StreamRef | None
    lease_ttl_ms: int
    created_at: str
    status: str
    description: str | None
    generation: int
    wake: WakeView | None
    # Why the last attempt failed, while `status` is `failed` (to `streams:admin` only).
    last_error: str | None = None


class SubscriptionList(msgspec.Struct, frozen=True):
    subscriptions: list[SubscriptionView]


class StreamsRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    streams: Annotated[list[StreamRef], msgspec.Meta(max_length=1000)]


class NativeAck(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    run_id: Id
    stream_id: Id
    sequence: Annotated[int, msgspec.Meta(ge=0, le=2**53 - 1)]


class WakeRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    wake_id: Annotated[str, msgspec.Meta(max_length=256)]
    generation: Annotated[int, msgspec.Meta(ge=0, le=2**53 - 1)]
    acks: Annotated[list[NativeAck], msgspec.Meta(max_length=1000)] | None = None
    done: bool = False


class WakeAnswer(msgspec.Struct, frozen=True):
    ok: bool
    next_wake: bool


class ClaimRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    worker: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_WORKER), DOCUMENTED_TEXT]


class ClaimAnswer(msgspec.Struct, frozen=True):
    wake_id: str
    generation: int
    token: str
    streams: list[LinkView]
    lease_ttl_ms: int


def _path(ref: StreamRef, field: str = "streams") -> StreamPath:
    return StreamPath(check_id("runID", ref.run_id), check_id("streamID", ref.stream_id))


def _links(sub: Subscription, heads: Heads) -> list[LinkView]:
    return [
        LinkView(s.path.run_id, s.path.stream_id, s.link_type, s.acked, s.tail, s.pending)
        for s in sub.streams(heads)
    ]


def _pair(pattern: str) -> PatternRef | None:
    """A stored glob (canonical: domain.subscriptions.check_pattern made it) as a glob per ID,
    when it is one: `stream` (the default run) or `run/stream`, neither `**`."""
    segments = pattern.split("/")
    if len(segments) == 1:
        segments = [DEFAULT_RUN, *segments]
    if len(segments) != 2 or "**" in segments:
        return None
    return PatternRef(segments[0], segments[1])


async def view(services: Services, sub: Subscription, heads: Heads) -> SubscriptionView:
    config = sub.config
    pattern = None
    if config.pattern is not None:
        pattern = _pair(config.pattern)
    webhook = None
    if config.webhook_url is not None:
        signing = Signing(
            "ed25519", await services.webhook_keys.kid(), f"{sub.base_url}{DS}/jwks.json"
        )
        webhook = WebhookView(config.webhook_url, signing)
    wake = sub.wake
    return SubscriptionView(
        id=sub.id,
        type=config.type,
        pattern=pattern,
        path_pattern=config.pattern,
        streams=_links(sub, heads),
        webhook=webhook,
        wake_stream=(
            StreamRef(config.wake_stream.run_id, config.wake_stream.stream_id)
            if config.wake_stream
            else None
        ),
        lease_ttl_ms=config.lease_ttl_ms,
        created_at=datetime.fromtimestamp(sub.created_at, UTC).isoformat().replace("+00:00", "Z"),
        status=sub.status,
        description=config.description,
        generation=sub.generation,
        wake=None if wake is None else WakeView(wake.generation, wake.wake_id, wake.holder),
        last_error=sub.last_error,
    )


def _protocol_request(
    body: WebhookSubscriptionRequest | PullWakeSubscriptionRequest,
) -> SubscriptionRequest:
    pattern = None
    if body.pattern is not None:
        for part in (body.pattern.run_id, body.pattern.stream_id):
            if not part or "/" in part:
                raise InvalidInput("pattern: a glob per ID, without '/'", field="pattern")
        pattern = f"{body.pattern.run_id}/{body.pattern.stream_id}"
    webhook = body.webhook if isinstance(body, WebhookSubscriptionRequest) else None
    wake = body.wake_stream if isinstance(body, PullWakeSubscriptionRequest) else None
    return SubscriptionRequest(
        type="webhook" if webhook is not None else "pull-wake",
        pattern=pattern,
        streams=[f"{_path(s).run_id}/{_path(s).stream_id}" for s in body.streams or ()],
        webhook=WebhookConfig(webhook.url) if webhook else None,
        wake_stream=f"{_path(wake).run_id}/{_path(wake).stream_id}" if wake else None,
        lease_ttl_ms=body.lease_ttl_ms,
        description=body.description,
    )


SUB = "/{subscription_id:str}"


class SubscriptionsApiController(Controller):
    path = API_PREFIX + "/subscriptions"
    tags = ["subscriptions"]

    @put(
        SUB,
        operation_id="putSubscription",
        summary="Create (201) or re-confirm (200) a subscription",
        operation_class=documented(
            Answer(201, "Created", SubscriptionView),
            Answer(200, "Re-confirmed: the same configuration", SubscriptionView),
            problems=(
                *PROBLEMS,
                *WITH_A_BODY,
                "subscription-conflict",
                "webhook-url-rejected",
                "quota-exhausted",
            ),
            request_body=RequestBody("application/json", NativeSubscriptionRequest),
        ),
    )
    async def put_subscription(
        self, request: Request, subscription_id: FromPath[str]
    ) -> Response[SubscriptionView]:
        services, caller = await authenticated(request)
        caller.require("streams:admin")
        check_subscription_id(subscription_id)
        body: WebhookSubscriptionRequest | PullWakeSubscriptionRequest = await decode_body(
            request,
            NativeSubscriptionRequest,  # type: ignore[arg-type]  # a union of two structs
        )
        config = configure(_protocol_request(body), allow_no_streams=True)
        sub, heads, created = await services.subscriptions.put(
            caller,
            subscription_id,
            config,
            stream_root_url(
                request.app.state.public_url,
                request.scope.get("server"),
                request.scope.get("scheme", "http"),
            ),
        )
        return Response(await view(services, sub, heads), status_code=201 if created else 200)

    @get(
        SUB,
        operation_id="getSubscription",
        summary="A subscription, its streams and their acknowledged sequences",
        operation_class=documented(
            Answer(200, "The subscription", SubscriptionView), problems=PROBLEMS
        ),
    )
    async def get_subscription(
        self, request: Request, subscription_id: FromPath[str]
    ) -> SubscriptionView:
        services, caller = await authenticated(request)
        sub, heads = await services.subscriptions.get(caller, subscription_id)
        return await view(services, sub, heads)

    @delete(
        SUB,
        operation_id="deleteSubscription",
        summary="Delete a subscription",
        status_code=204,
        operation_class=documented(Answer(204, "Deleted"), problems=PROBLEMS),
    )
    async def delete_subscription(self, request: Request, subscription_id: FromPath[str]) -> None:
        services, caller = await authenticated(request)
        await services.subscriptions.delete(caller, subscription_id)

    @post(
        SUB + "/streams",
        operation_id="linkSubscriptionStreams",
        summary="Link streams explicitly (from their current head)",
        status_code=204,
        operation_class=documented(
            Answer(204, "Linked"),
            problems=(*PROBLEMS, *WITH_A_BODY, "too-many-links"),
            request_body=StreamsRequest,
        ),
    )
    async def add_streams(self, request: Request, subscription_id: FromPath[str]) -> None:
        services, caller = await authenticated(request)
        caller.require("streams:admin")
        body = await decode_body(request, StreamsRequest)
        paths = tuple(sorted({_path(s) for s in body.streams}))
        await services.subscriptions.add_streams(caller, subscription_id, paths)

    @delete(
        SUB + "/streams/{run_id:str}/{stream_id:str}",
        operation_id="unlinkSubscriptionStream",
        summary="Remove a stream's explicit link (a matching pattern keeps it linked)",
        status_code=204,
        operation_class=documented(Answer(204, "Unlinked"), problems=PROBLEMS),
    )
    async def remove_stream(
        self,
        request: Request,
        subscription_id: FromPath[str],
        run_id: FromPath[str],
        stream_id: FromPath[str],
    ) -> None:
        services, caller = await authenticated(request)
        path = _path(StreamRef(run_id, stream_id))
        await services.subscriptions.remove_stream(caller, subscription_id, path)

    @post(
        SUB + "/claim",
        operation_id="claimSubscription",
        summary="Claim a pull-wake subscription's wake",
        status_code=200,
        operation_class=documented(
            Answer(200, "Claimed", ClaimAnswer),
            problems=(*PROBLEMS, *WITH_A_BODY, "already-claimed", "no-pending-work"),
            request_body=ClaimRequest,
        ),
    )
    async def claim(self, request: Request, subscription_id: FromPath[str]) -> ClaimAnswer:
        services, caller = await authenticated(request)
        body = await decode_body(request, ClaimRequest)
        sub, heads, token = await services.subscriptions.claim(caller, subscription_id, body.worker)
        assert sub.wake is not None
        return ClaimAnswer(
            sub.wake.wake_id,
            sub.wake.generation,
            token,
            _links(sub, heads),
            sub.config.lease_ttl_ms,
        )

    async def _ack(self, request: Request, subscription_id: str, kind: str) -> WakeAnswer:
        services: Services = request.app.state.services
        token = wake_token(request.headers.get("authorization"))
        await at_work_for(services.subscriptions.wake_tenant(token, subscription_id))
        body = await decode_body(request, WakeRequest)
        acks = [
            AckRequest(_path(StreamRef(a.run_id, a.stream_id), "acks"), a.sequence)
            for a in body.acks or ()
        ]
        woke = await services.subscriptions.callback(
            token, subscription_id, body.generation, body.wake_id, acks, body.done, kind
        )
        return WakeAnswer(True, woke)

    _WAKE = documented(
        Answer(200, "Applied", WakeAnswer),
        problems=(*PROBLEMS, *WITH_A_BODY, *WAKE_PROBLEMS),
        request_body=WakeRequest,
    )

    @post(
        SUB + "/callback",
        operation_id="subscriptionCallback",
        summary="A webhook's callback (Bearer: its callback token), by sequence",
        status_code=200,
        operation_class=_WAKE,
    )
    async def callback(self, request: Request, subscription_id: FromPath[str]) -> WakeAnswer:
        return await self._ack(request, subscription_id, WEBHOOK)

    @post(
        SUB + "/ack",
        operation_id="ackSubscription",
        summary="A pull-wake worker's ack or heartbeat (Bearer: its claim token)",
        status_code=200,
        operation_class=_WAKE,
    )
    async def ack(self, request: Request, subscription_id: FromPath[str]) -> WakeAnswer:
        return await self._ack(request, subscription_id, WAKE_EVENT)

    @post(
        SUB + "/release",
        operation_id="releaseSubscription",
        summary="Give a claimed wake back (Bearer: its claim token)",
        status_code=204,
        operation_class=documented(
            Answer(204, "Released"),
            problems=(*PROBLEMS, *WITH_A_BODY, *WAKE_PROBLEMS),
            request_body=WakeRequest,
        ),
    )
    async def release(self, request: Request, subscription_id: FromPath[str]) -> None:
        services: Services = request.app.state.services
        token = wake_token(request.headers.get("authorization"))
        await at_work_for(services.subscriptions.wake_tenant(token, subscription_id))
        body = await decode_body(request, WakeRequest)
        await services.subscriptions.release(token, subscription_id, body.generation, body.wake_id)


class StreamSubscriptionsController(Controller):
    path = API_PREFIX + "/runs/{run_id:str}/streams/{stream_id:str}/subscriptions"
    tags = ["subscriptions"]

    @get(
        "",
        operation_id="listStreamSubscriptions",
        summary="The subscriptions that link this stream, with its acknowledged sequence",
        operation_class=documented(
            Answer(200, "The stream's subscriptions", SubscriptionList),
            problems=(*EVERY_ROUTE, "forbidden", "not-found"),
        ),
    )
    async def list_subscriptions(
        self, request: Request, run_id: FromPath[str], stream_id: FromPath[str]
    ) -> SubscriptionList:
        services, caller = await authenticated(request)
        found = await services.subscriptions.of_stream(caller, run_id, stream_id)
        return SubscriptionList([await view(services, sub, heads) for sub, heads in found])
