"""Storage cleanup (the StorageCleanup port) on every adapter, subclassed per adapter.

A subclass provides the fixtures `repo` (its StreamRepository), `deliveries` (its input
delivery queue) and `cleanup`, and the hooks `deliver(key, through, ago)` (mark records 1 to
`through` delivered `ago` before now, as the dispatcher would have) and `rows(key)` (how many
delivery rows the stream has). Every assertion is about the test's own stream, so a store
shared with other tests needs no cleaning."""

from __future__ import annotations

from datetime import timedelta

from application.set_legal_hold import LegalHoldCommand
from domain.definition import DefinitionRequest, resolve_definition
from domain.stream import StreamKey
from tests.support.builders import NOW, append, new_key, record

HOURS_AGO = timedelta(hours=2)


def input_definition():
    request = DefinitionRequest(direction="input", stream_id="s")
    return resolve_definition(request, region="local", egress_region="local")


class StorageCleanupContract:
    async def deliver(self, key: StreamKey, through: int, ago: timedelta) -> None:
        raise NotImplementedError

    async def rows(self, key: StreamKey) -> int:
        raise NotImplementedError

    async def _input_stream(self, repo, records: int = 5) -> StreamKey:
        key = new_key()
        await repo.create(key, input_definition(), NOW)
        await repo.update(key, [append([record(b"%d" % n) for n in range(records)])])
        return key

    async def test_delivered_rows_older_than_the_age_go_and_the_status_stays(
        self, repo, deliveries, cleanup
    ) -> None:
        key = await self._input_stream(repo)
        await self.deliver(key, 3, HOURS_AGO)
        before = await deliveries.status(key)
        assert (before.delivered_through, before.pending) == (3, 2)
        await cleanup.forget_delivered_inputs(timedelta(hours=3), batch=1)  # younger: kept
        assert await self.rows(key) == 5
        assert await cleanup.forget_delivered_inputs(timedelta(hours=1), batch=1) >= 2
        assert await self.rows(key) == 3  # the highest delivered (3) and the pending 4 and 5
        assert await deliveries.status(key) == before
        assert await deliveries.delivered_through(key) == 3

    async def test_a_fully_delivered_stream_keeps_its_highest_delivered_row(
        self, repo, deliveries, cleanup
    ) -> None:
        key = await self._input_stream(repo)
        await self.deliver(key, 5, HOURS_AGO)
        before = await deliveries.status(key)
        await cleanup.forget_delivered_inputs(timedelta(0))
        assert await self.rows(key) == 1
        assert await deliveries.status(key) == before
        assert (before.delivered_through, before.pending) == (5, 0)

    async def test_undelivered_rows_are_never_removed(self, repo, deliveries, cleanup) -> None:
        key = await self._input_stream(repo)
        await cleanup.forget_delivered_inputs(timedelta(0))
        assert await self.rows(key) == 5
        assert (await deliveries.status(key)).pending == 5

    async def test_a_held_streams_delivered_rows_stay(self, repo, deliveries, cleanup) -> None:
        key = await self._input_stream(repo)
        await repo.update(key, [LegalHoldCommand(True, "audit", NOW)])
        await self.deliver(key, 5, HOURS_AGO)
        await cleanup.forget_delivered_inputs(timedelta(0))
        assert await self.rows(key) == 5
        await repo.update(key, [LegalHoldCommand(False, None, NOW)])
        await cleanup.forget_delivered_inputs(timedelta(0))
        assert await self.rows(key) == 1
