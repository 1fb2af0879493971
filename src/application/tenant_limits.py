"""A tenant's limits on what it holds, in the database every tenant shares: its streams
(DUCTOR_STREAMS_MAX_STREAMS_PER_TENANT), its bytes (DUCTOR_STREAMS_MAX_BYTES_PER_TENANT: what
its records count, `domain.records.held_bytes`, and its open object intents pledge) and its
tokens (DUCTOR_STREAMS_MAX_TOKENS_PER_TENANT).

A valid token creating streams in a loop (2,000 a second and more), or appending to them, would
otherwise fill the database's disk for everyone. Past its limit, a creation is refused (409
`quota-exhausted`; a creation that finds its stream already there is answered as before), and
so is an append or an object's intent whose bytes would pass it (`TenantRoom`, decided under
the stream's row lock, after an idempotent or a producer's retry is recognized: a retry of what
was stored is answered as before, limit or not).

Each count is read from the storage (`TenantCounts`), at most once a second per tenant and
process, and this process's own additions since are added to it (for the bytes, what its
requests in flight may add too: `ByteLimit`); a request past a count that old is refused without
reading. So a limit may be passed by what the other processes and replicas added in the last
second (and the streams' by creations in flight at once), never by more."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import msgspec

from application import tracing
from application.access import Caller
from application.errors import Forbidden
from application.ports import TenantCounts, TokenStore
from domain.errors import QuotaExhausted

FRESH_SECONDS = 1.0
# Tenants whose counts a process keeps at once; the one read longest ago goes first.
MAX_TENANTS = 10_000


class _Budget:
    """A tenant's count as this process knows it: as last read, what this process added since
    (`stored`: its requests' outcomes), and what its requests in flight may add (`reserved`)."""

    __slots__ = ("forgotten", "held", "read_at", "reserved", "stored")

    def __init__(self, held: int, read_at: float) -> None:
        self.held, self.read_at = held, read_at
        self.stored = 0
        self.reserved = 0
        self.forgotten = 0  # how many times `forget` was called: a read older than that is old


class _TenantLimit:
    """A limit on one of the tenants' counts (`count`: the `TenantCounts` method reading it),
    each tenant's read at most every `fresh_seconds`, one read at a time, with what this
    process changed since (`_Budget`)."""

    count = ""

    def __init__(
        self,
        counts: TenantCounts | TokenStore,  # whichever holds the `count` method
        limit: int,
        *,
        fresh_seconds: float = FRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        max_tenants: int = MAX_TENANTS,
    ) -> None:
        self.limit = limit  # 0: no limit
        self._read_count: Callable[[str], Awaitable[int]] = getattr(counts, self.count)
        self._fresh, self._clock, self._max_tenants = fresh_seconds, clock, max_tenants
        self._budgets: OrderedDict[str, _Budget] = OrderedDict()
        # One read per tenant at a time, whoever waits for it (a tenant's appends in flight
        # when its count goes stale would otherwise each read it).
        self._reads: dict[str, asyncio.Task[_Budget]] = {}

    async def _known(self, tenant: str) -> _Budget:
        """The tenant's budget, read again if it is older than `fresh_seconds`."""
        budget = self._budgets.get(tenant)
        if budget is None or self._clock() - budget.read_at >= self._fresh:
            budget = await self._read(tenant)
        return budget

    def forget(self, tenant: str) -> None:
        """Read the tenant's count again at its next request: this process gave some of it back
        (a deletion, a prune, an abort), and a client that makes room expects it there at once.
        What its requests in flight reserved stays reserved."""
        budget = self._budgets.get(tenant)
        if budget is not None:
            budget.read_at = float("-inf")
            budget.forgotten += 1

    async def _read(self, tenant: str) -> _Budget:
        reading = self._reads.get(tenant)
        if reading is None:
            reading = asyncio.ensure_future(self._read_now(tenant))
            self._reads[tenant] = reading
        # Shielded: a request that gives up waiting does not cancel the others' read.
        return await asyncio.shield(reading)

    async def _read_now(self, tenant: str) -> _Budget:
        budget = self._budgets.get(tenant)
        if budget is None:
            budget = _Budget(0, float("-inf"))
        # What this process stored before the read starts is in the count it reads; what it
        # stores while the read is under way may or may not be (it is kept: counted twice at
        # worst, for a second, rather than missed).
        stored_before, forgotten = budget.stored, budget.forgotten
        try:
            held = await self._read_count(tenant)
        finally:
            del self._reads[tenant]
        budget.held = held
        budget.stored -= stored_before
        # A `forget` while it read (a deletion's commit it may not have seen): read again next.
        budget.read_at = self._clock() if budget.forgotten == forgotten else float("-inf")
        self._budgets[tenant] = budget
        self._budgets.move_to_end(tenant)
        if len(self._budgets) > self._max_tenants:
            # The one read longest ago with nothing reserved goes: a reservation in flight must
            # find its budget to be given back (else another budget, made without it, would
            # let the tenant store what it reserved twice).
            idle = next((t for t, b in self._budgets.items() if not b.reserved), None)
            if idle is not None and idle != tenant:
                del self._budgets[idle]
        return budget


class _CountLimit(_TenantLimit):
    """A limit on how many of something a tenant holds, each made one at a time: checked with
    `reached` and counted with `created` once made (the streams'), or taken before it is made
    and settled after (`take` and `made`: the tokens')."""

    async def reached(self, tenant: str) -> bool:
        """Whether the tenant holds its limit, as last counted (within a second) with this
        process's creations since."""
        if not self.limit:
            return False
        budget = await self._known(tenant)
        return budget.held + budget.stored >= self.limit

    def created(self, tenant: str) -> None:
        """This process made one more of the tenant's: counted until the next read."""
        budget = self._budgets.get(tenant)
        if budget is not None:
            budget.stored += 1

    async def take(self, tenant: str) -> bool:
        """Whether the tenant may make one more, as last counted (within a second) with this
        process's since and those it is making; if so, it is counted as being made until
        `made`. A read of the count while it is being made leaves it counted: it is not in the
        rows yet (a count of what was made before the read is taken off, since the read finds
        it there)."""
        if not self.limit:
            return True
        budget = await self._known(tenant)
        if budget.held + budget.stored + budget.reserved >= self.limit:
            return False
        budget.reserved += 1
        return True

    def made(self, tenant: str, stored: bool) -> None:
        """One that `take` allowed is made (`stored`) or not."""
        budget = self._budgets.get(tenant)
        if budget is None:
            return  # (no limit; only a budget with nothing reserved is forgotten)
        budget.reserved = max(0, budget.reserved - 1)
        if stored:
            budget.stored += 1


class StreamLimit(_CountLimit):
    count = "tenant_streams"


class TokenLimit(_CountLimit):
    """DUCTOR_STREAMS_MAX_TOKENS_PER_TENANT: the tokens a tenant's administrators may mint over
    HTTP while it holds that many (`TokenStore.tenant_tokens`: revoked and expired ones too,
    until the workers forget them). Each is a row, kept up to its life and then
    `CLEANUP_AGE_SECONDS`: a valid token minting in a loop (thousands a second) would otherwise
    fill the database's disk for everyone."""

    count = "tenant_tokens"


class TenantRoom(msgspec.Struct, frozen=True):
    """What a tenant held as its request came (as its process knew it, the process's requests
    in flight before it included), and its limit: carried by the request's command
    (`tenant_room`) to its decision under the row lock (`deciding.decide_all`), in whichever
    process of the host commits it."""

    held: int
    limit: int
    # Whether the refusal may say what the tenant holds: not to a caller restricted to runs
    # (the others' bytes are not its to see, as `GET /usage` is not).
    shown: bool = True

    def refusal(self, adding: int) -> QuotaExhausted:
        """The refusal of a request adding `adding` bytes."""
        if not self.shown:
            return QuotaExhausted(
                f"{adding} more bytes would pass the tenant's limit of {self.limit}: nothing "
                "more is stored until some are deleted",
                max_tenant_bytes=self.limit,
            )
        held = self.held
        if held >= self.limit:
            detail = f"the tenant holds {held} bytes, its limit of {self.limit}"
        else:
            detail = (
                f"{adding} bytes would pass the tenant's limit of {self.limit}: it holds {held}"
            )
        detail += (
            " (its streams and records, its append receipts while they are kept, its input"
            " records' events with the default wait service, and what its open object intents"
            " pledge)"
        )
        return QuotaExhausted(
            f"{detail}: nothing more is stored until some are deleted",
            tenant_bytes=held,
            max_tenant_bytes=self.limit,
        )


class ByteLimit(_TenantLimit):
    """Each request that may store bytes reserves them as it comes (`reserve`) and gives the
    reservation back with what it stored (`release`). Its room is the limit less the count as
    last read, less what this process stored since and less what its requests in flight may
    store: so requests at once in one process count against each other, a forwarded one too
    (it is reserved where it was received). A request whose retry stores nothing holds its
    reservation while in flight: near the limit, a request beside it may be refused that would
    have fitted (it is answered 409, and fits once retried)."""

    count = "tenant_bytes"

    async def reserve(self, tenant: str, size: int, *, shown: bool = True) -> TenantRoom | None:
        """The room of a request that may store `size` bytes (None: no limit), its bytes
        reserved until `release`; `shown`: its refusal may say what the tenant holds."""
        if not self.limit:
            return None
        budget = await self._known(tenant)
        room = TenantRoom(budget.held + budget.stored + budget.reserved, self.limit, shown)
        budget.reserved += size
        return room

    def release(self, tenant: str, size: int, stored: int) -> None:
        """A request that reserved `size` bytes has its outcome: it stored `stored` (0 when
        refused, a duplicate, or not known)."""
        budget = self._budgets.get(tenant)
        if budget is None:
            return  # (only a budget with nothing reserved is forgotten)
        budget.reserved = max(0, budget.reserved - size)
        budget.stored += stored


class UsageView(msgspec.Struct, frozen=True):
    """What a tenant holds against its limits (`GET /usage`)."""

    streams: int  # the streams it holds (one deleted while forks read it, until it is erased)
    max_streams: int | None  # DUCTOR_STREAMS_MAX_STREAMS_PER_TENANT (null: no limit)
    # what its streams, records, receipts and wait events count and its open intents pledge
    bytes: int
    max_bytes: int | None  # DUCTOR_STREAMS_MAX_BYTES_PER_TENANT (null: no limit)
    tokens: int  # the tokens it holds (revoked and expired ones too, until they are forgotten)
    max_tokens: int | None  # DUCTOR_STREAMS_MAX_TOKENS_PER_TENANT (null: no limit)
    subscriptions: int = 0  # the subscriptions (webhook, pull-wake) it holds
    # DUCTOR_STREAMS_MAX_STORED_SUBSCRIPTIONS_PER_TENANT (null: no limit)
    max_subscriptions: int | None = None


class TenantUsage:
    """The caller's tenant's counts, read now (not the second-old view the limits decide by),
    against its limits. Tenant-wide: an administrator's, not one restricted to runs (the
    others' streams and bytes are not its to see)."""

    def __init__(
        self,
        counts: TenantCounts,
        streams: StreamLimit,
        bytes_: ByteLimit,
        tokens: TokenStore,
        token_limit: TokenLimit,
        subscriptions: Callable[[str], Awaitable[tuple[int, int | None]]] | None = None,
    ) -> None:
        # (what a tenant holds of subscriptions, and its limit: application/subscriptions.py)
        self._subscriptions = subscriptions
        self._counts = counts
        self._streams = streams
        self._bytes = bytes_
        self._tokens = tokens
        self._token_limit = token_limit

    @tracing.use_case("tenant usage")
    async def __call__(self, caller: Caller) -> UsageView:
        caller.require("streams:admin")
        if caller.runs is not None:
            raise Forbidden("a token restricted to runs cannot see its tenant's usage")
        held, limit = (0, None)
        if self._subscriptions is not None:
            held, limit = await self._subscriptions(caller.tenant)
        return UsageView(
            streams=await self._counts.tenant_streams(caller.tenant),
            max_streams=self._streams.limit or None,
            bytes=await self._counts.tenant_bytes(caller.tenant),
            max_bytes=self._bytes.limit or None,
            tokens=await self._tokens.tenant_tokens(caller.tenant),
            max_tokens=self._token_limit.limit or None,
            subscriptions=held,
            max_subscriptions=limit,
        )
