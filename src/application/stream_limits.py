"""A tenant's limit on the streams it holds (DUCTOR_STREAMS_MAX_STREAMS_PER_TENANT).

Streams are rows every tenant's requests share the database with: a valid token creating
streams in a loop (2,000 a second and more) would otherwise fill its disk for everyone. A
creation is refused (409 `quota-exhausted`) once the tenant holds its limit; a creation that
finds its stream already there is answered as before, limit or not.

The count is read from the storage (`TenantStreamCounts`), at most once a second per tenant and
process, and this process's own creations since are added to it; a creation past a count that
old is refused without reading. So the limit may be passed by what the other processes and
replicas created in the last second, and by creations in flight at once, never by more."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from application.ports import TenantStreamCounts

FRESH_SECONDS = 1.0
# Tenants whose counts a process keeps at once; the one read longest ago goes first.
MAX_TENANTS = 10_000


class StreamLimit:
    def __init__(
        self,
        counts: TenantStreamCounts,
        limit: int,
        *,
        fresh_seconds: float = FRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        max_tenants: int = MAX_TENANTS,
    ) -> None:
        self._counts = counts
        self.limit = limit  # 0: no limit
        self._fresh = fresh_seconds
        self._clock = clock
        self._max_tenants = max_tenants
        self._known: OrderedDict[str, tuple[int, float]] = OrderedDict()

    async def reached(self, tenant: str) -> bool:
        """Whether the tenant holds its limit of streams, as last counted (within a second)
        with this process's creations since."""
        if not self.limit:
            return False
        now = self._clock()
        known = self._known.get(tenant)
        if known is None or now - known[1] >= self._fresh:
            count = await self._counts.tenant_streams(tenant)
            known = (count, now)
            self._known[tenant] = known
            self._known.move_to_end(tenant)
            while len(self._known) > self._max_tenants:
                self._known.popitem(last=False)
        return known[0] >= self.limit

    def created(self, tenant: str) -> None:
        """This process created one of the tenant's streams: counted until the next read."""
        known = self._known.get(tenant)
        if known is not None:
            self._known[tenant] = (known[0] + 1, known[1])
