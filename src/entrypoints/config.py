"""Configuration from DUCTOR_STREAMS_* environment variables (docs/configuration.md).

Each setting is declared once, below, with its type and default; the variable is the field's
name upper-cased after the prefix. msgspec converts and checks the environment's strings, so a
bad value stops the process with one line naming the variable."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_type_hints

import msgspec

PREFIX = "DUCTOR_STREAMS_"

Positive = Annotated[float, msgspec.Meta(gt=0)]
Count = Annotated[int, msgspec.Meta(ge=1)]
# `Name/handler`: a Restate virtual object or workflow and the handler each input record calls.
RESTATE_TARGET = r"[A-Za-z_][A-Za-z0-9_.-]*/[A-Za-z_][A-Za-z0-9_]*"
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]


class InvalidSetting(ValueError):
    """A DUCTOR_STREAMS_* variable whose value cannot be used."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    database_url: str | None = None
    data_dir: Path = Path("./.ductor-streams")
    host: str = "127.0.0.1"
    port: Port = 8080
    header_read_timeout_seconds: Positive = 30.0
    # A client connection whose peer takes nothing this long (data unacknowledged, or its
    # window kept shut) is dropped by the kernel (entrypoints/client_sockets.py). 0: never.
    # (At 60 s, readers of 1-4 KB/s with small windows were cut: docs/architecture.md.)
    client_silence_seconds: Annotated[float, msgspec.Meta(ge=0, le=86_400)] = 300.0
    # A request body's next piece is waited for this long, and a body (but an object upload's)
    # must be complete this long after its request arrived: 408 otherwise (edge/body.py).
    body_idle_seconds: Positive = 30.0
    body_seconds: Positive = 120.0
    # From 5 s after it is first read, a body must average this many bytes a second (0: no
    # floor), and a tenant may have this many bodies arriving, and this many of their bytes held,
    # per process: 429 `too-many-requests` past those (edge/body.py).
    body_min_bytes_per_second: Annotated[float, msgspec.Meta(ge=0)] = 1024.0
    max_arriving_bodies_per_tenant: Count = 1_000
    max_body_bytes_per_tenant: Count = 256 * 1024 * 1024
    object_store: Literal["filesystem", "s3"] = "filesystem"
    region: str = "local"
    egress_region: str = "local"  # from_env: REGION when unset (and for object_regions)
    object_regions: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)] = ("local",)
    bootstrap_token: str | None = None
    wait_service: Literal["postgres", "http", "dbos", "restate"] = "postgres"
    wait_service_url: str | None = None
    # WAIT_SERVICE=dbos and =restate (docs/integrators.md): where input records are delivered.
    dbos_system_database_url: str | None = None
    dbos_workflow_id: str = "{run_id}"
    dbos_topic: str = "{stream_id}"
    restate_ingress_url: str | None = None
    restate_target: str | None = None
    restate_key: str = "{run_id}"
    # Set by `serve --workers N` for its processes: the private directory where each listens,
    # so that a stream's appends are committed by one of them (adapters/peers.py).
    peers_dir: Path | None = None
    # Set with it: the supervisor's pid (its processes stop once it is gone).
    supervisor_pid: int | None = None
    pool_min_size: Annotated[int, msgspec.Meta(ge=0)] = 2
    pool_max_size: Count = 20
    # The share of those connections one tenant's requests may use at once (adapters/postgres/
    # bounded.py): the rest stay for the other tenants, the append leaders and the workers.
    pool_tenant_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.75
    # A tenant's requests at work at once in a process (application/waiting.py, "Turns at
    # work"); past it, its next request waits for one of its own. 0: no limit.
    requests_at_work_per_tenant: Annotated[int, msgspec.Meta(ge=0)] = 64
    # Its arriving requests that may wait so at once; one more is 429 at once. 0: no limit.
    requests_waiting_per_tenant: Annotated[int, msgspec.Meta(ge=0)] = 1024
    # Bytes of its large answers being written (not yet taken by their clients) past which a
    # tenant's next requests are 429 at once (entrypoints/edge/writing.py). 0: no limit.
    max_answer_bytes_per_tenant: Annotated[int, msgspec.Meta(ge=0)] = 256 * 1024 * 1024
    # Of all tenants' together: past it, a tenant holding at least its equal share is refused.
    max_answer_bytes_per_process: Annotated[int, msgspec.Meta(ge=0)] = 1024 * 1024 * 1024
    # A piece of a large answer its client has not taken within this long ends the answer.
    answer_stall_seconds: Positive = 30.0
    statement_timeout_seconds: Positive = 10.0
    # The most a request waits on PostgreSQL in all (application/waiting.py) before its 503.
    request_timeout_seconds: Positive = 5.0
    # The wake bus proves its connection alive by a heartbeat through PostgreSQL: sent when it
    # heard nothing for this long; polling starts after two such intervals of silence, and the
    # connection is replaced after WAKE_DEAD_SECONDS of it.
    wake_heartbeat_seconds: Positive = 0.5
    wake_dead_seconds: Positive = 5.0
    token_cache_seconds: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    sse_heartbeat_seconds: Positive = 15.0
    head_check_seconds: Positive = 2.0
    max_subscriptions_per_principal: Count = 1_000
    # Every principal of a tenant together: a tenant's administrator may mint any number.
    max_subscriptions_per_tenant: Count = 10_000
    # Every token restricted to runs that include the run together: an administrator of one run
    # may mint any number too.
    max_subscriptions_per_run: Count = 1_000
    # The stored subscriptions (webhook, pull-wake) a tenant may hold; 0: no limit.
    max_stored_subscriptions_per_tenant: Annotated[int, msgspec.Meta(ge=0)] = 10_000
    # The streams a tenant may hold (application/tenant_limits.py); past it, a creation is 409
    # `quota-exhausted`. 0: no limit.
    max_streams_per_tenant: Annotated[int, msgspec.Meta(ge=0)] = 1_000_000
    # The tokens a tenant may hold while its administrators mint more over HTTP (revoked and
    # expired ones count until they are forgotten: application/tenant_limits.py); past it, a
    # mint is 409 `quota-exhausted`. 0: no limit.
    max_tokens_per_tenant: Annotated[int, msgspec.Meta(ge=0)] = 1_000_000
    # The bytes a tenant's records may hold (application/tenant_limits.py); past it, an append
    # or an object's intent is 409 `quota-exhausted`. 0: no limit.
    max_bytes_per_tenant: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 1 << 40
    # Open (prepared or uploaded) object intents per stream; each lives in the stream's state,
    # which every commit of the stream rewrites: ~600 B each (docs/configuration.md says why 32).
    max_open_objects_per_stream: Count = 32
    # Consumers per stream, of each kind: those that hold credit, and those that track.
    max_consumers_per_stream: Count = 1_000
    run_workers: bool = False
    worker_lease_seconds: Positive = 6.0
    worker_poll_seconds: Positive = 1.0
    prune_interval_seconds: Positive = 5.0
    s3_endpoint_url: str | None = None
    s3_bucket: str | None = None
    s3_region: str | None = None
    sweep_interval_seconds: Positive = 30.0
    idempotency_window_seconds: Positive = 86400.0
    snapshot_every_events: Count = 1000
    compaction_batch_events: Count = 1000
    cleanup_age_seconds: Positive = 86400.0
    upload_abandoned_seconds: Positive = 86400.0
    cleanup_interval_seconds: Positive = 300.0
    dispatch_poll_seconds: Positive = 0.1
    access_flush_seconds: Positive = 1.0
    expiry_interval_seconds: Positive = 5.0
    expiry_grace_seconds: Positive = 5.0
    retry_base_seconds: Positive = 1.0
    # The Durable Streams surface (docs/durable-streams.md): how long a live=long-poll read
    # waits before its 204, and the browser origins allowed to call either surface (CORS).
    long_poll_seconds: Annotated[float, msgspec.Meta(gt=0, le=300)] = 15.0
    cors_origins: tuple[str, ...] = ()
    # Identity (docs/configuration.md, "Tokens"): the longest life of a token minted over HTTP,
    # and the identity provider whose JWTs are accepted as Bearer tokens (all three of URL,
    # issuer and audience, or none).
    max_token_seconds: Count = 86_400
    jwt_jwks_url: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_tenant_claim: Annotated[str, msgspec.Meta(min_length=1)] = "tenant"
    jwt_jwks_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=60)] = 5.0
    jwt_jwks_refetch_seconds: Positive = 30.0
    jwt_jwks_refresh_seconds: Positive = 300.0
    jwt_reverify_seconds: Positive = 60.0
    # Subscriptions (docs/configuration.md, "Subscriptions"): hosts a webhook may name whatever
    # they resolve to, how often the scheduler looks for pending work (and at every
    # subscription), the webhook's timeout, the unit of the retry backoff (1 s: 1, 2, 4 ... 60 s),
    # how many deliveries run at once per process, and the public URL callbacks and the JWKS are
    # announced under.
    webhook_allowed_hosts: tuple[str, ...] = ()
    # Whether a webhook URL may name a loopback host (http:// too): a development receiver on
    # this machine. Off, a tenant's admin token cannot have the service POST to the host's own
    # ports (`python3 dev.py serve` turns it on).
    webhook_loopback: bool = False
    subscription_poll_seconds: Positive = 0.05
    subscription_sweep_seconds: Positive = 5.0
    webhook_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=60)] = 10.0
    webhook_retry_base_seconds: Positive = 1.0
    webhook_concurrency: Count = 32
    # Deliveries of one tenant under way at once, across every process (the others' go out
    # meanwhile, whatever that tenant's receivers do).
    webhook_tenant_concurrency: Count = 8
    public_url: str | None = None

    @property
    def embedded(self) -> bool:
        return self.database_url is None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings the environment gives (an empty value counts as unset). Raises
        InvalidSetting naming the variable when a value does not fit its setting."""
        env = os.environ if environ is None else environ
        given: dict[str, Any] = {}
        for name in cls.__struct_fields__:
            value = env.get(PREFIX + name.upper(), "").strip()
            if value:
                given[name] = value
        given.setdefault("egress_region", given.get("region", "local"))
        regions = given.get("object_regions", given.get("region", "local"))
        given["object_regions"] = [r.strip() for r in regions.split(",") if r.strip()]
        origins = given.get("cors_origins", "")
        given["cors_origins"] = [o.strip() for o in origins.split(",") if o.strip()]
        hosts = given.get("webhook_allowed_hosts", "")
        given["webhook_allowed_hosts"] = [
            h.strip().lower().rstrip(".") for h in hosts.split(",") if h.strip()
        ]
        if "log_level" in given:
            given["log_level"] = given["log_level"].upper()
        try:
            settings = msgspec.convert(given, cls, strict=False, dec_hook=_decode)
        except msgspec.ValidationError as error:
            raise _naming_the_variable(error, given) from None
        if settings.pool_min_size > settings.pool_max_size:
            raise InvalidSetting(
                f"{PREFIX}POOL_MIN_SIZE={settings.pool_min_size} is above "
                f"{PREFIX}POOL_MAX_SIZE={settings.pool_max_size}"
            )
        if settings.expiry_grace_seconds < 2 * settings.access_flush_seconds:
            raise InvalidSetting(
                f"{PREFIX}EXPIRY_GRACE_SECONDS={settings.expiry_grace_seconds} is below twice "
                f"{PREFIX}ACCESS_FLUSH_SECONDS={settings.access_flush_seconds}: accesses lost in "
                "a crash could get a stream in use erased"
            )
        jwt = (settings.jwt_jwks_url, settings.jwt_issuer, settings.jwt_audience)
        if any(jwt) and not all(jwt):
            raise InvalidSetting(
                f"{PREFIX}JWT_JWKS_URL, {PREFIX}JWT_ISSUER and {PREFIX}JWT_AUDIENCE are set "
                "together (JWTs are accepted) or not at all"
            )
        if settings.jwt_jwks_url and not settings.jwt_jwks_url.startswith(("https://", "http://")):
            raise InvalidSetting(f"{PREFIX}JWT_JWKS_URL must be an http(s) URL")
        url = settings.database_url
        if url and url.partition("://")[0].lower() not in ("postgresql", "postgres"):
            # The value itself is not shown: a URL of a database may hold its password.
            raise InvalidSetting(f"{PREFIX}DATABASE_URL: expected a postgresql:// URL")
        _check_wait_service(settings)
        return settings

    @property
    def accepts_jwts(self) -> bool:
        return self.jwt_jwks_url is not None


def _check_wait_service(settings: Settings) -> None:
    """A workflow-engine wait service that cannot work stops the process at start-up, once,
    naming the variable; one that is only unreachable does not (deliveries retry)."""
    if settings.wait_service == "dbos":
        if not settings.dbos_system_database_url:
            raise InvalidSetting(
                f"{PREFIX}WAIT_SERVICE=dbos needs {PREFIX}DBOS_SYSTEM_DATABASE_URL "
                "(the DBOS application's system database, postgresql://...)"
            )
        if not settings.dbos_system_database_url.startswith(("postgresql://", "postgres://")):
            raise InvalidSetting(f"{PREFIX}DBOS_SYSTEM_DATABASE_URL: expected a postgresql:// URL")
        _check_templates(settings, "dbos_workflow_id", "dbos_topic")
    if settings.wait_service == "restate":
        if not settings.restate_ingress_url or not settings.restate_target:
            raise InvalidSetting(
                f"{PREFIX}WAIT_SERVICE=restate needs {PREFIX}RESTATE_INGRESS_URL and "
                f"{PREFIX}RESTATE_TARGET"
            )
        if not settings.restate_ingress_url.startswith(("http://", "https://")):
            raise InvalidSetting(f"{PREFIX}RESTATE_INGRESS_URL: expected an http(s) URL")
        _check_templates(settings, "restate_key")
        if not re.fullmatch(RESTATE_TARGET, settings.restate_target):
            raise InvalidSetting(
                f"{PREFIX}RESTATE_TARGET={settings.restate_target!r}: expected `Name/handler` "
                "(a virtual object or workflow and its handler, e.g. `Inbox/on_record`)"
            )


def _check_templates(settings: Settings, *names: str) -> None:
    from adapters.wait_service.templates import check_template

    for name in names:
        try:
            check_template(PREFIX + name.upper(), getattr(settings, name))
        except ValueError as error:
            raise InvalidSetting(str(error)) from None


def _decode(type_: type, value: Any) -> Any:
    if type_ is Path and isinstance(value, str):
        return Path(value)
    raise NotImplementedError


_READABLE = (
    ("Expected `int`, got `str`", "expected a whole number"),
    ("Expected `float`, got `str`", "expected a number"),
    ("Expected `bool`, got `str`", "expected true or false"),
)


def _naming_the_variable(
    error: msgspec.ValidationError, given: Mapping[str, Any]
) -> InvalidSetting:
    # msgspec ends its message with the path of the field: "Expected `int`, got `str` - at `$.port`"
    reason, _, where = str(error).rpartition(" - at ")
    match = re.match(r"`\$\.(\w+)", where)
    if not match:
        return InvalidSetting(str(error))
    name = match.group(1)
    value = given.get(name)
    shown = ",".join(value) if isinstance(value, list) else value
    choices = get_args(get_type_hints(Settings)[name])
    reason = reason.replace("`array`", "a comma-separated list")
    # msgspec names the types; a setting is text: say what text it takes.
    for typed, text in _READABLE:
        reason = reason.replace(typed, text)
    if reason.startswith("Invalid enum value") and choices:
        reason = "expected one of " + ", ".join(choices)
    return InvalidSetting(f"{PREFIX}{name.upper()}={shown!r}: {reason[:1].lower()}{reason[1:]}")
