"""A read that waits (a native `wait`, a Durable Streams `live=long-poll`) ends when its client
leaves, not at its deadline: the live slot it holds (the principal's cap on live connections)
comes back at once, and nothing goes on waiting for nobody.

The wait races a task that awaits the ASGI `receive()` for `http.disconnect` (the request has
no body left to read by then). Only for an answer that is complete once the wait ends: an
event stream watches `receive()` itself (entrypoints/sse/asgi.py), and under granian a second
`receive()` after a cancelled one did not report its client's disconnect (the event streams'
slots were lost when their reads were raced so)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from application.waiting import acts_like

T = TypeVar("T")
# The ASGI callables, as the rest of this framework-free package takes them.
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
Answer = Callable[[Any, Receive, Send], Awaitable[None]]


class ClientLeft(Exception):
    """The client disconnected while its read waited."""


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(receive: Receive, operation: Awaitable[T]) -> T:
    """`operation`'s result, or ClientLeft as soon as the client disconnects (the operation is
    then cancelled, and has ended when this raises)."""
    work = asyncio.ensure_future(operation)
    acts_like(work)  # the request's own work, charged to its tenant
    watch = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        raise
    finally:
        watch.cancel()
        if watch.done() and not watch.cancelled():
            watch.exception()  # a server that raises where others send the disconnect
    if work.done():
        return work.result()
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    raise ClientLeft


async def answered_unless_client_leaves(receive: Receive, answer: Awaitable[Answer]) -> Answer:
    """`answer` (an ASGI answer, awaited), or `answer_to_nobody` if the client leaves first."""
    try:
        return await unless_client_leaves(receive, answer)
    except ClientLeft:
        return answer_to_nobody


async def answer_to_nobody(scope: Any, receive: Receive, send: Send) -> None:
    """The answer to a client that left: 499 (a status nobody receives, as in access logs)."""
    with contextlib.suppress(OSError):
        await send({"type": "http.response.start", "status": 499, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
