"""A minimal `text/event-stream` parser (WHATWG HTML, "Server-sent events") over httpx lines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx


@dataclass(frozen=True, slots=True)
class Event:
    event: str
    data: str
    id: str | None


async def events(response: httpx.Response) -> AsyncIterator[Event]:
    """The events of `response`, in order. Comment lines (heartbeats) are skipped; the read
    timeout of the request bounds how long the stream may stay silent."""
    event = ""
    data: list[str] = []
    last_id: str | None = None
    async for line in response.aiter_lines():
        line = line.rstrip("\r\n")
        if not line:
            if data:
                yield Event(event or "message", "\n".join(data), last_id)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id" and "\0" not in value:
            last_id = value
        # `retry` and unknown fields are ignored: reconnection is this client's own policy.
