"""Client commands against a running server (docs/configuration.md): `tail`, `append`, `put-object`.

They use the Python client (`ductor_streams_client`) and nothing of the service itself. Exit
codes: 0 success, 1 a service or connection error, 2 a usage error (bad arguments, bad JSON,
unreadable file, no token, or a token, server URL or idempotency key no request can carry),
130 interrupted. Every error is one line on stderr."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import math
import mimetypes
import os
import re
import sys
import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from ductor_streams_client import Record, StreamsClient, StreamsError

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV = "DUCTOR_STREAMS_URL"
TOKEN_ENV = "DUCTOR_STREAMS_TOKEN"
BATCH_RECORDS = 1000  # the service's per-request ceiling
BATCH_BYTES = 4 * 1024 * 1024  # well under its 8 MiB body ceiling

ENVIRONMENT = f"""\
environment:
  {URL_ENV}    the server (default {DEFAULT_URL})
  {TOKEN_ENV}  the bearer token (else ./.ductor-streams/dev-token, the file a
                        development server writes)

exit codes: 0 ok, 1 service or connection error, 2 usage error, 130 interrupted"""


class UsageError(Exception):
    """Bad local input: exit code 2."""


def _sequence(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def register(subparsers: Any) -> None:
    """Add `tail`, `append` and `put-object` to the `ductor-streams` command."""

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = subparsers.add_parser(
            name,
            help=summary,
            description=description,
            epilog=ENVIRONMENT,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument("run", metavar="RUN", help="the run ID")
        parser.add_argument("stream", metavar="STREAM", help="the stream ID")
        parser.add_argument("--url", help=f"the server (overrides {URL_ENV})")
        parser.add_argument("--token", help=f"the bearer token (overrides {TOKEN_ENV})")
        return parser

    tail = command(
        "tail",
        "follow a stream live and print one JSON record per line",
        "Follow a stream live: print every record after --cursor as one JSON object per line "
        "on stdout, in order and each once. Reconnects by itself (also across a server "
        "restart) from the last printed sequence; exits 0 once the stream is closed and every "
        "record printed.",
    )
    tail.add_argument(
        "--cursor",
        type=_sequence,
        default=0,
        metavar="N",
        help="start after sequence N (default 0: from the beginning)",
    )
    tail.set_defaults(func=cmd_tail)

    append = command(
        "append",
        "append records (from arguments, or one JSON value per stdin line)",
        "Append records to a stream, one atomic batch: each JSON argument is one record's "
        "data; with no arguments, each non-blank stdin line is one JSON value (stdin is sent in "
        "batches of up to 1,000 records). NaN, Infinity and numbers past a 64-bit float (1e400) "
        "are refused as bad JSON. Prints the service's answer as JSON, one line per batch. "
        "Retries are safe: every batch carries an Idempotency-Key.",
    )
    append.add_argument(
        "records", nargs="*", default=[], metavar="JSON", help="a record's data, as JSON"
    )
    append.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="the Idempotency-Key of the batch (default: a fresh one; only with arguments)",
    )
    append.set_defaults(func=cmd_append)

    put = command(
        "put-object",
        "upload a file as an object and append the record that carries it",
        "Upload FILE (up to 32 MiB) as an object of the stream: prepare, streamed upload, "
        "commit. Shows a progress bar on stderr and prints the commit answer "
        '({"sequence", "object_id"}) as JSON.',
    )
    put.add_argument("file", metavar="FILE", help="the file to upload")
    put.add_argument(
        "--content-type",
        metavar="T",
        help="the body's media type (default: guessed from FILE's name, else "
        "application/octet-stream)",
    )
    put.add_argument(
        "--idempotency-key", metavar="KEY", help="reuse to resume or replay the same upload"
    )
    put.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    put.set_defaults(func=cmd_put_object)


# -- shared ---------------------------------------------------------------------------------------


def _token(args: argparse.Namespace) -> str:
    """The bearer token to send, checked: a usage error names where a bad one came from."""
    # The token commands take their --token as `bearer` (`token revoke` has a TOKEN argument).
    given = args.bearer if "bearer" in vars(args) else args.token
    token, source = (given.strip(), "--token") if given else (None, "")
    if not token and (token := os.environ.get(TOKEN_ENV, "").strip()):
        source = TOKEN_ENV
    candidates = [Path(".ductor-streams") / "dev-token"]
    if not token:
        if data_dir := os.environ.get("DUCTOR_STREAMS_DATA_DIR"):
            candidates.insert(0, Path(data_dir) / "dev-token")
        for candidate in candidates:
            with contextlib.suppress(OSError):
                if token := candidate.read_text().strip():
                    source = str(candidate)
                    break
    if not token:
        looked = " nor ".join(str(c) for c in candidates)
        raise UsageError(
            f"no token: set {TOKEN_ENV} or pass --token (no dev token in {looked}; `serve` writes "
            "one in its data directory, DUCTOR_STREAMS_DATA_DIR)"
        )
    if not all(" " < char <= "~" for char in token):  # what an Authorization header can carry
        raise UsageError(
            f"the token of {source} holds a character no Bearer token has (a space, a control "
            "character or non-ASCII)"
        )
    return token


def _client(args: argparse.Namespace) -> StreamsClient:
    url = args.url or os.environ.get(URL_ENV, "").strip() or DEFAULT_URL
    source = "--url" if args.url else URL_ENV
    wrong = f"{source} must be an http:// or https:// URL, got {url!r}"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises when it is no number, or past 65535
    except ValueError as error:  # `http://[::1`
        raise UsageError(f"{wrong}: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(wrong)
    if port == 0:
        raise UsageError(f"{wrong}: its port is not 1 to 65535")
    token = _token(args)
    try:
        return StreamsClient(url, token)
    except ValueError as error:  # what the client refuses beyond the checks above
        raise UsageError(f"{wrong}: {error}") from None


def _run(args: argparse.Namespace, main: Any) -> int:
    """Run a command coroutine; one-line errors on stderr and the exit code."""
    for noisy in ("httpx", "httpcore"):  # their INFO lines would clutter stderr
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        asyncio.run(main(args))
    except UsageError as error:
        print(f"ductor-streams: error: {error}", file=sys.stderr)
        return 2
    except StreamsError as error:
        print(f"ductor-streams: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


def _print_json(value: Any) -> None:
    """One line of JSON; an answer (a msgspec Struct) as the service sent it."""
    if isinstance(value, msgspec.Struct):
        value = msgspec.to_builtins(value)
    print(json.dumps(value, separators=(",", ":"), ensure_ascii=False), flush=True)


_FIELD_OF_KIND = {"json": "data", "bytes": "data_base64", "object": "object"}


def _record_json(record: Record) -> dict[str, Any]:
    """A record as the service sends it: only the one of `data`, `data_base64` or `object`
    that it carries."""
    value: dict[str, Any] = msgspec.to_builtins(record)
    keep = _FIELD_OF_KIND[record.kind]
    for name in _FIELD_OF_KIND.values():
        if name != keep:
            value.pop(name, None)
    return value


# -- tail -----------------------------------------------------------------------------------------


def cmd_tail(args: argparse.Namespace) -> int:
    return _run(args, _tail)


async def _tail(args: argparse.Namespace) -> None:
    outage = False  # say so once per outage, not on every attempt

    def reconnecting(failure: StreamsError, delay: float) -> None:
        nonlocal outage
        if not outage:
            print(f"tail: {failure}; reconnecting", file=sys.stderr, flush=True)
        outage = True

    async with _client(args) as client:
        # events=False: the end of a closed stream ends the loop; a deleted stream, records
        # removed by retention or a revoked token raise, and exit 1 with one line.
        records = client.follow(
            args.run, args.stream, args.cursor, events=False, on_reconnect=reconnecting
        )
        async with contextlib.aclosing(records):
            async for record in records:
                outage = False
                assert isinstance(record, Record)
                _print_json(_record_json(record))


# -- append ---------------------------------------------------------------------------------------


def cmd_append(args: argparse.Namespace) -> int:
    return _run(args, _append)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of a JSON number's range (a 64-bit float)")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse(text: str, where: str) -> Any:
    # Python's json takes NaN and Infinity, and makes 1e400 infinity: each would be sent as
    # null (JSON has no such number), so each is refused here, as bad JSON.
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except ValueError as error:
        raise UsageError(f"{where} is not valid JSON: {error}") from None


def _stdin_batches() -> Iterator[list[Any]]:
    batch: list[Any] = []
    size = 0
    for number, line in enumerate(sys.stdin, start=1):
        if not line.strip():
            continue
        value = _parse(line, f"stdin line {number}")
        batch.append(value)
        size += len(line)
        if len(batch) >= BATCH_RECORDS or size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _idempotency_key(key: str | None) -> str | None:
    """An append's key, as a header carries it (what the client checks too)."""
    if key is not None and not (
        0 < len(key) <= 255 and all(" " <= char <= "~" for char in key) and key == key.strip()
    ):
        raise UsageError(
            "--idempotency-key is 1 to 255 printable ASCII characters, neither starting nor "
            "ending with a space (it travels as a header)"
        )
    return key


async def _append(args: argparse.Namespace) -> None:
    if args.records:
        batches: Any = [
            [_parse(text, f"argument {i}") for i, text in enumerate(args.records, start=1)]
        ]
        if len(batches[0]) > BATCH_RECORDS:
            raise UsageError(f"at most {BATCH_RECORDS} records per call; pipe more via stdin")
        key = _idempotency_key(args.idempotency_key)
    else:
        if args.idempotency_key:
            raise UsageError("--idempotency-key needs the records as arguments")
        if sys.stdin.isatty():
            print("append: reading one JSON value per line from stdin", file=sys.stderr)
        batches = _stdin_batches()
        key = None
    sent = 0
    async with _client(args) as client:
        for batch in batches:
            _print_json(await client.append(args.run, args.stream, batch, idempotency_key=key))
            sent += 1
    if sent == 0:
        raise UsageError("no records: give JSON arguments or lines on stdin")


# -- put-object -----------------------------------------------------------------------------------


class ProgressBar:
    """A one-line progress bar on stderr: redrawn in place on a terminal (at most 10 times a
    second), a single final line otherwise."""

    WIDTH = 30

    def __init__(self, label: str, stream: Any = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self.drawn = 0.0
        self.done = False

    def __call__(self, sent: int, total: int) -> None:
        now = time.monotonic()
        finished = sent >= total
        if self.done or (not finished and (not self.tty or now - self.drawn < 0.1)):
            return
        self.drawn = now
        fraction = 1.0 if total == 0 else min(1.0, sent / total)
        filled = int(self.WIDTH * fraction)
        rate = sent / max(now - self.started, 1e-6)
        line = (
            f"{self.label} [{'#' * filled}{'-' * (self.WIDTH - filled)}] {fraction:4.0%} "
            f"{_size(sent)}/{_size(total)} {_size(rate)}/s"
        )
        self.stream.write(("\r" + line) if self.tty else line)
        if finished:
            self.stream.write("\n")
            self.done = True
        self.stream.flush()


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if count < 1024 or unit == "MiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} MiB"


def cmd_put_object(args: argparse.Namespace) -> int:
    path = Path(args.file)
    problem = None
    if not path.exists():
        problem = "no such file"
    elif not path.is_file():
        problem = "not a regular file"
    elif not os.access(path, os.R_OK):
        problem = "permission denied"
    if problem:
        print(f"ductor-streams: error: cannot read {str(path)!r}: {problem}", file=sys.stderr)
        return 2
    return _run(args, _put_object)


async def _put_object(args: argparse.Namespace) -> None:
    path = Path(args.file)
    content_type = (
        args.content_type or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    )
    progress = None if args.no_progress else ProgressBar(f"upload {path.name}")
    async with _client(args) as client:
        answer = await client.put_object(
            args.run,
            args.stream,
            path,
            content_type=content_type,
            idempotency_key=args.idempotency_key,
            progress=progress,
        )
    _print_json(answer)


# -- token --server -------------------------------------------------------------------------------
# `ductor-streams token create|list|revoke --server`: the same operations through a running
# server's token routes, with the caller's own token (which decides the tenant, and bounds the
# scopes, runs and life of what it mints). Without --server they work on the database directly.


def token_state(revoked_at: datetime | None, expires_at: datetime | None, now: datetime) -> str:
    """A listed token's state: revoked, expired or active."""
    if revoked_at is not None:
        return "revoked"
    if expires_at is not None and expires_at <= now:
        return "expired"
    return "active"


def token_line(
    token_id: str,
    tenant: str,
    principal: str,
    scopes: Any,
    runs: Any,
    created: str,
    expires: str,
    revoked: str,
    state: str,
) -> str:
    """One line of `token list`, tab-separated; a token restricted to runs has a ninth field,
    its runs (comma-separated)."""
    fields = [token_id, tenant, principal, ",".join(sorted(scopes)), created, expires, revoked]
    fields.append(state)
    if runs is not None:
        fields.append(",".join(sorted(runs)))
    return "\t".join(fields)


def _rfc3339(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def cmd_token_mint(args: argparse.Namespace) -> int:
    return _run(args, _token_mint)


async def _token_mint(args: argparse.Namespace) -> None:
    if args.tenant is not None:
        raise UsageError("--server mints in the tenant of the token it uses: drop --tenant")
    if args.expires_in is None:
        raise UsageError("--server needs --expires-in: a token minted over HTTP always expires")
    async with _client(args) as client:
        minted = await client.mint_token(
            scopes=args.scope,
            expires_in_seconds=args.expires_in,
            principal=args.principal,
            runs=args.run,
        )
    print(minted.token)


def cmd_token_list_server(args: argparse.Namespace) -> int:
    return _run(args, _token_list)


async def _token_list(args: argparse.Namespace) -> None:
    if args.tenant is not None:
        raise UsageError("--server lists the tenant of the token it uses: drop --tenant")
    now = datetime.now(UTC)
    async with _client(args) as client:
        # Every token: page after page, each printed as its page arrives.
        async for t in client.iter_tokens(page_size=1000):
            state = token_state(t.revoked_at, t.expires_at, now)
            print(
                token_line(
                    t.id,
                    t.tenant,
                    t.principal,
                    t.scopes,
                    t.runs,
                    _rfc3339(t.created_at),
                    _rfc3339(t.expires_at),
                    _rfc3339(t.revoked_at),
                    state,
                )
            )


def cmd_token_revoke_server(args: argparse.Namespace) -> int:
    return _run(args, _token_revoke)


async def _token_revoke(args: argparse.Namespace) -> None:
    named = args.token
    if re.fullmatch(r"tok_[0-9a-f]{16}", named):
        token_id = named
    else:  # the token itself: its id is derived from its hash, as the service derives it
        token_id = "tok_" + hashlib.sha256(named.encode()).digest()[:8].hex()
    async with _client(args) as client:
        await client.revoke_token(token_id)
    print(f"revoked {token_id}", file=sys.stderr)
