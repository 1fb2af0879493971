"""Checks of what a request is, before its handler runs (the Litestar guard on every route,
and the append front), for both API surfaces:

- an ID never holds "/": `%2F` in a path is decoded into a separator by the router, so
  `/v1/stream/a%2Fb` would name run `a`, stream `b`. The raw path is checked instead: 400.
  A Durable Streams URL with a trailing slash names no stream: 404.
- a body is stored as sent: a write whose `Content-Encoding` is anything but `identity`, or whose
  `Transfer-Encoding` holds a coding other than `chunked`, would store the encoded bytes as its
  content: 415.
- a header the service reads as one value (its credentials, an idempotency key, a content
  type, a protocol header) sent twice is 400: which of the two counts would be the service's
  guess, and a proxy in front may have checked the other one."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import parse_qsl

from application.errors import NotFound
from domain.errors import DomainError, InvalidInput
from entrypoints.edge.paths import (
    DURABLE_STREAMS_PREFIX,
    NATIVE_PREFIX,
    STREAM_PATH,
    subscription_parts,
)

API = b"/api/"
NATIVE = (NATIVE_PREFIX + "/").encode()
STREAMS = (DURABLE_STREAMS_PREFIX + STREAM_PATH + "/").encode()
WRITES = frozenset({"POST", "PUT", "PATCH"})
# Headers of one value each (RFC 9110 5.3: a sender sends no field twice that is not a list).
SINGLE = frozenset(
    {
        b"authorization",
        b"host",  # RFC 9112 3.2: more than one is 400
        b"content-type",
        b"idempotency-key",
        b"last-event-id",
        b"range",
        b"if-range",
        b"producer-id",
        b"producer-epoch",
        b"producer-seq",
        b"stream-seq",
        b"stream-ttl",
        b"stream-expires-at",
        b"stream-closed",
        b"stream-forked-from",
        b"stream-fork-offset",
        b"stream-fork-sub-offset",
    }
)


class UnsupportedMediaType(DomainError):
    code = "unsupported-media-type"


# The native API's integer query parameters (the Durable Streams `cursor` is a decimal of any
# length, the protocol's, and not checked here). The framework reads `4.99999999999999999999` as
# the float 5.0 and takes it for 5 (a cursor that skipped a record): a number is whole only if
# its text is, and 2^53 at most when it is written with a point or an exponent (read as a
# float, such a number past 2^53 is not the one written), as the JSON bodies' integers
# (docs/http-api.md, "Conventions"). Written in digits alone it is judged by its range.
_INTEGER_PARAMETERS = frozenset({"cursor", "limit"})
_WHOLE_UP_TO = 2**53


def _may_not_be_whole(query: bytes) -> bool:
    """A cheap look first: this runs for every request."""
    named = b"cursor=" in query or b"limit=" in query
    return named and (b"." in query or b"e" in query or b"E" in query)


def _check_whole_numbers(query: bytes) -> None:
    for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if name not in _INTEGER_PARAMETERS or not any(c in value for c in ".eE"):
            continue  # (digits alone are read exactly, however large: the framework judges them)
        try:
            number = Decimal(value)
        except InvalidOperation:
            continue  # not a number: the framework says what it must be
        if not number.is_finite() or not float(number).is_integer():
            continue  # refused by the framework too, which says what it must be
        if number != number.to_integral_value() or abs(number) > _WHOLE_UP_TO:
            raise InvalidInput(
                f"{name} must be a whole number (at most 2^53), not {value[:40]!r}", field=name
            )


def _a_link_named(raw: bytes) -> bool:
    """Whether `%2F` stands where it is meant: in the stream path of a subscription's link
    (`__ds/subscriptions/{id}/streams/{path}`), not in the subscription's ID."""
    parts = subscription_parts(raw)
    return parts is not None and b"%2f" not in parts[0].lower()


def _codings(value: bytes) -> list[bytes]:
    return [c.strip().lower() for c in value.split(b",") if c.strip()]


def check_scope(scope: Any) -> bool:
    """The checks that need only the request's scope (raising the problem); answers whether the
    request is on the Durable Streams surface's stream paths."""
    raw = scope.get("raw_path") or scope["path"].encode("latin-1", "replace")
    if not raw.startswith(API):
        return False
    # A subscription's stream link is named by its URL-encoded path (PROTOCOL.md 6.4), slashes
    # and all: the one place an encoded slash is meant.
    if b"%2f" in raw.lower() and not _a_link_named(raw):
        raise InvalidInput("an ID may not contain '/' (an encoded %2F in the path)", field="path")
    if raw.startswith(STREAMS):
        if raw.endswith(b"/"):
            raise NotFound(f"no stream at {raw[:200].decode('latin-1')!r}: the path ends in '/'")
        rest = raw[len(STREAMS) :]
        # (Empty segments aside: the router takes `//` as `/`.)
        if (
            rest.count(b"/") > 1
            and len([p for p in rest.split(b"/") if p]) > 2
            and not (rest.lstrip(b"/").startswith(b"__ds/"))
        ):
            # (The framework's own 404 said only "Not Found".)
            raise NotFound(
                f"no stream at {raw[:200].decode('latin-1')!r}: a stream's path is "
                f"{STREAMS.decode()}{{runID}}/{{streamID}}, or {STREAMS.decode()}{{streamID}} "
                "for run 'default'"
            )
    query = scope.get("query_string")
    if query and raw.startswith(NATIVE) and _may_not_be_whole(query):
        _check_whole_numbers(query)
    write = scope["method"] in WRITES
    seen: set[bytes] = set()
    for name, value in scope["headers"]:  # one pass: this runs for every request
        if name in SINGLE:
            if name in seen:
                raise InvalidInput(
                    f"the {name.decode('latin-1')} header is sent more than once: send it once",
                    field=name.decode("latin-1"),
                )
            seen.add(name)
        elif not write:
            continue
        elif name == b"content-encoding" and any(c != b"identity" for c in _codings(value)):
            raise UnsupportedMediaType(
                f"Content-Encoding {value[:40].decode('latin-1')!r} is not accepted: send the "
                "body as it is to be stored (identity)"
            )
        elif name == b"transfer-encoding" and any(c != b"chunked" for c in _codings(value)):
            raise UnsupportedMediaType(
                f"Transfer-Encoding {value[:40].decode('latin-1')!r} is not accepted: only chunked"
            )
    return raw.startswith(STREAMS)
