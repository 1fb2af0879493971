"""The deletion worker's use case: remove a body from the store of the region it was pinned to.

Never under a legal hold (the job waits), never anywhere else (the region is the one recorded
with the body), and idempotent (deleting what is gone is not an error)."""

from __future__ import annotations

import logging

from application.log_context import about_stream
from application.objects import ObjectStores
from application.ports import StreamRepository
from application.workers import Job

log = logging.getLogger("ductor_streams.deletions")


class DeleteBodies:
    def __init__(
        self, streams: StreamRepository, stores: ObjectStores, hold_recheck_seconds: float = 30.0
    ) -> None:
        self._streams = streams
        self._stores = stores
        self._recheck = hold_recheck_seconds

    async def run_job(self, job: Job) -> float | None:
        assert job.storage_region is not None and job.storage_key is not None
        stream = await self._streams.load(job.key)
        if stream is not None:
            about_stream(job.key, stream.definition.placement.log_region)
            if stream.state.legal_hold.enabled:
                return self._recheck
        await self._stores.store(job.storage_region).delete(job.storage_key)
        log.info("deleted an object body in region %s", job.storage_region)
        return None
