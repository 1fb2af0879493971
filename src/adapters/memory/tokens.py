"""Tokens in memory."""

from __future__ import annotations

from application.access import Caller


class MemoryTokens:
    def __init__(self) -> None:
        self._tokens: dict[bytes, Caller] = {}

    async def find(self, token_hash: bytes) -> Caller | None:
        return self._tokens.get(token_hash)

    async def put(self, token_hash: bytes, caller: Caller) -> None:
        self._tokens[token_hash] = caller
