"""A logged traceback is bounded: a deep recursion once wrote 222 KB to the log per request."""

from __future__ import annotations

import json
import logging
import sys

from entrypoints.logs import MAX_TRACEBACK_CHARS, JsonFormatter


def ping(n: int) -> int:
    return pong(n + 1)


def pong(n: int) -> int:
    return ping(n + 1)


def test_a_recursion_error_logs_its_start_and_its_end_only() -> None:
    try:
        ping(0)
    except RecursionError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "boom", (), exc_info)
    line = json.loads(JsonFormatter().format(record))
    exception = line["exception"]
    assert len(exception) < MAX_TRACEBACK_CHARS + 100
    assert exception.startswith("Traceback (most recent call last):")
    assert "characters of traceback left out" in exception
    assert exception.rstrip().endswith("RecursionError: maximum recursion depth exceeded")


def test_a_short_traceback_is_logged_whole() -> None:
    try:
        raise ValueError("short")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "boom", (), exc_info)
    exception = json.loads(JsonFormatter().format(record))["exception"]
    assert "left out" not in exception
    assert exception.endswith("ValueError: short")
