"""What goes on the wire: the service's paths and ceilings, how records are encoded, and the
`Settings` both clients turn a `Call` into a request with."""

from __future__ import annotations

import base64
import math
import uuid
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote

import httpx
import msgspec

from ductor_streams_client._core.exchange import Call, Exchange, RetryPolicy
from ductor_streams_client.errors import InvalidInput

API_PREFIX = "/api/workflow-streams"
USER_AGENT = "ductor-streams-client/0.2"
CHUNK = 256 * 1024
MAX_BATCH_RECORDS = 1_000  # the service's per-append ceiling
MAX_REQUEST_BYTES = 8 * 1024 * 1024  # its JSON body ceiling
MAX_INLINE_RECORD_BYTES = 65_536  # its ceiling of one record's stored bytes (larger: an object)

Progress = Callable[[int, int], None]
"""Called as `progress(bytes_sent, total_bytes)` while an object body uploads."""

_msgspec_encode = msgspec.json.Encoder().encode


def encode_json(value: Any) -> bytes:
    """`value` as compact JSON. A float that is not finite (nan, inf: JSON has no such number,
    and msgspec would write `null` in its place) raises `ValueError`, so that nothing is sent."""
    encoded = _msgspec_encode(value)
    if b"null" in encoded:  # where such a float would show: look for one only then
        _refuse_non_finite(value)
    return encoded


def _already_json(value: Any) -> None:
    """`msgspec.Raw` is JSON text the caller gave as it is (no float of ours in it)."""
    if isinstance(value, msgspec.Raw):
        return None
    raise NotImplementedError(f"{type(value).__name__} is not JSON")


def _refuse_non_finite(value: Any) -> None:
    # Structs, dataclasses...: dicts and lists (a Raw: as None, it holds no Python float)
    pending = [msgspec.to_builtins(value, enc_hook=_already_json)]
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(
                f"{item!r} is not a JSON number (JSON has no nan or infinity): send a finite "
                "number, null or a string"
            )
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)


_encode = encode_json


# Path parts that no encoding carries as they are: an empty part, and the dot segments, which
# httpx (like any URL library) removes from a path before sending it (RFC 3986, 5.2.4), so that
# `runs/r1/streams/..` would reach `runs/r1`, and a DELETE of a stream would delete its run.
_NO_PATH_PART = frozenset({"", ".", ".."})


def segment(value: str, field: str) -> str:
    """`value` as one part of a path, percent-encoded. An empty, `.` or `..` value, which would
    reach another route, raises `InvalidInput` (status 0: nothing was sent), the class the
    service answers every other invalid ID with; `field` names it (`run_id`, `stream_id`...)."""
    text = str(value)
    if text in _NO_PATH_PART:
        detail = (
            f"{field} {text!r} is not a valid ID: an empty, '.' or '..' path part would reach "
            "another route (nothing was sent)"
        )
        raise InvalidInput(
            0, "invalid-input", detail, {"code": "invalid-input", "detail": detail, "field": field}
        )
    return quote(text, safe="._:-~")


def stream_path(run_id: str, stream_id: str | None = None, tail: str = "") -> str:
    path = f"{API_PREFIX}/runs/{segment(run_id, 'run_id')}/streams"
    if stream_id is not None:
        path += "/" + segment(stream_id, "stream_id")
    return path + tail


def object_path(run_id: str, stream_id: str, object_id: str, tail: str = "") -> str:
    return stream_path(run_id, stream_id, f"/objects/{segment(object_id, 'object_id')}{tail}")


def new_key() -> str:
    return str(uuid.uuid4())


def encode_record(value: Any, content_type: str | None = None) -> bytes:
    """One record of an append body, encoded: bytes go as `data_base64` (with `content_type`,
    default `application/octet-stream`), anything else as the JSON `data` (with `content_type`
    when given)."""
    if isinstance(value, bytes | bytearray | memoryview):
        record: dict[str, Any] = {"data_base64": base64.b64encode(bytes(value)).decode("ascii")}
        record["content_type"] = content_type or "application/octet-stream"
        return _encode(record)
    if content_type:
        return _encode({"data": value, "content_type": content_type})
    return b'{"data":' + _encode(value) + b"}"


def stored_size(value: Any) -> int:
    """The bytes the service stores for a record of `value`: the bytes themselves, or the
    compact JSON of the value (before any redaction)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return len(bytes(value))
    return len(_encode(value))


def append_body(parts: Iterable[bytes]) -> bytes:
    return b'{"records":[' + b",".join(parts) + b"]}"


class Settings:
    """What both clients are configured with, and how they turn a `Call` into a request."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        timeout: float | httpx.Timeout,
        idle_timeout: float,
        retry: RetryPolicy | None,
    ) -> None:
        root = base_url.rstrip("/").removesuffix(API_PREFIX)
        wrong = f"base_url must be an http:// or https:// URL, got {base_url!r}"
        try:
            parts = httpx.URL(root)
        except httpx.InvalidURL as error:  # `http://[::1`: no ValueError, but the same mistake
            raise ValueError(f"{wrong}: {error}") from None
        if parts.scheme not in ("http", "https") or not parts.host:
            raise ValueError(wrong)
        if parts.port is not None and not 1 <= parts.port <= 65535:
            # httpx takes any number; the socket would raise OverflowError on every call.
            raise ValueError(f"{wrong}: its port is not 1 to 65535")
        self.base_url = root
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self.idle_timeout = idle_timeout
        self.retry = retry or RetryPolicy()
        self.headers = {"User-Agent": USER_AGENT}
        # Surrounding whitespace is never part of a token: a token file's newline (`serve`
        # writes the development token with one) would otherwise make every header illegal.
        token = token.strip() if token else None
        if token:
            if not all(" " < char <= "~" for char in token):
                raise ValueError(
                    "token holds a character no Bearer token has (a space, a control "
                    "character or non-ASCII)"
                )
            self.headers["Authorization"] = f"Bearer {token}"

    def url(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            return path
        return self.base_url + path

    def timeout_of(self, call: Call) -> httpx.Timeout:
        t = self.timeout
        if call.read_timeout is not None:
            return httpx.Timeout(
                connect=t.connect, read=call.read_timeout, write=t.write, pool=t.pool
            )
        if call.extra_read:
            read = None if t.read is None else t.read + call.extra_read
            return httpx.Timeout(connect=t.connect, read=read, write=t.write, pool=t.pool)
        return t

    def exchange(self, call: Call) -> Exchange:
        return Exchange(call, self.retry, self.base_url)
