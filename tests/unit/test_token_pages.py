"""`GET /tokens` as the use case answers it (`TenantTokens.list`): a keyset page by creation,
read one token past `limit` to know whether more follow, and, for a caller restricted to runs,
filtered after it is read, with `next_after` the last token read so no page skips or stops."""

from __future__ import annotations

import asyncio

import pytest

from adapters.memory.tokens import MemoryTokens
from application.access import SCOPES, Caller
from application.errors import Forbidden
from application.tokens import IssueToken, TenantTokens, token_hash, token_id
from domain.errors import CursorUnknown, InvalidInput

ADMIN = Caller(tenant="t", principal="admin", scopes=frozenset(SCOPES))
SCOPED = Caller(tenant="t", principal="a", scopes=frozenset(SCOPES), runs=frozenset({"r1", "r2"}))


async def issue(store: MemoryTokens, runs: list[str] | None = None, tenant: str = "t") -> str:
    who = Caller(
        tenant=tenant,
        principal="p",
        scopes=frozenset(SCOPES),
        runs=None if runs is None else frozenset(runs),
    )
    issued = token_id(token_hash(await IssueToken(store)(who)))
    await asyncio.sleep(0.001)  # each created a moment after the last
    return issued


async def walk(tokens: TenantTokens, caller: Caller, limit: int) -> tuple[list[str], int]:
    """Every token id listed, page after page, and how many pages that took."""
    listed: list[str] = []
    after, pages = None, 0
    while True:
        page = await tokens.list(caller, after, limit)
        pages += 1
        listed.extend(t.id for t in page.tokens)
        if page.next_after is None:
            return listed, pages
        after = page.next_after


async def test_pages_list_every_token_once_by_creation() -> None:
    store = MemoryTokens()
    ids = [await issue(store) for _ in range(7)]
    await issue(store, tenant="u")
    tokens = TenantTokens(store)
    first = await tokens.list(ADMIN, limit=3)
    assert [t.id for t in first.tokens] == ids[:3] and first.next_after == ids[2]
    second = await tokens.list(ADMIN, first.next_after, 3)
    assert [t.id for t in second.tokens] == ids[3:6] and second.next_after == ids[5]
    last = await tokens.list(ADMIN, second.next_after, 3)
    assert [t.id for t in last.tokens] == ids[6:] and last.next_after is None
    # Exactly `limit` left: no next page (the token one past the limit says whether one follows).
    exact = await tokens.list(ADMIN, ids[3], 3)
    assert [t.id for t in exact.tokens] == ids[4:] and exact.next_after is None
    whole = await tokens.list(ADMIN)
    assert [t.id for t in whole.tokens] == ids and whole.next_after is None
    for limit in (1, 2, 7, 8):
        assert await walk(tokens, ADMIN, limit) == (ids, -(-len(ids) // limit))


async def test_a_run_restricted_caller_pages_on_past_the_tokens_it_does_not_see() -> None:
    store = MemoryTokens()
    made = [
        (await issue(store, runs=runs), visible)
        for runs, visible in [
            (["r1"], True),
            (None, False),  # every run: wider than the caller
            (["r3"], False),
            (["r1", "r3"], False),
            (["r2"], True),
            (None, False),
            (None, False),
            (["r1", "r2"], True),
            (None, False),
        ]
    ]
    tokens = TenantTokens(store)
    # The page read [r1], [*], [r3] and more follow: it says so, from the last token it read,
    # though it lists only the first.
    first = await tokens.list(SCOPED, limit=3)
    assert [t.id for t in first.tokens] == [made[0][0]] and first.next_after == made[2][0]
    # A page can list nothing and still go on.
    empty = await tokens.list(SCOPED, made[4][0], 2)
    assert empty.tokens == [] and empty.next_after == made[6][0]
    visible = [tid for tid, seen in made if seen]
    for limit in (1, 2, 3, 4, 9, 10):
        listed, _ = await walk(tokens, SCOPED, limit)
        assert listed == visible, limit


@pytest.mark.parametrize(
    ("after", "limit", "error"),
    [
        (None, 0, InvalidInput),
        (None, 1001, InvalidInput),
        ("nothing", 10, InvalidInput),
        ("tok_XYZ", 10, InvalidInput),
        ("tok_0000000000000000", 10, CursorUnknown),
    ],
)
async def test_a_bad_limit_or_cursor_is_refused(after: str | None, limit: int, error) -> None:
    store = MemoryTokens()
    await issue(store)
    with pytest.raises(error) as caught:
        await TenantTokens(store).list(ADMIN, after, limit)
    assert caught.value.extra == {"field": "after" if after else "limit"}


async def test_another_tenants_token_is_no_cursor_and_listing_needs_admin() -> None:
    store = MemoryTokens()
    theirs = await issue(store, tenant="u")
    with pytest.raises(CursorUnknown):
        await TenantTokens(store).list(ADMIN, theirs)
    reader = Caller(tenant="t", principal="r", scopes=frozenset({"streams:read"}))
    with pytest.raises(Forbidden):
        await TenantTokens(store).list(reader)
