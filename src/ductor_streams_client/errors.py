"""The one error type of the client: a problem answer (RFC 9457), or the service unreachable."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx


class StreamsError(Exception):
    """A request failed.

    `status` is the HTTP status (0 when no answer arrived: connection refused, reset, timed out),
    `code` the service's stable machine code (`not-found`, `backpressure`, `cursor-expired`, ...;
    `connection-error` when unreachable), `detail` the human sentence and `problem` the whole
    problem body (with extra fields such as `requested`/`earliest`/`latest` of a 410)."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        problem: dict[str, Any] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.code = code
        self.detail = detail
        self.problem: dict[str, Any] = problem if problem is not None else {}
        self.retry_after = retry_after
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.status == 0:
            return f"{self.code}: {self.detail}"
        return f"{self.status} {self.code}: {self.detail}"

    def __repr__(self) -> str:
        return f"StreamsError(status={self.status}, code={self.code!r}, detail={self.detail!r})"

    @classmethod
    def from_response(cls, response: httpx.Response) -> StreamsError:
        """Build from an error answer whose body has been read."""
        body: Any = None
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            text = response.text.strip()
            body = {
                "status": response.status_code,
                "code": f"http-{response.status_code}",
                "detail": text[:500] or response.reason_phrase,
            }
        return cls(
            response.status_code,
            str(body.get("code") or f"http-{response.status_code}"),
            str(body.get("detail") or body.get("title") or response.reason_phrase),
            body,
            retry_after=parse_retry_after(response.headers.get("retry-after")),
        )

    @classmethod
    def from_transport(cls, error: httpx.TransportError, url: str) -> StreamsError:
        reason = str(error) or type(error).__name__
        return cls(
            0,
            "connection-error",
            f"cannot reach {url}: {reason}",
            {"code": "connection-error", "detail": reason, "exception": type(error).__name__},
        )


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
