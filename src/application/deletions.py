"""The deletion worker's use case: remove a body from the store of the region it was pinned to.

Never under a legal hold (the job waits), never anywhere else (the region is the one recorded
with the body), and idempotent (deleting what is gone is not an error). The bodies of an erased
stream were released when it was deleted (which a hold refuses): a stream created again under
its ID, held or not, has bodies of its own under other keys, so they do not wait for it."""

from __future__ import annotations

import logging

from application.log_context import about_stream
from application.objects import ObjectStores
from application.ports import StreamRepository
from application.workers import Job, ensure_claimed

log = logging.getLogger("ductor_streams.deletions")

# The outbox reason of the bodies of an erased stream: "stream-deleted", "stream-expired".
ERASED_STREAM = "stream-"


class DeleteBodies:
    def __init__(
        self, streams: StreamRepository, stores: ObjectStores, hold_recheck_seconds: float = 30.0
    ) -> None:
        self._streams = streams
        self._stores = stores
        self._recheck = hold_recheck_seconds

    async def run_job(self, job: Job) -> float | None:
        assert job.storage_region is not None and job.storage_key is not None
        erased = job.reason is not None and job.reason.startswith(ERASED_STREAM)
        stream = None if erased else await self._streams.load(job.key)
        if stream is not None:
            about_stream(job.key, stream.definition.placement.log_region)
            if stream.state.legal_hold.enabled:
                return self._recheck
        ensure_claimed()  # a claim this worker could not renew is not acted on
        await self._stores.store(job.storage_region).delete(job.storage_key)
        log.info("deleted an object body in region %s", job.storage_region)
        return None
