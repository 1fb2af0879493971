"""Protocol answers: a status, exact headers and a body, sent as they are (no charset is added
to a `text/*` type: the protocol answers a stream's content type exactly as configured)."""

from __future__ import annotations

from typing import Any

from domain.errors import DomainError
from entrypoints.edge.problems import PROBLEM_JSON, of_domain_error

_NAMES: dict[str, bytes] = {}


def _name(name: str) -> bytes:
    """A header name as sent (lower case), encoded once per name: the names are the
    protocol's few, and a name not seen before is encoded without being kept past a bound."""
    encoded = _NAMES.get(name)
    if encoded is None:
        encoded = name.lower().encode("latin-1")
        if len(_NAMES) < 256:
            _NAMES[name] = encoded
    return encoded


class Answer:
    __slots__ = ("body", "extra", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.status = status
        self.headers = headers
        self.body = body
        # Encoded headers added as they are (the append front's request id and browser headers).
        self.extra: list[tuple[bytes, bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [(_name(k), v.encode("latin-1")) for k, v in self.headers.items()]
        headers += self.extra
        if self.status not in (204, 304):
            headers.append((b"content-length", b"%d" % len(self.body)))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if self.status in (204, 304) else self.body}
        )


def problem_answer(error: DomainError, headers: dict[str, str] | None = None) -> Answer:
    """The application's problem answer for `error` (entrypoints/edge/problems.py), with the
    protocol's headers."""
    problem = of_domain_error(error, headers)
    return Answer(problem.status, {"Content-Type": PROBLEM_JSON, **problem.headers}, problem.body)
