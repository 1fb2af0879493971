"""The request pipeline's header lookups (entrypoints/edge/head.py) answer as Litestar's Headers
does, so a protocol function sees the same values whichever way the request came."""

from __future__ import annotations

import pytest
from litestar.datastructures import Headers

from entrypoints.edge.head import RequestHead, RequestHeaders

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
    ours, theirs = RequestHeaders(RAW), Headers.from_scope({"headers": RAW})  # type: ignore[arg-type]
    assert ours.get(name) == theirs.get(name)
    assert ours.getall(name) == theirs.getall(name, [])


def test_the_head_takes_the_first_token_and_key_and_the_last_request_id() -> None:
    head = RequestHead(
        [
            (b"authorization", b"Bearer a"),
            (b"authorization", b"Bearer b"),
            (b"idempotency-key", b"k1"),
            (b"idempotency-key", b"k2"),
            (b"x-request-id", b"first"),
            (b"x-request-id", b"x" * 300),
            (b"content-length", b"12"),
            (b"connection", b"Close"),
        ]
    )
    assert (head.authorization, head.idempotency_key) == ("Bearer a", "k1")
    assert head.request_id == "x" * 128
    assert (head.declared, head.lengths, head.has_body, head.closing) == (12, 1, True, True)
    chunked = RequestHead([(b"content-length", b"0"), (b"transfer-encoding", b"chunked")])
    assert (chunked.declared, chunked.lengths, chunked.has_body) == (0, 3, True)
