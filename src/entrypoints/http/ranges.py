"""The one byte range of an object body a download serves (RFC 9110 §14).

Only a single range is honoured: `bytes=a-b`, `bytes=a-` or `bytes=-n`. A header that is not
valid, names another unit, or lists several ranges is ignored, as RFC 9110 allows, and the whole
body is served. No library here parses Range (Litestar does not serve ranges), and the single
form a resumable download needs is this small."""

from __future__ import annotations

import re
from typing import NamedTuple

_SINGLE = re.compile(r"bytes=([0-9]*)-([0-9]*)", re.IGNORECASE)
# Positions longer than this are past any body (at most 32 MiB) and need not be exact; it keeps
# int() away from Python's limit on the digits it converts.
_DIGITS = 18


class Span(NamedTuple):
    """Bytes `first` to `last` inclusive, as Content-Range counts them."""

    first: int
    last: int

    @property
    def length(self) -> int:
        return self.last - self.first + 1


class NotSatisfiable(Exception):
    """The range names no byte of the body: 416 with `Content-Range: bytes */size`."""


def byte_span(header: str | None, size: int) -> Span | None:
    """The span of a `size`-byte body the Range header asks for, or None for the whole body.
    Raises NotSatisfiable when the range starts at or past the end (or asks for no bytes)."""
    if header is None:
        return None
    match = _SINGLE.fullmatch(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first:
        if not last:
            return None  # "bytes=-" is not a range
        suffix = _position(last)
        if suffix == 0:
            raise NotSatisfiable
        if size == 0:
            return None  # no Content-Range can name a span of an empty body: serve it whole
        return Span(max(size - suffix, 0), size - 1)
    start = _position(first)
    end = _position(last) if last else None
    if end is not None and end < start:
        return None  # invalid, so ignored
    if start >= size:
        raise NotSatisfiable
    return Span(start, size - 1 if end is None else min(end, size - 1))


def _position(digits: str) -> int:
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= _DIGITS else 10**_DIGITS
