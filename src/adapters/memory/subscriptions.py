"""Subscriptions in memory: the same port as PostgreSQL (tests/unit, the memory container).
Stream heads come from a callable over the memory streams; a stream the glob matches that is
not linked yet is linked from its start when the subscription is next loaded, which is what
PostgreSQL's trigger does when the stream is created."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from typing import TypeVar

import msgspec

from adapters.memory.streams import MemoryStreams
from application.subscriptions import Census, Change, Delivery, Heads
from application.workers import Job
from domain.stream import StreamKey, decode_state
from domain.subscriptions import (
    WAKE_STREAMS,
    Link,
    StreamPath,
    Subscription,
    Watcher,
    in_turn,
    matches,
)

_T = TypeVar("_T")
StreamHeads = Callable[[str], dict[StreamPath, int]]


class MemorySubscriptions:
    def __init__(
        self,
        heads: StreamHeads,
        clock: Callable[[], float] = time.time,
        wake_streams: int = WAKE_STREAMS,
    ) -> None:
        self._heads = heads
        self._wake_streams = wake_streams
        self._clock = clock
        self._rows: dict[tuple[str, str], bytes] = {}
        self._locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self.outbox: dict[tuple[str, str, int], tuple[Delivery, float]] = {}
        self.delivered: set[tuple[str, str, int]] = set()

    def _watchers(self, tenant: str) -> list[Watcher]:
        subs = [
            msgspec.msgpack.decode(raw, type=Subscription)
            for (t, _), raw in self._rows.items()
            if t == tenant
        ]
        found = (Watcher.of(s.id, s.config, (k.path for k in s.links if k.explicit)) for s in subs)
        return [w for w in found if w is not None]

    def _wakes_of(self, tenant: str) -> set[StreamPath]:
        return {w.wake_stream for w in self._watchers(tenant)}

    def _load(self, tenant: str, subscription_id: str) -> tuple[Subscription, Heads] | None:
        raw = self._rows.get((tenant, subscription_id))
        if raw is None:
            return None
        sub = msgspec.msgpack.decode(raw, type=Subscription)
        streams = self._heads(tenant)
        linked = {link.path for link in sub.links}  # (once: `link` scans them all)
        if sub.config.pattern:
            pattern = sub.config.pattern
            new = {p: 0 for p in streams if p not in linked and matches(pattern, p)}
            if new:
                sub = sub.linked(new, explicit=False)
                self._rows[(tenant, subscription_id)] = msgspec.msgpack.encode(sub)
                linked.update(new)
        runs = tuple(sorted({link.path.run_id for link in sub.links if link.explicit}))
        sub = msgspec.structs.replace(sub, named_runs=runs)
        return sub, {p: h for p, h in streams.items() if p in linked}

    def _deciding(
        self, sub: Subscription, heads: Heads, named: set[StreamPath], count_named: bool
    ) -> tuple[Subscription, Heads]:
        """What PostgreSQL's decision reads: the links with pending work, up to `wake_streams`
        (after `woken_up_to` first), and those `named` or in the current wake."""
        pending = [k for k in sub.links if max(heads.get(k.path, 0), 0) > k.acked]
        turn = in_turn(pending, sub.woken_up_to)[: self._wake_streams]
        seen: dict[StreamPath, Link] = {k.path: k for k in turn}
        if sub.wake is not None:
            named = named | {path for path, _ in sub.wake.tails}
        seen.update({k.path: k for k in sub.links if k.path in named})
        view = sub.with_links(seen)
        if count_named:
            view = msgspec.structs.replace(view, named_elsewhere=sub.named() - view.named())
        return view, {p: h for p, h in heads.items() if p in seen}

    async def update(
        self,
        tenant: str,
        subscription_id: str,
        decide: Callable[[Subscription | None, Heads], tuple[Change | None, _T]],
        discover: str | None = None,
        extra: tuple[StreamPath, ...] = (),
        touching: Collection[StreamPath] = (),
        named_runs: bool = False,
        census: Callable[[Census], None] | None = None,
        watchers: Collection[StreamPath] | None = None,
        census_if_wakes: bool = False,
    ) -> _T:
        async with self._locks[(tenant, subscription_id)]:
            found = self._load(tenant, subscription_id) if census is not None else None
            if census_if_wakes and (
                found is None
                or found[0].config.wake_stream is None
                or not self._wakes_of(tenant).intersection(extra)
            ):
                census = None  # a webhook's change, or one linking no wake stream: no census
            if census is not None:  # (nothing awaited from here to the change: one at a time)
                count = sum(1 for t, _ in self._rows if t == tenant) if found is None else 0
                pull = found is None or found[0].config.wake_stream is not None
                wanted = watchers is not None and pull
                census(Census(count, self._watchers(tenant) if wanted else []))
            found = self._load(tenant, subscription_id)
            streams = self._heads(tenant)
            whole: Subscription | None = None
            sub: Subscription | None = None
            heads: Heads = {}
            if found is not None:
                whole = found[0]
                sub, heads = self._deciding(whole, found[1], {*extra, *touching}, bool(extra))
                if named_runs:
                    sub = msgspec.structs.replace(sub, named_runs=whole.named_runs)
            heads.update({p: streams[p] for p in extra if p in streams})
            if discover is not None and sub is None:
                heads.update({p: h for p, h in streams.items() if matches(discover, p)})
            change, answer = decide(sub, heads)
            if change is not None:
                if change.subscription is None:
                    self._rows.pop((tenant, subscription_id), None)
                    for key in [k for k in self.outbox if k[:2] == (tenant, subscription_id)]:
                        del self.outbox[key]
                else:
                    new = change.subscription
                    if whole is not None and sub is not None:  # the links it did not see stay
                        seen = {k.path for k in sub.links}
                        kept = {k.path: k for k in whole.links if k.path not in seen}
                        new = new.with_links({**kept, **{k.path: k for k in new.links}})
                    new = msgspec.structs.replace(new, named_elsewhere=0)
                    self._rows[(tenant, subscription_id)] = msgspec.msgpack.encode(new)
                    for d in change.deliveries:
                        self.outbox.setdefault(
                            (d.tenant, d.subscription_id, d.generation), (d, 0.0)
                        )
            return answer

    async def get(self, tenant: str, subscription_id: str) -> tuple[Subscription, Heads] | None:
        return self._load(tenant, subscription_id)  # every link, and `named_runs`

    async def count(self, tenant: str) -> int:
        return sum(1 for t, _ in self._rows if t == tenant)

    async def wake_id(self, tenant: str, subscription_id: str) -> str | None:
        raw = self._rows.get((tenant, subscription_id))
        wake = None if raw is None else msgspec.msgpack.decode(raw, type=Subscription).wake
        return None if wake is None else wake.wake_id

    async def due(
        self, limit: int, streams: Collection[StreamKey] | None = None
    ) -> list[tuple[str, str]]:
        now = self._clock()
        out = []
        for tenant, sid in list(self._rows):
            found = self._load(tenant, sid)
            if found is None:
                continue
            sub, heads = found
            leased_out = sub.wake is not None and (sub.wake.lease_until or now) < now
            if streams is not None:  # pending on one of them: only those links count
                named = {StreamPath(k.run_id, k.stream_id) for k in streams if k.tenant == tenant}
                heads = {p: h for p, h in heads.items() if p in named}
            if (sub.wake is None and sub.has_pending(heads)) or leased_out:
                out.append((tenant, sid))
        return out[:limit]

    async def of_stream(
        self, key: StreamKey, named_runs: bool = False
    ) -> list[tuple[Subscription, Heads]]:
        path = StreamPath(key.run_id, key.stream_id)
        found = [self._load(t, s) for t, s in list(self._rows) if t == key.tenant]
        return [f for f in found if f is not None and f[0].link(path) is not None]

    async def delivery(self, job: Job) -> Delivery | None:
        assert job.id is not None
        key = (job.key.tenant, job.key.stream_id, job.id)
        if key in self.delivered or key not in self.outbox:
            return None
        return self.outbox[key][0]

    async def forget_delivered(self, age_seconds: float) -> int:
        gone = [k for k in self.delivered if k in self.outbox]
        for key in gone:
            del self.outbox[key]
        return len(gone)


def memory_heads(streams: MemoryStreams) -> StreamHeads:
    """The heads of a tenant's memory streams, as the subscriptions' store reads them."""

    def heads(tenant: str) -> dict[StreamPath, int]:
        rows = streams._rows  # the memory adapters share their process: no port for this
        return {
            StreamPath(key.run_id, key.stream_id): decode_state(row.state).head
            for key, row in rows.items()
            if key.tenant == tenant
        }

    return heads
