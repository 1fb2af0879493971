"""Subscriptions in PostgreSQL (migration 0496): a row per subscription (its state as one
document, with the columns the scheduler selects on), a row per linked stream with its cursor,
and the wake outbox, claimed by the delivering workers with a lease like input deliveries."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections.abc import Callable, Collection
from typing import Any, Literal, TypeVar

import asyncpg
import msgspec

from adapters.postgres.bounded import bounded_on
from adapters.postgres.connections import Connection
from adapters.postgres.marks import MARK
from application.subscriptions import Census, Change, Delivery, Heads
from application.waiting import committing, within_allowance
from application.workers import Job
from domain.offsets import incarnation
from domain.stream import StreamKey
from domain.subscriptions import (
    WAKE_STREAMS,
    Link,
    StreamPath,
    Subscription,
    Watcher,
    pattern_regex,
)

_T = TypeVar("_T")
log = logging.getLogger("ductor_streams.subscriptions")
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Subscription).decode

_LOCK = """SELECT state, failing, last_error, creator_runs, kind FROM ds_subscriptions
           WHERE tenant = $1 AND subscription_id = $2 FOR UPDATE"""
_STATE = "SELECT state FROM ds_subscriptions WHERE tenant = $1 AND subscription_id = $2"
_GET = """SELECT state, failing, last_error, creator_runs FROM ds_subscriptions
          WHERE tenant = $1 AND subscription_id = $2"""
# Every link, with its stream's head (what `get` shows).
_LINKS = """SELECT l.run_id, l.stream_id, l.explicit, l.glob, l.acked, t.head, t.created_at,
                   f.through
            FROM ds_subscription_links l
            LEFT JOIN streams t ON (t.tenant, t.run_id, t.stream_id)
                                 = (l.tenant, l.run_id, l.stream_id)
            LEFT JOIN stream_forks f ON (f.tenant, f.run_id, f.stream_id)
                                      = (l.tenant, l.run_id, l.stream_id)
            WHERE l.tenant = $1 AND l.subscription_id = $2"""
# What a decision reads of the links: those marked pending (migration 0508), up to $5, after
# the stream the last wake named up to first (the order a wake names them in,
# `Subscription.issue_wake`)...
# (Each link looked up by its whole key, `OFFSET 0` keeping the planner from joining the
# subscription's every link instead, as it did on tables it had no statistics for yet: a pass
# over 20,000 links for each mark.)
_PENDING_LINK = """SELECT {part} AS part, p.run_id, p.stream_id, l.explicit, l.glob, l.acked,
                          t.head, t.created_at, f.through
                   FROM (SELECT * FROM ds_subscription_pending
                         WHERE tenant = $1 AND subscription_id = $2
                           AND (run_id COLLATE "C", stream_id COLLATE "C") {compare} ($3, $4)
                         ORDER BY run_id COLLATE "C", stream_id COLLATE "C"
                         LIMIT $5) p
                   CROSS JOIN LATERAL (
                       SELECT explicit, glob, acked FROM ds_subscription_links
                       WHERE tenant = p.tenant AND subscription_id = p.subscription_id
                         AND run_id = p.run_id AND stream_id = p.stream_id
                       OFFSET 0) l
                   LEFT JOIN streams t ON (t.tenant, t.run_id, t.stream_id)
                                        = (p.tenant, p.run_id, p.stream_id)
                   LEFT JOIN stream_forks f ON (f.tenant, f.run_id, f.stream_id)
                                             = (p.tenant, p.run_id, p.stream_id)
                   WHERE l.acked < p.head"""
# (Through the marks' order index, in the code points' order, as the domain orders streams
# (migration 0508): the marks after the last stream named, then from the first. A mark its
# link caught up with, which the sweep forgets, takes a place in the window meanwhile.)
_PENDING_LINKS = f"""SELECT run_id, stream_id, explicit, glob, acked, head, created_at, through
                     FROM (
                         ({_PENDING_LINK.format(part=0, compare=">")})
                         UNION ALL
                         ({_PENDING_LINK.format(part=1, compare="<=")})) AS pending
                     ORDER BY part, run_id COLLATE "C", stream_id COLLATE "C"
                     LIMIT $5"""
# ... and those it names (what it acknowledges, links or unlinks, and the current wake's).
_NAMED_LINKS = """SELECT k.run_id, k.stream_id, l.explicit, l.glob, l.acked, t.head, t.created_at,
                         f.through
                  FROM unnest($3::text[], $4::text[]) AS k(run_id, stream_id)
                  CROSS JOIN LATERAL (
                      SELECT explicit, glob, acked FROM ds_subscription_links
                      WHERE tenant = $1 AND subscription_id = $2
                        AND run_id = k.run_id AND stream_id = k.stream_id
                      OFFSET 0) l
                  LEFT JOIN streams t ON (t.tenant, t.run_id, t.stream_id)
                                       = ($1, k.run_id, k.stream_id)
                  LEFT JOIN stream_forks f ON (f.tenant, f.run_id, f.stream_id)
                                            = ($1, k.run_id, k.stream_id)"""
# The runs of the streams each subscription names explicitly (at most MAX_EXPLICIT_STREAMS
# links each: migration 0514's partial index, not a pass over a pattern's links).
_NAMED_RUNS = """SELECT subscription_id, array_agg(DISTINCT run_id ORDER BY run_id)
                 FROM ds_subscription_links
                 WHERE tenant = $1 AND subscription_id = ANY($2::text[]) AND explicit
                 GROUP BY subscription_id"""
_NAMED_COUNT = """SELECT count(*) FROM ds_subscription_links
                  WHERE tenant = $1 AND subscription_id = $2 AND explicit"""
# After a decision's writes: the marks of the links it read (or named) that are pending no more
# removed: each whose head the link's cursor (`acked`, as the decision left it; a link it
# removed: past any head) has reached. A mark another transaction holds is left: only a writer
# that raises a mark (an append, the scheduler) or removes it holds one, so it stays pending or
# goes anyway; and a decision that waited for marks, holding its subscription's row, deadlocked
# with a run's deletion (its marks, then the subscriptions its erasures hold). A mark raised
# and committed after this statement began is judged by its new head: the condition is the
# mark's own against a parameter, which PostgreSQL checks again on the row it locks. (Judged
# through the links, as NOT EXISTS, it was not: the mark was removed.)
_SETTLE = """WITH cursors AS (
                 SELECT * FROM unnest($3::text[], $4::text[], $5::bigint[])
                     AS c(run_id, stream_id, acked)
             ), held AS MATERIALIZED (
                 SELECT p.run_id, p.stream_id FROM ds_subscription_pending p
                 JOIN cursors c ON (c.run_id, c.stream_id) = (p.run_id, p.stream_id)
                 WHERE p.tenant = $1 AND p.subscription_id = $2 AND p.head <= c.acked
                 ORDER BY p.run_id, p.stream_id
                 FOR UPDATE OF p SKIP LOCKED
             )
             DELETE FROM ds_subscription_pending p USING cursors c
             WHERE p.tenant = $1 AND p.subscription_id = $2
               AND (p.run_id, p.stream_id) = (c.run_id, c.stream_id) AND p.head <= c.acked
               AND (p.run_id, p.stream_id) IN (SELECT run_id, stream_id FROM held)"""
# Marks for the links past their cursors (marks.py): of the streams `k` names (an
# announcement: an append of a process of an earlier version), of the links a decision just made
# (`_MARK_NEW`), or of every link (the sweep's belt).
_WITH_HEADS = """SELECT l.tenant, l.subscription_id, l.run_id, l.stream_id, l.acked, t.head
                 FROM {links}
                 JOIN streams t
                   ON (t.tenant, t.run_id, t.stream_id) = (l.tenant, l.run_id, l.stream_id)"""
_MARK_ALL = MARK.format(links=_WITH_HEADS.format(links="ds_subscription_links l"))
_MARK_OF = MARK.format(
    links=_WITH_HEADS.format(
        links="""unnest($2::text[], $3::text[], $4::text[]) AS k(tenant, run_id, stream_id)
                 JOIN ds_subscription_links l
                   ON (l.tenant, l.run_id, l.stream_id) = (k.tenant, k.run_id, k.stream_id)"""
    )
)
_MARK_NEW = MARK.format(
    links=_WITH_HEADS.format(
        links="""unnest($3::text[], $4::text[]) AS k(run_id, stream_id)
                 JOIN ds_subscription_links l
                   ON (l.tenant, l.subscription_id, l.run_id, l.stream_id)
                    = ($1, $2, k.run_id, k.stream_id)"""
    )
)
# The sweep's: marks whose link's cursor reached them (left by a process of an earlier
# version, which removes none), and marks whose link or stream is gone (a link named again
# before the sweep, to a stream erased, would keep a mark of the old stream's head), removed;
# those another transaction holds are passed over (the sweep waits for no one). Held, a mark
# keeps its head, and its link's cursor does not go back (a stream created again, which starts
# its links at 0, forgets their marks itself, after this): it is removed without a second look.
# Each mark's link looked up by its key (`OFFSET 0`): the pass is over the marks, not the links.
_FORGET_CAUGHT_UP = """WITH held AS MATERIALIZED (
                           SELECT p.tenant, p.subscription_id, p.run_id, p.stream_id
                           FROM ds_subscription_pending p
                           CROSS JOIN LATERAL (
                               SELECT acked FROM ds_subscription_links
                               WHERE tenant = p.tenant AND subscription_id = p.subscription_id
                                 AND run_id = p.run_id AND stream_id = p.stream_id
                               OFFSET 0) l
                           WHERE l.acked >= p.head
                           ORDER BY p.tenant, p.subscription_id, p.run_id, p.stream_id
                           LIMIT 10000
                           FOR UPDATE OF p SKIP LOCKED
                       )
                       DELETE FROM ds_subscription_pending p USING held h
                       WHERE (p.tenant, p.subscription_id, p.run_id, p.stream_id)
                           = (h.tenant, h.subscription_id, h.run_id, h.stream_id)"""
_FORGET_UNLINKED = """WITH held AS MATERIALIZED (
                          SELECT p.tenant, p.subscription_id, p.run_id, p.stream_id
                          FROM ds_subscription_pending p
                          WHERE NOT EXISTS (
                              SELECT 1 FROM ds_subscription_links
                              WHERE tenant = p.tenant AND subscription_id = p.subscription_id
                                AND run_id = p.run_id AND stream_id = p.stream_id
                              OFFSET 0)
                             OR NOT EXISTS (
                              SELECT 1 FROM streams
                              WHERE tenant = p.tenant AND run_id = p.run_id
                                AND stream_id = p.stream_id
                              OFFSET 0)
                          ORDER BY p.tenant, p.subscription_id, p.run_id, p.stream_id
                          LIMIT 10000
                          FOR UPDATE SKIP LOCKED
                      )
                      DELETE FROM ds_subscription_pending p USING held h
                      WHERE (p.tenant, p.subscription_id, p.run_id, p.stream_id)
                          = (h.tenant, h.subscription_id, h.run_id, h.stream_id)"""
_HOLD_NAMED = """SELECT run_id, stream_id, head FROM streams
                 WHERE tenant = $1 AND (run_id, stream_id) IN
                       (SELECT * FROM unnest($2::text[], $3::text[]))
                 ORDER BY run_id, stream_id
                 FOR KEY SHARE"""
_MATCHING = """SELECT run_id, stream_id, head FROM streams
               WHERE tenant = $1
                 AND ((CASE WHEN run_id = 'default' THEN stream_id
                            ELSE run_id || '/' || stream_id END) ~ $2
                      OR (run_id || '/' || stream_id) ~ $2)"""
_LINKS_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('ds-links:' || $1, 0))"
# A tenant's subscriptions are made, and its pull-wakes changed where they could wake each
# other, one at a time (`update(census=...)`): each sees what the one before it made.
_CENSUS_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('ds-census:' || $1, 0))"
# Shared, by a pull-wake's linking of streams none of which is a wake stream: such links make
# no ring, so they do not wait for each other, only for what takes the census itself (a
# creation, which may make a wake stream of one of them, or a link to a wake stream).
_CENSUS_SHARED = "SELECT pg_advisory_xact_lock_shared(hashtextextended('ds-census:' || $1, 0))"
# Whether any of the streams is a pull-wake's wake stream (or may be: one made before the
# columns were, not yet changed since).
_NAMES_WAKES = """SELECT EXISTS (
                      SELECT 1 FROM ds_subscriptions
                      WHERE tenant = $1 AND kind = 'pull-wake'
                        AND (wake_stream IS NULL OR (wake_run, wake_stream) IN
                             (SELECT * FROM unnest($2::text[], $3::text[]))))"""
_COUNT = "SELECT count(*) FROM ds_subscriptions WHERE tenant = $1"
_KIND = "SELECT kind FROM ds_subscriptions WHERE tenant = $1 AND subscription_id = $2"
_WATCHERS = """SELECT subscription_id, state FROM ds_subscriptions
               WHERE tenant = $1 AND kind = 'pull-wake'"""
# The streams linked by name that are wake streams (the others make no ring).
_WATCHED_WAKES = """SELECT subscription_id, run_id, stream_id FROM ds_subscription_links
                    WHERE tenant = $1 AND explicit AND (run_id, stream_id) IN
                          (SELECT * FROM unnest($2::text[], $3::text[]))"""
_INSERT = """INSERT INTO ds_subscriptions
             (tenant, subscription_id, kind, pattern_regex, state, wake_active, lease_until,
              failing, creator_runs, wake_run, wake_stream)
             VALUES ($1, $2, $3, $4, $5, $6, to_timestamp($7), $8, $9, $10, $11)
             ON CONFLICT (tenant, subscription_id) DO NOTHING"""
_UPDATE = """UPDATE ds_subscriptions
             SET state = $3, wake_active = $4, lease_until = to_timestamp($5), failing = $6,
                 last_error = CASE WHEN $6 THEN last_error END,
                 wake_run = coalesce(wake_run, $7), wake_stream = coalesce(wake_stream, $8)
             WHERE tenant = $1 AND subscription_id = $2"""
_DELETE = "DELETE FROM ds_subscriptions WHERE tenant = $1 AND subscription_id = $2"
_UPSERT_LINKS = """INSERT INTO ds_subscription_links
                   (tenant, subscription_id, run_id, stream_id, explicit, glob, acked)
                   SELECT $1, $2, * FROM unnest($3::text[], $4::text[], $5::bool[], $6::bool[],
                                                $7::bigint[])
                   ON CONFLICT (tenant, subscription_id, run_id, stream_id) DO UPDATE
                   SET explicit = EXCLUDED.explicit, glob = EXCLUDED.glob, acked = EXCLUDED.acked"""
# A link the decision read and changed: updated only if it is still there (a stream's erasure
# removes its links without the subscription's lock, and must not see them written back).
# (Each link found by its whole key, then written by its row's address: the planner, knowing
# nothing of a table yet, once wrote a subscription's few links through a pass over all its
# 20,000, in every ack.) A link gone meanwhile is not found, so not written back.
_UPDATE_LINKS = """WITH c AS (
                       SELECT * FROM unnest($3::text[], $4::text[], $5::bool[], $6::bool[],
                                            $7::bigint[])
                           AS c(run_id, stream_id, explicit, glob, acked)
                   ), found AS (
                       SELECT f.tid, c.explicit, c.glob, c.acked FROM c
                       CROSS JOIN LATERAL (
                           SELECT ctid AS tid FROM ds_subscription_links
                           WHERE tenant = $1 AND subscription_id = $2
                             AND run_id = c.run_id AND stream_id = c.stream_id
                           OFFSET 0) f
                   )
                   UPDATE ds_subscription_links AS l
                   SET explicit = found.explicit, glob = found.glob, acked = found.acked
                   FROM found WHERE l.ctid = found.tid"""
_DROP_LINKS = """WITH found AS (
                     SELECT f.tid FROM unnest($3::text[], $4::text[]) AS c(run_id, stream_id)
                     CROSS JOIN LATERAL (
                         SELECT ctid AS tid FROM ds_subscription_links
                         WHERE tenant = $1 AND subscription_id = $2
                           AND run_id = c.run_id AND stream_id = c.stream_id
                         OFFSET 0) f
                 )
                 DELETE FROM ds_subscription_links AS l USING found WHERE l.ctid = found.tid"""
_ENQUEUE = """INSERT INTO ds_wake_deliveries
              (tenant, subscription_id, generation, wake_id, kind, payload, url, wake_run,
               wake_stream, created_by, created_by_runs)
              VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
              ON CONFLICT DO NOTHING"""
# Idle with a mark (after `_MARK_ALL` and the forgetting of those caught up), or leased past
# the lease.
_DUE = """SELECT s.tenant, s.subscription_id FROM ds_subscriptions s
          WHERE (NOT s.wake_active AND EXISTS (
                    SELECT 1 FROM ds_subscription_pending p
                    WHERE p.tenant = s.tenant AND p.subscription_id = s.subscription_id))
             OR s.lease_until < now()
          LIMIT $1"""
# The same, for the subscriptions linking some streams (through the links' stream index), and
# those leased past their lease (through the lease index): what a notified append may have
# made due, at the cost of those streams rather than of every subscription; with the marks of
# those streams' links (`_MARK_OF`), in the same round trip (a tick runs at every announcement:
# a statement more cost a hot stream's process a tenth of its appends).
_DUE_OF = f"""WITH marked AS ({_MARK_OF})
             SELECT s.tenant, s.subscription_id FROM ds_subscriptions s
             WHERE (s.tenant, s.subscription_id) IN (
                 SELECT l.tenant, l.subscription_id
                 FROM unnest($2::text[], $3::text[], $4::text[]) AS k(tenant, run_id, stream_id)
                 JOIN ds_subscription_links l
                   ON (l.tenant, l.run_id, l.stream_id) = (k.tenant, k.run_id, k.stream_id)
                 JOIN streams t
                   ON (t.tenant, t.run_id, t.stream_id) = (l.tenant, l.run_id, l.stream_id)
                 WHERE t.head > l.acked)
               AND NOT s.wake_active
             UNION
             SELECT tenant, subscription_id FROM ds_subscriptions WHERE lease_until < now()
             LIMIT $1"""
# The subscriptions linking a stream, each with that link alone.
_OF_STREAM = """SELECT s.state, s.failing, s.last_error, s.creator_runs, l.explicit, l.glob,
                       l.acked, t.head
                FROM ds_subscription_links l
                JOIN ds_subscriptions s ON (s.tenant, s.subscription_id)
                                         = (l.tenant, l.subscription_id)
                LEFT JOIN streams t ON (t.tenant, t.run_id, t.stream_id)
                                     = (l.tenant, l.run_id, l.stream_id)
                WHERE l.tenant = $1 AND l.run_id = $2 AND l.stream_id = $3
                ORDER BY l.subscription_id"""


_GONE = 2**62  # a link removed: past any head its mark may have
# How often a process's sweep passes over every link to mark those past their cursors: every
# append and fork marks its own, a decision those it links, and the scheduler those of every
# announcement, so this pass is for what slips between them: an append of a process of an
# earlier version (during a rolling upgrade) whose announcement was lost, or a mark the sweep
# forgot as a link to its stream was being named again. (Every sweep, every 5 s, it grew with
# the links: 43 ms for 20,000.)
MARK_ALL_SECONDS = 30.0


_Census = Literal["alone", "later", "shared"]


class _Raced(Exception):
    """The subscription was created by another transaction since this one found none."""


class _NoCensus(Exception):
    """The subscription is a pull-wake: its change needs the census lock, taken first."""


class _NamesWakes(Exception):
    """The change links a wake stream: it needs the census, the lock taken alone."""


def _state(sub: Subscription) -> bytes:
    """The state document: what the columns beside it keep is left out."""
    return _encode(
        msgspec.structs.replace(
            sub,
            links=(),
            failing=False,
            last_error=None,
            creator_runs=None,
            named_elsewhere=0,
            named_runs=None,
        )
    )


def _row(row: Any) -> Subscription:
    """A subscription from its row's state, failing, last_error and creator_runs (no links)."""
    return msgspec.structs.replace(
        _decode(row[0]),
        failing=row[1],
        last_error=row[2],
        creator_runs=None if row[3] is None else tuple(row[3]),
    )


def _columns(paths: Collection[StreamPath]) -> tuple[list[str], list[str]]:
    """`paths` as the two array parameters a statement takes them in: run IDs, stream IDs."""
    return [p.run_id for p in paths], [p.stream_id for p in paths]


async def _watchers(
    conn: Connection, tenant: str, also: Collection[StreamPath] = ()
) -> list[Watcher]:
    """The tenant's pull-wake subscriptions, each with its pattern and the streams it links by
    name among the wake streams (theirs, and `also`: one being made)."""
    configs = {r[0]: _decode(r[1]).config for r in await conn.fetch(_WATCHERS, tenant)}
    wakes = sorted({c.wake_stream for c in configs.values() if c.wake_stream is not None} | {*also})
    named: dict[str, list[StreamPath]] = {}
    if wakes:
        for r in await conn.fetch(_WATCHED_WAKES, tenant, *_columns(wakes)):
            named.setdefault(r[0], []).append(StreamPath(r[1], r[2]))
    found = (Watcher.of(i, c, named.get(i, ())) for i, c in configs.items())
    return [w for w in found if w is not None]


async def _with_named_runs(
    conn: Connection, tenant: str, subs: list[Subscription]
) -> list[Subscription]:
    """`subs` with the runs of the streams each names explicitly (`named_runs`)."""
    rows = await conn.fetch(_NAMED_RUNS, tenant, [sub.id for sub in subs])
    runs = {r[0]: tuple(r[1]) for r in rows}
    return [msgspec.structs.replace(sub, named_runs=runs.get(sub.id, ())) for sub in subs]


def _linked(sub: Subscription, rows: list[Any]) -> tuple[Subscription, Heads]:
    """`sub` with the links of `rows` (path, explicit, glob, acked, head, the stream's creation
    time, a fork's fork point), and their heads. A link's incarnation is its stream's, read with
    it: a link exists only while its stream does (an erasure unlinks it), so it is the stream
    the cursor is of."""
    links = {
        StreamPath(r[0], r[1]): Link(
            StreamPath(r[0], r[1]),
            r[2],
            r[3],
            r[4],
            incarnation(r[6]),
            -1 if r[7] is None else r[7],
        )
        for r in rows
    }
    return sub.with_links(links), {StreamPath(r[0], r[1]): r[5] for r in rows if r[5] is not None}


class PostgresSubscriptions:
    def __init__(
        self,
        pool: asyncpg.Pool,
        wake_streams: int = WAKE_STREAMS,
        mark_all_every: float = MARK_ALL_SECONDS,
    ) -> None:
        self._pool = pool
        self._wake_streams = wake_streams  # the most pending links a decision reads
        # How often this process's sweep marks every link past its cursor (`_MARK_ALL`, a pass
        # over every link), and when it last did.
        self._mark_all_every = mark_all_every
        self._marked_all_at = -math.inf
        # One lock per subscription being changed in this process, taken before a connection:
        # the changes of one subscription wait for each other here, holding nothing, rather
        # than on its row, each on a connection of the pool. (A flood of one wake's acks held
        # its tenant's share of the pool on one row, and the other tenants, the append leaders
        # and the workers shared what was left.) The row lock still orders the processes and
        # replicas.
        self._changing: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    async def _deciding(
        self,
        conn: Connection,
        row: Any,
        tenant: str,
        subscription_id: str,
        named: Collection[StreamPath],
        count_named: bool,
    ) -> tuple[Subscription, Heads]:
        """The subscription as a decision sees it (`Subscription.named_elsewhere`): the links
        marked pending, up to `wake_streams`, and those `named` or in the current wake, with
        their streams' heads. Never all its links: a pattern links every stream it matches
        (160,000 links took each decision past its 5 s bound when it read them all)."""
        sub = _row(row)
        after = sub.woken_up_to or StreamPath("", "")
        rows = list(
            await conn.fetch(
                _PENDING_LINKS,
                tenant,
                subscription_id,
                after.run_id,
                after.stream_id,
                self._wake_streams,
            )
        )
        wanted = set(named)
        if sub.wake is not None:
            wanted.update(path for path, _ in sub.wake.tails)
        wanted.difference_update(StreamPath(r[0], r[1]) for r in rows)
        if wanted:
            ordered = sorted(wanted)
            rows.extend(
                await conn.fetch(
                    _NAMED_LINKS,
                    tenant,
                    subscription_id,
                    *_columns(ordered),
                )
            )
        sub, heads = _linked(sub, rows)
        if count_named:
            named_count = await conn.fetchval(_NAMED_COUNT, tenant, subscription_id)
            seen = sum(1 for link in sub.links if link.explicit)
            sub = msgspec.structs.replace(sub, named_elsewhere=named_count - seen)
        return sub, heads

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
        key = (tenant, subscription_id)
        # The census: taken at once ("alone"); or, with `census_if_wakes`, not until the
        # subscription's row shows a pull-wake (`_NoCensus`), then the lock shared with its
        # like, and alone only when the change links a wake stream (`_NamesWakes`).
        mode: _Census = "alone" if not census_if_wakes else "later"
        lock = self._changing.get(key)
        if lock is None:
            lock = self._changing[key] = asyncio.Lock()
        # Always within the allowance: `lock.locked()` is False from a release until the waiter
        # it woke runs, and an `acquire` meanwhile queues behind every waiter, unbounded.
        await within_allowance(
            lock.acquire(), "the database (this subscription's changes before this one)"
        )
        try:
            while True:
                try:
                    return await bounded_on(
                        self._pool,
                        self._update(
                            tenant,
                            subscription_id,
                            decide,
                            discover,
                            extra,
                            touching,
                            named_runs,
                            census if mode == "alone" else None,
                            watchers,
                            None if census is None else mode,
                        ),
                    )
                except _NoCensus:
                    # A pull-wake: made again, the census lock taken first.
                    mode = "shared"
                    continue
                except _NamesWakes:
                    mode = "alone"
                    continue
                except _Raced:
                    # Another transaction created it meanwhile (nothing was locked: there was
                    # no row): decided again, from the row it made, under its lock (or, deleted
                    # again meanwhile, from none).
                    continue
        finally:
            lock.release()

    async def _update(
        self,
        tenant: str,
        subscription_id: str,
        decide: Callable[[Subscription | None, Heads], tuple[Change | None, _T]],
        discover: str | None,
        extra: tuple[StreamPath, ...],
        touching: Collection[StreamPath],
        named_runs: bool,
        census: Callable[[Census], None] | None,
        watchers: Collection[StreamPath] | None,
        mode: _Census | None,
    ) -> _T:
        async with self._pool.acquire() as conn, conn.transaction():
            kind: str | None = None
            if mode == "shared":
                # First too. Held until the commit, it keeps every stream of `extra` what it is
                # now: a stream becomes a wake stream only under the lock alone.
                await conn.execute(_CENSUS_SHARED, tenant)
                if await conn.fetchval(_NAMES_WAKES, tenant, *_columns(sorted(set(extra)))):
                    raise _NamesWakes
            if census is not None:
                # First, before any stream or subscription is held: no other transaction takes
                # this lock while holding one.
                await conn.execute(_CENSUS_LOCK, tenant)
                # (Its kind is settled under the lock against creations, which take it; a
                # deletion, which does not, is found below. A webhook is in no ring: it writes
                # no wake event.)
                kind = await conn.fetchval(_KIND, tenant, subscription_id)
                count = await conn.fetchval(_COUNT, tenant) if kind is None else 0
                wanted = watchers is not None and kind in (None, "pull-wake")
                found = await _watchers(conn, tenant, watchers or ()) if wanted else []
                census(Census(count, found))
            named: Heads = {}
            if extra:
                # The streams it may link by name are held (FOR KEY SHARE, in the key's order,
                # before the subscription's row, as an erasure holds its streams before the
                # subscriptions its trigger unlinks) and their heads read with them: none is
                # erased, so none created again, until this commits. (Read unheld, a stream
                # erased and created again before the commit had its new link start from the
                # old one's head.) Appends (FOR NO KEY UPDATE) do not wait for it.
                ordered = sorted(set(extra))
                rows = await conn.fetch(
                    _HOLD_NAMED,
                    tenant,
                    *_columns(ordered),
                )
                named = {StreamPath(r[0], r[1]): r[2] for r in rows}
            row = await conn.fetchrow(_LOCK, tenant, subscription_id)
            if mode == "later" and row is not None and row[4] == "pull-wake":
                raise _NoCensus  # (its row let go at once: the census lock is taken first)
            if row is None and kind is not None:
                # Deleted since its kind was read (a deletion takes no census lock): what the
                # census left out for that kind may matter now. Decided again, afresh.
                raise _Raced
            sub: Subscription | None = None
            heads: Heads = {}
            if row is not None:
                sub, heads = await self._deciding(
                    conn, row, tenant, subscription_id, {*extra, *touching}, bool(extra)
                )
                if named_runs:
                    (sub,) = await _with_named_runs(conn, tenant, [sub])
            heads.update(named)
            if discover is not None and sub is None:
                # Not while a stream is being created, nor one created until this commits
                # (migration 0497): every stream the glob matches is linked by one or the other.
                await conn.execute(_LINKS_LOCK, tenant)
                rows = await conn.fetch(_MATCHING, tenant, pattern_regex(discover))
                heads.update({StreamPath(r[0], r[1]): r[2] for r in rows})
            change, answer = decide(sub, heads)
            made: list[StreamPath] = []
            if change is not None:
                made = await self._write(conn, tenant, subscription_id, sub, change)
            if sub is not None and sub.links:
                await self._settle(conn, tenant, subscription_id, sub, change)
            if change is not None:
                # Bounded (`bounded_on`): given up on from here, the change may have committed
                # (a claim, a done, a release: a client must not take it as not made).
                committing()
        if made:
            await self._mark_made(tenant, subscription_id, made)
        return answer

    async def _mark_made(self, tenant: str, subscription_id: str, made: list[StreamPath]) -> None:
        """Once a decision that made links has committed: those whose stream stands past the
        cursor (an append committed between the read of its head and that commit, whose own
        statement could not see the link, nor the scheduler's marking of its announcement, if
        that ran before the commit) marked. The decision's outcome does not depend on it: a
        failure is logged, and the scheduler's pass over every link marks them."""
        ordered = sorted(made)
        try:
            await self._pool.execute(
                _MARK_NEW,
                tenant,
                subscription_id,
                *_columns(ordered),
            )
        except (asyncpg.PostgresError, OSError, TimeoutError) as error:
            log.warning("marking the links a decision made failed: %s", error)

    async def _settle(
        self,
        conn: Connection,
        tenant: str,
        subscription_id: str,
        seen: Subscription,
        change: Change | None,
    ) -> None:
        """`_SETTLE` for the links the decision saw, at the cursors it left them at."""
        after = seen if change is None else change.subscription
        if after is None:
            return  # deleted: its marks are the sweep's
        acked = {link.path: link.acked for link in after.links}
        ordered = sorted(link.path for link in seen.links)
        await conn.execute(
            _SETTLE,
            tenant,
            subscription_id,
            *_columns(ordered),
            [acked.get(p, _GONE) for p in ordered],
        )

    async def _write(
        self,
        conn: Connection,
        tenant: str,
        subscription_id: str,
        old: Subscription | None,
        change: Change,
    ) -> list[StreamPath]:
        """The change written; answers the links it made (for `_mark_made`)."""
        new = change.subscription
        if new is None:
            await conn.execute(_DELETE, tenant, subscription_id)
            return []
        wake = new.wake
        lease = None if wake is None else wake.lease_until
        woken = new.config.wake_stream
        wake_run, wake_stream = (None, None) if woken is None else (woken.run_id, woken.stream_id)
        if old is None:
            regex = pattern_regex(new.config.pattern) if new.config.pattern else None
            inserted = await conn.execute(
                _INSERT,
                tenant,
                subscription_id,
                new.config.type,
                regex,
                _state(new),
                wake is not None,
                lease,
                new.failing,
                None if new.creator_runs is None else list(new.creator_runs),
                wake_run,
                wake_stream,
            )
            if inserted == "INSERT 0 0":
                raise _Raced
        else:
            await conn.execute(
                _UPDATE,
                tenant,
                subscription_id,
                _state(new),
                wake is not None,
                lease,
                new.failing,
                wake_run,
                wake_stream,
            )
        before = {link.path: link for link in old.links} if old else {}
        after = {link.path: link for link in new.links}
        changed = [link for path, link in after.items() if before.get(path) != link]
        for statement, links in (
            (_UPDATE_LINKS, [k for k in changed if k.path in before]),
            (_UPSERT_LINKS, [k for k in changed if k.path not in before]),
        ):
            if links:
                await conn.execute(
                    statement,
                    tenant,
                    subscription_id,
                    [k.path.run_id for k in links],
                    [k.path.stream_id for k in links],
                    [k.explicit for k in links],
                    [k.glob for k in links],
                    [k.acked for k in links],
                )
        gone = [path for path in before if path not in after]
        if gone:
            await conn.execute(
                _DROP_LINKS,
                tenant,
                subscription_id,
                *_columns(gone),
            )
        for d in change.deliveries:
            await conn.execute(
                _ENQUEUE,
                d.tenant,
                d.subscription_id,
                d.generation,
                d.wake_id,
                d.kind,
                d.payload,
                d.url,
                d.wake_stream.run_id if d.wake_stream else None,
                d.wake_stream.stream_id if d.wake_stream else None,
                d.created_by,
                None if d.creator_runs is None else list(d.creator_runs),
            )
        return [k.path for k in changed if k.path not in before]

    async def get(self, tenant: str, subscription_id: str) -> tuple[Subscription, Heads] | None:
        return await bounded_on(self._pool, self._get(tenant, subscription_id))

    async def _get(self, tenant: str, subscription_id: str) -> tuple[Subscription, Heads] | None:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(_GET, tenant, subscription_id)
            if row is None:
                return None
            sub, heads = _linked(_row(row), await conn.fetch(_LINKS, tenant, subscription_id))
            runs = sorted({link.path.run_id for link in sub.links if link.explicit})
            return msgspec.structs.replace(sub, named_runs=tuple(runs)), heads

    async def count(self, tenant: str) -> int:
        count: int = await self._pool.fetchval(_COUNT, tenant)
        return count

    async def wake_id(self, tenant: str, subscription_id: str) -> str | None:
        state = await self._pool.fetchval(_STATE, tenant, subscription_id)
        wake = None if state is None else _decode(state).wake
        return None if wake is None else wake.wake_id

    async def due(
        self, limit: int, streams: Collection[StreamKey] | None = None
    ) -> list[tuple[str, str]]:
        if streams is None:
            # The sweep: at most every `mark_all_every`, every link past its cursor marked (the
            # belt to the appends' and the announcements' marks: for an append of a process of
            # an earlier version whose announcement was lost) and the marks pending no more
            # forgotten (each a look-up of its link: a pass over the marks); then, every sweep,
            # the subscriptions with a mark.
            now = time.monotonic()
            if now - self._marked_all_at >= self._mark_all_every:
                await self._pool.execute(_MARK_ALL)
                await self._pool.execute(_FORGET_CAUGHT_UP)
                await self._pool.execute(_FORGET_UNLINKED)
                self._marked_all_at = now
            rows = await self._pool.fetch(_DUE, limit)
        else:
            keys = sorted(streams)
            named = (
                [k.tenant for k in keys],
                [k.run_id for k in keys],
                [k.stream_id for k in keys],
            )
            rows = await self._pool.fetch(_DUE_OF, limit, *named)
        return [(r[0], r[1]) for r in rows]

    async def of_stream(
        self, key: StreamKey, named_runs: bool = False
    ) -> list[tuple[Subscription, Heads]]:
        path = StreamPath(key.run_id, key.stream_id)
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(_OF_STREAM, *key)
            subs = [_row(r).with_links({path: Link(path, r[4], r[5], r[6])}) for r in rows]
            if named_runs and subs:
                subs = await _with_named_runs(conn, key.tenant, subs)
        heads = [{} if r[7] is None else {path: r[7]} for r in rows]
        return list(zip(subs, heads, strict=True))

    async def delivery(self, job: Job) -> Delivery | None:
        row = await self._pool.fetchrow(
            """SELECT generation, wake_id, kind, payload, url, wake_run, wake_stream, created_by,
                      created_by_runs
               FROM ds_wake_deliveries
               WHERE tenant = $1 AND subscription_id = $2 AND generation = $3
                 AND delivered_at IS NULL""",
            job.key.tenant,
            job.key.stream_id,
            job.id,
        )
        if row is None:
            return None
        return Delivery(
            job.key.tenant,
            job.key.stream_id,
            row[0],
            row[1],
            row[2],
            row[3],
            url=row[4],
            wake_stream=StreamPath(row[5], row[6]) if row[5] is not None else None,
            created_by=row[7],
            creator_runs=None if row[8] is None else tuple(row[8]),
        )

    async def forget_delivered(self, age_seconds: float, batch: int = 1000) -> int:
        """Remove delivered outbox rows older than `age_seconds`, in bounded batches."""
        removed = 0
        while True:
            status = await self._pool.execute(
                """DELETE FROM ds_wake_deliveries WHERE ctid IN (
                       SELECT ctid FROM ds_wake_deliveries
                       WHERE delivered_at < now() - make_interval(secs => $1) LIMIT $2)""",
                age_seconds,
                batch,
            )
            count = int(status.split()[-1])
            removed += count
            if count < batch:
                return removed


_KEY = "tenant = $2 AND subscription_id = $3 AND generation = $4 AND claimed_by = $1"


# A claim looks at a window of tenants, never at the whole backlog. Ranking every due row cost
# each claim (20 a second in every process) 0.2-0.28 s with 100,000 due over 10 tenants
# (docs/architecture.md, "Subscriptions"). The tenants that have undelivered wakes are walked in
# name order from a cursor kept by the process (an index probe each), at most `TENANT_WINDOW` a
# claim; each contributes at most the few rows it may take, read from the queue index in order;
# and only those are ranked, locked with SKIP LOCKED and checked again (a row another worker
# took meanwhile is skipped).
TENANT_WINDOW = 64

_WAKE_DUE = (
    "delivered_at IS NULL AND next_attempt_at <= now() "
    "AND (lease_until IS NULL OR lease_until < now())"
)


def _queued(kind: str, retry: int, when: str, late: int, limit: str) -> str:
    """At most `limit` of a tenant's due rows of one kind, first attempts (retry 0) or retries
    (1), oldest first: a range of the queue index (migration 0501)."""
    return f"""(SELECT subscription_id, generation, next_attempt_at, {late} AS late
        FROM ds_wake_deliveries
        WHERE tenant = t.tenant AND kind = '{kind}' AND least(attempts, 1) = {retry}
          AND {when} AND {_WAKE_DUE}
        ORDER BY next_attempt_at LIMIT {limit})"""


def _turns(kind: str, limit: str) -> str:
    """A tenant's next `limit` rows of one kind, in its order: first attempts and retries due
    for over a minute (oldest first), then the other retries."""
    old = "next_attempt_at <= now() - interval '1 minute'"
    recent = "next_attempt_at > now() - interval '1 minute'"
    return f"""(SELECT '{kind}' AS kind, * FROM (
        {_queued(kind, 0, "true", 0, limit)}
        UNION ALL {_queued(kind, 1, old, 0, limit)}
        UNION ALL {_queued(kind, 1, recent, 1, limit)}
    ) q ORDER BY late, next_attempt_at LIMIT {limit})"""


_CLAIM = f"""
WITH RECURSIVE ahead(tenant, n) AS (
    (SELECT tenant, 1 FROM ds_wake_deliveries
     WHERE delivered_at IS NULL AND tenant > $5 ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT w.tenant FROM ds_wake_deliveries w
            WHERE w.delivered_at IS NULL AND w.tenant > t.tenant ORDER BY w.tenant LIMIT 1),
           t.n + 1
    FROM ahead t WHERE t.tenant IS NOT NULL AND t.n < $6
),
-- From the first tenant up to the cursor: walked only when the tenants after the cursor are
-- fewer than the window (an Append runs its second part only for the rows the LIMIT still
-- wants), so that a window always holds as many tenants as there are, up to its size.
behind(tenant, n) AS (
    (SELECT tenant, 1 FROM ds_wake_deliveries
     WHERE delivered_at IS NULL AND $5 <> '' ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT w.tenant FROM ds_wake_deliveries w
            WHERE w.delivered_at IS NULL AND w.tenant > t.tenant ORDER BY w.tenant LIMIT 1),
           t.n + 1
    FROM behind t WHERE t.tenant IS NOT NULL AND t.tenant < $5 AND t.n < $6
),
tenants AS (
    SELECT tenant, row_number() OVER () AS place FROM (
        (SELECT tenant FROM ahead WHERE tenant IS NOT NULL)
        UNION ALL
        (SELECT tenant FROM behind WHERE tenant IS NOT NULL AND tenant <= $5)
        LIMIT $6
    ) w
),
busy AS (
    SELECT tenant, count(*) AS n FROM ds_wake_deliveries
    WHERE delivered_at IS NULL AND lease_until >= now() AND kind = 'webhook'
    GROUP BY tenant
),
candidates AS (
    SELECT t.tenant, t.place, c.subscription_id, c.generation,
           row_number() OVER (PARTITION BY t.tenant, c.kind ORDER BY c.late, c.next_attempt_at)
               AS turn
    FROM tenants t
    LEFT JOIN busy b ON b.tenant = t.tenant
    CROSS JOIN LATERAL (
        {_turns("webhook", "greatest($4 - coalesce(b.n, 0), 0)")}
        UNION ALL
        {_turns("wake-event", "$3")}
    ) c
    WHERE t.tenant IS NOT NULL
),
-- Each tenant's first, in the walk's order from the cursor, then each one's second, ...
picked AS (
    SELECT tenant, place, turn, subscription_id, generation FROM candidates
    ORDER BY turn, place LIMIT $3
),
locked AS (
    SELECT w.tenant, w.subscription_id, w.generation
    FROM picked p JOIN ds_wake_deliveries w USING (tenant, subscription_id, generation)
    WHERE w.delivered_at IS NULL AND w.next_attempt_at <= now()
      AND (w.lease_until IS NULL OR w.lease_until < now())
    FOR UPDATE OF w SKIP LOCKED
),
claimed AS (
    UPDATE ds_wake_deliveries d
    SET claimed_by = $1, lease_until = now() + make_interval(secs => $2)
    FROM locked
    WHERE (d.tenant, d.subscription_id, d.generation)
          = (locked.tenant, locked.subscription_id, locked.generation)
    RETURNING d.tenant, d.subscription_id, d.generation, d.attempts
),
walked AS (
    SELECT (SELECT tenant FROM tenants ORDER BY place DESC LIMIT 1) AS last,
           (SELECT count(*) FROM tenants) AS seen,
           (SELECT count(*) FROM picked) AS picked,
           (SELECT max(turn) FROM picked) AS turns,
           (SELECT tenant FROM picked ORDER BY place DESC LIMIT 1) AS served
)
SELECT c.tenant, c.subscription_id, c.generation, c.attempts,
       walked.last, walked.seen, walked.picked, walked.turns, walked.served
FROM walked LEFT JOIN claimed c ON true
"""


class PostgresWakeDeliveries:
    """The wake outbox as the workers' job queue (application.workers.JobQueue): a job is one
    undelivered row, claimed with a lease; a subscription's rows are independent (a new wake
    supersedes an old one, whose job then finds it ended and does nothing)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        worker_id: str,
        lease_seconds: float = 6.0,
        per_tenant: int = 8,
        tenant_window: int = TENANT_WINDOW,
    ) -> None:
        self._pool = pool
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self.per_tenant = per_tenant
        self._window = tenant_window
        self._after = ""  # the last tenant of the previous claim's window, when it was full

    async def claim(self, limit: int) -> list[Job]:
        """Due deliveries, taken in turn across tenants (each tenant's first, then each one's
        second, …; a tenant's first attempts before its retries, but for retries due for a
        minute already, oldest first), and no more of a tenant's webhooks than make
        `per_tenant` under way across every process: a tenant whose receivers hang holds that
        many delivery slots at most, and the others' webhooks go out meanwhile; its own new
        wakes go before the retries of those that hang. Wake events (pull-wake: an append of
        the service's own, no receiver) are not capped. The tenants are looked at
        `tenant_window` at a time, from where the last claim stopped, so that a claim's cost
        does not grow with the backlog and every tenant's turn comes."""
        rows = await self._pool.fetch(
            _CLAIM,
            self.worker_id,
            self.lease_seconds,
            limit,
            self.per_tenant,
            self._after,
            self._window,
        )
        # Every row carries the walk (a row of nulls besides when nothing was claimed). A claim
        # filled with tenants' first turns goes on after the last tenant it served; one that
        # gave every tenant of a full window its turn, after the window; else from the start.
        last, seen, picked, turns, served = rows[0][4:9]
        if picked >= limit and turns == 1 and served is not None:
            self._after = served
        elif seen >= self._window and last is not None:
            self._after = last
        else:
            self._after = ""
        return [_job(r[0], r[1], r[2], r[3]) for r in rows if r[0] is not None]

    async def renew(self, jobs: list[Job]) -> list[Job]:
        lost = []
        for job in jobs:
            held = await self._pool.fetchval(
                f"""UPDATE ds_wake_deliveries
                    SET lease_until = now() + make_interval(secs => $5)
                    WHERE {_KEY} AND delivered_at IS NULL RETURNING 1""",
                self.worker_id,
                job.key.tenant,
                job.key.stream_id,
                job.id,
                self.lease_seconds,
            )
            if held is None:
                lost.append(job)
        return lost

    # The subscription's row first, then its outbox row: the order a subscription's deletion
    # takes them in (its row, then the cascade), so that the two never deadlock.

    async def done(self, job: Job, next_in: float | None) -> None:
        """Delivered: the subscription is not failing any more (a pull-wake's wake stream that
        was missing and now exists, a webhook answered after its attempt timed out)."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                """UPDATE ds_subscriptions SET failing = false, last_error = NULL
                   WHERE tenant = $1 AND subscription_id = $2 AND failing""",
                job.key.tenant,
                job.key.stream_id,
            )
            await conn.execute(
                f"""UPDATE ds_wake_deliveries
                    SET delivered_at = now(), claimed_by = NULL, lease_until = NULL,
                        last_error = NULL
                    WHERE {_KEY}""",
                self.worker_id,
                job.key.tenant,
                job.key.stream_id,
                job.id,
            )

    async def failed(self, job: Job, error: str, retry_in: float) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                """UPDATE ds_subscriptions SET failing = true, last_error = $3
                   WHERE tenant = $1 AND subscription_id = $2""",
                job.key.tenant,
                job.key.stream_id,
                error[:500],
            )
            await conn.execute(
                f"""UPDATE ds_wake_deliveries
                    SET claimed_by = NULL, lease_until = NULL, attempts = attempts + 1,
                        last_error = $5, next_attempt_at = now() + make_interval(secs => $6)
                    WHERE {_KEY}""",
                self.worker_id,
                job.key.tenant,
                job.key.stream_id,
                job.id,
                error[:2000],
                retry_in,
            )

    async def release(self, jobs: list[Job]) -> None:
        for job in jobs:
            await self._pool.execute(
                f"UPDATE ds_wake_deliveries SET claimed_by = NULL, lease_until = NULL WHERE {_KEY}",
                self.worker_id,
                job.key.tenant,
                job.key.stream_id,
                job.id,
            )


def _job(tenant: str, subscription_id: str, generation: int, attempts: int) -> Job:
    return Job(
        key=StreamKey(tenant, "__subscription__", subscription_id), attempts=attempts, id=generation
    )
