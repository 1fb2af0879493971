"""Turn a stream's legal hold on or off (streams:admin). While on, nothing is pruned or deleted."""

from __future__ import annotations

from datetime import datetime

from application import tracing
from application.access import Caller
from application.definitions import Definitions
from application.group_commit import GroupCommit, run_one
from application.ports import Clock, Idempotency
from application.views import LegalHoldView
from domain import errors
from domain.events import Event
from domain.stream import Stream
from domain.text import check_text


class LegalHoldCommand:
    idempotency: Idempotency | None = None
    records = ()
    offset_of = None
    producer = None

    def __init__(self, enabled: bool, reason: str | None, now: datetime) -> None:
        self.enabled = enabled
        self.reason = reason
        self.now = now

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        return stream.set_legal_hold(self.enabled, self.reason, self.now)

    def answer(self, stream: Stream, events: list[Event]) -> LegalHoldView:
        hold = stream.state.legal_hold
        return LegalHoldView(enabled=hold.enabled, reason=hold.reason, updated_at=hold.updated_at)


class SetLegalHold:
    def __init__(self, definitions: Definitions, commits: GroupCommit, clock: Clock) -> None:
        self._definitions = definitions
        self._commits = commits
        self._clock = clock

    @tracing.use_case("set legal hold")
    async def __call__(
        self, caller: Caller, run_id: str, stream_id: str, enabled: bool, reason: str | None
    ) -> LegalHoldView:
        caller.require("streams:admin")
        key = caller.key(run_id, stream_id)
        if reason is not None and len(reason) > 1_000:
            raise errors.InvalidInput("reason is at most 1,000 characters", field="reason")
        if reason is not None:
            check_text("reason", reason)
        await self._definitions.get(key, runs=caller.runs)
        command = LegalHoldCommand(enabled, reason, self._clock())
        return await run_one(self._commits, key, command)
