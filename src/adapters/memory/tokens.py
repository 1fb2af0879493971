"""Tokens in memory: a revocation takes effect at once (there is no other process to tell)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from application.access import Caller
from application.errors import MinterEnded
from application.ports import FoundToken, TokenRecord
from application.tokens import token_id
from domain.errors import CursorUnknown


def _utc_now() -> datetime:
    return datetime.now(UTC)


class _Row:
    __slots__ = ("caller", "created_at", "expires_at", "minted_by", "revoked_at")

    def __init__(
        self,
        caller: Caller,
        created_at: datetime,
        expires_at: datetime | None,
        minted_by: str | None = None,
    ) -> None:
        self.caller = caller
        self.created_at = created_at
        self.expires_at = expires_at
        self.minted_by = minted_by
        self.revoked_at: datetime | None = None

    def works(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class MemoryTokens:
    def __init__(self, clock: Callable[[], datetime] = _utc_now) -> None:
        self._clock = clock
        self._tokens: dict[bytes, _Row] = {}
        self._ids: dict[str, bytes] = {}

    async def find(self, token_hash: bytes) -> FoundToken | None:
        row = self._tokens.get(token_hash)
        if row is None or row.revoked_at is not None:
            return None
        if row.expires_at is None:
            return FoundToken(caller=row.caller, expires_in_seconds=None)
        left = (row.expires_at - self._clock()).total_seconds()
        return FoundToken(caller=row.caller, expires_in_seconds=left) if left > 0 else None

    async def put(
        self,
        token_hash: bytes,
        caller: Caller,
        expires_in_seconds: int | None = None,
        minted_by: str | None = None,
    ) -> datetime | None:
        now = self._clock()
        if minted_by is not None:
            minter = self._ids.get(minted_by)
            if minter is None or not self._tokens[minter].works(now):
                raise MinterEnded("the token that mints it is revoked or expired")
        expires_at = None
        if expires_in_seconds is not None:
            expires_at = now + timedelta(seconds=expires_in_seconds)
        row = self._tokens.get(token_hash)
        if row is None:
            self._tokens[token_hash] = _Row(caller, now, expires_at, minted_by)
            self._ids[token_id(token_hash)] = token_hash
        else:  # replaced, but a revoked token stays revoked
            row.caller, row.expires_at = caller, expires_at
        return expires_at

    async def revoke(self, token_id: str) -> list[str]:
        digest = self._ids.get(token_id)
        if digest is None:
            return []
        row = self._tokens[digest]
        row.revoked_at = row.revoked_at or self._clock()
        revoked, last = [token_id], {token_id}
        while last:
            minted = [
                (i, self._tokens[d])
                for i, d in self._ids.items()
                if self._tokens[d].minted_by in last and self._tokens[d].revoked_at is None
            ]
            for _, child in minted:
                child.revoked_at = self._clock()
            last = {i for i, _ in minted}
            revoked += sorted(last)
        return revoked

    async def get(self, token_id: str) -> TokenRecord | None:
        return self._record(token_id) if token_id in self._ids else None

    async def tenant_tokens(self, tenant: str) -> int:
        return sum(1 for row in self._tokens.values() if row.caller.tenant == tenant)

    async def forget_ended(self, older_than: timedelta) -> int:
        cutoff = self._clock() - older_than
        ended = [
            tid
            for tid, digest in self._ids.items()
            if (expires_at := self._tokens[digest].expires_at) is not None and expires_at < cutoff
        ]
        for tid in ended:
            del self._tokens[self._ids.pop(tid)]
        return len(ended)

    def _record(self, tid: str) -> TokenRecord:
        row = self._tokens[self._ids[tid]]
        return TokenRecord(
            token_id=tid,
            caller=row.caller,
            created_at=row.created_at,
            expires_at=row.expires_at,
            revoked_at=row.revoked_at,
        )

    async def page(
        self, tenant: str, after: str | None, limit: int, within: frozenset[str] | None = None
    ) -> list[TokenRecord]:
        records = [  # by creation, within the one tenant
            r
            for r in await self.list(tenant)
            if within is None or (r.caller.runs is not None and r.caller.runs <= within)
        ]
        if after is not None:
            ids = [r.token_id for r in records]
            if after not in ids:
                raise CursorUnknown(f"after {after!r} is no token of this tenant", field="after")
            records = records[ids.index(after) + 1 :]
        return records[:limit]

    async def list(self, tenant: str | None = None) -> list[TokenRecord]:
        records = [
            self._record(tid)
            for tid, digest in self._ids.items()
            if tenant is None or self._tokens[digest].caller.tenant == tenant
        ]
        return sorted(records, key=lambda r: (r.caller.tenant, r.created_at, r.token_id))
