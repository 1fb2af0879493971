"""A request's head, read once: the few fields every request needs (request id, token,
idempotency key, how its body is framed, whether the client closes), and lookups of the rest
for the handlers that want more (the Durable Streams headers)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from domain.digits import bounded_integer

# The largest Content-Length the HTTP servers in front pass on (a u64 in hyper, under granian):
# a longer one is refused before the application, so None below means "not declared".
MAX_CONTENT_LENGTH = 2**64 - 1
MAX_REQUEST_ID = 128


class RequestHead:
    """What one pass over a request's raw ASGI headers finds. `authorization` and
    `idempotency_key` are the first of each (as a header lookup answers); the request id and
    Content-Length are the last given."""

    __slots__ = (
        "authorization",
        "closing",
        "declared",
        "has_body",
        "idempotency_key",
        "lengths",
        "raw",
        "request_id",
    )

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        self.raw = raw
        self.request_id: str | None = None
        self.authorization: str | None = None
        self.idempotency_key: str | None = None
        self.declared: int | None = None
        self.lengths = 0  # one Content-Length alone is 1: then the body ends at its last byte
        self.has_body = False
        self.closing = False
        for name, value in raw:
            if name == b"authorization":
                if self.authorization is None:
                    self.authorization = value.decode("latin-1")
            elif name == b"idempotency-key":
                if self.idempotency_key is None:
                    self.idempotency_key = value.decode("latin-1")
            elif name == b"content-length":
                self.declared = bounded_integer(value, MAX_CONTENT_LENGTH)
                self.has_body = value not in (b"0", b"")
                self.lengths += 1
            elif name == b"transfer-encoding":
                self.has_body = True
                self.lengths += 2  # chunked framing: the Content-Length (if any) does not count
            elif name == b"x-request-id":
                # Printable ASCII only: other bytes (UTF-8 read as Latin-1) were echoed encoded
                # twice, and logged as mojibake; such a request gets an ID of the server's.
                text = value.decode("latin-1")[:MAX_REQUEST_ID]
                if text.isascii() and text.isprintable():
                    self.request_id = text
            elif name == b"connection" and value.lower() == b"close":
                self.closing = True


class RequestHeaders:
    """A request's headers by name, case-insensitive (names are lower case in ASGI, values
    latin-1): `get` answers the first of a repeated header, `getall` every one, `pick` the
    values of a few names in one pass (an append's protocol headers). The map by name is built
    from one pass over the few there are, when a handler first asks by name."""

    __slots__ = ("_by_name", "raw")

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        self.raw = raw
        self._by_name: dict[str, list[bytes]] | None = None

    def _names(self) -> dict[str, list[bytes]]:
        by_name = self._by_name
        if by_name is None:
            by_name = self._by_name = {}
            for key, value in self.raw:
                name = key.decode("latin-1")
                values = by_name.get(name)
                if values is None:
                    by_name[name] = [value]
                else:
                    values.append(value)
        return by_name

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._names()

    def get(self, name: str) -> str | None:
        values = self._names().get(name.lower())
        return None if values is None else values[0].decode("latin-1")

    def raw_values(self, name: str) -> list[bytes] | None:
        """Every value of `name` as given (None when it is not)."""
        return self._names().get(name.lower())

    def getall(self, name: str) -> list[str]:
        values = self._names().get(name.lower())
        return [] if values is None else [value.decode("latin-1") for value in values]

    def pick(self, slots: Mapping[bytes, int], count: int) -> list[list[bytes] | None]:
        """The raw values of the names `slots` numbers (lower case, 0 to `count` - 1), each
        name's in the order given; None for a name not given."""
        picked: list[list[bytes] | None] = [None] * count
        for key, value in self.raw:
            slot = slots.get(key)
            if slot is not None:
                values = picked[slot]
                if values is None:
                    picked[slot] = [value]
                else:
                    values.append(value)
        return picked
