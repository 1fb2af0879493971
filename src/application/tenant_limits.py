"""A tenant's limits on what it holds, in the database every tenant shares: its streams
(DUCTOR_STREAMS_MAX_STREAMS_PER_TENANT) and its records' bytes
(DUCTOR_STREAMS_MAX_BYTES_PER_TENANT).

A valid token creating streams in a loop (2,000 a second and more), or appending to them, would
otherwise fill the database's disk for everyone. Past its limit, a creation is refused (409
`quota-exhausted`; a creation that finds its stream already there is answered as before), and
so is an append or an object's intent whose bytes would pass it (`TenantRoom`, decided under
the stream's row lock, after an idempotent or a producer's retry is recognized: a retry of what
was stored is answered as before, limit or not).

Each count is read from the storage (`TenantCounts`), at most once a second per tenant and
process, and this process's own additions since are added to it; a request past a count that old
is refused without reading. So a limit may be passed by what the other processes and replicas
added in the last second, and by requests in flight at once, never by more."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import msgspec

from application import tracing
from application.access import Caller
from application.errors import Forbidden
from application.ports import TenantCounts
from domain.errors import QuotaExhausted

FRESH_SECONDS = 1.0
# Tenants whose counts a process keeps at once; the one read longest ago goes first.
MAX_TENANTS = 10_000


class _Tally:
    """A count per tenant, read through `read` at most every `fresh` seconds, with this
    process's own changes since added."""

    def __init__(
        self,
        read: Callable[[str], Awaitable[int]],
        fresh_seconds: float,
        clock: Callable[[], float],
        max_tenants: int,
    ) -> None:
        self._read = read
        self._fresh = fresh_seconds
        self._clock = clock
        self._max_tenants = max_tenants
        self._known: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def fresh(self, tenant: str) -> int | None:
        """The count, if it was read within `fresh` seconds (no await on the append path)."""
        known = self._known.get(tenant)
        if known is None or self._clock() - known[1] >= self._fresh:
            return None
        return known[0]

    async def count(self, tenant: str) -> int:
        now = self._clock()
        known = self._known.get(tenant)
        if known is None or now - known[1] >= self._fresh:
            known = (await self._read(tenant), now)
            self._known[tenant] = known
            self._known.move_to_end(tenant)
            while len(self._known) > self._max_tenants:
                self._known.popitem(last=False)
        return known[0]

    def add(self, tenant: str, amount: int) -> None:
        """Counted until the next read (a tenant not known is read then anyway)."""
        known = self._known.get(tenant)
        if known is not None:
            self._known[tenant] = (known[0] + amount, known[1])


class _TenantLimit:
    """A limit on one of the tenants' counts (`count`: the `TenantCounts` method reading it)."""

    count = ""

    def __init__(
        self,
        counts: TenantCounts,
        limit: int,
        *,
        fresh_seconds: float = FRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        max_tenants: int = MAX_TENANTS,
    ) -> None:
        self.limit = limit  # 0: no limit
        read = getattr(counts, self.count)
        self._tally = _Tally(read, fresh_seconds, clock, max_tenants)


class StreamLimit(_TenantLimit):
    count = "tenant_streams"

    async def reached(self, tenant: str) -> bool:
        """Whether the tenant holds its limit of streams, as last counted (within a second)
        with this process's creations since."""
        if not self.limit:
            return False
        return await self._tally.count(tenant) >= self.limit

    def created(self, tenant: str) -> None:
        """This process created one of the tenant's streams: counted until the next read."""
        self._tally.add(tenant, 1)


class TenantRoom(msgspec.Struct, frozen=True):
    """What a tenant's records held, as counted when a request came, and its limit: carried by
    the request's command (`tenant_room`) to its decision under the row lock
    (`deciding.decide_all`), in whichever process of the host commits it."""

    held: int
    limit: int

    def refusal(self, adding: int, before: int) -> QuotaExhausted:
        """The refusal of a request adding `adding` bytes after `before` bytes the same
        transaction already added for it."""
        held = self.held + before
        if held >= self.limit:
            detail = f"the tenant holds {held} bytes, its limit of {self.limit}"
        else:
            detail = (
                f"{adding} bytes would pass the tenant's limit of {self.limit}: it holds {held}"
            )
        detail += " (its records, and what its open object intents pledge)"
        return QuotaExhausted(
            f"{detail}: nothing more is stored until some are deleted",
            tenant_bytes=held,
            max_tenant_bytes=self.limit,
        )


class ByteLimit(_TenantLimit):
    count = "tenant_bytes"

    async def room(self, tenant: str) -> TenantRoom | None:
        """The tenant's bytes as last counted (within a second) with this process's additions
        since, and its limit; None without a limit."""
        if not self.limit:
            return None
        held = self._tally.fresh(tenant)
        if held is None:
            held = await self._tally.count(tenant)
        return TenantRoom(held, self.limit)

    def added(self, tenant: str, size: int) -> None:
        """This process stored `size` more bytes of the tenant's records."""
        if size:
            self._tally.add(tenant, size)


class UsageView(msgspec.Struct, frozen=True):
    """What a tenant holds against its limits (`GET /usage`)."""

    streams: int  # the streams it holds (one deleted while forks read it, until it is erased)
    max_streams: int | None  # DUCTOR_STREAMS_MAX_STREAMS_PER_TENANT (null: no limit)
    bytes: int  # its records' sizes and its open object intents' pledges
    max_bytes: int | None  # DUCTOR_STREAMS_MAX_BYTES_PER_TENANT (null: no limit)


class TenantUsage:
    """The caller's tenant's counts, read now (not the second-old view the limits decide by),
    against its limits. Tenant-wide: an administrator's, not one restricted to runs (the
    others' streams and bytes are not its to see)."""

    def __init__(self, counts: TenantCounts, streams: StreamLimit, bytes_: ByteLimit) -> None:
        self._counts = counts
        self._streams = streams
        self._bytes = bytes_

    @tracing.use_case("tenant usage")
    async def __call__(self, caller: Caller) -> UsageView:
        caller.require("streams:admin")
        if caller.runs is not None:
            raise Forbidden("a token restricted to runs cannot see its tenant's usage")
        return UsageView(
            streams=await self._counts.tenant_streams(caller.tenant),
            max_streams=self._streams.limit or None,
            bytes=await self._counts.tenant_bytes(caller.tenant),
            max_bytes=self._bytes.limit or None,
        )
