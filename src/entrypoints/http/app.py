"""The Litestar application: routes, dependencies, problem responses, lifespan, OpenAPI."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import AsyncIterator

import asyncpg
import msgspec
from litestar import Litestar, Request, Response, get
from litestar.enums import ScopeType
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.types import ASGIApp, Receive, Scope, Send

from adapters.postgres.bounded import BoundedPool, bounded
from application import tracing, waiting
from application.workers import run_workers
from domain.errors import DomainError
from entrypoints import tracing as exporting
from entrypoints.client_sockets import drop_silent_clients_once_listening
from entrypoints.config import Settings
from entrypoints.console.route import ROUTES as CONSOLE_ROUTES
from entrypoints.container import Container, Services, provided, start, stop, workers
from entrypoints.durable_streams.routes import DurableStreamsController
from entrypoints.durable_streams.subscriptions import SubscriptionsController
from entrypoints.edge import writing
from entrypoints.edge.body import TenantBodies, body_coming, streamed_body, with_body_deadlines
from entrypoints.edge.browser import allowed_origin, browser_headers
from entrypoints.edge.head_method import serve_head
from entrypoints.edge.outages import RETRY_AFTER_SECONDS
from entrypoints.edge.turns import with_turns
from entrypoints.edge.websockets import refuse_websockets
from entrypoints.front import append_front
from entrypoints.http import problems
from entrypoints.http.methods import every_method_in_options
from entrypoints.http.objects import ObjectsController
from entrypoints.http.observability import metrics, request_middleware
from entrypoints.http.outages import outage_handlers
from entrypoints.http.request_checks import check_request
from entrypoints.http.streams import RunsController, StreamsController
from entrypoints.http.subscriptions import (
    StreamSubscriptionsController,
    SubscriptionsApiController,
)
from entrypoints.http.tokens import TokensController
from entrypoints.http.traced import traced_requests
from entrypoints.http.usage import UsageController
from entrypoints.lean_imports import without_optional_integrations
from entrypoints.logs import configure_logging
from entrypoints.openapi import SECURITY, Answer, WireDocument, documented
from entrypoints.sse import asgi as event_streams

log = logging.getLogger("ductor_streams")

MAX_REQUEST_BYTES = 8 * 1024 * 1024
# /readyz answers within about this, even when PostgreSQL accepts connections but never replies.
READY_TIMEOUT_SECONDS = 2.0
# How often a process of `serve --workers N` checks that its supervisor is still there.
ORPHAN_CHECK_SECONDS = 1.0


class Health(msgspec.Struct, frozen=True):
    status: str


@get(
    "/healthz",
    operation_id="healthz",
    tags=["operations"],
    operation_class=documented(Answer(200, "The process answers", Health), authenticated=False),
)
async def healthz() -> Health:
    return Health(status="ok")


@get(
    "/readyz",
    operation_id="readyz",
    tags=["operations"],
    operation_class=documented(
        Answer(200, "Ready: PostgreSQL answers", Health),
        problems=("unavailable",),
        authenticated=False,
    ),
)
async def readyz(request: Request) -> Response[Health] | Response[bytes]:
    container: Container = request.app.state.container
    pool = await provided(container.pool)
    if isinstance(pool, asyncpg.Pool | BoundedPool):
        half = READY_TIMEOUT_SECONDS / 2

        async def probe() -> None:
            async with pool.acquire(timeout=half) as connection:
                await connection.fetchval("SELECT 1", timeout=half)

        try:
            # Awaited for at most `half` (bounded): the release of a connection whose query
            # timed out waits for its cancellation, which a silent network never answers.
            await bounded(probe(), seconds=half)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            # The same answer as any route's while PostgreSQL is out of reach.
            return problems.problem(
                "unavailable",
                "not ready: PostgreSQL does not answer; retry shortly",
                status=503,
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
    return Response(Health(status="ready"))


# The handler lives beside the metrics it reads; its route is declared here, where the
# document's declarations can be imported (observability.py is imported by problems.py).
metrics_route = get(
    "/metrics",
    operation_id="metrics",
    tags=["operations"],
    operation_class=documented(
        Answer(
            200,
            "Prometheus text exposition",
            media_type="text/plain",
            schema={"type": "string"},
        ),
        authenticated=False,
    ),
)(metrics)


def create_app(container: Container, *, front: bool = True, serving: bool = False) -> Litestar:
    """The application. `front=False` leaves the append routes to Litestar's router too (the
    test that holds the two ways to one answer builds both). `serving`: served by a server of
    this process (`app_from_env`), whose listening sockets it tunes."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        app.state.container = container
        app.state.long_poll_seconds = container.settings().long_poll_seconds
        app.state.public_url = container.settings().public_url
        app.state.services = await start(container)
        stopping = asyncio.Event()
        background = None
        if container.settings().run_workers:
            background = asyncio.create_task(run_workers(await workers(container), stopping))
        silence = container.settings().client_silence_seconds if serving else 0
        sockets = None  # (ends by itself within seconds of start-up)
        if silence:
            sockets = asyncio.create_task(drop_silent_clients_once_listening(silence))
        orphaned = None
        supervisor = container.settings().supervisor_pid
        if supervisor is not None:  # one of `serve --workers N`'s
            orphaned = asyncio.create_task(_stop_when_orphaned(supervisor, stopping))
        try:
            yield
        finally:
            stopping.set()
            if sockets is not None:
                sockets.cancel()
            if orphaned is not None:
                orphaned.cancel()
            if background is not None:
                await background
            await stop(container)
            exporting.flush()  # what is still batched is exported

    with without_optional_integrations("pydantic", "attrs", "attr"):
        # Litestar adds plugins for these when they happen to be installed; nothing here uses
        # them, and in an environment with the test tools they cost every process ~5 MB.
        app = Litestar(
            route_handlers=[
                StreamsController,
                RunsController,
                ObjectsController,
                TokensController,
                UsageController,
                SubscriptionsApiController,
                StreamSubscriptionsController,
                SubscriptionsController,  # its static `__ds` routes before the streams'
                DurableStreamsController,
                healthz,
                readyz,
                metrics_route,
                *CONSOLE_ROUTES,  # outside the API prefix: the page needs no token to load
            ],
            guards=[check_request],
            lifespan=[lifespan],
            exception_handlers={
                DomainError: problems.domain_error,
                # A route parameter refused by Litestar's signature (`Parameter(ge=, le=)`).
                ValidationException: problems.validation_error,
                HTTPException: problems.http_error,
                **outage_handlers(),
                Exception: problems.internal_error,
            },
            request_max_body_size=MAX_REQUEST_BYTES,
            openapi_config=OpenAPIConfig(
                title="ductor-streams",
                version="0.1.0",
                description=(
                    "Durable, ordered, flow-controlled data streams for workflow runs. "
                    "HEAD is served wherever GET is: GET's status and headers, no body."
                ),
                path="/schema",
                render_plugins=[WireDocument()],
                components=SECURITY,
            ),
            debug=False,
            # Logging is configured once, as JSON lines (entrypoints/logs.py): Litestar's own
            # configuration would replace the root handler with its plain-text one.
            logging_config=None,
        )
    # Around the router, not as a route's middleware: the router's own answers (an unknown
    # path's 404, a 405) carry the request's id and are counted and logged too.
    app.asgi_handler = request_middleware(app.asgi_handler)
    app.asgi_handler = every_method_in_options(app, app.asgi_handler)
    # Around the router and the exception handlers, so that a HEAD is routed as its GET and
    # answers its problems too (404, 401, 405).
    app.asgi_handler = serve_head(app.asgi_handler)
    origins = container.settings().cors_origins
    # Security headers on every answer, and CORS preflights answered before routing.
    app.asgi_handler = browser_headers(app.asgi_handler, origins)
    if front:
        # Outermost: the append routes, served by the pipeline Litestar's layers run, without
        # them (entrypoints/front.py).
        app.asgi_handler = append_front(
            lambda: app.state.services, app.asgi_handler, MAX_REQUEST_BYTES, origins
        )
    # A request of a token the process knows takes its tenant's turn at work first of all
    # (entrypoints/edge/turns.py), within its budget.
    app.asgi_handler = with_turns(
        app.asgi_handler,
        container.token_cache(),
        origins,
        lambda token, sid: app.state.services.subscriptions.wake_tenant(token, sid),
    )
    writing.configure(container.settings().answer_stall_seconds)  # (the turns' send writes)
    app.asgi_handler = with_budget(app.asgi_handler, container.settings().request_timeout_seconds)
    # Outermost but for tracing: the front and Litestar read bodies through it.
    settings = container.settings()
    app.asgi_handler = with_body_deadlines(
        app.asgi_handler,
        settings.body_idle_seconds,
        settings.body_seconds,
        settings.body_min_bytes_per_second,
        TenantBodies(settings.max_arriving_bodies_per_tenant, settings.max_body_bytes_per_tenant),
    )
    app.asgi_handler = refuse_websockets(app.asgi_handler, allowed_origin(origins))
    if tracing.on():  # the request's span around everything (entrypoints/tracing.py)
        app.asgi_handler = traced_requests(app.asgi_handler)
    return app


def with_budget(asgi: ASGIApp, seconds: float) -> ASGIApp:
    """Each HTTP request waits on PostgreSQL for at most `seconds` in all, counted from its
    arrival (application/waiting.py); then it answers 503 with Retry-After."""

    async def bounded_request(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await asgi(scope, receive, send)
            return
        coming = body_coming(scope)
        streamed = coming and streamed_body(scope)
        with waiting.request_budget(seconds, body_to_come=coming, streamed=streamed):
            await asgi(scope, receive, send)

    return bounded_request


def begin_stopping(app: Litestar) -> None:
    """Called on SIGTERM before the server drains its requests: live subscriptions never end by
    themselves, so they are ended here (each client resumes with Last-Event-ID) and new ones
    are answered 503 with Retry-After."""
    services: Services | None = getattr(app.state, "services", None)
    if services is not None:
        services.subscribe.end_all()
    # A subscriber that does not read keeps its event stream waiting to write: ended too, and
    # so is a large answer whose client does not read it (entrypoints/edge/writing.py).
    event_streams.stop_all(app.state)
    writing.stop_all()


async def _stop_when_orphaned(supervisor: int, stopping: asyncio.Event) -> None:
    """A process of `serve --workers N` whose supervisor is gone (killed outright: it could not
    stop its processes) stops as SIGTERM stops it, draining what it serves. Left running, it
    held the port unsupervised (a new `serve` was refused it) and nothing started it again."""
    while not stopping.is_set():
        await asyncio.sleep(ORPHAN_CHECK_SECONDS)
        if os.getppid() != supervisor:  # (gone even before this process started: found too)
            log.error("the supervising process %d is gone: this server process stops", supervisor)
            os.kill(os.getpid(), signal.SIGTERM)
            return


def app_from_env() -> Litestar:
    """The factory the ASGI server imports: settings from the environment."""
    settings = Settings.from_env()
    configure_logging(settings.log_level)
    exporting.configure()  # only if an OTLP endpoint is set
    app = create_app(Container(settings=settings), serving=True)
    tune_collector()
    return app


def tune_collector() -> None:
    """Keep the cyclic garbage collector from pausing the event loop for long.

    Measured during (5) in the bench: full collections took 40-100 ms (on the event loop, so
    every delivery waited) and freed nothing. They walked what start-up built (modules,
    classes, the app: ~100k objects), which lives as long as the process: frozen here, it is
    left out. And they were set off by the 1,000 subscriptions' own long-lived objects plus
    whatever a delivery burst had in flight when the default threshold (a young collection
    every 700 allocations) promoted it: with a young collection every 50,000 allocations,
    bursts finish between collections and full ones become rare (p99 of (5) 78-103 ms -> 29
    ms, the longest pause 16 ms). Reference counting frees everything that is not a cycle."""
    gc.collect()  # start-up's own garbage is freed, not frozen
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
