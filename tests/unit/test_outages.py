"""Which errors are outages (503 `unavailable`, Retry-After) and which stay bugs (500)."""

from __future__ import annotations

import asyncio
import socket

import asyncpg
import botocore.exceptions as s3_errors
import pytest
from litestar import Litestar, get
from litestar.testing import TestClient

from adapters.postgres.bounded import bounded
from application.waiting import CommitOutcomeUnknown, Unanswered
from entrypoints.http import problems
from entrypoints.http.outages import outage_handlers


async def _refused_by_the_driver() -> Exception:
    """What asyncpg raises connecting to a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        await asyncpg.connect(f"postgresql://x@127.0.0.1:{port}/x", timeout=5)
    except Exception as error:
        return error
    raise AssertionError("connected to a closed port")


async def _missing_unix_socket(tmp: str) -> Exception:
    """What asyncpg raises when a stopped server removed its Unix socket."""
    try:
        await asyncpg.connect(f"postgresql://x@/x?host={tmp}", timeout=5)
    except Exception as error:
        return error
    raise AssertionError("connected to a missing socket")


def s3_client_error(code: str, status: int) -> s3_errors.ClientError:
    answer = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return s3_errors.ClientError(answer, "PutObject")  # type: ignore[arg-type]


OUTAGES = {
    "57P03 cannot connect now": asyncpg.exceptions.CannotConnectNowError(
        "the database system is starting up"
    ),
    "57P01 admin shutdown": asyncpg.exceptions.AdminShutdownError(
        "terminating connection due to administrator command"
    ),
    "57P02 crash shutdown": asyncpg.exceptions.CrashShutdownError("crash"),
    "08006 connection failure": asyncpg.exceptions.ConnectionFailureError("failure"),
    "08001 client cannot connect": asyncpg.exceptions.ClientCannotConnectError("no"),
    "connection does not exist": asyncpg.exceptions.ConnectionDoesNotExistError(
        "connection was closed in the middle of operation"
    ),
    "53300 too many connections": asyncpg.exceptions.TooManyConnectionsError("too many"),
    "a closed connection": asyncpg.InterfaceError("cannot perform operation: connection is closed"),
    "a session ended mid-operation": asyncpg.exceptions.InternalClientError(
        "cannot switch to state 12; another operation (2) is in progress"
    ),
    "pool acquire timeout": TimeoutError(),
    "connection refused": ConnectionRefusedError(111, "Connection refused"),
    "host unreachable": OSError(113, "No route to host"),
    "dns failure": socket.gaierror(-2, "Name or service not known"),
    "S3 endpoint unreachable": s3_errors.EndpointConnectionError(endpoint_url="http://s3"),
    "S3 connect timeout": s3_errors.ConnectTimeoutError(endpoint_url="http://s3"),
    "S3 read timeout": s3_errors.ReadTimeoutError(endpoint_url="http://s3"),
    "S3 connection closed": s3_errors.ConnectionClosedError(endpoint_url="http://s3"),
    "S3 slow down": s3_client_error("SlowDown", 503),
    "S3 internal error": s3_client_error("InternalError", 500),
}

BUGS = {
    "syntax error": asyncpg.exceptions.PostgresSyntaxError('syntax error at or near "SELEC"'),
    "unique violation": asyncpg.exceptions.UniqueViolationError("duplicate key"),
    "another operation in progress": asyncpg.InterfaceError(
        "cannot perform operation: another operation is in progress"
    ),
    "a pool misused": asyncpg.exceptions.InternalClientError(
        "PoolConnectionHolder.release() called on a free connection holder"
    ),
    "bad query argument": asyncpg.exceptions.DataError("invalid input for query argument $1"),
    "a file of ours missing": FileNotFoundError(2, "No such file or directory"),
    "permission denied": PermissionError(13, "Permission denied"),
    "S3 access denied": s3_client_error("AccessDenied", 403),
    "S3 bad parameter": s3_errors.ParamValidationError(report="Bucket: missing"),
    "a plain bug": ValueError("oops"),
}


def answer_for(error: Exception) -> tuple[int, dict[str, str], dict]:
    @get("/boom")
    async def boom() -> None:
        raise error

    app = Litestar(
        route_handlers=[boom],
        # The same shape app.py registers: outages first, then the catch-all.
        exception_handlers={**outage_handlers(), Exception: problems.internal_error},
    )
    with TestClient(app) as client:
        response = client.get("/boom")
    return response.status_code, dict(response.headers), response.json()


@pytest.mark.parametrize("error", OUTAGES.values(), ids=OUTAGES.keys())
def test_an_outage_answers_503_unavailable_with_retry_after(error: Exception) -> None:
    status, headers, body = answer_for(error)
    assert status == 503, body
    assert body["code"] == "unavailable" and body["status"] == 503
    assert headers["content-type"].startswith("application/problem+json")
    assert int(headers["retry-after"]) >= 1


@pytest.mark.parametrize("error", BUGS.values(), ids=BUGS.keys())
def test_a_bug_is_still_a_500(error: Exception) -> None:
    status, headers, body = answer_for(error)
    assert status == 500, body
    assert body["code"] == "internal"
    assert "retry-after" not in headers


def test_what_the_driver_raises_for_a_closed_port_is_an_outage() -> None:
    error = asyncio.run(_refused_by_the_driver())
    status, _, body = answer_for(error)
    assert status == 503, (type(error), body)


def test_what_the_driver_raises_for_a_removed_unix_socket_is_an_outage(tmp_path) -> None:
    error = asyncio.run(_missing_unix_socket(str(tmp_path)))
    assert isinstance(error, OSError)  # FileNotFoundError: the same as a file of ours missing
    status, _, body = answer_for(error)
    assert status == 503, (type(error), body)


async def _each_awaiter_of_one_failed_lookup(tmp: str) -> list[BaseException]:
    """One lookup, through `bounded` as every statement goes, failing at a missing socket, and
    awaited by several requests in turn, as one token's lookup is by the requests it came for."""

    async def connect() -> None:
        await asyncpg.connect(f"postgresql://x@/x?host={tmp}", timeout=5)

    shared = asyncio.ensure_future(bounded(connect()))
    errors: list[BaseException] = []
    for _ in range(3):
        try:
            async with asyncio.timeout(5):
                await asyncio.shield(shared)
        except OSError as error:
            errors.append(error)
    return errors


def test_a_driver_error_awaited_by_many_is_an_outage_to_each(tmp_path) -> None:
    """Awaited again, a failed future hands a later awaiter a traceback without the driver's
    frames: the third request answered 500 while PostgreSQL restarted under load."""
    errors = asyncio.run(_each_awaiter_of_one_failed_lookup(str(tmp_path)))
    assert len(errors) == 3
    for error in errors:
        status, _, body = answer_for(error)
        assert status == 503, (type(error), body)


def test_a_backing_service_that_did_not_answer_in_time_is_a_503_that_never_claims_a_failure() -> (
    None
):
    status, _, body = answer_for(Unanswered("the database", 5.0))
    assert status == 503 and "outcome" not in body
    assert "the database" in body["detail"]


@pytest.mark.parametrize(
    "error",
    [
        Unanswered("the database", 5.0, outcome_unknown=True),
        CommitOutcomeUnknown("the connection failed during COMMIT"),
    ],
    ids=["commit unanswered", "connection lost during commit"],
)
def test_a_write_whose_commit_went_unanswered_says_its_outcome_is_unknown(
    error: Exception,
) -> None:
    status, headers, body = answer_for(error)
    assert status == 503 and body["code"] == "unavailable"
    assert body["outcome"] == "unknown"
    assert "Idempotency-Key" in body["detail"]
    assert headers["retry-after"] == "1"
