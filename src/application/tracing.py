"""Tracing: spans for a request's use case, its commit, the live delivery of what it appended and
the input dispatch of it, through OpenTelemetry's API.

Off until the entrypoint hands a tracer to `enable` (it does when an OTLP endpoint is
configured, docs/configuration.md). Off costs nothing worth measuring: `span()` answers one
shared no-op context manager, `current()` None, and OpenTelemetry is not even imported.

Live delivery and input dispatch happen later, in other tasks (and the records they carry were
often appended by several requests), so they are not children of an append's span but linked to
it: `AppendTraces` keeps, per stream, the span context of the latest appends with the sequences
each appended, and the tail (application/live.py) and the dispatcher
(application/input_delivery.py) link their spans to the appends whose records they handle."""

from __future__ import annotations

import functools
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from domain.stream import StreamKey

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext, Tracer

# OpenTelemetry's span kinds, named without importing it.
Kind = Literal["internal", "server", "client", "producer", "consumer"]


class _Off:
    """What `span()` answers while tracing is off: enters to None, does nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


OFF = _Off()

_tracer: Tracer | None = None


def enable(tracer: Tracer) -> None:
    global _tracer
    _tracer = tracer


def disable() -> None:
    global _tracer
    _tracer = None


def on() -> bool:
    return _tracer is not None


def span(
    name: str,
    *,
    kind: Kind = "internal",
    attributes: Mapping[str, str | int | bool] | None = None,
    links: Iterable[SpanContext] = (),
    parent: SpanContext | None = None,
) -> AbstractContextManager[Span | None]:
    """A span, current while the block runs (None while tracing is off): a child of the
    current span, or of `parent`, linked to each context of `links`."""
    tracer = _tracer
    if tracer is None:
        return OFF
    from opentelemetry import trace

    context = None
    if parent is not None:
        context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    return tracer.start_as_current_span(
        name,
        context=context,
        kind=trace.SpanKind[kind.upper()],
        attributes=attributes,
        links=[trace.Link(c) for c in links],
    )


def start(
    name: str,
    *,
    links: Iterable[SpanContext] = (),
    attributes: Mapping[str, str | int | bool] | None = None,
) -> Span | None:
    """A span begun now and not made current (its owner ends it): for work that spans a
    generator's `yield`, where a current span could not be detached in order. Under the
    current span, if any."""
    tracer = _tracer
    if tracer is None:
        return None
    from opentelemetry import trace

    return tracer.start_span(name, attributes=attributes, links=[trace.Link(c) for c in links])


def stream_attributes(key: StreamKey) -> dict[str, str | int | bool]:
    return {
        "ductor_streams.tenant": key.tenant,
        "ductor_streams.run_id": key.run_id,
        "ductor_streams.stream_id": key.stream_id,
    }


_P = ParamSpec("_P")
_R = TypeVar("_R")


def use_case(
    name: str,
) -> Callable[[Callable[_P, Awaitable[_R]]], Callable[_P, Awaitable[_R]]]:
    """A use case's span around each call of the decorated coroutine function."""

    def decorate(call: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
        @functools.wraps(call)
        async def traced(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            if _tracer is None:
                return await call(*args, **kwargs)
            with span(name, attributes={"ductor_streams.use_case": name}):
                return await call(*args, **kwargs)

        return traced

    return decorate


@contextmanager
def _server_span(
    tracer: Tracer, name: str, traceparent: str | None, tracestate: str | None
) -> Iterator[Span]:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {} if traceparent is None else {"traceparent": traceparent}
    if traceparent is not None and tracestate is not None:
        carrier["tracestate"] = tracestate
    context = TraceContextTextMapPropagator().extract(carrier)
    with tracer.start_as_current_span(name, context=context, kind=trace.SpanKind.SERVER) as s:
        yield s


def request_span(
    name: str, traceparent: str | None, tracestate: str | None = None
) -> AbstractContextManager[Span | None]:
    """The span of a request: a child of the caller's span when it sent a valid W3C
    `traceparent` (a malformed one is ignored, as the standard says), a root otherwise."""
    tracer = _tracer
    if tracer is None:
        return OFF
    return _server_span(tracer, name, traceparent, tracestate)


def current() -> SpanContext | None:
    """The current span's context, if tracing is on and a span is current."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return context if context.is_valid else None


def log_ids() -> tuple[str, str] | None:
    """(trace_id, span_id) of the current span, in hex, for a log line."""
    context = current()
    if context is None:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def set_attributes(target: Any, attributes: Mapping[str, str | int | bool]) -> None:
    """Set attributes on a span `span()` answered (nothing when it answered None)."""
    if target is not None:
        target.set_attributes(attributes)


def traceparent(context: SpanContext) -> str:
    """The W3C `traceparent` of a span context."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def from_traceparent(value: str) -> SpanContext | None:
    """The span context a W3C `traceparent` names (None if it is not a valid one)."""
    if _tracer is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract({"traceparent": value})
    found = trace.get_current_span(context).get_span_context()
    return found if found.is_valid else None


class AppendTraces:
    """Per stream, the span contexts of its latest appends and the last sequence each appended
    (at most `per_stream` appends for at most `streams` streams, the least recent forgotten),
    kept only while tracing is on: what links a delivery or a dispatch to the appends whose
    records it carries."""

    def __init__(self, per_stream: int = 64, streams: int = 4096) -> None:
        self._per_stream = per_stream
        self._streams = streams
        self._appends: OrderedDict[StreamKey, deque[tuple[int, int, SpanContext]]] = OrderedDict()
        # Per stream, the contexts of the appends of the batch being committed: their records
        # can be read (and delivered) before the leader learns their sequences.
        self._committing: dict[StreamKey, list[SpanContext]] = {}

    def committing(self, key: StreamKey, contexts: list[SpanContext]) -> None:
        """A batch with these appends to `key` is being committed: a record of `key` past every
        sequence recorded so far is theirs until `committed`."""
        self._committing[key] = contexts

    def committed(self, key: StreamKey) -> None:
        self._committing.pop(key, None)

    def appended(self, key: StreamKey, first: int, last: int, context: SpanContext) -> None:
        appends = self._appends.get(key)
        if appends is None:
            appends = self._appends[key] = deque(maxlen=self._per_stream)
            if len(self._appends) > self._streams:
                self._appends.popitem(last=False)
        else:
            self._appends.move_to_end(key)
        appends.append((first, last, context))

    def of(self, key: StreamKey, first: int, last: int) -> list[SpanContext]:
        """The contexts of the appends that brought any of the sequences `first..last` (with
        those being committed, for sequences past every one recorded)."""
        appends = self._appends.get(key)
        found = [c for a, b, c in appends if a <= last and b >= first] if appends else []
        committing = self._committing.get(key)
        if committing and (not appends or last > appends[-1][1]):
            found += committing
        return found


# The process's: written by the group commit and a creation, read by live delivery and dispatch.
APPENDS = AppendTraces()
