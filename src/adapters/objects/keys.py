"""Object keys and body spans, checked the same way by every store.

Keys are chosen by the server ("tenant/run/stream/obj-…"), but a store must not trust even
those: a key becomes a path on the filesystem store, so one that could climb out of the root or
collide with a store's own temporary names is refused before any I/O. The stores share the rule
so the memory fake refuses exactly what the real ones refuse."""

from __future__ import annotations

MAX_KEY_BYTES = 1024  # S3's limit; the others follow it so a key works in every store

# Segments starting with "." are the stores' own (temporary uploads); no key may name them.
RESERVED_MARK = "."


def key_segments(key: str) -> list[str]:
    """The key's "/"-separated segments; raises ValueError for a key that is not safe."""
    if not isinstance(key, str) or not key:
        raise ValueError("an object key must be a non-empty string")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise ValueError(f"an object key is at most {MAX_KEY_BYTES} bytes")
    if key.startswith("/"):
        raise ValueError(f"object key {key!r} is absolute")
    segments = key.split("/")
    for segment in segments:
        _check_segment(key, segment)
    return segments


def prefix_segments(prefix: str) -> tuple[list[str], str]:
    """The complete segments of a listing prefix and the partial last one ("" after a "/")."""
    if prefix.startswith("/") or "\x00" in prefix:
        raise ValueError(f"object key prefix {prefix!r} is not a relative key prefix")
    *complete, partial = prefix.split("/")
    for segment in complete:
        _check_segment(prefix, segment)
    return complete, partial


def _check_segment(key: str, segment: str) -> None:
    if not segment:
        raise ValueError(f"object key {key!r} has an empty segment")
    if segment.startswith(RESERVED_MARK):  # covers "." and ".." too
        raise ValueError(f"object key {key!r} has a segment starting with {RESERVED_MARK!r}")
    if "\x00" in segment or "\\" in segment:
        raise ValueError(f"object key {key!r} has a NUL or a backslash")


def check_span(offset: int, length: int | None) -> None:
    """The span a ranged `get` reads; raises ValueError for one no store can read."""
    if offset < 0 or (length is not None and length < 0):
        raise ValueError(f"a body span needs offset >= 0 and length >= 0, not {offset}, {length}")
