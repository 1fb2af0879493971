"""A request handed straight to an ASGI application, its headers exactly as given (a test
client would join a repeated header's values with ", ")."""

from __future__ import annotations

from typing import Any


def http_scope(
    method: str, path: str, headers: list[tuple[bytes, bytes]], host: str = "testserver"
) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": (host, 80),
    }
