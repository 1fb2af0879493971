"""List a run's streams: those the caller may read and this deployment serves, and not expired,
a keyset page in ascending stream_id. Listing is not an access: it keeps no stream alive."""

from __future__ import annotations

from datetime import datetime

from application import tracing
from application.access import Caller
from application.definitions import sources_within
from application.errors import NotFound
from application.expiry import AccessLog
from application.placement import Deployment
from application.ports import StreamAccess, StreamRepository
from application.views import StreamList, stream_document
from domain import errors
from domain.ids import check_id
from domain.stream import Stream

DEFAULT_LIMIT = 100
MAX_LIMIT = 1_000
# Streams the caller may not see (another principal's, soft-deleted, expired, served elsewhere)
# are passed over, so one page may read more rows than it answers: at most this many batches of
# `limit + 1` before it answers what it has, shorter, with `next_after` where it stopped. A
# listing's cost stays bounded by its limit, however many streams it passes over.
MAX_BATCHES = 10
# The stored definitions and states one page reads, at most (past the first stream): a
# definition may hold a 64 KiB schema, and a page of 1,000 of them (61 MB) held the event loop
# about 100 ms to decode and encode; 64 such listings at once took another tenant's appends to
# p99 1.3 s. A page that stops at this answers `next_after` where it stopped.
PAGE_BYTES = 4 * 1024 * 1024


class ListStreams:
    def __init__(
        self,
        streams: StreamRepository,
        deployment: Deployment,
        access: AccessLog,
        recorded: StreamAccess,
    ) -> None:
        self._streams = streams
        self._deployment = deployment
        self._access = access
        self._recorded = recorded

    @tracing.use_case("list streams")
    async def __call__(
        self,
        caller: Caller,
        run_id: str,
        after: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> StreamList:
        caller.require("streams:read")
        run_id = caller.run(run_id)  # a run outside a run-restricted caller's runs: not found
        if not 1 <= limit <= MAX_LIMIT:
            raise errors.InvalidInput(f"limit must be 1 to {MAX_LIMIT}", field="limit")
        if after is not None:
            check_id("after", after)
        page: list[Stream] = []
        recorded: dict[str, datetime] = {}  # last accesses, read once per request when needed
        live = False  # the run holds a stream that is not gone (readable by this caller or not)
        cursor = after
        left = PAGE_BYTES
        for _ in range(MAX_BATCHES):
            # One more than asked says whether another batch follows.
            read = await self._streams.list_run_within(
                caller.tenant, run_id, cursor, limit + 1, left
            )
            batch, left = read.streams, left - read.size
            more = len(batch) > limit or read.cut
            batch = batch[:limit]
            alive = await self._alive(caller.tenant, run_id, batch, recorded)
            live = live or bool(alive)
            alive_ids = {s.key.stream_id for s in alive}
            for index, stream in enumerate(batch):
                if stream.key.stream_id in alive_ids and await self._shows(caller, stream):
                    page.append(stream)
                    if len(page) == limit:
                        follows = more or index < len(batch) - 1
                        return self._answer(page, stream.key.stream_id if follows else None)
            if not more:
                gone = not page and not live
                if gone and (after is None or not await self._exists(caller, run_id)):
                    raise NotFound(f"no run {run_id!r}")
                return self._answer(page, None)
            cursor = batch[-1].key.stream_id
            if read.cut or left <= 0:
                return self._answer(page, cursor)  # read its bytes: go on from here
        return self._answer(page, cursor)  # passed over enough for one page: go on from here

    async def _alive(
        self, tenant: str, run_id: str, streams: list[Stream], recorded: dict[str, datetime]
    ) -> list[Stream]:
        """Those not gone: neither deleted but for their forks, nor expired. `recorded`: the
        run's last accesses, filled at the first stream with an expiry."""
        streams = [s for s in streams if not s.state.soft_deleted]
        if any(s.definition.expiry.enabled for s in streams):
            if not recorded:
                recorded.update(await self._recorded.run_access(tenant, run_id))
            streams = self._access.visible(streams, recorded)
        return streams

    async def _shows(self, caller: Caller, stream: Stream) -> bool:
        if not (
            stream.definition.authorization.may_read(caller.principal)
            and self._deployment.serves(stream.definition)
        ):
            return False
        # A fork that reads a run a run-restricted caller cannot see: not there for it.
        return caller.runs is None or await sources_within(
            self._streams, stream.key, stream.definition, caller.runs
        )

    async def _exists(self, caller: Caller, run_id: str) -> bool:
        """After `after`, nothing: the run exists if it holds a stream that is not gone. Read
        within PAGE_BYTES as a page is; when more streams follow those read (past MAX_LIMIT or
        the bytes), it is taken to exist rather than answered 404 unread."""
        read = await self._streams.list_run_within(
            caller.tenant, run_id, None, MAX_LIMIT + 1, PAGE_BYTES
        )
        if read.cut or len(read.streams) > MAX_LIMIT:
            return True
        return bool(await self._alive(caller.tenant, run_id, read.streams, {}))

    @staticmethod
    def _answer(page: list[Stream], next_after: str | None) -> StreamList:
        return StreamList(streams=[stream_document(s) for s in page], next_after=next_after)
