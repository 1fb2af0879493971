"""Errors the application raises on top of the domain's."""

from __future__ import annotations

from domain.errors import DomainError


class NotFound(DomainError):
    code = "not-found"


class Unauthenticated(DomainError):
    code = "unauthenticated"


class Forbidden(DomainError):
    code = "forbidden"
