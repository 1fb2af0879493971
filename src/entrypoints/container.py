"""The one place where everything is wired. Bad wiring fails at start, not at the first call.

Tests swap an adapter with `container.streams.override(...)` (see `memory_container`)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg

from entrypoints.lean_imports import without_optional_integrations

with without_optional_integrations(
    "pydantic", "pydantic_settings", "werkzeug", "fastapi", "starlette"
):
    # dependency-injector imports these, when they happen to be installed, for integrations
    # this service never uses; in an environment with the test tools (which bring pydantic and
    # werkzeug) that was 13 MB of every server process (docs/benchmarks.md, (6)).
    from dependency_injector import containers, providers

from adapters.memory.access import MemoryStreamAccess
from adapters.memory.cleanup import MemoryCleanup
from adapters.memory.deliveries import MemoryInputDeliveries
from adapters.memory.streams import MemoryStreams
from adapters.memory.subscriptions import MemorySubscriptions, memory_heads
from adapters.memory.sweeps import MemorySweepLeases
from adapters.memory.tokens import MemoryTokens
from adapters.objects.filesystem import FilesystemObjectStore
from adapters.objects.memory import MemoryObjectStore
from adapters.peers import UnixPeers
from adapters.postgres.access import PostgresStreamAccess
from adapters.postgres.bounded import BoundedPool, TenantShares
from adapters.postgres.cleanup import PostgresCleanup
from adapters.postgres.deliveries import PostgresInputDeliveries
from adapters.postgres.figures import PostgresFigures
from adapters.postgres.jobs import PostgresDeletionJobs, PostgresRetentionJobs
from adapters.postgres.journal import PostgresCompactionJobs, PostgresJournalCompactor
from adapters.postgres.stream_writes import prepare_pooled
from adapters.postgres.streams import PostgresStreams
from adapters.postgres.subscriptions import PostgresSubscriptions, PostgresWakeDeliveries
from adapters.postgres.sweeps import PostgresSweepLeases
from adapters.postgres.tokens import PostgresTokens
from adapters.postgres.wake_bus import SERVER_KEEPALIVES, PostgresWakeBus
from adapters.wait_service.memory import MemoryWaitService
from adapters.wait_service.postgres import PostgresWaitService
from adapters.webhook_signing import MemoryKeyRows, PostgresKeyRows, WebhookKeys
from adapters.webhooks import HttpWebhookSender
from application import waiting
from application.acknowledge import Acknowledge
from application.append_records import AppendRecords
from application.cleanup import Cleanup
from application.close_stream import CloseStream
from application.compaction import CompactJournal
from application.consumers import DeleteConsumer, ListConsumers
from application.create_durable_stream import CreateDurableStream
from application.create_stream import CreateStream
from application.definitions import Definitions
from application.delete_stream import DeleteRun, DeleteStream
from application.deletions import DeleteBodies
from application.durable_reads import DurableReads
from application.expiry import AccessLog, SweepExpired
from application.figures import ReadFigures
from application.forks import Forks
from application.get_stream import GetStream
from application.group_commit import GroupCommit
from application.input_delivery import Dispatch
from application.jwts import JwtCallers
from application.list_runs import ListRuns
from application.list_streams import ListStreams
from application.live import TAIL_LINGER_SECONDS, LiveTails
from application.live_slots import LiveSlots
from application.objects import ListOpenObjects, Objects, ObjectStores
from application.placement import Deployment
from application.read_records import ReadRecords
from application.retention import PruneRetention
from application.set_legal_hold import SetLegalHold
from application.subscribe import Subscribe
from application.subscriptions import DeliverWakes, Subscriptions, WakeScheduler, WakeTokens
from application.tenant_limits import ByteLimit, StreamLimit, TenantUsage, TokenLimit
from application.throughput import Throughput
from application.tokens import Authenticate, IssueToken, MintToken, TenantTokens, TokenCache
from application.wake import WakeRegistry
from application.workers import LeasedSweep, Runs, Worker
from entrypoints.config import InvalidSetting, Settings

if TYPE_CHECKING:
    from adapters.wait_service.dbos import DbosWaitService
    from adapters.wait_service.http import HttpWaitService
    from adapters.wait_service.restate import RestateWaitService

log = logging.getLogger("ductor_streams.workers")
T = TypeVar("T")


# Streams one dispatcher publishes side by side: one stream's backlog (or slow wait service)
# does not hold up the others it claimed, and a dead dispatcher's streams, taken over together
# once their leases run out, all resume then rather than one after another.
DISPATCH_CONCURRENCY = 8


def utc_now() -> datetime:
    return datetime.now(UTC)


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


async def _keep_session(connection: asyncpg.Connection) -> None:
    """Pooled connections carry no session state (no LISTEN, SET, advisory lock or cursor: the
    wake bus and migrations use connections of their own), so the default reset on release —
    four statements per request — is skipped; asyncpg still rolls back a stray transaction."""


async def open_pool(settings: Settings) -> AsyncIterator[BoundedPool | None]:
    if settings.database_url is None:
        raise RuntimeError("no database URL: start the embedded PostgreSQL first")
    # A PostgreSQL that accepts a connection but never answers (stopped, or a network that
    # drops packets) would otherwise hold a request forever. Every wait on it is bounded by
    # REQUEST_TIMEOUT_SECONDS where it is made (BoundedPool, application/waiting.py), so a
    # request answers 503 within that of its arrival; the statement timeout is the driver's
    # own, behind it (asyncpg then cancels, or gives up, the connection whose statement timed
    # out), and a connection attempt gives up within the request bound.
    pool = await asyncpg.create_pool(
        settings.database_url,
        min_size=settings.pool_min_size,
        max_size=settings.pool_max_size,
        reset=_keep_session,
        init=prepare_pooled,  # the write statement, prepared on each connection
        timeout=min(settings.statement_timeout_seconds, settings.request_timeout_seconds),
        command_timeout=settings.statement_timeout_seconds,
        server_settings={
            # A transaction whose client went silent (a partition) would hold its stream-row
            # lock, and every replica's appends to that stream with it, until the server's TCP
            # gave up on the client (hours). None of ours waits between its statements, so one
            # idle this long has lost its client: PostgreSQL rolls it back and frees the lock.
            "idle_in_transaction_session_timeout": str(
                max(1000, round(settings.request_timeout_seconds * 1000))
            ),
            # And the server's end of a connection given up on a silent network is closed
            # within ~20 s (its TCP would take far longer to notice).
            **SERVER_KEEPALIVES,
        },
    )
    try:
        places = max(1, int(settings.pool_max_size * settings.pool_tenant_share))
        yield BoundedPool(pool, TenantShares(places))
    finally:
        await pool.close()


async def open_peers(settings: Settings, commits: GroupCommit) -> AsyncIterator[UnixPeers | None]:
    """Under `serve --workers N`, this process among the others (`peers_dir`): each stream's
    appends are committed by one of them (adapters/peers.py). None for a lone process."""
    if settings.peers_dir is None:
        yield None
        return
    peers = UnixPeers(settings.peers_dir, commits.enqueue_until)
    await peers.start()
    commits.forward_to(peers)
    try:
        yield peers
    finally:
        commits.forward_to(None)
        await peers.close()


async def open_wake_bus(
    settings: Settings,
    wake: WakeRegistry,
    tokens: TokenCache | None = None,
    pool: BoundedPool | None = None,
    keys: WebhookKeys | None = None,
) -> AsyncIterator[PostgresWakeBus | None]:
    assert settings.database_url is not None
    bus = PostgresWakeBus(
        settings.database_url,
        wake,
        settings.head_check_seconds,
        tokens=tokens,
        pool=pool,  # the repairs never share the connection they back up
        heartbeat_seconds=settings.wake_heartbeat_seconds,
        dead_seconds=settings.wake_dead_seconds,
        keys_changed=None if keys is None else keys.forget,
    )
    await bus.start()
    try:
        yield bus
    finally:
        await bus.stop()


async def open_object_stores(settings: Settings) -> AsyncIterator[ObjectStores]:
    """The store of each region this deployment writes bodies to (OBJECT_REGIONS, default
    REGION): a directory per region under DATA_DIR/objects, or the S3 bucket (a body's key names
    its tenant, run, stream and object, so regions sharing the bucket never share a key)."""
    if settings.object_store == "filesystem":
        root = settings.data_dir / "objects"
        yield ObjectStores(
            {region: FilesystemObjectStore(root / region) for region in settings.object_regions}
        )
        return
    if settings.object_store != "s3":
        raise ValueError(f"OBJECT_STORE must be filesystem or s3, not {settings.object_store!r}")
    if not settings.s3_bucket:
        raise ValueError("OBJECT_STORE=s3 needs DUCTOR_STREAMS_S3_BUCKET")
    from adapters.objects.s3 import S3ObjectStore  # aioboto3 is loaded only when configured

    stores = {
        region: S3ObjectStore(
            settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url,
            region_name=settings.s3_region,
            timeout_seconds=settings.request_timeout_seconds,
        )
        for region in settings.object_regions
    }
    for store in stores.values():
        await store.start()
    try:
        yield ObjectStores(stores)
    finally:
        for store in stores.values():
            await store.close()


async def open_wait_service(
    settings: Settings, pool: asyncpg.Pool
) -> AsyncIterator[PostgresWaitService | HttpWaitService | DbosWaitService | RestateWaitService]:
    if settings.wait_service == "postgres":
        yield PostgresWaitService(pool)
        return
    service = engine_wait_service(settings)
    # An engine that is down at start-up is not a reason to stop: deliveries wait and retry,
    # with the delivery's last_error saying why. It is worth one line in the log, though.
    problem = None
    if hasattr(service, "check"):
        try:
            problem = await asyncio.wait_for(service.check(), 5.0)
        except TimeoutError:
            problem = "no answer within 5 s"
    if problem:
        log.warning("the %s wait service is not reachable yet: %s", settings.wait_service, problem)
    try:
        yield service
    finally:
        await service.close()


async def open_wake_tokens(rows: PostgresKeyRows | MemoryKeyRows) -> AsyncIterator[WakeTokens]:
    """The secret that signs callback and claim tokens, shared by every replica."""
    yield WakeTokens(await rows.secret("wake-tokens"))


def jwt_callers(settings: Settings) -> JwtCallers | None:
    """The identity provider's JWTs, when one is configured."""
    if not settings.accepts_jwts:
        return None
    # Imported only then: PyJWT and cryptography cost every server process a few MB.
    from adapters.jwks import JwksVerifier

    assert settings.jwt_jwks_url and settings.jwt_issuer and settings.jwt_audience
    verifier = JwksVerifier(
        settings.jwt_jwks_url,
        settings.jwt_issuer,
        settings.jwt_audience,
        fetch_timeout_seconds=settings.jwt_jwks_timeout_seconds,
        refetch_seconds=settings.jwt_jwks_refetch_seconds,
        refresh_seconds=settings.jwt_jwks_refresh_seconds,
    )
    return JwtCallers(
        verifier, settings.jwt_tenant_claim, reverify_seconds=settings.jwt_reverify_seconds
    )


def engine_wait_service(
    settings: Settings,
) -> HttpWaitService | DbosWaitService | RestateWaitService:
    """The configured wait service other than the PostgreSQL table (Settings.from_env has
    checked its variables). Imported only when configured: the HTTP and DBOS clients and what
    they load cost every process several MB otherwise."""
    if settings.wait_service == "dbos":
        assert settings.dbos_system_database_url is not None
        try:
            from adapters.wait_service.dbos import DbosWaitService

            return DbosWaitService(
                settings.dbos_system_database_url, settings.dbos_workflow_id, settings.dbos_topic
            )
        except ImportError as error:
            raise InvalidSetting(
                "DUCTOR_STREAMS_WAIT_SERVICE=dbos needs the `dbos` package: install "
                f"ductor-streams[dbos] ({error})"
            ) from None
        except Exception as error:  # DBOS's client refuses a URL it cannot use
            raise InvalidSetting(
                f"DUCTOR_STREAMS_DBOS_SYSTEM_DATABASE_URL: {type(error).__name__}: {error}"
            ) from None
    if settings.wait_service == "restate":
        assert settings.restate_ingress_url is not None and settings.restate_target is not None
        from adapters.wait_service.restate import RestateWaitService

        return RestateWaitService(
            settings.restate_ingress_url, settings.restate_target, settings.restate_key
        )
    if settings.wait_service != "http" or not settings.wait_service_url:
        raise ValueError("WAIT_SERVICE is postgres, or http with WAIT_SERVICE_URL")
    from adapters.wait_service.http import HttpWaitService

    return HttpWaitService(settings.wait_service_url)


class Container(containers.DeclarativeContainer):
    settings = providers.Dependency(instance_of=Settings)
    clock = providers.Object(utc_now)

    # A slot that `memory_container` fills with a memory adapter says so in its type: what
    # `provided` answers for it is either.
    pool = providers.Resource(open_pool, settings)
    wake = providers.Singleton(WakeRegistry)
    streams: providers.Singleton[PostgresStreams | MemoryStreams] = providers.Singleton(
        PostgresStreams, pool, wake, snapshot_every=settings.provided.snapshot_every_events
    )
    tokens: providers.Singleton[PostgresTokens | MemoryTokens] = providers.Singleton(
        PostgresTokens, pool
    )
    jwt_callers = providers.Singleton(jwt_callers, settings)
    token_cache = providers.Singleton(
        TokenCache, settings.provided.token_cache_seconds, jwts=jwt_callers
    )
    # The webhook signing keys (adapters/webhook_signing.py): the wake bus hears rotations.
    key_rows = providers.Singleton(PostgresKeyRows, pool)
    webhook_keys = providers.Singleton(WebhookKeys, key_rows)
    wake_bus = providers.Resource(open_wake_bus, settings, wake, token_cache, pool, webhook_keys)
    tails = providers.Singleton(LiveTails, streams, wake, linger_seconds=TAIL_LINGER_SECONDS)
    # One cap per principal and process over every live connection: native subscriptions and
    # waiting reads, Durable Streams live=sse and long-poll reads.
    live_slots = providers.Singleton(
        LiveSlots,
        settings.provided.max_subscriptions_per_principal,
        settings.provided.max_subscriptions_per_tenant,
        settings.provided.max_subscriptions_per_run,
    )

    deployment = providers.Singleton(
        Deployment,
        region=settings.provided.region,
        egress_region=settings.provided.egress_region,
    )
    stream_access: providers.Singleton[PostgresStreamAccess | MemoryStreamAccess] = (
        providers.Singleton(PostgresStreamAccess, pool)
    )
    access_log = providers.Singleton(
        AccessLog, stream_access, clock, settings.provided.access_flush_seconds
    )
    definitions = providers.Singleton(Definitions, streams, deployment, access_log)
    # Records and appends, counted where they commit (every surface, every way in).
    throughput = providers.Singleton(Throughput)
    # A tenant's limit on its bytes, decided with each append and creation (tenant_limits.py).
    byte_limit = providers.Singleton(ByteLimit, streams, settings.provided.max_bytes_per_tenant)
    commits = providers.Singleton(
        GroupCommit, streams, throughput=throughput, byte_limit=byte_limit
    )
    peers = providers.Resource(open_peers, settings, commits)
    figures = providers.Singleton(ReadFigures, providers.Singleton(PostgresFigures, pool))

    authenticate = providers.Singleton(Authenticate, tokens, token_cache, jwt_callers)
    issue_token = providers.Singleton(IssueToken, tokens)
    token_limit = providers.Singleton(TokenLimit, tokens, settings.provided.max_tokens_per_tenant)
    mint_token = providers.Singleton(
        MintToken, tokens, settings.provided.max_token_seconds, limit=token_limit
    )
    tenant_tokens = providers.Singleton(TenantTokens, tokens, token_cache)
    stream_limit = providers.Singleton(
        StreamLimit, streams, settings.provided.max_streams_per_tenant
    )
    create_stream = providers.Singleton(
        CreateStream, streams, clock, deployment, access_log, throughput, stream_limit, byte_limit
    )
    list_streams = providers.Singleton(ListStreams, streams, deployment, access_log, stream_access)
    # The default wait service keeps each input record's event in the database, counted in
    # its tenant's bytes (the memory adapters' apart from their streams: not counted).
    copies_kept = providers.Callable(lambda settings: settings.wait_service == "postgres", settings)
    append_records = providers.Singleton(
        AppendRecords, definitions, commits, wake, clock, live_slots, copies_kept, token_cache
    )
    read_records = providers.Singleton(
        ReadRecords, definitions, streams, wake, token_cache, live_slots, tails
    )  # reads pages too
    acknowledge = providers.Singleton(
        Acknowledge, definitions, commits, clock, settings.provided.max_consumers_per_stream
    )
    delete_consumer = providers.Singleton(DeleteConsumer, definitions, commits, clock)
    list_consumers = providers.Singleton(ListConsumers, definitions, streams)
    close_stream = providers.Singleton(CloseStream, definitions, commits, clock)
    set_legal_hold = providers.Singleton(SetLegalHold, definitions, commits, clock)
    delete_stream = providers.Singleton(DeleteStream, definitions, commits, clock, stream_limit)
    delete_run = providers.Singleton(
        DeleteRun, streams, definitions, clock, byte_limit, stream_limit
    )
    list_runs = providers.Singleton(ListRuns, streams, access_log)
    object_stores = providers.Resource(open_object_stores, settings)
    objects = providers.Singleton(
        Objects,
        definitions,
        streams,
        commits,
        object_stores,
        clock,
        max_open_objects=settings.provided.max_open_objects_per_stream,
        wake=wake,
        copies_kept=copies_kept,
        reader=streams,
        slots=live_slots,
        tokens=token_cache,
    )
    list_objects = providers.Singleton(ListOpenObjects, definitions, streams, streams)
    delete_bodies = providers.Singleton(
        DeleteBodies,
        streams,
        object_stores,
        streams,
        clock,
        hold_recheck_seconds=settings.provided.prune_interval_seconds,
    )
    worker_id = providers.Singleton(new_worker_id)
    deletion_jobs = providers.Singleton(
        PostgresDeletionJobs,
        pool,
        worker_id,
        lease_seconds=settings.provided.worker_lease_seconds,
    )
    deleter = providers.Singleton(
        Worker,
        "deleter",
        deletion_jobs,
        delete_bodies.provided.run_job,
        poll_seconds=settings.provided.worker_poll_seconds,
        retry_base_seconds=settings.provided.retry_base_seconds,
    )
    retention_jobs = providers.Singleton(
        PostgresRetentionJobs,
        pool,
        worker_id,
        lease_seconds=settings.provided.worker_lease_seconds,
    )
    input_deliveries: providers.Singleton[PostgresInputDeliveries | MemoryInputDeliveries] = (
        providers.Singleton(
            PostgresInputDeliveries,
            pool,
            worker_id,
            lease_seconds=settings.provided.worker_lease_seconds,
        )
    )
    wait_service = providers.Resource(open_wait_service, settings, pool)
    dispatch = providers.Singleton(
        Dispatch,
        streams,
        streams,
        wait_service,
        input_deliveries,
        retry_base_seconds=settings.provided.retry_base_seconds,
    )
    dispatcher = providers.Singleton(
        Worker,
        "dispatcher",
        input_deliveries,
        dispatch.provided.run_job,
        poll_seconds=settings.provided.dispatch_poll_seconds,
        retry_base_seconds=settings.provided.retry_base_seconds,
        batch=DISPATCH_CONCURRENCY,  # claim only streams it can start: none waits behind another
        concurrency=DISPATCH_CONCURRENCY,
    )
    compaction_jobs = providers.Singleton(
        PostgresCompactionJobs,
        pool,
        worker_id,
        lease_seconds=settings.provided.worker_lease_seconds,
    )
    compact_journal = providers.Singleton(
        CompactJournal,
        streams,
        providers.Singleton(PostgresJournalCompactor, pool),
        hold_recheck_seconds=settings.provided.prune_interval_seconds,
        batch=settings.provided.compaction_batch_events,
    )
    compactor = providers.Singleton(
        Worker,
        "compactor",
        compaction_jobs,
        compact_journal.provided.run_job,
        poll_seconds=settings.provided.worker_poll_seconds,
        retry_base_seconds=settings.provided.retry_base_seconds,
    )
    get_stream = providers.Singleton(GetStream, streams, deployment, input_deliveries, access_log)
    sweep_leases: providers.Singleton[PostgresSweepLeases | MemorySweepLeases] = (
        providers.Singleton(
            PostgresSweepLeases,
            pool,
            worker_id,
            lease_seconds=settings.provided.worker_lease_seconds,
        )
    )
    storage_cleanup: providers.Singleton[PostgresCleanup | MemoryCleanup] = providers.Singleton(
        PostgresCleanup, pool
    )
    cleanup = providers.Singleton(
        Cleanup,
        storage_cleanup,
        object_stores,
        age_seconds=settings.provided.cleanup_age_seconds,
        upload_age_seconds=settings.provided.upload_abandoned_seconds,
    )
    prune_retention = providers.Singleton(
        PruneRetention,
        streams,
        streams,
        commits,
        clock,
        input_deliveries,
        interval_seconds=settings.provided.prune_interval_seconds,
    )
    pruner = providers.Singleton(
        Worker,
        "pruner",
        retention_jobs,
        prune_retention.provided.run_job,
        poll_seconds=settings.provided.worker_poll_seconds,
        retry_base_seconds=settings.provided.retry_base_seconds,
    )
    forks = providers.Singleton(Forks, definitions, streams, streams)
    create_durable_stream = providers.Singleton(
        CreateDurableStream, create_stream, forks, definitions, deployment
    )
    durable_reads = providers.Singleton(
        DurableReads,
        definitions,
        streams,
        tails,
        heartbeat_seconds=settings.provided.sse_heartbeat_seconds,
        tokens=token_cache,
        slots=live_slots,
    )
    subscribe = providers.Singleton(
        Subscribe,
        definitions,
        streams,
        tails,
        live_slots,
        heartbeat_seconds=settings.provided.sse_heartbeat_seconds,
        tokens=token_cache,
    )
    # Subscriptions (application/subscriptions.py): their store, the wake tokens, the sender
    # that checks every address it connects to, and the worker that delivers the wake outbox.
    subscription_store = providers.Singleton(PostgresSubscriptions, pool)
    wake_tokens = providers.Resource(open_wake_tokens, key_rows)
    webhook_sender = providers.Singleton(
        HttpWebhookSender,
        allowed_hosts=providers.Callable(lambda s: frozenset(s.webhook_allowed_hosts), settings),
        loopback=settings.provided.webhook_loopback,
        timeout=settings.provided.webhook_timeout_seconds,
    )
    subscriptions = providers.Singleton(
        Subscriptions,
        subscription_store,
        wake_tokens,
        webhook_sender.provided.check,
        definitions=definitions,
        api_tokens=tokens,
        reader=streams,
        max_per_tenant=settings.provided.max_stored_subscriptions_per_tenant,
    )
    tenant_usage = providers.Singleton(
        TenantUsage,
        streams,
        stream_limit,
        byte_limit,
        tokens,
        token_limit,
        subscriptions.provided.held,
    )
    wake_deliveries = providers.Singleton(
        PostgresWakeDeliveries,
        pool,
        worker_id,
        lease_seconds=settings.provided.worker_lease_seconds,
        per_tenant=settings.provided.webhook_tenant_concurrency,
    )
    deliver_wakes = providers.Singleton(
        DeliverWakes,
        subscription_store,
        subscriptions,
        webhook_sender,
        webhook_keys,
        append_records.provided.notify,
        retry_unit_seconds=settings.provided.webhook_retry_base_seconds,
    )
    wake_deliverer = providers.Singleton(
        Worker,
        "wake-deliverer",
        wake_deliveries,
        deliver_wakes.provided.run_job,
        poll_seconds=settings.provided.subscription_poll_seconds,
        batch=settings.provided.webhook_concurrency,
        concurrency=settings.provided.webhook_concurrency,
    )


def memory_container(settings: Settings | None = None) -> Container:
    """Every port on its memory adapter: the whole application without a database."""
    container = Container(settings=settings or Settings())
    streams = MemoryStreams(container.wake(), container.settings().snapshot_every_events)
    container.pool.override(providers.Object(None))
    container.wake_bus.override(providers.Object(None))
    container.input_deliveries.override(providers.Object(MemoryInputDeliveries(streams)))
    container.wait_service.override(providers.Object(MemoryWaitService()))
    container.copies_kept.override(providers.Object(False))
    container.object_stores.override(
        providers.Object(
            ObjectStores({r: MemoryObjectStore() for r in container.settings().object_regions})
        )
    )
    container.streams.override(providers.Object(streams))
    container.figures.override(providers.Object(ReadFigures(streams)))
    container.stream_access.override(providers.Object(MemoryStreamAccess(streams)))
    container.tokens.override(providers.Object(MemoryTokens()))
    container.sweep_leases.override(providers.Object(MemorySweepLeases()))
    container.storage_cleanup.override(providers.Object(MemoryCleanup(streams)))
    container.subscription_store.override(
        providers.Object(MemorySubscriptions(memory_heads(streams)))
    )
    container.key_rows.override(providers.Object(MemoryKeyRows()))
    return container


@dataclass(frozen=True, slots=True)
class Services:
    """The built use cases, resolved once at start-up (so a wiring mistake fails at start and a
    request only reads an attribute)."""

    authenticate: Authenticate
    mint_token: MintToken
    tenant_tokens: TenantTokens
    create_stream: CreateStream
    get_stream: GetStream
    list_streams: ListStreams
    append_records: AppendRecords
    read_records: ReadRecords
    acknowledge: Acknowledge
    delete_consumer: DeleteConsumer
    list_consumers: ListConsumers
    close_stream: CloseStream
    set_legal_hold: SetLegalHold
    delete_stream: DeleteStream
    delete_run: DeleteRun
    list_runs: ListRuns
    tenant_usage: TenantUsage
    subscribe: Subscribe
    objects: Objects
    list_objects: ListOpenObjects
    # The Durable Streams surface (entrypoints/durable_streams).
    durable_reads: DurableReads
    create_durable_stream: CreateDurableStream
    forks: Forks
    definitions: Definitions
    deployment: Deployment
    subscriptions: Subscriptions
    webhook_keys: WebhookKeys


async def provided(provider: providers.Provider[T]) -> T:
    """What `provider` builds. A provider that depends on an async resource (the pool, the
    wake bus, the stores) answers an awaitable, and so does everything built on it: awaited."""
    value: T | Awaitable[T] = provider()
    if inspect.isawaitable(value):
        return await value
    return value


async def start(container: Container) -> Services:
    """Open the resources and build every use case once."""
    waiting.configure(container.settings().request_timeout_seconds)
    waiting.configure_turns(
        container.settings().requests_at_work_per_tenant,
        container.settings().requests_waiting_per_tenant,
        container.settings().max_answer_bytes_per_tenant,
        container.settings().max_answer_bytes_per_process,
    )
    opening = container.init_resources()
    if opening is not None:  # None when every resource is overridden (memory_container)
        await opening
    c = container
    services = Services(
        authenticate=await provided(c.authenticate),
        mint_token=await provided(c.mint_token),
        tenant_tokens=await provided(c.tenant_tokens),
        create_stream=await provided(c.create_stream),
        create_durable_stream=await provided(c.create_durable_stream),
        subscriptions=await provided(c.subscriptions),
        webhook_keys=await provided(c.webhook_keys),
        get_stream=await provided(c.get_stream),
        list_streams=await provided(c.list_streams),
        append_records=await provided(c.append_records),
        read_records=await provided(c.read_records),
        acknowledge=await provided(c.acknowledge),
        delete_consumer=await provided(c.delete_consumer),
        list_consumers=await provided(c.list_consumers),
        close_stream=await provided(c.close_stream),
        set_legal_hold=await provided(c.set_legal_hold),
        delete_stream=await provided(c.delete_stream),
        delete_run=await provided(c.delete_run),
        list_runs=await provided(c.list_runs),
        tenant_usage=await provided(c.tenant_usage),
        subscribe=await provided(c.subscribe),
        objects=await provided(c.objects),
        list_objects=await provided(c.list_objects),
        durable_reads=await provided(c.durable_reads),
        forks=await provided(c.forks),
        definitions=await provided(c.definitions),
        deployment=await provided(c.deployment),
    )
    (await provided(c.access_log)).start()
    return services


def upload_sweep_name(settings: Settings) -> str:
    """The abandoned-upload sweep is one per set of stores: a filesystem store is this host's
    directory (another host's is its own), an S3 bucket is shared by every replica using it."""
    regions = ",".join(sorted(settings.object_regions))
    if settings.object_store == "filesystem":
        where = f"{socket.gethostname()}:{(settings.data_dir / 'objects').resolve()}"
    else:
        where = f"s3:{settings.s3_endpoint_url or ''}:{settings.s3_bucket}"
    return f"sweep-abandoned-uploads:{regions}:{where}"


async def workers(container: Container) -> list[Runs]:
    """The background workers: pruner, deletion worker, input dispatcher and journal
    compactor (leased job queues), and the leased sweeps, each run by one worker across every
    replica at a time: orphan sweeper (expires open intents), receipt sweeper (append receipts
    past the idempotency window), expiry sweep (erases expired streams) and the storage cleanup
    (docs/architecture.md, "Storage cleanup")."""
    settings = container.settings()
    leases = await provided(container.sweep_leases)
    objects = await provided(container.objects)
    streams = await provided(container.streams)
    cleanup = await provided(container.cleanup)
    subscription_store = await provided(container.subscription_store)
    tokens = await provided(container.tokens)
    wake_deliverer = await provided(container.wake_deliverer)
    wake_scheduler = WakeScheduler(
        await provided(container.subscriptions),
        await provided(container.wake),
        settings.subscription_poll_seconds,
        settings.subscription_sweep_seconds,
    )
    window = timedelta(seconds=settings.idempotency_window_seconds)

    def sweep(
        name: str, tick: Callable[[], Coroutine[Any, Any, int]], interval: float
    ) -> LeasedSweep:
        return LeasedSweep(
            name,
            tick,
            interval,
            leases,
            poll_seconds=settings.worker_lease_seconds,  # capped at the interval
            retry_base_seconds=settings.retry_base_seconds,
        )

    every = settings.cleanup_interval_seconds
    access = await provided(container.stream_access)
    access_log = await provided(container.access_log)
    expire_streams = SweepExpired(
        streams,
        access,
        container.clock(),
        grace=timedelta(seconds=settings.expiry_grace_seconds),
        access_log=access_log,
    )
    job_queues = (container.pruner, container.deleter, container.dispatcher, container.compactor)
    return [
        *[await provided(queue) for queue in job_queues],
        sweep("expire-intents", objects.expire_due, settings.sweep_interval_seconds),
        sweep(
            "forget-receipts",
            lambda: streams.forget_receipts(window),
            settings.sweep_interval_seconds,
        ),
        sweep("forget-delivered-inputs", cleanup.delivered_inputs, every),
        sweep("forget-done-deletions", cleanup.done_deletions, every),
        sweep("forget-gap-evidence", cleanup.gap_evidence, every),
        sweep("fold-tenant-counts", cleanup.tenant_counts, every),
        sweep(
            "forget-ended-tokens",
            lambda: tokens.forget_ended(timedelta(seconds=settings.cleanup_age_seconds)),
            every,
        ),
        sweep(upload_sweep_name(settings), cleanup.abandoned_uploads, every),
        sweep("expire-streams", expire_streams, settings.expiry_interval_seconds),
        wake_deliverer,
        sweep(
            "forget-delivered-wakes",
            lambda: subscription_store.forget_delivered(settings.cleanup_age_seconds),
            every,
        ),
        wake_scheduler,
    ]


async def stop(container: Container) -> None:
    await (await provided(container.commits)).drain()
    await (await provided(container.access_log)).close()  # a last flush: a graceful stop loses none
    closing = container.shutdown_resources()
    if closing is not None:
        await closing
