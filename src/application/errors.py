"""Errors the application raises on top of the domain's."""

from __future__ import annotations

from domain.errors import DomainError


class NotFound(DomainError):
    code = "not-found"


class Unauthenticated(DomainError):
    code = "unauthenticated"


class MinterEnded(Unauthenticated):
    """The token minting another was revoked (or expired) before the mint was stored: nothing
    is stored (401, as any request with that token is from then on)."""


class Forbidden(DomainError):
    code = "forbidden"
