"""API tokens in PostgreSQL, by hash."""

from __future__ import annotations

import asyncpg

from application.access import Caller


class PostgresTokens:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def find(self, token_hash: bytes) -> Caller | None:
        row = await self._pool.fetchrow(
            "SELECT tenant, principal, scopes FROM api_tokens WHERE token_hash = $1", token_hash
        )
        if row is None:
            return None
        return Caller(tenant=row[0], principal=row[1], scopes=frozenset(row[2]))

    async def put(self, token_hash: bytes, caller: Caller) -> None:
        await self._pool.execute(
            """INSERT INTO api_tokens (token_hash, tenant, principal, scopes)
               VALUES ($1, $2, $3, $4)
               ON CONFLICT (token_hash) DO UPDATE
               SET tenant = excluded.tenant, principal = excluded.principal,
                   scopes = excluded.scopes""",
            token_hash,
            caller.tenant,
            caller.principal,
            sorted(caller.scopes),
        )
