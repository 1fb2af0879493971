"""The deletion worker's use case: remove a body from the store of the region it was pinned to.

Never under a legal hold (the job waits), never anywhere else (the region is the one recorded
with the body), and idempotent (deleting what is gone is not an error). The bodies of an erased
stream were released when it was deleted (which a hold refuses): a stream created again under
its ID, held or not, has bodies of its own under other keys, so they do not wait for it.

An upload arms its body's deletion before it puts a byte (`UPLOADING`), due once no put of it
can still land, and counts its put as under way; the put's end, seen by its process (the intent
marked `uploaded`, or the body refused or removed), ends that count, and the last one disarms
it. So a process killed between its put and its bookkeeping leaves no body that nothing
references: the armed deletion finds the intent never uploaded (or aborted, expired, gone) and
removes it (docs/architecture.md, "Object bodies")."""

from __future__ import annotations

import logging
from datetime import timedelta

from application.log_context import about_stream
from application.objects import ObjectStores, object_id_in
from application.ports import Clock, ObjectIntents, StreamRepository
from application.workers import Job, ensure_claimed

log = logging.getLogger("ductor_streams.deletions")

# The outbox reason of the bodies of an erased stream: "stream-deleted", "stream-expired".
ERASED_STREAM = "stream-"
# The outbox reason of a body an upload is putting: armed before the put, due when no put of it
# can still land (`upload_until`), disarmed when every put that armed it has ended. A deletion
# queued for the body meanwhile (abort, expiry, pruning, erasure) takes the row over: it runs at
# once, and again at `upload_until` while a put is under way.
UPLOADING = "upload"
# The intent states whose body a commit references or may reference: an armed upload deletion
# found in one of these is done without removing the body.
_KEPT = ("uploaded", "committed")
ZERO = timedelta(0)


class DeleteBodies:
    def __init__(
        self,
        streams: StreamRepository,
        stores: ObjectStores,
        intents: ObjectIntents,
        clock: Clock,
        hold_recheck_seconds: float = 30.0,
    ) -> None:
        self._streams = streams
        self._stores = stores
        self._intents = intents
        self._clock = clock
        self._recheck = hold_recheck_seconds

    async def run_job(self, job: Job) -> float | None:
        assert job.storage_region is not None and job.storage_key is not None
        erased = job.reason is not None and job.reason.startswith(ERASED_STREAM)
        stream = None if erased else await self._streams.load(job.key)
        if stream is not None:
            about_stream(job.key, stream.definition.placement.log_region)
            if stream.state.legal_hold.enabled:
                return self._recheck
        if job.reason == UPLOADING:
            intent = await self._intents.intent(job.key, object_id_in(job.storage_key))
            if intent is not None and intent.storage_key == job.storage_key:
                if intent.state in _KEPT:
                    # A twin upload's arming, or one whose end its process did not see: the
                    # body is the intent's own. (Its abort, expiry or pruning takes it over.)
                    return None
                if intent.state == "prepared" and intent.expires_at > self._clock():
                    return self._recheck  # due early (clocks apart): an upload may still land
        ensure_claimed()  # a claim this worker could not renew is not acted on
        await self._stores.store(job.storage_region).delete(job.storage_key)
        log.info("deleted an object body in region %s", job.storage_region)
        if job.upload_until is not None and (left := job.upload_until - self._clock()) > ZERO:
            # An upload's put of it may still land: deleted once more when none can.
            return left.total_seconds()
        return None
