"""JSON answers sent as they are, for the hottest routes.

Litestar turns a handler's return value into a response through its response pipeline (type
lookup, serializer, header and cookie handling, an ASGI response object). For a route that runs
thousands of times a second and always answers one small msgspec Struct, that pipeline cost about
a tenth of the request. `JsonAnswer` is the ASGI app the pipeline would have produced: the
value encoded by msgspec, `content-type` and `content-length`, and any extra headers. Errors are
unaffected: they are raised, and answered by the application's exception handlers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

_encode = msgspec.json.Encoder().encode

_JSON = (b"content-type", b"application/json")


class JsonAnswer:
    __slots__ = ("_body", "_headers", "_status")

    def __init__(self, value: Any, status: int, headers: Sequence[tuple[bytes, bytes]] = ()):
        self._body = _encode(value)
        self._status = status
        self._headers = [_JSON, (b"content-length", b"%d" % len(self._body)), *headers]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": self._status, "headers": self._headers}
        )
        await send({"type": "http.response.body", "body": self._body})

    @property
    def status(self) -> int:
        return self._status


class EncodedJsonAnswer(JsonAnswer):
    """A JsonAnswer whose body is already JSON bytes (a page of records, `StoredPage.json`)."""

    __slots__ = ()

    def __init__(self, body: bytes, status: int = 200) -> None:
        self._body = body
        self._status = status
        self._headers = [_JSON, (b"content-length", b"%d" % len(body))]


class HeadersAnswer:
    """A status and headers, with no body (HEAD on a route whose GET answers an endless one)."""

    __slots__ = ("_headers", "_status")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._status = status
        self._headers = headers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": self._status, "headers": self._headers}
        )
        await send({"type": "http.response.body", "body": b""})
