"""The append-receipt window on every StreamRepository adapter, subclassed per adapter.

A subclass provides the `repo` fixture. A removed receipt shows as the same key with other
records appending anew, where a kept one refuses them (idempotency-key-reused)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from application.ports import Done, Failed, Replayed
from application.set_legal_hold import LegalHoldCommand
from domain import errors
from tests.support.builders import NOW, append, definition, new_key, record


class ReceiptWindowContract:
    async def test_receipts_older_than_the_window_are_removed_in_batches(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        for n in range(5):
            [done] = await repo.update(key, [append([record(b"%d" % n)], key=f"k{n}")])
            assert isinstance(done, Done)
        await asyncio.sleep(0.01)  # every receipt now lies before the zero window's cutoff
        assert await repo.forget_receipts(timedelta(0), batch=2) >= 5
        for n in range(5):
            [again] = await repo.update(key, [append([record(b"other")], key=f"k{n}")])
            assert isinstance(again, Done), again
        assert (await repo.page(key, 0, 100))[0].head == 10

    async def test_receipts_inside_the_window_are_kept(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        await repo.update(key, [append([record(b"1")], key="young")])
        await repo.forget_receipts(timedelta(hours=1), batch=2)
        [again] = await repo.update(key, [append([record(b"1")], key="young")])
        [other] = await repo.update(key, [append([record(b"2")], key="young")])
        assert isinstance(again, Replayed)
        assert isinstance(other, Failed) and isinstance(other.error, errors.IdempotencyKeyReused)

    async def test_a_legal_hold_keeps_receipts_until_it_is_lifted(self, repo) -> None:
        key, free = new_key(), new_key()
        for k in (key, free):
            await repo.create(k, definition(), NOW)
        await repo.update(key, [LegalHoldCommand(True, "audit", NOW)])
        for k in (key, free):
            await repo.update(k, [append([record(b"1")], key="held")])
        await asyncio.sleep(0.01)
        assert await repo.forget_receipts(timedelta(0)) >= 1  # the stream without a hold's
        [kept] = await repo.update(key, [append([record(b"2")], key="held")])
        assert isinstance(kept, Failed) and isinstance(kept.error, errors.IdempotencyKeyReused)
        [gone] = await repo.update(free, [append([record(b"2")], key="held")])
        assert isinstance(gone, Done)
        await repo.update(key, [LegalHoldCommand(False, None, NOW)])
        assert await repo.forget_receipts(timedelta(0)) >= 1
        [after] = await repo.update(key, [append([record(b"2")], key="held")])
        assert isinstance(after, Done)
        assert (await repo.page(key, 0, 10))[0].head == 2
