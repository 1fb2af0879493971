"""The TokenStore port on every adapter, subclassed per adapter (a `store` fixture)."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from application.access import SCOPES, Caller
from application.errors import MinterEnded, NotFound
from application.tokens import IssueToken, RevokeToken, token_hash, token_id
from domain.errors import CursorUnknown


def tenant() -> str:
    return "t-" + secrets.token_hex(4)


def caller(tenant_id: str, principal: str = "p", scopes=SCOPES) -> Caller:
    return Caller(tenant=tenant_id, principal=principal, scopes=frozenset(scopes))


async def issued_in_turn(store, tenant_id: str, count: int) -> list[str]:
    """The ids of `count` new tokens of the tenant, in the order they were created (a moment
    apart, so that their creation times differ)."""
    ids = []
    for _ in range(count):
        ids.append(token_id(token_hash(await IssueToken(store)(caller(tenant_id)))))
        await asyncio.sleep(0.002)
    return ids


class TokenStoreContract:
    async def test_a_stored_token_is_found_with_its_caller(self, store) -> None:
        who = caller(tenant(), "alice", ("streams:read",))
        token = await IssueToken(store)(who)
        found = await store.find(token_hash(token))
        assert found is not None and found.caller == who
        assert found.expires_in_seconds is None
        assert await store.find(token_hash(token + "x")) is None

    async def test_a_revoked_token_is_refused_at_once_and_revoking_twice_is_fine(
        self, store
    ) -> None:
        who = caller(tenant())
        token, other = await IssueToken(store)(who), await IssueToken(store)(who)
        digest = token_hash(token)
        assert await store.revoke(token_id(digest)) == [token_id(digest)]
        assert await store.find(digest) is None
        assert await store.revoke(token_id(digest)) == [token_id(digest)]
        assert await store.find(token_hash(other)) is not None
        assert await store.revoke("tok_0000000000000000") == []

    async def test_revoking_a_token_revokes_what_it_minted_and_a_mint_by_an_ended_one_fails(
        self, store
    ) -> None:
        who = caller(tenant())
        parent = token_id(token_hash(await IssueToken(store)(who)))
        child, grandchild, beside = (b"c" * 32, b"g" * 32, b"b" * 32)
        await store.put(child, who, 600, minted_by=parent)
        await store.put(grandchild, who, 600, minted_by=token_id(child))
        await store.put(beside, who, 600)
        revoked = await store.revoke(parent)
        assert sorted(revoked) == sorted([parent, token_id(child), token_id(grandchild)])
        assert await store.find(child) is None and await store.find(grandchild) is None
        assert await store.find(beside) is not None
        with pytest.raises(MinterEnded):
            await store.put(b"n" * 32, who, 600, minted_by=parent)
        with pytest.raises(MinterEnded):
            await store.put(b"n" * 32, who, 600, minted_by="tok_0000000000000000")
        assert await store.find(b"n" * 32) is None

    async def test_a_revoked_token_stays_revoked_when_stored_again(self, store) -> None:
        who = caller(tenant())
        token = await IssueToken(store)(who, "bootstrap-" + secrets.token_hex(8))
        await store.revoke(token_id(token_hash(token)))
        assert await IssueToken(store)(who, token) == token
        assert await store.find(token_hash(token)) is None

    async def test_an_expiring_token_counts_down_then_is_refused(self, store) -> None:
        token = await IssueToken(store)(caller(tenant()), expires_in_seconds=1)
        found = await store.find(token_hash(token))
        assert found is not None
        assert 0 < found.expires_in_seconds <= 1
        await asyncio.sleep(1.05)
        assert await store.find(token_hash(token)) is None

    async def test_revoke_names_a_token_by_itself_or_by_its_id(self, store) -> None:
        who = caller(tenant())
        by_value, by_id = await IssueToken(store)(who), await IssueToken(store)(who)
        revoke = RevokeToken(store)
        assert await revoke(by_value) == token_id(token_hash(by_value))
        assert await revoke(token_id(token_hash(by_id))) == token_id(token_hash(by_id))
        assert await store.find(token_hash(by_value)) is None
        assert await store.find(token_hash(by_id)) is None
        with pytest.raises(NotFound):
            await revoke("tok_ffffffffffffffff")
        with pytest.raises(NotFound):
            await revoke("not-a-token")

    async def test_list_shows_every_token_of_a_tenant_without_the_token(self, store) -> None:
        mine, theirs = tenant(), tenant()
        first = await IssueToken(store)(caller(mine, "a", ("streams:read",)))
        second = await IssueToken(store)(caller(mine, "b"), expires_in_seconds=60)
        await IssueToken(store)(caller(theirs))
        await store.revoke(token_id(token_hash(first)))
        records = await store.list(mine)
        assert [r.token_id for r in records] == [
            token_id(token_hash(first)),
            token_id(token_hash(second)),
        ]
        assert [r.caller.principal for r in records] == ["a", "b"]
        assert records[0].revoked_at is not None and records[0].expires_at is None
        assert records[1].revoked_at is None and records[1].expires_at is not None
        assert records[1].expires_at > records[1].created_at
        assert all(r.caller.tenant == mine for r in records)
        everyone = {r.caller.tenant for r in await store.list()}
        assert {mine, theirs} <= everyone

    async def test_a_token_restricted_to_runs_keeps_them_and_is_found_by_id(self, store) -> None:
        who = Caller(
            tenant=tenant(), principal="p", scopes=frozenset(SCOPES), runs=frozenset({"r1", "r2"})
        )
        token = await IssueToken(store)(who, expires_in_seconds=60)
        found = await store.find(token_hash(token))
        assert found is not None and found.caller == who
        record = await store.get(token_id(token_hash(token)))
        assert record is not None and record.caller == who and record.expires_at is not None
        assert (await store.list(who.tenant))[0].caller.runs == frozenset({"r1", "r2"})
        assert await store.get("tok_0000000000000000") is None

    async def test_put_answers_when_the_token_expires(self, store) -> None:
        expires_at = await store.put(token_hash("x" + secrets.token_hex(8)), caller(tenant()), 60)
        assert expires_at is not None
        assert await store.put(token_hash("y" + secrets.token_hex(8)), caller(tenant())) is None

    async def test_tokens_expired_long_enough_ago_are_forgotten_and_revoked_ones_kept(
        self, store
    ) -> None:
        """Every minted token adds a record: those that expired more than the cleanup age ago
        go (a long-lived deployment kept them all); a revoked token that never expires stays,
        so that storing its value again (a bootstrap token) leaves it revoked."""
        from datetime import timedelta

        who = caller(tenant())
        expired = await IssueToken(store)(who, expires_in_seconds=1)
        revoked = await IssueToken(store)(who, "bootstrap-" + secrets.token_hex(8))
        kept = await IssueToken(store)(who, expires_in_seconds=3600)
        await store.revoke(token_id(token_hash(revoked)))
        await asyncio.sleep(1.05)
        await store.forget_ended(timedelta(hours=1))
        assert await store.get(token_id(token_hash(expired))) is not None  # not old enough yet
        assert await store.forget_ended(timedelta(0)) >= 1
        assert await store.get(token_id(token_hash(expired))) is None
        assert await store.get(token_id(token_hash(kept))) is not None
        assert await store.get(token_id(token_hash(revoked))) is not None
        assert await IssueToken(store)(who, revoked) == revoked
        assert await store.find(token_hash(revoked)) is None

    async def test_a_page_is_by_creation_after_the_cursor_and_at_most_limit(self, store) -> None:
        mine, theirs = tenant(), tenant()
        await issued_in_turn(store, theirs, 2)
        ids = await issued_in_turn(store, mine, 7)
        await issued_in_turn(store, theirs, 2)
        await store.revoke(ids[2])  # a revoked token keeps its place

        async def page(after: str | None, limit: int) -> list[str]:
            records = await store.page(mine, after, limit)
            assert all(r.caller.tenant == mine for r in records)
            return [r.token_id for r in records]

        assert await page(None, 100) == ids  # by creation, not by id (random, as hashes are)
        assert await page(None, 3) == ids[:3]
        assert await page(ids[2], 3) == ids[3:6]
        assert await page(ids[5], 3) == ids[6:]
        assert await page(ids[-1], 3) == []  # the end: an empty page, not an error

    async def test_a_page_after_a_token_of_no_one_or_of_another_tenant_is_cursor_unknown(
        self, store
    ) -> None:
        mine, theirs = tenant(), tenant()
        (own,) = await issued_in_turn(store, mine, 1)
        (other,) = await issued_in_turn(store, theirs, 1)
        for after in ("tok_0000000000000000", other):
            with pytest.raises(CursorUnknown) as caught:
                await store.page(mine, after, 10)
            assert caught.value.extra == {"field": "after"}
        assert await store.page(mine, own, 10) == []
        with pytest.raises(CursorUnknown):
            await store.page(tenant(), own, 10)  # a tenant with no token at all
