"""The framework's floor for an append, for (3b): `POST …/records` through the same front as
`ductor-streams serve` (entrypoints/front.py: request checks, request id, metric, body
limit, JSON decoding, browser headers, answer), the same ASGI server and event loop, and
nothing else: authentication and the append are stubs that answer at once, nothing is stored.

Run by the bench as `python -m bench.bare_app PORT`.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from granian.constants import HTTPModes, Interfaces
from granian.server.embed import Server
from litestar import Litestar, get

from application.views import AppendAnswer
from domain.stream import Credit
from entrypoints.front import append_front
from entrypoints.http.app import MAX_REQUEST_BYTES, tune_collector
from entrypoints.http.observability import request_middleware
from entrypoints.lean_imports import without_optional_integrations
from entrypoints.serving import GRANIAN_OPTIONS, fast_loop

_ANSWER = AppendAnswer(
    first_sequence=1,
    last_sequence=1,
    head=1,
    credit=Credit(
        unread_items=1, unread_bytes=100, max_unread_items=10_000, max_unread_bytes=67_108_864
    ),
)


class _Services:
    """What the front calls, answering at once."""

    async def authenticate(self, authorization: str | None) -> object:
        return None

    async def append_records(self, *args: object) -> tuple[AppendAnswer, bool]:
        return _ANSWER, False


@get("/readyz")
async def readyz() -> dict[str, str]:
    return {"status": "ready"}


def main(port: int) -> None:
    with without_optional_integrations("pydantic", "attrs", "attr"):
        app = Litestar([readyz], middleware=[request_middleware])
    app.state.services = _Services()
    app.asgi_handler = append_front(
        lambda: app.state.services, app.asgi_handler, MAX_REQUEST_BYTES, ()
    )
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
