"""Who is calling, and what they may do. Tenancy is structural: every key starts with the
caller's tenant, so another tenant's run or stream is simply not found.

A caller may also be restricted to some of its tenant's runs (a token minted with `runs`, or a
JWT with a `runs` claim): every other run is then not found either, exactly as if it belonged
to another tenant. `key` is where that is decided for a named run; listings filter with
`sees_run`, and `Definitions.get` hides a fork whose source is in a run the caller cannot see."""

from __future__ import annotations

from typing import Literal

import msgspec

from application.errors import Forbidden, NotFound
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
    # The runs this caller may see, or None: every run of its tenant.
    runs: frozenset[str] | None = None
    # The latest a token this caller mints may live until, on the same clock (None: its
    # `token_deadline`): a JWT's own `exp`, where its `token_deadline` adds the clock leeway.
    mint_deadline: float | None = None

    def require(self, scope: Scope) -> None:
        if scope not in self.scopes:
            raise Forbidden(f"this token lacks the {scope} scope")

    def key(self, run_id: str, stream_id: str) -> StreamKey:
        key = StreamKey(self.tenant, check_id("runID", run_id), check_id("streamID", stream_id))
        if self.runs is not None and run_id not in self.runs:
            raise NotFound(f"no stream {stream_id!r} in run {run_id!r}")
        return key

    def run(self, run_id: str) -> str:
        """A run the caller names as a whole (its listing, its deletion): not found outside
        the caller's runs."""
        check_id("runID", run_id)
        if self.runs is not None and run_id not in self.runs:
            raise NotFound(f"no run {run_id!r}")
        return run_id

    def sees_run(self, run_id: str) -> bool:
        return self.runs is None or run_id in self.runs


def require_reader(caller: Caller, definition: StreamDefinition) -> None:
    if not definition.authorization.may_read(caller.principal):
        raise Forbidden(f"principal {caller.principal!r} is not a reader of this stream")


def require_writer(caller: Caller, definition: StreamDefinition) -> None:
    if not definition.authorization.may_write(caller.principal):
        raise Forbidden(f"principal {caller.principal!r} is not a writer of this stream")
