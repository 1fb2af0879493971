"""Configuration from DUCTOR_STREAMS_* environment variables (docs/configuration.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

PREFIX = "DUCTOR_STREAMS_"


class Settings(msgspec.Struct, frozen=True):
    database_url: str | None = None
    data_dir: Path = Path("./.ductor-streams")
    object_store: str = "filesystem"
    region: str = "local"
    egress_region: str = "local"
    bootstrap_token: str | None = None
    wait_service: str = "postgres"
    wait_service_url: str | None = None
    pool_min_size: int = 2
    pool_max_size: int = 20
    token_cache_seconds: float = 10.0
    log_level: str = "INFO"
    sse_heartbeat_seconds: float = 15.0
    head_check_seconds: float = 2.0
    max_subscriptions_per_principal: int = 1_000
    run_workers: bool = False
    worker_lease_seconds: float = 30.0
    worker_poll_seconds: float = 1.0
    prune_interval_seconds: float = 5.0
    object_regions: tuple[str, ...] = ("local",)
    s3_endpoint_url: str | None = None
    s3_bucket: str | None = None
    s3_region: str | None = None
    sweep_interval_seconds: float = 30.0
    dispatch_poll_seconds: float = 0.1
    retry_base_seconds: float = 1.0

    @property
    def embedded(self) -> bool:
        return self.database_url is None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(PREFIX + name)
            return value if value not in (None, "") else None

        region = get("REGION") or "local"
        return cls(
            database_url=get("DATABASE_URL"),
            data_dir=Path(get("DATA_DIR") or "./.ductor-streams"),
            object_store=get("OBJECT_STORE") or "filesystem",
            region=region,
            egress_region=get("EGRESS_REGION") or region,
            bootstrap_token=get("BOOTSTRAP_TOKEN"),
            wait_service=get("WAIT_SERVICE") or "postgres",
            wait_service_url=get("WAIT_SERVICE_URL"),
            pool_min_size=int(get("POOL_MIN_SIZE") or 2),
            pool_max_size=int(get("POOL_MAX_SIZE") or 20),
            token_cache_seconds=float(get("TOKEN_CACHE_SECONDS") or 10.0),
            log_level=(get("LOG_LEVEL") or "INFO").upper(),
            sse_heartbeat_seconds=float(get("SSE_HEARTBEAT_SECONDS") or 15.0),
            head_check_seconds=float(get("HEAD_CHECK_SECONDS") or 2.0),
            max_subscriptions_per_principal=int(get("MAX_SUBSCRIPTIONS_PER_PRINCIPAL") or 1_000),
            run_workers=(get("RUN_WORKERS") or "0") in {"1", "true", "yes"},
            worker_lease_seconds=float(get("WORKER_LEASE_SECONDS") or 30.0),
            worker_poll_seconds=float(get("WORKER_POLL_SECONDS") or 1.0),
            prune_interval_seconds=float(get("PRUNE_INTERVAL_SECONDS") or 5.0),
            object_regions=tuple(
                r.strip() for r in (get("OBJECT_REGIONS") or region).split(",") if r.strip()
            ),
            s3_endpoint_url=get("S3_ENDPOINT_URL"),
            s3_bucket=get("S3_BUCKET"),
            s3_region=get("S3_REGION"),
            sweep_interval_seconds=float(get("SWEEP_INTERVAL_SECONDS") or 30.0),
            dispatch_poll_seconds=float(get("DISPATCH_POLL_SECONDS") or 0.1),
            retry_base_seconds=float(get("RETRY_BASE_SECONDS") or 1.0),
        )
