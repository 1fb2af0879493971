"""The TokenStore contract on PostgreSQL."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from adapters.postgres.tokens import TOKENS_CHANNEL, PostgresTokens
from application.tokens import IssueToken, make_caller, token_hash, token_id
from tests.support.token_contract import TokenStoreContract


class TestPostgresTokens(TokenStoreContract):
    @pytest.fixture
    def store(self, pool: asyncpg.Pool) -> PostgresTokens:
        return PostgresTokens(pool)


async def test_a_revocation_notifies_the_token_id_on_the_tokens_channel(
    pool: asyncpg.Pool, database_url: str
) -> None:
    store = PostgresTokens(pool)
    token = await IssueToken(store)(make_caller("default", "notified", ["streams:read"]))
    heard: asyncio.Queue[str] = asyncio.Queue()
    conn = await asyncpg.connect(database_url)
    try:
        await conn.add_listener(TOKENS_CHANNEL, lambda *args: heard.put_nowait(args[3]))
        assert await store.revoke(token_id(token_hash(token)))
        assert await asyncio.wait_for(heard.get(), 5) == token_id(token_hash(token))
        assert not await store.revoke("tok_0000000000000000")
        await asyncio.sleep(0.2)
        assert heard.empty()  # nothing for an unknown id
    finally:
        await conn.close()
