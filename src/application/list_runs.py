"""List the caller's tenant's runs (streams:read): a keyset page in ascending run_id, optionally
only those whose run_id starts with a prefix."""

from __future__ import annotations

import msgspec

from application import tracing
from application.access import Caller
from application.expiry import AccessLog
from application.ports import RunSummary, StreamRepository
from domain import errors
from domain.ids import check_id

DEFAULT_LIMIT = 100
MAX_LIMIT = 1_000


class RunList(msgspec.Struct, frozen=True):
    runs: list[RunSummary]
    next_after: str | None  # the last run_id answered, or null when no run follows


class ListRuns:
    """With an access log, streams that answer 404 as expired (not yet erased by the workers) are
    not counted, and a run whose streams have all expired is not listed."""

    def __init__(self, streams: StreamRepository, access: AccessLog | None = None) -> None:
        self._streams = streams
        self._access = access

    @tracing.use_case("list runs")
    async def __call__(
        self,
        caller: Caller,
        after: str | None = None,
        limit: int = DEFAULT_LIMIT,
        prefix: str = "",
    ) -> RunList:
        caller.require("streams:read")
        if not 1 <= limit <= MAX_LIMIT:
            raise errors.InvalidInput(f"limit must be 1 to {MAX_LIMIT}", field="limit")
        if after is not None:
            check_id("after", after)
        if prefix:
            check_id("prefix", prefix)  # the start of a run ID is an ID itself
        # One more than asked says whether another page follows.
        if caller.runs is not None:
            runs = await self._only(caller, after, limit + 1, prefix)
        else:
            runs = await self._page(caller.tenant, after, limit + 1, prefix)
        more = len(runs) > limit
        runs = runs[:limit]
        return RunList(runs=runs, next_after=runs[-1].run_id if more else None)

    async def _page(
        self, tenant: str, after: str | None, limit: int, prefix: str
    ) -> list[RunSummary]:
        if self._access is None:
            return await self._streams.list_runs(tenant, after, limit, prefix)
        return await self._access.live_runs(tenant, after, limit, prefix)

    async def _only(
        self, caller: Caller, after: str | None, limit: int, prefix: str
    ) -> list[RunSummary]:
        """A caller restricted to some runs lists those of them that exist: each is the first
        run of the page that starts with its own ID (no shorter ID starts with it)."""
        assert caller.runs is not None
        found: list[RunSummary] = []
        for run_id in sorted(caller.runs):
            if (after is not None and run_id <= after) or not run_id.startswith(prefix):
                continue
            page = await self._page(caller.tenant, None, 1, run_id)
            if page and page[0].run_id == run_id:
                found.append(page[0])
                if len(found) >= limit:
                    break
        return found
