"""Who is calling, and what they may do. Tenancy is structural: every key starts with the
caller's tenant, so another tenant's run or stream is simply not found."""

from __future__ import annotations

from typing import Literal

import msgspec

from application.errors import Forbidden
from domain.definition import StreamDefinition
from domain.ids import check_id
from domain.stream import StreamKey

Scope = Literal["streams:read", "streams:write", "streams:admin"]
SCOPES: tuple[str, ...] = ("streams:read", "streams:write", "streams:admin")


class Caller(msgspec.Struct, frozen=True):
    tenant: str
    principal: str
    scopes: frozenset[str]
    # Which token authenticated this caller (its public id) and when it expires on this
    # process's monotonic clock: an open connection ends when that token is revoked or expires.
    token_id: str | None = None
    token_deadline: float | None = None

    def require(self, scope: Scope) -> None:
        if scope not in self.scopes:
            raise Forbidden(f"this token lacks the {scope} scope")

    def key(self, run_id: str, stream_id: str) -> StreamKey:
        return StreamKey(self.tenant, check_id("runID", run_id), check_id("streamID", stream_id))


def require_reader(caller: Caller, definition: StreamDefinition) -> None:
    if not definition.authorization.may_read(caller.principal):
        raise Forbidden(f"principal {caller.principal!r} is not a reader of this stream")


def require_writer(caller: Caller, definition: StreamDefinition) -> None:
    if not definition.authorization.may_write(caller.principal):
        raise Forbidden(f"principal {caller.principal!r} is not a writer of this stream")
