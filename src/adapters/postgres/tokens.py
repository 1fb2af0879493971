"""API tokens in PostgreSQL, by hash. Whether a token is expired or revoked is decided by the
database's clock (now()), and a revocation notifies every process's wake bus on
`TOKENS_CHANNEL` (with each revoked token's id: the token and those minted from it) in the
transaction that revokes it."""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg

from adapters.postgres.tenant_counts import tenant_tokens
from application.access import Caller
from application.errors import MinterEnded
from application.ports import FoundToken, TokenRecord
from domain.errors import CursorUnknown

TOKENS_CHANNEL = "ductor_streams_tokens"

_FIND = """
SELECT tenant, principal, scopes, extract(epoch FROM expires_at - now())::float8, runs
FROM api_tokens
WHERE token_hash = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
"""

_PUT = """
INSERT INTO api_tokens (token_hash, tenant, principal, scopes, expires_at, runs)
VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5::bigint), $6)
ON CONFLICT (token_hash) DO UPDATE
SET tenant = excluded.tenant, principal = excluded.principal, scopes = excluded.scopes,
    expires_at = excluded.expires_at, runs = excluded.runs
RETURNING expires_at
"""

# A token minted by the stored token `$7`, only while `$7` works: its row is held (FOR SHARE)
# until this commits, so a revocation of it waits, and then finds this token among its minted.
_MINT = """
WITH minter AS (
    SELECT 1 FROM api_tokens
    WHERE token_id = $7 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
    FOR SHARE
)
INSERT INTO api_tokens (token_hash, tenant, principal, scopes, expires_at, runs, minted_by)
SELECT $1, $2, $3, $4, now() + make_interval(secs => $5::bigint), $6, $7
WHERE EXISTS (SELECT 1 FROM minter)
RETURNING expires_at
"""

# The token, then (each a statement of its own, which sees what committed before it started)
# the tokens minted from those it revoked, until none is left: a mint that held its minter
# against the first statement committed before it, so a later statement sees it. Each
# notification is sent only if (and when) the revocation commits.
_REVOKE = f"""
WITH revoked AS (
    UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now())
    WHERE token_id = $1
    RETURNING token_id
)
SELECT token_id, pg_notify('{TOKENS_CHANNEL}', token_id) FROM revoked
"""
_REVOKE_MINTED = f"""
WITH revoked AS (
    UPDATE api_tokens SET revoked_at = now()
    WHERE minted_by = ANY($1::text[]) AND revoked_at IS NULL
    RETURNING token_id
)
SELECT token_id, pg_notify('{TOKENS_CHANNEL}', token_id) FROM revoked
"""

# Of these token ids, the ones that still work (the wake bus asks on each (re)connection about
# the tokens open connections hold: a revocation may have been missed while it was away).
STILL_VALID = """
SELECT token_id FROM api_tokens
WHERE token_id = ANY($1::text[]) AND revoked_at IS NULL
  AND (expires_at IS NULL OR expires_at > now())
"""

_COLUMNS = "token_id, tenant, principal, scopes, created_at, expires_at, revoked_at, runs"

_LIST = f"""
SELECT {_COLUMNS}
FROM api_tokens
WHERE $1::text IS NULL OR tenant = $1
ORDER BY tenant, created_at, token_id
"""

# `GET /tokens`: a keyset page of a tenant's tokens by creation, an index range
# (api_tokens_tenant_created) read in order, whose cost follows the page, not the tenant.
# `$3`: the runs of a run-restricted caller, who sees only the tokens restricted to some of them.
_VISIBLE = "($3::text[] IS NULL OR (runs IS NOT NULL AND runs <@ $3::text[]))"
_FIRST_PAGE = f"""
SELECT {_COLUMNS}
FROM api_tokens
WHERE tenant = $1 AND {_VISIBLE}
ORDER BY created_at, token_id
LIMIT $2
"""

_PAGE_AFTER = f"""
SELECT {_COLUMNS}
FROM api_tokens
WHERE tenant = $1 AND {_VISIBLE} AND (created_at, token_id) > (
    SELECT created_at, token_id FROM api_tokens
    WHERE tenant = $1 AND token_id = $4 AND {_VISIBLE}
)
ORDER BY created_at, token_id
LIMIT $2
"""

# An empty page after `after`: the end of the listing, or a cursor that names no token (that
# the caller may see).
_KNOWN = f"""
SELECT EXISTS (SELECT 1 FROM api_tokens WHERE tenant = $1 AND token_id = $2 AND {_VISIBLE})
"""

_GET = f"SELECT {_COLUMNS} FROM api_tokens WHERE token_id = $1"

# Tokens expired long enough ago, a bounded batch a statement (they refuse every request
# already; the listing shows them until then). A revoked token that never expires stays: its
# row is what keeps it revoked should its value be stored again (a bootstrap token, at the
# next start).
_FORGET_ENDED = """
DELETE FROM api_tokens WHERE token_hash = ANY(ARRAY(
    SELECT token_hash FROM api_tokens WHERE expires_at < now() - $1::interval LIMIT $2
))
"""


def _record(row: asyncpg.Record) -> TokenRecord:
    return TokenRecord(
        token_id=row[0],
        caller=Caller(
            tenant=row[1],
            principal=row[2],
            scopes=frozenset(row[3]),
            runs=None if row[7] is None else frozenset(row[7]),
        ),
        created_at=row[4],
        expires_at=row[5],
        revoked_at=row[6],
    )


class PostgresTokens:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def find(self, token_hash: bytes) -> FoundToken | None:
        row = await self._pool.fetchrow(_FIND, token_hash)
        if row is None:
            return None
        caller = Caller(
            tenant=row[0],
            principal=row[1],
            scopes=frozenset(row[2]),
            runs=None if row[4] is None else frozenset(row[4]),
        )
        return FoundToken(caller=caller, expires_in_seconds=row[3])

    async def put(
        self,
        token_hash: bytes,
        caller: Caller,
        expires_in_seconds: int | None = None,
        minted_by: str | None = None,
    ) -> datetime | None:
        arguments = (
            token_hash,
            caller.tenant,
            caller.principal,
            sorted(caller.scopes),
            expires_in_seconds,
            None if caller.runs is None else sorted(caller.runs),
        )
        if minted_by is None:
            expires_at: datetime | None = await self._pool.fetchval(_PUT, *arguments)
            return expires_at
        row = await self._pool.fetchrow(_MINT, *arguments, minted_by)
        if row is None:
            raise MinterEnded("the token that mints it is revoked or expired")
        minted: datetime | None = row[0]
        return minted

    async def revoke(self, token_id: str) -> list[str]:
        async with self._pool.acquire() as conn, conn.transaction():
            found = [r[0] for r in await conn.fetch(_REVOKE, token_id)]
            revoked, last = list(found), found
            while last:
                last = [r[0] for r in await conn.fetch(_REVOKE_MINTED, last)]
                revoked += last
        return revoked

    async def page(
        self, tenant: str, after: str | None, limit: int, within: frozenset[str] | None = None
    ) -> list[TokenRecord]:
        runs = None if within is None else sorted(within)
        if after is None:
            rows = await self._pool.fetch(_FIRST_PAGE, tenant, limit, runs)
            return [_record(row) for row in rows]
        rows = await self._pool.fetch(_PAGE_AFTER, tenant, limit, runs, after)
        if not rows and not await self._pool.fetchval(_KNOWN, tenant, after, runs):
            raise CursorUnknown(f"after {after!r} is no token of this tenant", field="after")
        return [_record(row) for row in rows]

    async def list(self, tenant: str | None = None) -> list[TokenRecord]:
        return [_record(row) for row in await self._pool.fetch(_LIST, tenant)]

    async def get(self, token_id: str) -> TokenRecord | None:
        row = await self._pool.fetchrow(_GET, token_id)
        return None if row is None else _record(row)

    async def tenant_tokens(self, tenant: str) -> int:
        return await tenant_tokens(self._pool, tenant)  # kept by migration 0512's triggers

    async def forget_ended(self, older_than: timedelta, batch: int = 1000) -> int:
        removed = 0
        while True:
            status = await self._pool.execute(_FORGET_ENDED, older_than, batch)
            count = int(status.rsplit(" ", 1)[1])  # "DELETE n"
            removed += count
            if count < batch:
                return removed
