"""`ductor-streams`: serve, migrate and token commands (docs/configuration.md)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

import asyncpg

from adapters.postgres.embedded import start_embedded
from adapters.postgres.migrations import migrate
from adapters.postgres.tokens import PostgresTokens
from application.access import SCOPES
from application.ports import TokenRecord
from application.tokens import (
    MAX_EXPIRES_IN_SECONDS,
    IssueToken,
    ListTokens,
    RevokeToken,
    make_caller,
    token_hash,
)
from domain.digits import bounded_integer
from domain.errors import DomainError
from entrypoints import client_cli
from entrypoints.config import PREFIX, InvalidSetting, Settings
from entrypoints.logs import configure_logging, granian_logging

log = logging.getLogger("ductor_streams")


def _database_url(settings: Settings) -> str:
    """The configured PostgreSQL, or the embedded one under DATA_DIR/pg (started if needed)."""
    if settings.database_url:
        return settings.database_url
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    url = start_embedded(settings.data_dir / "pg")
    os.environ[PREFIX + "DATABASE_URL"] = url  # the server's worker processes inherit it
    return url


async def _prepare(url: str, settings: Settings) -> str | None:
    """Migrate, make sure the bootstrap token exists, and on the embedded defaults without any
    configured token, create a development token once. Returns the token to announce, if any."""
    conn = await asyncpg.connect(url)
    try:
        for name in await migrate(conn):
            log.info("applied migration %s", name)
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        issue = IssueToken(PostgresTokens(pool))
        if settings.bootstrap_token:
            caller = make_caller("default", "bootstrap", list(SCOPES))
            await issue(caller, settings.bootstrap_token)
            if await PostgresTokens(pool).find(token_hash(settings.bootstrap_token)) is None:
                # A revocation is deliberate (the token may have leaked): a restart with the
                # same setting does not undo it.
                log.warning(
                    "the configured %sBOOTSTRAP_TOKEN was revoked and stays revoked; "
                    "configure a new value to have a working bootstrap token",
                    PREFIX,
                )
            return None
        if not settings.embedded:
            return None
        dev_file = settings.data_dir / "dev-token"
        if dev_file.exists():
            token = dev_file.read_text().strip()
            if await PostgresTokens(pool).find(token_hash(token)) is not None:
                return token
        token = await issue(make_caller("default", "developer", list(SCOPES)))
        dev_file.write_text(token + "\n")
        dev_file.chmod(0o600)
        return token
    finally:
        await pool.close()


class CommandError(Exception):
    """A command that cannot go on: its message is printed as one line on stderr, and the
    command exits with `exit_code` (2, a usage error, unless told otherwise)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    host = args.host if args.host is not None else settings.host
    port = args.port if args.port is not None else settings.port
    # Bound before anything starts (the embedded PostgreSQL included), and kept: the server
    # serves on this very socket, so nothing else can share the port meanwhile.
    listener = _listen(host, port)
    url = _database_url(settings)
    token = asyncio.run(_prepare(url, settings))
    if token:
        print(f"development token (tenant default, all scopes): {token}", flush=True)
        print(f"  also in {settings.data_dir / 'dev-token'}", flush=True)
    if not args.no_workers:
        os.environ[PREFIX + "RUN_WORKERS"] = "1"  # the server processes run the workers too
    print(f"ductor-streams listening on http://{_url_host(host)}:{port}", flush=True)
    if args.server == "uvicorn":
        _serve_uvicorn(listener, settings)
    elif args.workers == 1 and not args.supervised:
        _serve_in_process(listener, settings)
    else:
        _serve_supervised(listener, args.workers, settings)
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """The API's socket, bound without SO_REUSEPORT so that a port already in use (by another
    ductor-streams or anything else) is refused rather than shared."""
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
    listener.set_inheritable(True)  # --workers N: the server processes serve on it too
    return listener


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


BACKLOG = 2048

# Both granian modes: HTTP/1.1 only (protocol detection for h2c cost about 11 KB per open
# connection, measured with 1,000 idle subscribers), and no cap below the subscription cap on
# requests in flight per process (granian's default, backlog / workers, would queue the
# 1,025th subscriber of a process behind the others). Its lines go to our JSON log.
GRANIAN_OPTIONS = {
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


def _on_listener(server_class: type, listener: socket.socket) -> type:
    """granian's server class, serving on `listener` instead of a socket of its own: on Linux
    granian binds each worker's socket with SO_REUSEPORT, which lets a second server on the
    same port share it silently. This is what granian itself does on other platforms."""
    from granian.net import SocketHolder

    class OnListener(server_class):
        def _init_shared_socket(self) -> None:
            self._ssp = None
            # granian's stub declares no constructor; its native class takes (fd, uds, backlog).
            self._shd = SocketHolder(listener.fileno(), False, BACKLOG)  # type: ignore[call-arg]
            self._sfd = listener.fileno()
            self._sso = listener

    return OnListener


def _serve_in_process(listener: socket.socket, settings: Settings) -> None:
    """One server process: granian's embedded server on this process's event loop. A separate
    supervisor process (as with --workers N) would cost ~40 MB for nothing with one worker."""
    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server

    from entrypoints.http.app import app_from_env, begin_stopping

    async def main() -> None:
        app = app_from_env()
        server = _on_listener(Server, listener)(
            app,
            address=listener.getsockname()[0],
            port=listener.getsockname()[1],
            interface=Interfaces.ASGI,
            http=HTTPModes.http1,
            http1_settings=_http1(settings),
            **GRANIAN_OPTIONS,
        )

        def stopping() -> None:
            # granian drains in-flight requests before the application's shutdown runs, and a
            # live subscription never finishes by itself: end those first.
            begin_stopping(app)
            server.stop()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping)
        await server.serve()

    with asyncio.Runner(loop_factory=fast_loop()) as runner:
        runner.run(main())


def _serve_supervised(listener: socket.socket, workers: int, settings: Settings) -> None:
    """`--workers N`: a supervisor process and N server processes sharing the socket."""
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops

    _on_listener(Granian, listener)(
        target="entrypoints.http.app:app_from_env",
        factory=True,
        address=listener.getsockname()[0],
        port=listener.getsockname()[1],
        interface=Interfaces.ASGI,
        http=HTTPModes.http1,
        http1_settings=_http1(settings),
        workers=workers,
        # The workers drain in-flight requests on SIGTERM, and a live subscription never ends by
        # itself: after this many seconds a worker is stopped anyway (its subscribers resume
        # elsewhere with Last-Event-ID; leased jobs are picked up again once their lease ends).
        workers_kill_timeout=10,
        loop=Loops.uvloop if fast_loop() is not None else Loops.asyncio,
        **GRANIAN_OPTIONS,
    ).serve()


def _serve_uvicorn(listener: socket.socket, settings: Settings) -> None:
    import uvicorn

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


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    url = _database_url(settings)
    asyncio.run(_prepare(url, settings))

    async def run() -> None:
        from application.workers import run_workers
        from entrypoints import tracing
        from entrypoints.container import Container, start, stop, workers

        tracing.configure()  # only if an OTLP endpoint is set
        container = Container(settings=Settings.from_env())  # with the embedded URL
        await start(container)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        log.info("workers running (worker id %s)", container.worker_id())
        try:
            await run_workers(await workers(container), stopping)
        finally:
            await stop(container)
            tracing.flush()

    asyncio.run(run())
    return 0


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    url = _database_url(settings)

    async def run() -> list[str]:
        conn = await asyncpg.connect(url)
        try:
            return await migrate(conn)
        finally:
            await conn.close()

    applied = asyncio.run(run())
    print("\n".join(applied) if applied else "nothing to apply")
    return 0


T = TypeVar("T")


async def _on_tokens(url: str, use: Callable[[PostgresTokens], Awaitable[T]]) -> T:
    """Migrate the configured database, then run `use` on its tokens."""
    try:
        conn = await asyncpg.connect(url, timeout=10)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        pool = await asyncpg.create_pool(url, min_size=1, max_size=1, timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise CommandError(f"cannot reach the database: {error}", exit_code=1) from None
    try:
        return await use(PostgresTokens(pool))
    finally:
        await pool.close()


def cmd_token_create(args: argparse.Namespace, settings: Settings) -> int:
    if args.server:
        return client_cli.cmd_token_mint(args)
    if args.tenant is None:
        raise CommandError("--tenant is required (unless --server mints in the caller's tenant)")
    try:
        caller = make_caller(args.tenant, args.principal or "cli", args.scope, args.run)
    except DomainError as error:
        raise CommandError(error.detail) from None
    url = _database_url(settings)

    async def issue(tokens: PostgresTokens) -> str:
        return await IssueToken(tokens)(caller, expires_in_seconds=args.expires_in)

    print(asyncio.run(_on_tokens(url, issue)))
    return 0


def _rfc3339(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _token_line(record: TokenRecord, now: datetime) -> str:
    if record.revoked_at is not None:
        state = "revoked"
    elif record.expires_at is not None and record.expires_at <= now:
        state = "expired"
    else:
        state = "active"
    return client_cli.token_line(
        record.token_id,
        record.caller.tenant,
        record.caller.principal,
        record.caller.scopes,
        record.caller.runs,
        _rfc3339(record.created_at),
        _rfc3339(record.expires_at),
        _rfc3339(record.revoked_at),
        state,
    )


def cmd_token_list(args: argparse.Namespace, settings: Settings) -> int:
    if args.server:
        return client_cli.cmd_token_list_server(args)
    url = _database_url(settings)
    try:
        records = asyncio.run(_on_tokens(url, lambda tokens: ListTokens(tokens)(args.tenant)))
    except DomainError as error:
        raise CommandError(error.detail) from None
    now = datetime.now(UTC)
    for record in records:
        print(_token_line(record, now))
    return 0


def cmd_token_revoke(args: argparse.Namespace, settings: Settings) -> int:
    if args.server:
        return client_cli.cmd_token_revoke_server(args)
    url = _database_url(settings)
    try:
        revoked = asyncio.run(_on_tokens(url, lambda tokens: RevokeToken(tokens)(args.token)))
    except DomainError as error:
        raise CommandError(error.detail, exit_code=1) from None
    print(f"revoked {revoked}", file=sys.stderr)
    return 0


def _server_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        action="store_true",
        help=f"through a running server's token routes ({client_cli.URL_ENV}, with the token "
        f"{client_cli.TOKEN_ENV}, which decides the tenant) instead of the database",
    )
    parser.add_argument("--url", help=f"with --server: the server (overrides {client_cli.URL_ENV})")
    parser.add_argument(
        "--token",
        dest="bearer",
        help=f"with --server: the bearer token (overrides {client_cli.TOKEN_ENV})",
    )


def _expires_in(text: str) -> int:
    seconds = bounded_integer(text, MAX_EXPIRES_IN_SECONDS)
    if not seconds:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number of seconds from 1 to {MAX_EXPIRES_IN_SECONDS}"
        )
    return seconds


def _port(text: str) -> int:
    port = bounded_integer(text, 65535)
    if not port:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1-65535)")
    return port


def _version() -> str:
    try:
        return version("ductor-streams")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ductor-streams",
        description="Durable, ordered, flow-controlled data streams for workflow runs. "
        "Configured by DUCTOR_STREAMS_* environment variables (see docs/configuration.md).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    defaults = Settings()

    serve = sub.add_parser(
        "serve",
        help="start the HTTP API (migrates first)",
        description="Migrate, then serve the HTTP API and (unless --no-workers) the background "
        "workers. Prints the development token (embedded defaults only) and the address it "
        "listens on; refuses a port that is already in use.",
    )
    serve.add_argument(
        "--host",
        help=f"address to listen on (default: {PREFIX}HOST, else {defaults.host})",
    )
    serve.add_argument(
        "--port",
        type=_port,
        help=f"port to listen on (default: {PREFIX}PORT, else {defaults.port})",
    )
    serve.add_argument(
        "--workers", type=int, default=1, help="server processes (default: %(default)s)"
    )
    serve.add_argument(
        "--server",
        choices=["granian", "uvicorn"],
        default="granian",
        help="ASGI server (default: %(default)s; uvicorn serves one process)",
    )
    serve.add_argument(
        "--supervised",
        action="store_true",
        help="granian only: run the server process(es) under a supervisor process even with "
        "one worker (it respawns a worker that dies; costs ~40 MB)",
    )
    serve.add_argument(
        "--no-workers",
        action="store_true",
        help="do not run the background workers here (default: run them in every server process)",
    )
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser(
        "worker",
        help="run only the background workers (pruner, deletion, input dispatcher, journal "
        "compactor, orphan and receipt sweepers) until SIGTERM",
        description="Migrate, then run the background workers until SIGTERM or Ctrl-C. Takes "
        "no options: see docs/configuration.md for the DUCTOR_STREAMS_* settings it reads.",
    )
    worker.set_defaults(func=cmd_worker)

    mig = sub.add_parser(
        "migrate",
        help="apply pending migrations and exit",
        description="Apply pending migrations and print the name of each one applied (or "
        "'nothing to apply'). Takes no options.",
    )
    mig.set_defaults(func=cmd_migrate)

    token = sub.add_parser("token", help="manage API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser(
        "create",
        help="create a token and print it alone on stdout",
        description="Create an API token and print it alone on stdout.",
    )
    create.add_argument(
        "--tenant", help="the tenant the token belongs to (required without --server)"
    )
    create.add_argument(
        "--principal",
        help="who the token speaks for (default: cli; with --server, the caller's principal)",
    )
    create.add_argument(
        "--scope",
        action="append",
        required=True,
        choices=list(SCOPES),
        help="a scope the token carries; repeat for several (no default)",
    )
    create.add_argument(
        "--expires-in",
        type=_expires_in,
        metavar="SECONDS",
        help=f"the token stops working this many seconds from now (1 to "
        f"{MAX_EXPIRES_IN_SECONDS}; default: it does not expire; required with --server)",
    )
    create.add_argument(
        "--run",
        action="append",
        metavar="RUN",
        help="restrict the token to this run (repeat for several; default: every run of the "
        "tenant): every other run is not found (404) to it",
    )
    _server_option(create)
    create.set_defaults(func=cmd_token_create)
    listing = token_sub.add_parser(
        "list",
        help="list tokens (never the tokens themselves)",
        description="Print one tab-separated line per token, revoked and expired ones included, "
        "by tenant then creation: id, tenant, principal, scopes (comma-separated), created, "
        "expires ('-': never), revoked ('-': not revoked), state (active, expired or "
        "revoked), and for a token restricted to runs, its runs (comma-separated). Times are RFC "
        "3339 in UTC. Never prints a token or its hash.",
    )
    listing.add_argument("--tenant", help="only this tenant's tokens (default: every tenant)")
    _server_option(listing)
    listing.set_defaults(func=cmd_token_list)
    revoke = token_sub.add_parser(
        "revoke",
        help="revoke a token, named by itself or by its id",
        description="Revoke a token: every server process refuses it (401) within 2 seconds. "
        "Takes the token itself or its id (as `token list` shows it). Revoking a revoked "
        "token again is fine; an unknown one exits 1.",
    )
    revoke.add_argument("token", metavar="TOKEN_OR_ID", help="the token, or its id (tok_…)")
    _server_option(revoke)
    revoke.set_defaults(func=cmd_token_revoke)
    server_commands = {
        cmd_serve,
        cmd_worker,
        cmd_migrate,
        cmd_token_create,
        cmd_token_list,
        cmd_token_revoke,
    }
    client_cli.register(sub)
    parser.set_defaults(server_commands=server_commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.func not in args.server_commands:  # client commands read only URL and TOKEN
        level = os.environ.get(PREFIX + "LOG_LEVEL", "").upper()
        configure_logging(level if level in logging.getLevelNamesMapping() else "INFO")
        return int(args.func(args) or 0)
    # Until a server installs its own handlers, SIGTERM exits like Ctrl-C does: through the
    # exit handlers, which stop an embedded PostgreSQL this process started.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        settings = Settings.from_env()
        configure_logging(settings.log_level)
        return int(args.func(args, settings) or 0)
    except (InvalidSetting, CommandError) as error:
        print(f"ductor-streams: error: {error}", file=sys.stderr)
        return error.exit_code if isinstance(error, CommandError) else 2
    except KeyboardInterrupt:
        return 130


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main"]
