"""The client's token calls, async and sync alike, over a mock transport: what each sends, what
it decodes, and that a mint is not repeated after a lost answer."""

from __future__ import annotations

import json

import httpx
import pytest

from ductor_streams_client import MintedToken, TokenList
from tests.unit.test_client_core import Driver, kind  # noqa: F401  (the fixture)

MINTED = {
    "token": "dst_x",
    "id": "tok_0123456789abcdef",
    "tenant": "default",
    "principal": "p",
    "scopes": ["streams:read"],
    "runs": ["r1"],
    "expires_at": "2026-12-02T18:00:00Z",
}


def test_mint_token_posts_the_request_and_decodes_the_answer(kind: str) -> None:  # noqa: F811
    drive = Driver(kind, lambda _: httpx.Response(201, json=MINTED))
    minted = drive("mint_token", scopes=["streams:read"], expires_in_seconds=60, runs=["r1"])
    assert isinstance(minted, MintedToken) and minted.token == "dst_x"
    assert minted.runs == ("r1",)
    (request,) = drive.requests
    assert (request.method, request.url.path) == ("POST", "/api/workflow-streams/tokens")
    assert json.loads(request.content) == {
        "scopes": ["streams:read"],
        "expires_in_seconds": 60,
        "runs": ["r1"],
    }


def test_a_mint_is_not_repeated_after_a_lost_answer(kind: str) -> None:  # noqa: F811
    def lost(_: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("gone")

    drive = Driver(kind, lost)  # retries allowed, quickly
    with pytest.raises(Exception):  # noqa: B017  (the client's connection error)
        drive("mint_token", scopes=["streams:read"], expires_in_seconds=60)
    assert len(drive.requests) == 1


def test_list_and_revoke(kind: str) -> None:  # noqa: F811
    listed = {"tokens": [{**MINTED, "created_at": "2026-12-02T17:00:00Z", "revoked_at": None}]}
    listed["tokens"][0].pop("token")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json=listed)
        return httpx.Response(204)

    drive = Driver(kind, handler)
    tokens = drive("list_tokens")
    assert isinstance(tokens, TokenList) and tokens.tokens[0].id == "tok_0123456789abcdef"
    assert tokens.next_after is None  # an answer without it (an older server's): one page
    assert dict(drive.requests[-1].url.params) == {"limit": "100"}
    assert drive("revoke_token", "tok_0123456789abcdef") is None
    assert drive.requests[-1].url.path == "/api/workflow-streams/tokens/tok_0123456789abcdef"
    assert drive.requests[-1].method == "DELETE"


def info(token_id: str) -> dict:
    return {
        **{k: v for k, v in MINTED.items() if k != "token"},
        "id": token_id,
        "created_at": "2026-12-02T17:00:00Z",
        "revoked_at": None,
    }


IDS = [f"tok_{i:016x}" for i in range(7)]


def pages(request: httpx.Request) -> httpx.Response:
    """The service's pages of IDS: `limit` after `after`, and where the next one starts."""
    limit = int(request.url.params["limit"])
    after = request.url.params.get("after")
    start = 0 if after is None else IDS.index(after) + 1
    page = IDS[start : start + limit]
    more = start + limit < len(IDS)
    return httpx.Response(
        200, json={"tokens": [info(i) for i in page], "next_after": page[-1] if more else None}
    )


def test_list_tokens_asks_for_one_page(kind: str) -> None:  # noqa: F811
    drive = Driver(kind, pages)
    page = drive("list_tokens", after=IDS[1], limit=3)
    assert [t.id for t in page.tokens] == IDS[2:5] and page.next_after == IDS[4]
    (request,) = drive.requests
    assert (request.method, request.url.path) == ("GET", "/api/workflow-streams/tokens")
    assert dict(request.url.params) == {"after": IDS[1], "limit": "3"}


@pytest.mark.parametrize("page_size", [1, 3, 7, 100])
def test_iter_tokens_follows_next_after_to_the_last_page(kind: str, page_size: int) -> None:  # noqa: F811
    drive = Driver(kind, pages)
    assert [t.id for t in drive("iter_tokens", page_size=page_size)] == IDS
    afters = [r.url.params.get("after") for r in drive.requests]
    assert afters == [None, *IDS[page_size - 1 : -1 : page_size]]
    assert {r.url.params["limit"] for r in drive.requests} == {str(page_size)}


def test_iter_tokens_goes_on_past_an_empty_page(kind: str) -> None:  # noqa: F811
    """A run-restricted client's page may list none of the tokens it read, and more follow."""
    answers = iter(
        [
            {"tokens": [], "next_after": IDS[2]},
            {"tokens": [info(IDS[4])], "next_after": IDS[5]},
            {"tokens": [], "next_after": None},
        ]
    )
    drive = Driver(kind, lambda _: httpx.Response(200, json=next(answers)))
    assert [t.id for t in drive("iter_tokens", page_size=3)] == [IDS[4]]
    assert [r.url.params.get("after") for r in drive.requests] == [None, IDS[2], IDS[5]]
