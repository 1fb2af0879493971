"""Protocol answers: a status, exact headers and a body, sent as they are (no charset is added
to a `text/*` type: the protocol answers a stream's content type exactly as configured)."""

from __future__ import annotations

from typing import Any

import msgspec

from domain.errors import DomainError
from entrypoints.http.observability import HOT
from entrypoints.http.problems import PROBLEM_JSON, PROBLEM_TYPE_BASE, STATUS_OF_CODE, TITLE_OF_CODE

_encode = msgspec.json.Encoder().encode


class Answer:
    __slots__ = ("body", "extra", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.status = status
        self.headers = headers
        self.body = body
        # Encoded headers added as they are (the append front's request id and browser headers).
        self.extra: list[tuple[bytes, bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()
        ]
        headers += self.extra
        if self.status not in (204, 304):
            headers.append((b"content-length", b"%d" % len(self.body)))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if self.status in (204, 304) else self.body}
        )


def problem_answer(error: DomainError, headers: dict[str, str] | None = None) -> Answer:
    """The problem+json answer the application's handler would give, with protocol headers."""
    status = STATUS_OF_CODE.get(error.code, 400)
    HOT.problem(error.code)
    body = {
        "type": PROBLEM_TYPE_BASE + error.code,
        "title": TITLE_OF_CODE.get(error.code, error.code),
        "status": status,
        "detail": error.detail,
        "code": error.code,
        **error.extra,
    }
    return Answer(status, {"Content-Type": PROBLEM_JSON, **(headers or {})}, _encode(body))
