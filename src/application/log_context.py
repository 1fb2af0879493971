"""Which stream a log line is about, carried in a context variable so every line written while
handling it names the stream and its pinned log region (and never its payloads)."""

from __future__ import annotations

from contextvars import ContextVar

from domain.stream import StreamKey

_about: ContextVar[dict[str, str] | None] = ContextVar("ductor_stream_log", default=None)
request_id: ContextVar[str | None] = ContextVar("ductor_request_id", default=None)


def about_stream(key: StreamKey, log_region: str) -> None:
    _about.set(
        {
            "tenant": key.tenant,
            "run_id": key.run_id,
            "stream_id": key.stream_id,
            "log_region": log_region,
        }
    )


def stream_fields() -> dict[str, str]:
    return _about.get() or {}


def forget_stream() -> None:
    _about.set(None)
