"""The body wrapper's charges to a tenant (TenantBodies in entrypoints/edge/body.py), without a
server: a drain after an early answer is nobody's, and a body counts as arriving only until its
Content-Length has come (granian's closing empty message is not waited for)."""

from __future__ import annotations

import asyncio

from application.waiting import act_for
from entrypoints.edge.body import Body, TenantBodies, with_body_deadlines
from entrypoints.edge.head import RequestHead


def scope(length: int) -> dict:
    return {
        "type": "http",
        "method": "POST",
        "path": "/api/workflow-streams/runs/r/streams/s/records",
        "headers": [(b"content-length", str(length).encode())],
    }


async def test_a_drain_after_an_early_answer_is_not_charged_nor_refused() -> None:
    """As the front does: authenticate, answer 403 before reading the body, then drain it. The
    tenant is at its arriving cap: the drain must neither raise TooManyBodies (after the answer
    went out, the server would log an ASGI error and drop the connection) nor be counted."""
    bodies = TenantBodies(max_arriving=1, max_bytes=10**9)
    bodies.arriving["t"] = 1  # another body of the tenant's is arriving
    sent: list[dict] = []

    async def front(scope, receive, send):
        body = Body(receive, RequestHead(scope["headers"]))
        act_for("t")  # authenticated
        await send({"type": "http.response.start", "status": 403, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
        await body.finish(403)

    async def receive():
        return {"type": "http.request", "body": b"x" * 10, "more_body": False}

    async def send(message):
        sent.append(message)

    await with_body_deadlines(front, 30, 120, 0, bodies)(scope(10), receive, send)
    assert sent[0]["status"] == 403
    assert (bodies.arriving, bodies.held, bodies.refused) == ({"t": 1}, {}, 0)


async def test_a_body_has_arrived_once_its_content_length_came_though_its_request_goes_on() -> None:
    """granian sends an empty closing message after the last byte, which `Body.read` does not
    wait for: the body must stop counting as arriving when its bytes are in, not when its
    request ends (an append blocked for credit would otherwise hold the tenant's count)."""
    bodies = TenantBodies(max_arriving=1, max_bytes=10**9)
    reading_done, go_on = asyncio.Event(), asyncio.Event()
    messages = [
        {"type": "http.request", "body": b"12345", "more_body": True},
        {"type": "http.request", "body": b"", "more_body": False},  # never asked for
    ]

    async def app(scope, receive, send):
        act_for("t")
        body = Body(receive, RequestHead(scope["headers"]))
        assert await body.read(100) == b"12345"
        reading_done.set()
        await go_on.wait()  # e.g. waiting for credit

    async def receive():
        return messages.pop(0)

    async def send(message):
        pass

    request = asyncio.create_task(
        with_body_deadlines(app, 30, 120, 0, bodies)(scope(5), receive, send)
    )
    await reading_done.wait()
    assert bodies.arriving == {} and bodies.held == {"t": 5}  # held until the request ends
    bodies.admit("t")  # the tenant's next body is admitted meanwhile
    go_on.set()
    await request
    assert bodies.held == {} and bodies.arriving == {"t": 1}


async def test_a_drain_after_a_partly_read_body_holds_none_of_its_rest() -> None:
    """A chunked body refused (413) part way through its read: what is drained after the
    answer is not added to the tenant's held bytes, nor refused past them (the client would
    get a reset instead of its 413)."""
    from entrypoints.edge.problems import BodyTooLarge

    bodies = TenantBodies(max_arriving=10, max_bytes=1_000)
    pieces = [b"x" * 100] * 12  # 1,200 bytes in all, past the tenant's 1,000
    messages = [{"type": "http.request", "body": p, "more_body": True} for p in pieces]
    messages[-1]["more_body"] = False

    async def front(scope, receive, send):
        act_for("t")
        body = Body(receive, RequestHead(scope["headers"]))
        try:
            await body.read(250)
        except BodyTooLarge:
            await send({"type": "http.response.start", "status": 413, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            await body.finish(413)
        assert bodies.held == {"t": 300}  # what the read took, and nothing of the drain

    async def receive():
        return messages.pop(0)

    async def send(message):
        pass

    chunked = {
        "type": "http",
        "method": "POST",
        "path": "/api/workflow-streams/runs/r/streams/s/records",
        "headers": [(b"transfer-encoding", b"chunked")],
    }
    await with_body_deadlines(front, 30, 120, 0, bodies)(chunked, receive, send)
    assert messages == [] and bodies.refused == 0  # drained to its end, refused nothing
    assert bodies.held == {} and bodies.arriving == {}
