"""What both surfaces' subscription routes share, framework-free: the reserved `__ds` path of
the Durable Streams surface, the stream root's URL a subscription's links are made from, and
the wake token a callback or a claim carries."""

from __future__ import annotations

from domain.errors import DomainError
from entrypoints.edge.paths import DURABLE_STREAMS_PREFIX, STREAM_PATH

DS = "/__ds"


class WakeTokenMissing(DomainError):
    code = "wake-token-invalid"


def stream_root_url(
    public_url: str | None, server: tuple[str | None, int | None] | None, scheme: str
) -> str:
    """The stream root's URL as the client reached it (the socket's own address, never the
    Host header: a `Location` is made from it too), unless DUCTOR_STREAMS_PUBLIC_URL names it."""
    path = DURABLE_STREAMS_PREFIX + STREAM_PATH
    if public_url:
        return public_url.rstrip("/") + path
    if not server:
        return path
    address, port = server
    if address is None:
        return path
    host = f"[{address}]" if ":" in address else address
    default = {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{host}{'' if port in (None, default) else f':{port}'}{path}"


def wake_token(authorization: str | None) -> str:
    """The Bearer token of a callback or a pull-wake call (the wake's own token)."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise WakeTokenMissing("this wake's token is required: Authorization: Bearer <token>")
    return token.strip()
