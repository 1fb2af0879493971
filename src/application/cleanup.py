"""Storage cleanup: the sweeps that keep bookkeeping from growing without bound.

Each method is one sweep's tick (`async def tick() -> int`, run by a LeasedSweep, so one worker
across every replica runs it at a time): it removes what is older than its age, a bounded batch
per statement, never anything of a stream under legal hold, and answers how much it removed.

- the tenants' stream counts: the parts their writers kept apart, folded;
- delivered input-delivery rows, done deletion-outbox rows and gap evidence: older than
  `age` (DUCTOR_STREAMS_CLEANUP_AGE_SECONDS);
- what abandoned uploads left in the object stores (temporary files, incomplete multipart
  uploads): started more than `upload_age` ago (DUCTOR_STREAMS_UPLOAD_ABANDONED_SECONDS), an age
  well above any upload's duration, since an upload still running when swept fails."""

from __future__ import annotations

import logging
from datetime import timedelta

from application.objects import ObjectStores
from application.ports import StorageCleanup

log = logging.getLogger("ductor_streams.cleanup")

BATCH = 1000  # rows per statement: each batch is short, and holds no stream-row lock


class Cleanup:
    def __init__(
        self,
        storage: StorageCleanup,
        stores: ObjectStores,
        age_seconds: float,
        upload_age_seconds: float,
        batch: int = BATCH,
    ) -> None:
        self._storage = storage
        self._stores = stores
        self._age = timedelta(seconds=age_seconds)
        self._upload_age = timedelta(seconds=upload_age_seconds)
        self._batch = batch

    async def delivered_inputs(self) -> int:
        return await self._storage.forget_delivered_inputs(self._age, self._batch)

    async def done_deletions(self) -> int:
        return await self._storage.forget_done_deletions(self._age, self._batch)

    async def gap_evidence(self) -> int:
        return await self._storage.forget_gap_evidence(self._age, self._batch)

    async def tenant_counts(self) -> int:
        return await self._storage.fold_tenant_counts()

    async def abandoned_uploads(self) -> int:
        """Every region's store is swept, even when one fails (its error is raised after)."""
        removed, failure = 0, None
        for region in self._stores.regions():
            try:
                removed += await self._stores.store(region).sweep_incomplete(self._upload_age)
            except Exception as error:
                log.warning("cannot sweep the object store of region %s: %s", region, error)
                failure = error
        if failure is not None:
            raise failure
        return removed
