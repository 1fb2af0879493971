"""Serving the HTTP API: the listening socket, and the ASGI server on it (granian in this
process, granian supervising N processes, or uvicorn).

The port is bound first, without SO_REUSEPORT, so that a port already in use (by another
ductor-streams or anything else) is refused before anything starts, and held while the
database is prepared. granian binds its own sockets (with SO_REUSEPORT on Linux: each of its
worker processes has one), and has no public way to be handed ours: the listener is released
just before granian binds the same address, and a second ductor-streams is still refused,
because its own first bind (without SO_REUSEPORT) cannot share a port granian holds. uvicorn
is handed the listener itself."""

from __future__ import annotations

import asyncio
import errno
import http.client
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from entrypoints.bootstrap import CommandError
from entrypoints.client_sockets import drop_silent_clients
from entrypoints.config import PREFIX, Settings
from entrypoints.logs import granian_logging


def listen(host: str, port: int) -> socket.socket:
    """The API's socket, bound without SO_REUSEPORT so that a port already in use (by another
    ductor-streams or anything else) is refused rather than shared (CommandError)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        listener = socket.create_server((host, port), family=family, backlog=BACKLOG)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise CommandError(
                f"port {port} on {host} is already in use; choose another with --port "
                f"(or {PREFIX}PORT)"
            ) from None
        reason = error.strerror or str(error)
        raise CommandError(
            f"cannot listen on {host} port {port}: {reason}; choose another --host or --port"
        ) from None
    return listener


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# How often `announce_when_serving` asks (each answer waited for at most a second).
ANNOUNCE_POLL_SECONDS = 0.05


def announce_when_serving(host: str, port: int, line: str) -> threading.Thread:
    """Prints `line` once the server answers `GET /healthz` on `host:port` (a thread of its own,
    which ends when it has). The port is bound long before: while the database is prepared
    (and then the application), and granian takes the address over from the listener (the
    module says why). A connection made meanwhile is refused, or reset once its request is
    sent: a client that waits for the line is served."""
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)

    def ask() -> None:
        while True:
            connection = http.client.HTTPConnection(target, port, timeout=1)
            try:
                connection.request("GET", "/healthz")
                if connection.getresponse().status == 200:
                    print(line, flush=True)
                    return
            except (OSError, http.client.HTTPException):
                pass  # not answering yet (refused, reset, cut short)
            finally:
                connection.close()
            time.sleep(ANNOUNCE_POLL_SECONDS)

    thread = threading.Thread(target=ask, name="announce", daemon=True)
    thread.start()
    return thread


BACKLOG = 2048

# Both granian modes: HTTP/1.1 only (protocol detection for h2c cost about 11 KB per open
# connection, measured with 1,000 idle subscribers), and no cap below the subscription cap on
# requests in flight per process (granian's default, backlog / workers, would queue the
# 1,025th subscriber of a process behind the others). Its lines go to our JSON log.
log = logging.getLogger("ductor_streams")

# After SIGTERM, requests still in flight this long are dropped (a worker stopped anyway).
KILL_TIMEOUT_SECONDS = 10

GRANIAN_OPTIONS: dict[str, Any] = {
    "backlog": BACKLOG,
    "backpressure": 16384,
    "log_access": False,
    "log_level": "warning",
    "log_dictconfig": granian_logging(),
}


def _http1(settings: Settings) -> Any:
    from granian.http import HTTP1Settings

    # A client that has not sent its whole request head by then is disconnected.
    return HTTP1Settings(header_read_timeout=round(settings.header_read_timeout_seconds * 1000))


def _released(listener: socket.socket) -> tuple[str, int]:
    """The listener's address, the listener closed for granian to bind it (the module says
    why)."""
    address, port = listener.getsockname()[:2]
    listener.close()
    return address, port


def serve_in_process(listener: socket.socket, settings: Settings) -> None:
    """One server process: granian's embedded server on this process's event loop. A separate
    supervisor process (as with --workers N) would cost ~40 MB for nothing with one worker."""
    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server

    from entrypoints.http.app import app_from_env, begin_stopping

    async def main() -> None:
        app = app_from_env()
        address, port = _released(listener)
        server = Server(
            app,
            address=address,
            port=port,
            interface=Interfaces.ASGI,
            http=HTTPModes.http1,
            http1_settings=_http1(settings),
            **GRANIAN_OPTIONS,
        )
        # As under --workers N (`_granian`): what is still in flight this long after SIGTERM
        # is dropped. granian waits for what it was given to write, and a client that does not
        # read would otherwise hold the shutdown for as long as it liked. (The embedded server
        # takes no such argument; its stop reads the attribute.)
        server.workers_kill_timeout = KILL_TIMEOUT_SECONDS

        def stopping() -> None:
            # granian drains in-flight requests before the application's shutdown runs, and a
            # live subscription never finishes by itself: end those first.
            begin_stopping(app)
            server.stop()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping)
        try:
            await server.serve()
        except TimeoutError:
            log.warning(
                "stopped with requests still in flight %d s after the signal (their clients "
                "were not reading)",
                KILL_TIMEOUT_SECONDS,
            )

    with asyncio.Runner(loop_factory=fast_loop()) as runner:
        runner.run(main())


def serve_supervised(listener: socket.socket, workers: int, settings: Settings) -> None:
    """`--workers N`: a supervisor process and N server processes sharing the socket."""
    address, port = _released(listener)
    # Each process listens in this private directory (0700, made by mkdtemp) for the appends of
    # the streams it commits (adapters/peers.py); they find it in their environment.
    peers = tempfile.mkdtemp(prefix="ductor-streams-peers-")
    os.environ[PREFIX + "PEERS_DIR"] = peers
    os.environ[PREFIX + "SUPERVISOR_PID"] = str(os.getpid())
    try:
        _granian(address, port, workers, settings)
    finally:
        shutil.rmtree(peers, ignore_errors=True)


def _granian(address: str, port: int, workers: int, settings: Settings) -> None:
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops

    Granian(
        target="entrypoints.http.app:app_from_env",
        factory=True,
        address=address,
        port=port,
        interface=Interfaces.ASGI,
        http=HTTPModes.http1,
        http1_settings=_http1(settings),
        workers=workers,
        # The workers drain in-flight requests on SIGTERM, and a live subscription never ends by
        # itself: after this many seconds a worker is stopped anyway (its subscribers resume
        # elsewhere with Last-Event-ID; leased jobs are picked up again once their lease ends).
        workers_kill_timeout=KILL_TIMEOUT_SECONDS,
        # A worker that dies (killed, out of memory) is started again; the others keep serving
        # meanwhile, and the appends they had sent it to commit are answered as of unknown
        # outcome (adapters/peers.py). Without this, granian stopped the whole server.
        respawn_failed_workers=True,
        loop=Loops.uvloop if fast_loop() is not None else Loops.asyncio,
        **GRANIAN_OPTIONS,
    ).serve()


def serve_uvicorn(listener: socket.socket, settings: Settings) -> None:
    import uvicorn

    if settings.client_silence_seconds:  # (before it accepts anything)
        drop_silent_clients(listener, settings.client_silence_seconds)
    config = uvicorn.Config(
        "entrypoints.http.app:app_from_env",
        factory=True,
        log_config=None,  # its loggers propagate to our JSON handler
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,  # live subscriptions never end by themselves
        http=_uvicorn_protocol(settings.header_read_timeout_seconds),
    )
    uvicorn.Server(config).run(sockets=[listener])


def _uvicorn_protocol(header_timeout: float) -> Any:
    """uvicorn's HTTP/1.1 protocol with a deadline on each request head: uvicorn has none of
    its own (its keep-alive timeout only covers the time between requests)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # no httptools (Windows): uvicorn's default protocol, without it
        return "auto"

    class WithHeaderDeadline(HttpToolsProtocol):
        _head_deadline: asyncio.TimerHandle | None = None

        def _await_head(self) -> None:
            self._head_received()
            self._head_deadline = self.loop.call_later(header_timeout, self.transport.close)

        def _head_received(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        # uvicorn's own connection_made narrows asyncio.Protocol's BaseTransport (and ignores
        # that in its source); this one keeps uvicorn's signature.
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_head()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._head_deadline is None:
                self._await_head()

        def on_headers_complete(self) -> None:
            self._head_received()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_received()
            super().connection_lost(exc)

    return WithHeaderDeadline


def fast_loop() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # not on Windows
        return None
    return uvloop.new_event_loop
