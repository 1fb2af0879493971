"""`GET /tokens` as the use case answers it (`TenantTokens.list`): a keyset page by creation,
read one token past `limit` to know whether more follow, and, for a caller restricted to runs,
only the tokens it may see, chosen in the read: its pages are full while more follow, and
`next_after` never names a token it may not see."""

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
    visible = [tid for tid, seen in made if seen]
    # Pages of the visible tokens only: full while more follow, and a cursor that is one of them.
    first = await tokens.list(SCOPED, limit=2)
    assert [t.id for t in first.tokens] == visible[:2] and first.next_after == visible[1]
    last = await tokens.list(SCOPED, first.next_after, 2)
    assert [t.id for t in last.tokens] == visible[2:] and last.next_after is None
    for limit in (1, 2, 3, 4, 9, 10):
        listed, pages = await walk(tokens, SCOPED, limit)
        assert listed == visible, limit
        assert pages == -(-len(visible) // limit) or pages == len(visible) // limit + 1, limit
    # A token it may not see is no cursor for it: its id is not told by the answer either.
    with pytest.raises(CursorUnknown):
        await tokens.list(SCOPED, made[1][0], 2)


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
