"""`ductor-streams`: serve, migrate and token commands (docs/configuration.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable

import asyncpg

from adapters.postgres.embedded import start_embedded
from adapters.postgres.migrations import migrate
from adapters.postgres.tokens import PostgresTokens
from application.access import SCOPES
from application.tokens import IssueToken, make_caller, token_hash
from domain.errors import DomainError
from entrypoints import client_cli
from entrypoints.config import PREFIX, Settings
from entrypoints.logs import configure_logging

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


def cmd_serve(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    url = _database_url(settings)
    token = asyncio.run(_prepare(url, settings))
    if token:
        print(f"development token (tenant default, all scopes): {token}", flush=True)
        print(f"  also in {settings.data_dir / 'dev-token'}", flush=True)
    if not args.no_workers:
        os.environ[PREFIX + "RUN_WORKERS"] = "1"  # the server processes run the workers too
    print(f"ductor-streams listening on http://{args.host}:{args.port}", flush=True)
    if args.server == "uvicorn":
        import uvicorn

        uvicorn.run(
            "entrypoints.http.app:app_from_env",
            factory=True,
            host=args.host,
            port=args.port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=10,  # live subscriptions never end by themselves
        )
        return 0
    if args.workers == 1 and not args.supervised:
        _serve_in_process(args)
    else:
        _serve_supervised(args)
    return 0


# Both granian modes: HTTP/1.1 only (protocol detection for h2c cost about 11 KB per open
# connection, measured with 1,000 idle subscribers), and no cap below the subscription cap on
# requests in flight per process (granian's default, backlog / workers, would queue the
# 1,025th subscriber of a process behind the others).
GRANIAN_OPTIONS = {
    "backlog": 2048,
    "backpressure": 16384,
    "log_access": False,
    "log_level": "warning",
}


def _serve_in_process(args: argparse.Namespace) -> None:
    """One server process: granian's embedded server on this process's event loop. A separate
    supervisor process (as with --workers N) would cost ~40 MB for nothing with one worker."""
    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server

    from entrypoints.http.app import app_from_env, begin_stopping

    async def main() -> None:
        app = app_from_env()
        server = Server(
            app,
            address=args.host,
            port=args.port,
            interface=Interfaces.ASGI,
            http=HTTPModes.http1,
            **GRANIAN_OPTIONS,  # type: ignore[arg-type]
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


def _serve_supervised(args: argparse.Namespace) -> None:
    """`--workers N`: a supervisor process and N server processes sharing the socket."""
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops

    Granian(
        target="entrypoints.http.app:app_from_env",
        factory=True,
        address=args.host,
        port=args.port,
        interface=Interfaces.ASGI,
        http=HTTPModes.http1,
        workers=args.workers,
        # The workers drain in-flight requests on SIGTERM, and a live subscription never ends by
        # itself: after this many seconds a worker is stopped anyway (its subscribers resume
        # elsewhere with Last-Event-ID; leased jobs are picked up again once their lease ends).
        workers_kill_timeout=10,
        loop=Loops.uvloop if fast_loop() is not None else Loops.asyncio,
        **GRANIAN_OPTIONS,  # type: ignore[arg-type]
    ).serve()


def fast_loop() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # not on Windows
        return None
    return uvloop.new_event_loop


def cmd_worker(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    url = _database_url(settings)
    asyncio.run(_prepare(url, settings))

    async def run() -> None:
        from application.workers import run_workers
        from entrypoints.container import Container, start, stop, workers

        container = Container(settings=Settings.from_env())
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

    asyncio.run(run())
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
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


def cmd_token_create(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    try:
        caller = make_caller(args.tenant, args.principal, args.scope)
    except DomainError as error:
        print(f"error: {error.detail}", file=sys.stderr)
        return 2
    url = _database_url(settings)

    async def run() -> str:
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
        try:
            return await IssueToken(PostgresTokens(pool))(caller)
        finally:
            await pool.close()

    print(asyncio.run(run()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ductor-streams",
        description="Durable, ordered, flow-controlled data streams for workflow runs. "
        "Configured by DUCTOR_STREAMS_* environment variables (see docs/configuration.md).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the HTTP API (migrates first)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--workers", type=int, default=1, help="server processes (default 1)")
    serve.add_argument("--server", choices=["granian", "uvicorn"], default="granian")
    serve.add_argument(
        "--supervised",
        action="store_true",
        help="granian only: run the server process(es) under a supervisor process even with "
        "one worker (it respawns a worker that dies; costs ~40 MB)",
    )
    serve.add_argument(
        "--no-workers", action="store_true", help="do not run the background workers here"
    )
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser(
        "worker",
        help="run only the background workers (pruner, deletion, input dispatcher, orphan "
        "sweeper) until SIGTERM",
    )
    worker.set_defaults(func=cmd_worker)

    mig = sub.add_parser("migrate", help="apply pending migrations and exit")
    mig.set_defaults(func=cmd_migrate)

    token = sub.add_parser("token", help="manage API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser("create", help="create a token and print it alone on stdout")
    create.add_argument("--tenant", required=True)
    create.add_argument("--principal", default="cli")
    create.add_argument(
        "--scope", action="append", required=True, choices=list(SCOPES), help="repeatable"
    )
    create.set_defaults(func=cmd_token_create)
    client_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(os.environ.get(PREFIX + "LOG_LEVEL", "INFO").upper())
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main"]
