"""OpenTelemetry tracing, on when the standard OTLP endpoint variables say where to export.

`OTEL_EXPORTER_OTLP_ENDPOINT` (spans go to its `/v1/traces`) or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the whole URL) turns it on: spans are batched and posted as
OTLP/HTTP protobuf, the service named by `OTEL_SERVICE_NAME` (`ductor-streams` by default); the
SDK reads its other standard variables itself (headers, timeout, sampler, batch sizes). Without
either variable nothing is imported or installed, and every span of application/tracing.py is
its no-op.

Each server process (and `worker`) configures its own exporter when it starts, and flushes it
when it stops."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from application import tracing

DEFAULT_SERVICE_NAME = "ductor-streams"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_provider: Any = None


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces (an endpoint is set and not empty)."""
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def configure(environ: Mapping[str, str] = os.environ, exporter: Any = None) -> bool:
    """Turn tracing on if the environment asks for it (or `exporter` is given: tests hand an
    in-memory one); True if it is on."""
    global _provider
    if _provider is not None:
        return True
    if exporter is None and not wanted(environ):
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    name = environ.get("OTEL_SERVICE_NAME", "").strip() or DEFAULT_SERVICE_NAME
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _provider = provider
    tracing.enable(provider.get_tracer("ductor_streams"))
    return True


def flush() -> None:
    """Export what is still batched (a server stopping; the provider also shuts down, and
    flushes, when the process exits)."""
    if _provider is not None:
        _provider.force_flush()


def shutdown() -> None:
    """Export what is still batched, and turn tracing off."""
    global _provider
    provider, _provider = _provider, None
    tracing.disable()
    if provider is not None:
        provider.shutdown()
