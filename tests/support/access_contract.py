"""The StreamAccess port (stream expiry's last accesses) on every adapter, subclassed per adapter.

A subclass provides `ports`: a (StreamRepository, StreamAccess) pair over the same storage.
Keys are fresh per test, and the sweep's candidates are judged on those keys only, so the
PostgreSQL run may share its database with other tests."""

from __future__ import annotations

import secrets
from datetime import timedelta

import msgspec

from application.set_legal_hold import LegalHoldCommand
from domain.definition import Expiry
from tests.support.builders import NOW, definition, new_key

GRACE = timedelta(seconds=10)


def expiring(**expiry: object):
    return msgspec.structs.replace(definition(), expiry=Expiry(**expiry))  # type: ignore[arg-type]


class StreamAccessContract:
    async def test_creation_is_the_first_access_and_accesses_only_move_forward(self, ports) -> None:
        repo, access = ports
        key = new_key()
        await repo.create(key, expiring(idle_seconds=60), NOW)
        record = await access.last_access(key)
        assert record is not None and (record.last_access, record.legal_hold) == (NOW, False)
        later = NOW + timedelta(seconds=5)
        await access.record_access({key: later})
        await access.record_access({key: NOW + timedelta(seconds=1)})  # older: ignored
        record = await access.last_access(key)
        assert record is not None and record.last_access == later
        assert await access.run_access(key.tenant, key.run_id) == {key.stream_id: later}

    async def test_a_stream_without_expiry_or_none_at_all_has_no_access_record(self, ports) -> None:
        repo, access = ports
        key, missing = new_key(), new_key()
        await repo.create(key, definition(), NOW)
        await access.record_access({key: NOW + timedelta(1), missing: NOW})
        assert await access.last_access(key) is None
        assert await access.last_access(missing) is None
        assert await access.run_access(key.tenant, key.run_id) == {}

    async def test_the_legal_hold_shows_with_the_access(self, ports) -> None:
        repo, access = ports
        key = new_key()
        await repo.create(key, expiring(idle_seconds=60), NOW)
        await repo.update(key, [LegalHoldCommand(True, "audit", NOW)])
        record = await access.last_access(key)
        assert record is not None and record.legal_hold

    async def test_candidates_are_due_not_held_streams_idle_ones_after_the_grace(
        self, ports
    ) -> None:
        repo, access = ports
        idle, dated, held, young, forever = (new_key() for _ in range(5))
        await repo.create(idle, expiring(idle_seconds=60), NOW)
        await repo.create(dated, expiring(expires_at=NOW + timedelta(seconds=30)), NOW)
        await repo.create(held, expiring(expires_at=NOW + timedelta(seconds=30)), NOW)
        await repo.update(held, [LegalHoldCommand(True, "audit", NOW)])
        await repo.create(young, expiring(idle_seconds=60), NOW)
        await access.record_access({young: NOW + timedelta(seconds=100)})
        await repo.create(forever, definition(), NOW)
        ours = {idle, dated, held, young, forever}

        async def candidates(seconds: float) -> set:
            found = await access.expiry_candidates(NOW + timedelta(seconds=seconds), GRACE, 1000)
            return set(found) & ours

        assert await candidates(29) == set()
        assert await candidates(30) == {dated}  # absolute: no grace
        assert await candidates(60 + 9) == {dated}  # idle: only after the grace
        assert await candidates(60 + 10) == {dated, idle}
        assert await candidates(100 + 70) == {dated, idle, young}
        assert len(await access.expiry_candidates(NOW + timedelta(days=1), GRACE, 1)) == 1

    async def test_runs_are_listed_without_the_streams_that_answer_404_as_expired(
        self, ports
    ) -> None:
        repo, access = ports
        tenant = "t-" + secrets.token_hex(4)  # a tenant of its own: the listing is the whole of it
        mixed, gone, held = (new_key(tenant) for _ in range(3))
        mixed_forever = mixed._replace(stream_id="forever")
        await repo.create(mixed, expiring(idle_seconds=60), NOW)
        await repo.create(mixed_forever, definition(), NOW)
        await repo.create(gone, expiring(expires_at=NOW + timedelta(seconds=30)), NOW)
        await repo.create(held, expiring(expires_at=NOW + timedelta(seconds=30)), NOW)
        await repo.update(held, [LegalHoldCommand(True, "audit", NOW)])

        async def listed(seconds: float, after: str | None = None, limit: int = 10) -> dict:
            runs = await access.live_runs(
                tenant, after, limit, NOW + timedelta(seconds=seconds), GRACE
            )
            return {r.run_id: r.stream_count for r in runs}

        everything = {mixed.run_id: 2, gone.run_id: 1, held.run_id: 1}
        assert await listed(29) == everything
        assert await listed(30) == {mixed.run_id: 2, held.run_id: 1}  # absolute: from the instant
        assert await listed(69) == {mixed.run_id: 2, held.run_id: 1}  # idle: after the slack
        assert await listed(70) == {mixed.run_id: 1, held.run_id: 1}
        assert await access.live_runs(tenant, None, 10, NOW, GRACE) == await repo.list_runs(
            tenant, None, 10
        )
        assert await access.live_runs(
            tenant, None, 10, NOW, GRACE, prefix=gone.run_id
        ) == await repo.list_runs(tenant, None, 10, gone.run_id)
        assert [
            r.run_id
            for r in await access.live_runs(
                tenant, None, 10, NOW + timedelta(seconds=30), GRACE, prefix=gone.run_id
            )
        ] == []
        first = min(everything)
        assert set(await listed(0, after=first)) == set(everything) - {first}
        assert len(await listed(0, limit=1)) == 1
