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
    assert drive("revoke_token", "tok_0123456789abcdef") is None
    assert drive.requests[-1].url.path == "/api/workflow-streams/tokens/tok_0123456789abcdef"
    assert drive.requests[-1].method == "DELETE"
