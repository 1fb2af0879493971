"""`python -m bench.front_cpu [native|protocol] [N]`: the server's CPU time per single-record
append through the entrypoints, in process and on the memory adapters (no network, no
PostgreSQL): the request pipeline, the front or the router, the use case, deciding, the answer.

The appends are sent straight into the ASGI application, one after another, and the figure is
the process's CPU time (`time.process_time`) over N of them, so that other load on a shared
machine, which swings the wrk benchmarks by tens of percent, barely moves it. Compare two
checkouts by running it in each, alternately."""

from __future__ import annotations

import asyncio
import sys
import time
import warnings
from typing import Any

import httpx
from tests.support.asgi import http_scope

from application.access import SCOPES
from application.tokens import IssueToken, make_caller
from entrypoints.container import memory_container
from entrypoints.http.app import create_app

TOKEN = "dst_bench_" + "a" * 16
WARM_UP = 500
RECORD = b'{"data":"' + b"x" * 80 + b'"}'
ROUTES = {
    "native": ("/api/workflow-streams/runs/r/streams/s/records", b'{"records":[' + RECORD + b"]}"),
    "protocol": ("/api/durable-streams/v1/stream/r/p", RECORD),
}


async def measure(kind: str, count: int) -> tuple[float, dict[int, int]]:
    container = memory_container()
    await IssueToken(container.tokens())(make_caller("default", "w", list(SCOPES)), TOKEN)
    app = create_app(container)
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    lifespan = asyncio.create_task(app({"type": "lifespan"}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    auth = {"authorization": f"Bearer {TOKEN}"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        created = await client.post(
            "/api/workflow-streams/runs/r/streams",
            json={"stream_id": "s", "direction": "output"},
            headers=auth,
        )
        assert created.status_code == 201, created.text
        created = await client.put(
            ROUTES["protocol"][0], headers={**auth, "content-type": "application/json"}
        )
        assert created.status_code == 201, created.text
    path, body = ROUTES[kind]
    headers = [
        (b"host", b"bench"),
        (b"authorization", f"Bearer {TOKEN}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    scope = http_scope("POST", path, headers, host="127.0.0.1")
    statuses: dict[int, int] = {}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses[message["status"]] = statuses.get(message["status"], 0) + 1

    for _ in range(WARM_UP):
        await app(dict(scope), receive, send)
    started = time.process_time()
    for _ in range(count):
        await app(dict(scope), receive, send)
    seconds = time.process_time() - started
    await inbox.put({"type": "lifespan.shutdown"})
    await outbox.get()
    await lifespan
    return seconds / count, statuses


def main(argv: list[str]) -> int:
    kind = argv[0] if argv else "native"
    count = int(argv[1]) if len(argv) > 1 else 5_000
    # Building the application in process reports Litestar's deprecation of inferred path
    # parameters for every route.
    warnings.simplefilter("ignore")
    per_append, statuses = asyncio.run(measure(kind, count))
    print(f"{kind}: {per_append * 1e6:.1f} µs of CPU per append over {count} (statuses {statuses})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
