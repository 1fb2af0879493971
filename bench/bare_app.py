"""The framework's floor for an append, for (3b): the same route, body and answer as
`POST …/records`, through the same middleware, ASGI server and event loop as `ductor-streams
serve`, and nothing else: no authentication, no records prepared, nothing stored.

Run by the bench as `python -m bench.bare_app PORT`.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from granian.constants import HTTPModes, Interfaces
from granian.server.embed import Server
from litestar import Litestar, Request, get, post
from litestar.types import ASGIApp

from entrypoints.cli import GRANIAN_OPTIONS, fast_loop
from entrypoints.http.answers import JsonAnswer
from entrypoints.http.app import tune_collector
from entrypoints.http.body import decode_body
from entrypoints.http.observability import request_middleware
from entrypoints.http.schemas import AppendBody
from entrypoints.lean_imports import without_optional_integrations

_ANSWER = {
    "first_sequence": 1,
    "last_sequence": 1,
    "head": 1,
    "credit": {
        "unread_items": 1,
        "unread_bytes": 100,
        "max_unread_items": 10_000,
        "max_unread_bytes": 67_108_864,
    },
}


@post("/api/workflow-streams/runs/{run_id:str}/streams/{stream_id:str}/records")
async def append(request: Request) -> ASGIApp:
    await decode_body(request, AppendBody)
    return JsonAnswer(_ANSWER, 201)


@get("/readyz")
async def readyz() -> dict[str, str]:
    return {"status": "ready"}


def main(port: int) -> None:
    with without_optional_integrations("pydantic", "attrs", "attr"):
        app = Litestar([append, readyz], middleware=[request_middleware])
    tune_collector()

    async def serve() -> None:
        server = Server(
            app,
            address="127.0.0.1",
            port=port,
            interface=Interfaces.ASGI,
            http=HTTPModes.http1,
            **GRANIAN_OPTIONS,  # type: ignore[arg-type]
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, server.stop)
        await server.serve()

    with asyncio.Runner(loop_factory=fast_loop()) as runner:
        runner.run(serve())


if __name__ == "__main__":
    main(int(sys.argv[1]))
