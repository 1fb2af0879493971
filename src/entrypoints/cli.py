"""`ductor-streams`: serve, migrate and token commands (docs/configuration.md): the command
line only; the database is brought up by entrypoints/bootstrap.py and the HTTP server run by
entrypoints/serving.py."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import TypeVar

import asyncpg

from adapters.postgres.embedded import keep_running
from adapters.postgres.migrations import migrate
from adapters.postgres.tenant_counts import recount_tenant_bytes, tenants_held
from adapters.postgres.tokens import PostgresTokens
from adapters.webhook_signing import RELOAD_SECONDS, PostgresKeyRows, WebhookKeys
from application.access import SCOPES
from application.ports import TokenRecord
from application.tokens import (
    MAX_EXPIRES_IN_SECONDS,
    IssueToken,
    ListTokens,
    RevokeToken,
    make_caller,
)
from domain.digits import bounded_integer
from domain.errors import DomainError
from domain.ids import check_id
from entrypoints import client_cli, serving
from entrypoints.bootstrap import CommandError, connect, create_pool, database_url, prepare
from entrypoints.config import PREFIX, InvalidSetting, Settings
from entrypoints.logs import configure_logging

log = logging.getLogger("ductor_streams")


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    host = args.host if args.host is not None else settings.host
    port = args.port if args.port is not None else settings.port
    # Bound before anything starts (the embedded PostgreSQL included), and held until the
    # server binds it (entrypoints/serving.py), so nothing else can share the port meanwhile.
    listener = serving.listen(host, port)
    url = database_url(settings)
    if settings.embedded:
        keep_running(settings.data_dir / "pg")  # killed, it is started again
    token = asyncio.run(prepare(url, settings))
    if token:
        print(f"development token (tenant default, all scopes): {token}", flush=True)
        print(f"  also in {settings.data_dir / 'dev-token'}", flush=True)
    if not args.no_workers:
        os.environ[PREFIX + "RUN_WORKERS"] = "1"  # the server processes run the workers too
    # Once it answers: a client that waits for this line is served (the port was bound first).
    line = f"ductor-streams listening on http://{serving.url_host(host)}:{port}"
    serving.announce_when_serving(host, port, line)
    if args.server == "uvicorn":
        serving.serve_uvicorn(listener, settings)
    elif args.workers == 1 and not args.supervised:
        serving.serve_in_process(listener, settings)
    else:
        serving.serve_supervised(listener, args.workers, settings)
    return 0


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    url = database_url(settings)
    if settings.embedded:
        keep_running(settings.data_dir / "pg")
    asyncio.run(prepare(url, settings))

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
    url = database_url(settings)

    async def run() -> list[str]:
        conn = await connect(url)
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
    return await _on_database(url, lambda pool: use(PostgresTokens(pool)))


async def _on_database(url: str, use: Callable[[asyncpg.Pool], Awaitable[T]]) -> T:
    """Migrate the configured database, then run `use` on a pool of it."""
    try:
        conn = await connect(url, timeout=10)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        pool = await create_pool(url, min_size=1, max_size=1, timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise CommandError(f"cannot reach the database: {error}", exit_code=1) from None
    try:
        return await use(pool)
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
    url = database_url(settings)

    async def issue(tokens: PostgresTokens) -> str:
        return await IssueToken(tokens)(caller, expires_in_seconds=args.expires_in)

    print(asyncio.run(_on_tokens(url, issue)))
    return 0


def _rfc3339(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _token_line(record: TokenRecord, now: datetime) -> str:
    state = client_cli.token_state(record.revoked_at, record.expires_at, now)
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
    url = database_url(settings)
    try:
        records = asyncio.run(_on_tokens(url, lambda tokens: ListTokens(tokens)(args.tenant)))
    except DomainError as error:
        raise CommandError(error.detail) from None
    now = datetime.now(UTC)
    for record in records:
        print(_token_line(record, now))
    return 0


def cmd_tenants(args: argparse.Namespace, settings: Settings) -> int:
    if args.tenant is not None:
        try:
            check_id("tenant", args.tenant)
        except DomainError as error:
            raise CommandError(error.detail) from None
    url = database_url(settings)

    async def held(pool: asyncpg.Pool) -> list[tuple[str, int, int, int]]:
        if args.recount:
            try:
                await recount_tenant_bytes(pool)
            except asyncpg.LockNotAvailableError:
                raise CommandError(
                    "the tables stayed too busy to lock for the recount: try again", exit_code=1
                ) from None
        return await tenants_held(pool, args.tenant)

    lines = asyncio.run(_on_database(url, held))
    if args.tenant is not None and not lines:
        lines = [(args.tenant, 0, 0, 0)]
    for tenant, streams, size, tokens in lines:
        print(f"{tenant}\t{streams}\t{size}\t{tokens}")
    return 0


def cmd_token_revoke(args: argparse.Namespace, settings: Settings) -> int:
    if args.server:
        return client_cli.cmd_token_revoke_server(args)
    url = database_url(settings)
    try:
        revoked = asyncio.run(_on_tokens(url, lambda tokens: RevokeToken(tokens)(args.token)))
    except DomainError as error:
        raise CommandError(error.detail, exit_code=1) from None
    print(f"revoked {revoked}", file=sys.stderr)
    return 0


def _ahead_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (seconds == 0 or RELOAD_SECONDS <= seconds <= 86_400):
        # Under the reload interval, a process that did not hear of the rotation would still
        # serve a key set without the new key while others sign with it.
        raise argparse.ArgumentTypeError(
            f"the seconds are 0 (at once) or {RELOAD_SECONDS:g} to 86400"
        )
    return seconds


def cmd_webhook_key_rotate(args: argparse.Namespace, settings: Settings) -> int:
    """A new webhook signing key; the old ones stay published until their signatures expire."""
    url = database_url(settings)

    async def rotate() -> str:
        conn = await connect(url, timeout=10)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        pool = await create_pool(url, min_size=1, max_size=1, timeout=10)
        try:
            return await WebhookKeys(PostgresKeyRows(pool)).rotate(args.publish_ahead)
        finally:
            await pool.close()

    try:
        kid = asyncio.run(rotate())
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise CommandError(f"cannot reach the database: {error}", exit_code=1) from None
    print(kid)
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


class CommandParser(argparse.ArgumentParser):
    """The parser of each command: its options go anywhere among its arguments (`append r1 s
    --url U '{"a": 1}'`: argparse alone gives the positionals out before the option, JSON
    arguments none of them, and refuses those after it), and what it does not know is refused
    with the command's own usage rather than the top-level one."""

    _parsing = False

    def parse_known_args(  # type: ignore[override]  # called as argparse calls it, no more
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._parsing:  # parse_known_intermixed_args calls back here (Python 3.11, 3.12)
            return super().parse_known_args(args, namespace)
        nested = any(
            action.nargs in (argparse.PARSER, argparse.REMAINDER)
            for action in self._get_positional_actions()
        )  # `token`: its own commands parse what follows them
        self._parsing = True
        try:
            if nested:
                parsed, extras = super().parse_known_args(args, namespace)
            else:
                parsed, extras = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._parsing = False
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ductor-streams",
        description="Durable, ordered, flow-controlled data streams for workflow runs. "
        "Configured by DUCTOR_STREAMS_* environment variables (see docs/configuration.md).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
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
        "compactor, subscription wakes, and the sweeps: orphans, receipts, storage cleanup) "
        "until SIGTERM",
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
    tenants = sub.add_parser(
        "tenants",
        help="what each tenant holds",
        description="Print one tab-separated line per tenant that holds anything, by tenant: "
        "the tenant, its streams (one deleted while forks read it counts until it is erased), "
        "its bytes (each stream its definition and each record its size, each with 128 "
        "bytes for its row, an object's record its reference too, each append receipt its "
        "key and 416 bytes, each wait event its payload and 128, and what its open object "
        "intents and undelivered input records pledge) and its tokens (revoked and expired "
        "ones too, until they are forgotten), as the limits "
        "DUCTOR_STREAMS_MAX_STREAMS_PER_TENANT, DUCTOR_STREAMS_MAX_BYTES_PER_TENANT and "
        "DUCTOR_STREAMS_MAX_TOKENS_PER_TENANT count them. Read from the database; no server "
        "needed.",
    )
    tenants.add_argument(
        "--tenant", help="this tenant alone (printed with 0 0 0 if it holds nothing)"
    )
    tenants.add_argument(
        "--recount",
        action="store_true",
        help="count every tenant's bytes again from its streams, records, receipts, wait "
        "events and open object intents "
        "first (after a rolling upgrade from a version that did not count them: every write "
        "waits for it, a pass over those tables)",
    )
    tenants.set_defaults(func=cmd_tenants)
    keys = sub.add_parser("webhook-key", help="manage the webhook signing keys")
    keys_sub = keys.add_subparsers(dest="webhook_key_command", required=True)
    rotate = keys_sub.add_parser(
        "rotate",
        help="sign webhooks with a new key",
        description="Make a new Ed25519 webhook signing key and print its key id. Every "
        "process hears of it on its wake bus and publishes it from its next use (within 30 s "
        "at the latest), and signs with it from then, or from --publish-ahead seconds on; the "
        "old keys stay in the JWKS for ten minutes more, past a receiver's five-minute replay "
        "window.",
    )
    rotate.add_argument(
        "--publish-ahead",
        type=_ahead_seconds,
        default=0.0,
        metavar="SECONDS",
        help="publish the new key in the JWKS now and sign with it only this many seconds "
        "later (0, the default: at once; else 30 to 86400), so that receivers that keep the "
        "key set hold it before it signs: 330 covers its max-age (300 s) and a process's "
        "reload (30 s); the old keys sign until then",
    )
    rotate.set_defaults(func=cmd_webhook_key_rotate)
    server_commands = {
        cmd_webhook_key_rotate,
        cmd_serve,
        cmd_worker,
        cmd_migrate,
        cmd_token_create,
        cmd_token_list,
        cmd_token_revoke,
        cmd_tenants,
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
