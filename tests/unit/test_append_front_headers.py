"""The append front answers `protocol.append`'s header lookups as Litestar's Headers does."""

from __future__ import annotations

import pytest
from litestar.datastructures import Headers

from entrypoints.http.hot import _Headers

RAW = [
    (b"authorization", b"Bearer a"),
    (b"producer-id", b"p\xe9"),  # latin-1, as Litestar decodes it
    (b"stream-seq", b"1"),
    (b"stream-seq", b"2"),
    (b"content-type", b"application/json"),
]


@pytest.mark.parametrize(
    "name", ["authorization", "Producer-Id", "stream-seq", "CONTENT-TYPE", "stream-closed"]
)
def test_get_and_getall_answer_as_litestars_headers(name: str) -> None:
    ours, theirs = _Headers(RAW), Headers.from_scope({"headers": RAW})  # type: ignore[arg-type]
    assert ours.get(name) == theirs.get(name)
    assert ours.get(name, "none") == theirs.get(name, "none")
    assert ours.getall(name, []) == theirs.getall(name, [])
    if theirs.get(name) is None:
        with pytest.raises(KeyError):
            theirs.getall(name)
        with pytest.raises(KeyError):
            ours.getall(name)


# Building the application in process reports Litestar's deprecation of inferred path
# parameters for every route; not what this test is about.
@pytest.mark.filterwarnings(
    "ignore::litestar.exceptions.base_exceptions.LitestarDeprecationWarning"
)
def test_the_front_picks_each_errors_handler_as_litestar_does() -> None:
    """The front's choice of exception handler (hot._handler_of) against Litestar's own, on
    the application's handlers, for every family of error an append can meet."""
    import asyncpg
    from litestar.exceptions import InternalServerException, NotFoundException
    from litestar.exceptions.http_exceptions import RequestEntityTooLarge
    from litestar.middleware._internal.exceptions.middleware import get_exception_handler

    from domain.errors import Backpressure, InvalidInput, StreamClosed
    from entrypoints.container import memory_container
    from entrypoints.http.app import create_app
    from entrypoints.http.hot import _handler_of

    handlers = create_app(memory_container()).exception_handlers
    errors = [
        InvalidInput("x"),
        Backpressure("x"),
        StreamClosed("x"),
        RequestEntityTooLarge(),
        InternalServerException("client disconnected prematurely"),
        NotFoundException(),
        asyncpg.PostgresConnectionError("x"),
        ConnectionResetError(),
        TimeoutError(),
        ValueError("x"),
        KeyError("x"),
    ]
    for error in errors:
        assert _handler_of(handlers, error) is get_exception_handler(handlers, error), error
