"""PostgreSQL or the object store out of reach: which errors are an outage (answered 503
`unavailable` with Retry-After, never 500), decided from the error itself.

A driver error that is a bug (a syntax error, a constraint violation, a misused connection)
is no outage: it still answers 500 `internal`, so nothing real is hidden behind "retry
shortly"."""

from __future__ import annotations

import errno
import socket

import asyncpg
import botocore.exceptions as s3_errors

from adapters.postgres.bounded import raised_by_driver
from application.waiting import CommitOutcomeUnknown, Unanswered

RETRY_AFTER_SECONDS = 1

# The server cannot serve now, but will: shutting down, starting up, crashed, out of
# connection slots, or (after a failover) a read-only standby where the primary used to be.
_POSTGRES_UNAVAILABLE = (
    asyncpg.PostgresConnectionError,  # class 08, ConnectionDoesNotExistError included
    asyncpg.exceptions.AdminShutdownError,  # 57P01
    asyncpg.exceptions.CrashShutdownError,  # 57P02
    asyncpg.exceptions.CannotConnectNowError,  # 57P03
    asyncpg.exceptions.TooManyConnectionsError,  # 53300
    asyncpg.exceptions.ReadOnlySQLTransactionError,  # 25006
)

_PROTOCOL_LOST_STEP = (
    "cannot switch to",
    "cannot process message",
    "got result for unknown protocol state",
    "not connected",
)

_NETWORK_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.EHOSTDOWN,
        errno.ENETUNREACH,
        errno.ENETDOWN,
    }
)

# aiohttp is loaded only with the S3 store (and would cost every process ~10 MB), so its errors
# are recognized by name. aiobotocore wraps a request's in botocore's own; those that surface
# unwrapped (ClientOSError, ClientConnectorError) are OSErrors, and so reach the OSError handler.
_AIOHTTP_CONNECTION_ERROR = "aiohttp.client_exceptions.ClientConnectionError"

# An S3 answer that says "not now", as opposed to a refusal (AccessDenied, NoSuchBucket: bad
# configuration, which is a 500 to fix, not to retry).
_S3_BUSY_CODES = frozenset({"SlowDown", "ServiceUnavailable", "RequestTimeout", "InternalError"})


def _is_aiohttp_connection_error(error: BaseException) -> bool:
    return any(
        f"{cls.__module__}.{cls.__qualname__}" == _AIOHTTP_CONNECTION_ERROR
        for cls in type(error).__mro__
    )


def outage_of(error: BaseException) -> str | None:
    """What is out of reach ("the database", "the object store"), or None if this is no outage."""
    if isinstance(error, Unanswered):
        return error.what
    if isinstance(error, CommitOutcomeUnknown):
        return "the database"
    if isinstance(error, _POSTGRES_UNAVAILABLE):
        return "the database"
    if type(error) is asyncpg.InterfaceError and "connection is closed" in str(error):
        return "the database"
    if isinstance(error, asyncpg.exceptions.InternalClientError):
        # The driver's protocol lost step because the server ended the session in the middle
        # of an operation (MagicStack/asyncpg#1069): seen when PostgreSQL shuts down under load.
        lost_step = str(error).startswith(_PROTOCOL_LOST_STEP)
        return "the database" if lost_step else None
    if isinstance(error, s3_errors.ConnectionError | s3_errors.HTTPClientError):
        return "the object store"
    if isinstance(error, s3_errors.ClientError):
        answer = error.response or {}
        status = answer.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        if status >= 500 or answer.get("Error", {}).get("Code") in _S3_BUSY_CODES:
            return "the object store"
        return None
    if not isinstance(error, OSError):
        return None
    if raised_by_driver(error):
        return "the database"
    if _is_aiohttp_connection_error(error):
        return "the object store"
    if isinstance(error, TimeoutError | ConnectionError | socket.gaierror):
        return "a backing service"
    if error.errno in _NETWORK_ERRNOS:
        return "a backing service"
    return None


# Every family an outage can come from; `outage_of` decides for each member whether it is one.
OUTAGE_FAMILIES: tuple[type[Exception], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    s3_errors.BotoCoreError,
    s3_errors.ClientError,
    OSError,  # TimeoutError and ConnectionError too; aiohttp's are OSErrors
)


def is_outage_family(error: BaseException) -> bool:
    return isinstance(error, OUTAGE_FAMILIES)
