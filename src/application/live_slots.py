"""The per-principal and per-tenant caps on live connections, in this process.

Every request that holds its connection open waiting for records takes one slot of its
principal while it is open, whichever surface and kind it is: a native subscription
(`/subscribe`), a native read that waits (`records?wait=S`), a Durable Streams `live=sse` read
and a `live=long-poll` read. One more past the cap is refused (429, `Retry-After`) before
anything streams or waits; everyone else is served as before. The slot counts for its tenant
too: a tenant's administrator may mint tokens for any number of principals, and the tenant's
cap keeps them all from taking the process's connections from other tenants. A token restricted
to runs counts under each of its runs too: an administrator of one run may mint tokens for any
number of principals (below its own) as well, and the run's cap keeps them from taking the
tenant's connections from its other runs.

The cap is per process: each replica bounds its own memory, so with N replicas behind a load
balancer a principal may hold up to N times the cap in all (docs/configuration.md)."""

from __future__ import annotations

import weakref

from application.access import Caller
from application.waiting import give_turn
from domain import errors

RETRY_AFTER_SECONDS = 5


class TooManySubscriptions(errors.Backpressure):
    """The principal's live connections in this process are at the cap. (The code predates
    long-polls counting too; it is kept so that clients keep recognising it.)"""

    code = "too-many-subscriptions"


class Slot:
    """One admitted live connection's place under its principal's cap. Counted weakly, so a
    connection dropped before it ever started (a response never sent, a generator never run)
    frees its slot when it is collected; every path that did start gives it back explicitly."""

    __slots__ = ("__weakref__",)


_Holder = tuple[str, str, frozenset[str] | None]


def _holder(caller: Caller) -> _Holder:
    """Whose cap a live connection counts under: its principal's, apart for each set of runs
    its token is restricted to. A token restricted to runs may carry any principal's name (a
    tenant's administrator mints it, or a JWT names it); under the principal's own cap it could
    take the connections of that principal's tokens for every run."""
    return caller.tenant, caller.principal, caller.runs


class LiveSlots:
    def __init__(
        self,
        max_per_principal: int,
        max_per_tenant: int | None = None,
        max_per_run: int | None = None,
    ) -> None:
        self._max = max_per_principal
        self._max_tenant = max_per_tenant
        self._max_run = max_per_run
        self._active: dict[_Holder, weakref.WeakSet[Slot]] = {}
        self._tenants: dict[str, weakref.WeakSet[Slot]] = {}
        # (tenant, run) -> the slots of tokens restricted to runs that include it.
        self._runs: dict[tuple[str, str], weakref.WeakSet[Slot]] = {}

    def admit(self, caller: Caller) -> Slot:
        """A slot for the running request, which from now on waits for live events: it gives
        its tenant's turn at work back (application/waiting.py)."""
        self.check(caller)
        give_turn()
        slot = Slot()
        self._active.setdefault(_holder(caller), weakref.WeakSet()).add(slot)
        self._tenants.setdefault(caller.tenant, weakref.WeakSet()).add(slot)
        for run in caller.runs or ():
            self._runs.setdefault((caller.tenant, run), weakref.WeakSet()).add(slot)
        return slot

    def check(self, caller: Caller) -> None:
        """What `admit` would refuse, without taking a slot."""
        if self.held_by(caller) >= self._max:
            raise TooManySubscriptions(
                f"principal {caller.principal!r} already holds {self._max} live connections "
                "(subscriptions and waiting reads) on this server",
                retry_after=RETRY_AFTER_SECONDS,
            )
        limit = self._max_tenant
        if limit is not None and len(self._tenants.get(caller.tenant, ())) >= limit:
            raise TooManySubscriptions(
                f"the tenant's principals already hold {limit} live connections "
                "(subscriptions and waiting reads) on this server",
                retry_after=RETRY_AFTER_SECONDS,
            )
        limit = self._max_run
        if limit is not None:
            for run in sorted(caller.runs or ()):
                if len(self._runs.get((caller.tenant, run), ())) >= limit:
                    raise TooManySubscriptions(
                        f"tokens restricted to run {run!r} already hold {limit} live "
                        "connections (subscriptions and waiting reads) on this server",
                        retry_after=RETRY_AFTER_SECONDS,
                    )

    def release(self, caller: Caller, slot: Slot | None) -> None:
        """Give `slot` back (None, or a slot given back already: nothing happens)."""
        if slot is None:
            return
        who = _holder(caller)
        active = self._active.get(who)
        if active is not None:
            active.discard(slot)
            if not active:
                del self._active[who]
        tenant = self._tenants.get(caller.tenant)
        if tenant is not None:
            tenant.discard(slot)
            if not tenant:
                del self._tenants[caller.tenant]
        for run in caller.runs or ():
            key = (caller.tenant, run)
            held = self._runs.get(key)
            if held is not None:
                held.discard(slot)
                if not held:
                    del self._runs[key]

    def held_by(self, caller: Caller) -> int:
        return len(self._active.get(_holder(caller), ()))

    def count(self) -> int:
        return sum(len(a) for a in self._active.values())
