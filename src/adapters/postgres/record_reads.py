"""Record reads in PostgreSQL: a page of a stream's records in one statement, and a fork's
page stitched from its ancestors' segments (docs/architecture.md "Reads")."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from itertools import islice

import asyncpg

from application.fork_reads import ForkLink, segments, stitched
from application.ports import Position, StoredRecord, within_bytes
from domain.records import RecordKind
from domain.stream import StreamKey

# The stream's position (and fork link) once, in the first row, then one row per record: the
# position's columns repeated on every record row cost asyncpg a decode each (created_at a
# datetime) per record. One statement, one snapshot; the CTE is evaluated once.
_PAGE = """
WITH s AS (
    SELECT s.head, s.earliest, s.closed, s.created_at, s.soft_deleted,
           f.source_run_id, f.source_stream_id, f.source_created_at, f.through
    FROM streams s
    LEFT JOIN stream_forks f
           ON f.tenant = s.tenant AND f.run_id = s.run_id AND f.stream_id = s.stream_id
    WHERE s.tenant = $1 AND s.run_id = $2 AND s.stream_id = $3
)
SELECT s.*, NULL::bigint, NULL::bytea, NULL::int2, NULL::text, NULL::int4, NULL::bytea FROM s
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       r.sequence, timestamptz_send(r.appended_at), r.kind, r.content_type, r.size, r.payload
FROM s CROSS JOIN LATERAL (
    SELECT sequence, appended_at, kind, content_type, size, payload
    FROM stream_records r
    WHERE r.tenant = $1 AND r.run_id = $2 AND r.stream_id = $3
      AND r.sequence > $4 AND r.sequence <= s.head
    ORDER BY r.sequence
    LIMIT $5
) r
"""


def _within_budget(statement: str, where: str, limit: str, budget: str) -> str:
    """`statement` with its read of records (`WHERE {where} ORDER BY r.sequence LIMIT
    {limit}`) ending before the first record that would take their payloads past `budget`
    bytes (`within_bytes`: the first record always, with any empty ones before it): the
    records past it are never read out of their TOAST nor sent. octet_length reads a stored
    payload's length off its header; the running sum costs about 0.4 ms a page of 1,000 small
    records (a ROWS frame and no row_number: 0.2 ms less)."""
    plain = f"""    SELECT sequence, appended_at, kind, content_type, size, payload
    FROM stream_records r
    WHERE {where}
    ORDER BY r.sequence
    LIMIT {limit}
) r"""
    cut = f"""    SELECT sequence, appended_at, kind, content_type, size, payload FROM (
        SELECT sequence, appended_at, kind, content_type, size, payload,
               sum(octet_length(payload)) OVER (ORDER BY r.sequence ROWS UNBOUNDED PRECEDING)
                   AS upto
        FROM stream_records r
        WHERE {where}
        ORDER BY r.sequence
        LIMIT {limit}
    ) r WHERE upto <= {budget} OR upto = octet_length(payload)
) r"""
    assert plain in statement
    return statement.replace(plain, cut)


# The page within $6 bytes: one of 1,000 records of 64 KiB costs what 4 MiB of them do.
_PAGE_WITHIN = _within_budget(
    _PAGE,
    "r.tenant = $1 AND r.run_id = $2 AND r.stream_id = $3\n"
    "      AND r.sequence > $4 AND r.sequence <= s.head",
    "$5",
    "$6",
)

# A fork's chain, its own link first, up to the root: resolved once per fork and kept (it never
# changes while the fork exists). The bound only guards against a cycle, which no creation can
# make (a fork links a stream that existed before it).
_CHAIN = """
WITH RECURSIVE chain(n, source_run_id, source_stream_id, source_created_at, through) AS (
    SELECT 0, source_run_id, source_stream_id, source_created_at, through FROM stream_forks
    WHERE tenant = $1 AND run_id = $2 AND stream_id = $3
    UNION ALL
    SELECT c.n + 1, f.source_run_id, f.source_stream_id, f.source_created_at, f.through
    FROM chain c JOIN stream_forks f
      ON f.tenant = $1 AND f.run_id = c.source_run_id AND f.stream_id = c.source_stream_id
    WHERE c.n < $4
)
SELECT source_run_id, source_stream_id, source_created_at, through FROM chain ORDER BY n
"""
_CHAIN_BOUND = 100_000

# What a fork's read takes from its ancestors, in one statement whatever the chain's depth: each
# ancestor's position (n, earliest, created_at), then the records of each segment that is not
# empty (n, then a record's columns where _PAGE has them: one decoding loop for both). `n` is
# the ancestor's place in the chain (1: the source).
_SEGMENTS = """
WITH c AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::int8[], $5::int8[])
        WITH ORDINALITY AS c(run_id, stream_id, after, through, n)
)
SELECT c.n, s.earliest, s.created_at, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL::bigint, NULL::bytea, NULL::int2, NULL::text, NULL::int4, NULL::bytea
FROM c JOIN streams s ON s.tenant = $1 AND s.run_id = c.run_id AND s.stream_id = c.stream_id
UNION ALL
SELECT c.n, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       r.sequence, timestamptz_send(r.appended_at), r.kind, r.content_type, r.size, r.payload
FROM (SELECT * FROM c WHERE c.after < c.through) c CROSS JOIN LATERAL (
    SELECT sequence, appended_at, kind, content_type, size, payload
    FROM stream_records r
    WHERE r.tenant = $1 AND r.run_id = c.run_id AND r.stream_id = c.stream_id
      AND r.sequence > c.after AND r.sequence <= c.through
    ORDER BY r.sequence
    LIMIT $6
) r
"""

# The segments within $7 bytes each: a fork's page is read within a budget per segment (the
# stitched page is cut to the budget after), not up to `limit` records of every ancestor's
# (1,000 records of 60 KB: 60 MB read for 240 KB sent).
_SEGMENTS_WITHIN = _within_budget(
    _SEGMENTS,
    "r.tenant = $1 AND r.run_id = c.run_id AND r.stream_id = c.stream_id\n"
    "      AND r.sequence > c.after AND r.sequence <= c.through",
    "$6",
    "$7",
)

# A page's appended_at arrives as timestamptz_send's 8 bytes (microseconds since 2000-01-01 UTC)
# and is decoded once per distinct value: the records of one append share theirs, and decoding
# every row's into a datetime was a tenth of a catch-up's CPU (docs/architecture.md).
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_KINDS = tuple(RecordKind)  # RecordKind(n) per row cost more than the rest of the row


class RecordReads:
    """The stream adapter's reads of records (a mixin of `PostgresStreams`, whose pool and
    caches they use: `_times`, appended_at by its raw form, and `_chains`, forks' chains)."""

    _pool: asyncpg.Pool
    _times: dict[bytes, datetime]
    _chains: dict[StreamKey, tuple[datetime, list[ForkLink]]]

    async def created_at(self, key: StreamKey) -> datetime | None:
        raise NotImplementedError

    async def page(
        self, key: StreamKey, cursor: int, limit: int, max_bytes: int | None = None
    ) -> tuple[Position, list[StoredRecord]] | None:
        if max_bytes is None:
            rows = await self._pool.fetch(_PAGE, *key, cursor, limit)
        else:
            rows = await self._pool.fetch(_PAGE_WITHIN, *key, cursor, limit, max_bytes)
        if not rows:
            return None
        first = rows[0]
        body: Iterable[asyncpg.Record] = islice(rows, 1, None)
        if first[9] is not None:  # UNION ALL promises no order; PostgreSQL keeps it, but if not:
            first = next(r for r in rows if r[9] is None)
            body = sorted((r for r in rows if r[9] is not None), key=lambda r: r[9])
        position = Position(
            head=first[0],
            earliest=first[1],
            closed=first[2],
            created_at=first[3],
            soft_deleted=first[4],
        )
        records = self._records(body) if len(rows) > 1 else []
        if first[5] is None:
            return position, records
        return await self._stitched(key, position, records, first, cursor, limit, max_bytes)

    async def _stitched(
        self,
        key: StreamKey,
        position: Position,
        records: list[StoredRecord],
        first: asyncpg.Record,
        cursor: int,
        limit: int,
        max_bytes: int | None,
    ) -> tuple[Position, list[StoredRecord]]:
        """A fork's page: its own records (`records`) below what its ancestors serve. Their
        segments are read up to `limit` records and `max_bytes` each, and the stitched page is
        cut to `max_bytes` here."""
        assert position.created_at is not None
        link = ForkLink(StreamKey(key.tenant, first[5], first[6]), first[7], first[8])
        chain = await self._chain(key, position.created_at)
        if not chain or chain[0] != link:  # deleted and created again between the two reads
            self._chains.pop(key, None)
            chain = [link]
        wanted = segments(chain, cursor, limit)
        found: list[tuple[Position | None, list[StoredRecord]]] = [(None, [])] * len(chain)
        by_place: dict[int, list[asyncpg.Record]] = {}
        columns = (
            key.tenant,
            [s.key.run_id for s in wanted],
            [s.key.stream_id for s in wanted],
            [s.after for s in wanted],
            [s.through for s in wanted],
            limit,
        )
        if max_bytes is None:
            rows = await self._pool.fetch(_SEGMENTS, *columns)
        else:
            rows = await self._pool.fetch(_SEGMENTS_WITHIN, *columns, max_bytes)
        for r in rows:
            if r[9] is None:  # an ancestor's position (only what `stitched` reads of it)
                found[r[0] - 1] = (
                    Position(head=0, earliest=r[1], closed=False, created_at=r[2]),
                    [],
                )
            else:
                by_place.setdefault(r[0], []).append(r)
        for place, part in by_place.items():
            part.sort(key=lambda r: r[9])
            found[place - 1] = (found[place - 1][0], self._records(part))
        page = stitched((position, records), chain, found, limit)
        return page[0], within_bytes(page[1], max_bytes)

    def _records(self, rows: Iterable[asyncpg.Record]) -> list[StoredRecord]:
        """Records from rows whose columns 9 to 14 are a record's (sequence, raw appended_at,
        kind, content type, size, payload), in ascending sequence."""
        records: list[StoredRecord] = []
        times, kinds, add = self._times, _KINDS, records.append
        previous, ordered = -1, True
        for r in rows:
            at = times.get(raw := r[10])
            if at is None:
                at = _timestamptz(raw)
                if len(times) >= 4096:
                    times.clear()
                times[raw] = at
            if r[9] <= previous:
                ordered = False
            previous = r[9]
            add(StoredRecord(previous, at, kinds[r[11]], r[12], r[13], r[14]))
        if not ordered:  # the lateral's order reaches the outer query in every plan seen
            records.sort(key=lambda record: record.sequence)
        return records

    async def chain(self, key: StreamKey, created_at: datetime | None = None) -> list[ForkLink]:
        if created_at is None:
            created_at = await self.created_at(key)
        return [] if created_at is None else await self._chain(key, created_at)

    async def _chain(self, key: StreamKey, created_at: datetime) -> list[ForkLink]:
        """The fork's chain (`_CHAIN`), once per fork incarnation (its creation time)."""
        known = self._chains.get(key)
        if known is not None and known[0] == created_at:
            return known[1]
        rows = await self._pool.fetch(_CHAIN, *key, _CHAIN_BOUND)
        chain = [ForkLink(StreamKey(key.tenant, r[0], r[1]), r[2], r[3]) for r in rows]
        self._chains[key] = (created_at, chain)
        if len(self._chains) > 10_000:
            del self._chains[next(iter(self._chains))]
        return chain


def _timestamptz(raw: bytes) -> datetime:
    """What asyncpg decodes a timestamptz to, from its binary form (its infinities included:
    the naive extremes)."""
    micros = int.from_bytes(raw, "big", signed=True)
    if micros == 0x7FFF_FFFF_FFFF_FFFF:
        return datetime.max
    if micros == -0x8000_0000_0000_0000:
        return datetime.min
    return _PG_EPOCH + timedelta(microseconds=micros)
