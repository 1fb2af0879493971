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
