"""One contract for every StreamRepository adapter, subclassed per adapter.

A subclass provides the `repo` fixture; every test here then runs against that adapter, races
included, so the memory fake and PostgreSQL are held to the same behaviour. The journal's tests
also need `snapshotting_repo` (the same adapter, snapshotting every `SNAPSHOT_EVERY` versions),
`compact` (run what compacts a stream's journal, as its worker would; nothing where the adapter
compacts inline) and `journal_rows` (how many journal events the adapter stores for a stream)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from application.acknowledge import AckCommand
from application.close_stream import CloseCommand
from application.delete_stream import DeleteCommand
from application.errors import NotFound
from application.objects import AbortCommand, CommitCommand, PrepareCommand, UploadedCommand
from application.ports import Done, Failed, Replayed
from application.set_legal_hold import LegalHoldCommand
from domain import errors
from domain import events as ev
from domain.objects import AuthorizationReceipt, ObjectIntent
from domain.stream import Stream
from tests.support.builders import NOW, WRITER, append, definition, new_key, record

SNAPSHOT_EVERY = 5


class StreamRepositoryContract:
    async def test_create_is_idempotent_and_reports_whether_it_created(self, repo) -> None:
        key = new_key()
        first, created = await repo.create(key, definition(), NOW)
        again, created_again = await repo.create(key, definition(), NOW)
        assert (created, created_again) == (True, False)
        assert again.definition == first.definition
        assert (await repo.definition(key)) == definition()

    async def test_an_unknown_stream_is_not_found(self, repo) -> None:
        key = new_key()
        assert await repo.load(key) is None
        assert await repo.page(key, 0, 10) is None
        with pytest.raises(NotFound):
            await repo.update(key, [append()])

    async def test_a_batch_gets_contiguous_sequences_and_reads_back_in_order(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        payloads = [b'{"n":%d}' % i for i in range(5)]
        [done] = await repo.update(key, [append([record(p) for p in payloads])])
        assert isinstance(done, Done)
        assert (done.answer.first_sequence, done.answer.last_sequence) == (1, 5)
        position, records = await repo.page(key, 0, 100)
        assert (position.head, position.earliest, position.closed) == (5, 1, False)
        assert [r.sequence for r in records] == [1, 2, 3, 4, 5]
        assert [r.payload for r in records] == payloads

    async def test_a_large_batch_stores_every_record_with_its_byte_offset(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        payloads = [b"%d" % i for i in range(500)]  # past the PostgreSQL adapter's COPY threshold
        await repo.update(key, [append([record(p) for p in payloads])])
        _, records = await repo.page(key, 0, 1000)
        assert [r.payload for r in records] == payloads
        [done] = await repo.update(key, [AckCommand(WRITER, "c", 250, NOW)])
        assert done.answer.credit.unread_bytes == sum(len(p) for p in payloads[250:])

    async def test_a_page_holds_records_strictly_after_the_cursor_up_to_the_limit(
        self, repo
    ) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        await repo.update(key, [append([record() for _ in range(10)])])
        _, records = await repo.page(key, 3, 4)
        assert [r.sequence for r in records] == [4, 5, 6, 7]
        _, records = await repo.page(key, 10, 4)
        assert records == []

    async def test_one_failing_command_leaves_the_others_in_its_group_untouched(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(max_unread_items=3), NOW)
        outcomes = await repo.update(
            key,
            [
                append([record()]),
                append([record(), record(), record()]),  # would pass the unread ceiling
                append([record()]),
            ],
        )
        assert isinstance(outcomes[0], Done)
        assert isinstance(outcomes[1], Failed)
        assert isinstance(outcomes[1].error, errors.Backpressure)
        assert isinstance(outcomes[2], Done)
        assert outcomes[2].answer.first_sequence == 2
        position, records = await repo.page(key, 0, 10)
        assert position.head == 2 and [r.sequence for r in records] == [1, 2]

    async def test_an_idempotency_key_replays_its_answer_and_refuses_another_body(
        self, repo
    ) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        [first] = await repo.update(key, [append([record(b"1")], key="k")])
        [again] = await repo.update(key, [append([record(b"1")], key="k")])
        [other] = await repo.update(key, [append([record(b"2")], key="k")])
        assert isinstance(first, Done) and isinstance(again, Replayed)
        assert b'"first_sequence":1' in again.answer_json
        assert isinstance(other, Failed)
        assert isinstance(other.error, errors.IdempotencyKeyReused)
        assert (await repo.page(key, 0, 10))[0].head == 1

    async def test_the_same_key_twice_in_one_group_appends_once(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        outcomes = await repo.update(key, [append(key="k"), append(key="k")])
        assert isinstance(outcomes[0], Done) and isinstance(outcomes[1], Replayed)
        assert (await repo.page(key, 0, 10))[0].head == 1

    async def test_concurrent_updates_never_duplicate_or_skip_a_sequence(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        outcomes = await asyncio.gather(
            *(repo.update(key, [append([record(), record()])]) for _ in range(40))
        )
        firsts = sorted(o[0].answer.first_sequence for o in outcomes)
        assert firsts == list(range(1, 81, 2))
        _, records = await repo.page(key, 0, 1000)
        assert [r.sequence for r in records] == list(range(1, 81))

    async def test_concurrent_duplicates_of_one_key_never_append_twice(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        outcomes = await asyncio.gather(
            *(repo.update(key, [append(key="same")]) for _ in range(20))
        )
        kinds = sorted(type(o[0]).__name__ for o in outcomes)
        assert kinds == ["Done"] + ["Replayed"] * 19
        assert (await repo.page(key, 0, 10))[0].head == 1

    async def test_acknowledgements_use_the_stored_offset_for_byte_credit(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        await repo.update(key, [append([record(b"x" * 10), record(b"y" * 30)])])
        [done] = await repo.update(key, [AckCommand(WRITER, "c", 1, NOW)])
        assert isinstance(done, Done)
        assert (done.answer.credit.unread_items, done.answer.credit.unread_bytes) == (1, 30)

    async def test_the_journal_replays_into_the_stored_snapshot(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        await repo.update(key, [append([record(), record()])])
        await repo.update(key, [AckCommand(WRITER, "c", 1, NOW), append()])
        await repo.update(key, [CloseCommand(WRITER, NOW)])
        stored = await repo.load(key)
        replayed = Stream.replay(key, await repo.journal(key))
        assert replayed.state == stored.state
        assert stored.state.closed and stored.head == 3

    async def test_a_run_lists_its_streams(self, repo) -> None:
        key = new_key()
        await repo.create(key._replace(stream_id="b"), definition("b"), NOW)
        await repo.create(key._replace(stream_id="a"), definition("a"), NOW)
        listed = await repo.list_run(key.tenant, key.run_id)
        assert [s.key.stream_id for s in listed] == ["a", "b"]
        assert await repo.list_run("other-tenant", key.run_id) == []

    async def test_a_deleted_stream_is_gone_and_its_id_starts_again_from_sequence_1(
        self, repo
    ) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        await repo.update(key, [append([record(), record()], key="k1")])
        await repo.update(key, [AckCommand(WRITER, "c", 1, NOW)])
        before, deleted, after = await repo.update(key, [append(), DeleteCommand(NOW), append()])
        # In the deleting group: what came before was answered, what follows finds no stream.
        assert isinstance(before, Done) and before.answer.first_sequence == 3
        assert isinstance(deleted, Done)
        assert isinstance(after, Failed) and isinstance(after.error, NotFound)
        assert await repo.load(key) is None
        assert await repo.page(key, 0, 10) is None
        assert await repo.definition(key) is None
        assert await repo.list_run(key.tenant, key.run_id) == []
        with pytest.raises(NotFound):
            await repo.update(key, [append()])
        other = definition(max_unread_items=5)
        stream, created = await repo.create(key, other, NOW + timedelta(seconds=1))
        assert created and stream.head == 0 and stream.state.consumers == {}
        assert (await repo.definition(key)) == other
        [again] = await repo.update(key, [append(key="k1")])  # the old receipt is gone too
        assert isinstance(again, Done) and again.answer.first_sequence == 1
        assert (await repo.load(key)).definition == other
        position, records = await repo.page(key, 0, 10)
        assert position.head == 1 and [r.sequence for r in records] == [1]

    async def test_a_legal_hold_refuses_deletion_and_changes_nothing(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        await repo.update(key, [append(), LegalHoldCommand(True, "case", NOW)])
        [refused] = await repo.update(key, [DeleteCommand(NOW)])
        assert isinstance(refused, Failed)
        assert isinstance(refused.error, errors.LegalHoldActive)
        position, records = await repo.page(key, 0, 10)
        assert position.head == 1 and len(records) == 1

    async def test_concurrent_appends_commit_before_the_delete_or_find_no_stream(
        self, repo
    ) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)

        async def one_append() -> object:
            try:
                [outcome] = await repo.update(key, [append()])
            except NotFound:
                return "gone"
            return outcome

        results = await asyncio.gather(
            *(one_append() for _ in range(10)),
            repo.update(key, [DeleteCommand(NOW)]),
            *(one_append() for _ in range(10)),
        )
        outcomes = results[:10] + results[11:]
        assert all(o == "gone" or isinstance(o, Done) for o in outcomes)
        assert await repo.load(key) is None

    async def test_a_run_is_deleted_all_or_nothing(self, repo) -> None:
        key = new_key()
        a, b = key._replace(stream_id="a"), key._replace(stream_id="b")
        for k in (a, b):
            await repo.create(k, definition(k.stream_id), NOW)
            await repo.update(k, [append()])
        await repo.update(b, [LegalHoldCommand(True, "case", NOW)])
        with pytest.raises(errors.LegalHoldActive):
            await repo.delete_run(key.tenant, key.run_id, NOW)
        assert [s.key for s in await repo.list_run(key.tenant, key.run_id)] == [a, b]
        assert (await repo.page(a, 0, 10))[0].head == 1

        def refuse(stream: Stream) -> None:
            if stream.key.stream_id == "b":
                raise errors.InvalidInput("no")

        await repo.update(b, [LegalHoldCommand(False, None, NOW)])
        with pytest.raises(errors.InvalidInput):
            await repo.delete_run(key.tenant, key.run_id, NOW, refuse)
        assert len(await repo.list_run(key.tenant, key.run_id)) == 2
        with pytest.raises(NotFound):
            await repo.delete_run("other-tenant", key.run_id, NOW)
        assert await repo.delete_run(key.tenant, key.run_id, NOW) == [a, b]
        assert await repo.list_run(key.tenant, key.run_id) == []
        assert await repo.page(a, 0, 10) is None
        with pytest.raises(NotFound):
            await repo.update(b, [append()])
        with pytest.raises(NotFound):
            await repo.delete_run(key.tenant, key.run_id, NOW)

    async def test_runs_are_listed_by_keyset_in_ascending_run_id(self, repo) -> None:
        tenant = "tenant-" + new_key().run_id
        for run_id, streams in (("r-b", 2), ("r-a", 1), ("r-c", 3)):
            for n in range(streams):
                key = new_key(tenant)._replace(run_id=run_id, stream_id=f"s{n}")
                await repo.create(key, definition(key.stream_id), NOW + timedelta(seconds=n))
        await repo.create(new_key("another-" + tenant), definition(), NOW)
        first = await repo.list_runs(tenant, None, 2)
        assert [(r.run_id, r.stream_count) for r in first] == [("r-a", 1), ("r-b", 2)]
        assert all(r.created_at == NOW for r in first)
        rest = await repo.list_runs(tenant, "r-b", 2)
        assert [(r.run_id, r.stream_count) for r in rest] == [("r-c", 3)]
        assert await repo.list_runs(tenant, "r-c", 2) == []

    async def test_runs_are_listed_by_prefix(self, repo) -> None:
        tenant = "tenant-" + new_key().run_id
        for run_id in ("ab", "a_c", "abc", "abd", "ac", "b"):
            await repo.create(new_key(tenant)._replace(run_id=run_id), definition(), NOW)
        await repo.create(new_key("another-" + tenant)._replace(run_id="abx"), definition(), NOW)

        async def listed(prefix: str, after: str | None = None, limit: int = 10) -> list[str]:
            return [r.run_id for r in await repo.list_runs(tenant, after, limit, prefix)]

        assert await listed("ab") == ["ab", "abc", "abd"]
        assert await listed("ab", after="ab", limit=1) == ["abc"]
        assert await listed("ab", after="abc") == ["abd"]
        assert await listed("a_") == ["a_c"]  # `_` is no wildcard
        assert await listed("abcd") == []
        assert set(await listed("")) == {"a_c", "ab", "abc", "abd", "ac", "b"}


async def queued_bodies(repo, key) -> list[str]:
    """The storage keys on the deletion outbox for this stream, from either adapter."""
    if hasattr(repo, "deletions"):
        return [k for stream, _, k, _ in repo.deletions if stream == key]
    rows = await repo._pool.fetch(
        "SELECT storage_key FROM deletion_outbox WHERE tenant = $1 AND run_id = $2 "
        "AND stream_id = $3",
        *key,
    )
    return [r[0] for r in rows]


class JournalContract:
    """Snapshots bound the journal; replay of what is kept still rebuilds the stored state."""

    async def replays_into_the_stored_state(self, repo, key) -> list[ev.Event]:
        journal = await repo.journal(key)
        assert isinstance(journal[0], ev.StreamCreated | ev.StreamSnapshotted)
        assert Stream.replay(key, journal).state == (await repo.load(key)).state
        return journal

    async def test_snapshots_bound_the_journal_and_it_replays_into_the_stored_state(
        self, snapshotting_repo, compact, journal_rows
    ) -> None:
        repo, key = snapshotting_repo, new_key()
        await repo.create(key, definition(max_unread_items=50), NOW)
        largest_group = 0
        for n in range(60):
            # Groups of one to four commands, some of which fail (and so journal nothing).
            group = [append([record()] * (1 + n % 3), key=f"k{n}")]
            if n % 4 == 1:
                group.append(append([record(b"2")], key=f"k{n}"))  # key reused: Failed
            if n % 5 == 2:
                group.append(AckCommand(WRITER, "c", n, NOW))
            if n % 7 == 3:
                group.append(append([record()] * 60))  # can never fit the ceiling: Failed
            outcomes = await repo.update(key, group)
            largest_group = max(largest_group, sum(isinstance(o, Done) for o in outcomes))
            await compact(repo, key)
            assert await journal_rows(key) <= SNAPSHOT_EVERY + largest_group
            await self.replays_into_the_stored_state(repo, key)
        stored = await repo.load(key)
        assert stored.state.version > 12 * SNAPSHOT_EVERY  # it crossed many snapshots
        journal = await self.replays_into_the_stored_state(repo, key)
        assert isinstance(journal[0], ev.StreamSnapshotted)
        assert journal[0].definition == stored.definition
        assert [e.version for e in journal] == list(
            range(journal[0].version, stored.state.version + 1)
        )

    async def test_a_group_that_crosses_a_multiple_is_followed_by_one_snapshot(
        self, snapshotting_repo, journal_rows
    ) -> None:
        repo, key = snapshotting_repo, new_key()
        await repo.create(key, definition(max_unread_items=3), NOW)
        # Failed commands journal nothing, so they cannot bring a snapshot on.
        outcomes = await repo.update(key, [append([record()] * 4) for _ in range(8)])
        assert all(isinstance(o, Failed) for o in outcomes)
        assert (await repo.load(key)).state.version == 1
        await repo.update(key, [append(), append()])  # versions 2 and 3
        # One group whose events (4..7) cross 5, with a failure among them: the snapshot is 8.
        outcomes = await repo.update(
            key,
            [
                AckCommand(WRITER, "c", 1, NOW),
                append(),
                append(),
                append([record()] * 4),  # can never fit the ceiling: Failed
                AckCommand(WRITER, "c", 2, NOW),
            ],
        )
        assert [type(o).__name__ for o in outcomes] == ["Done"] * 3 + ["Failed", "Done"]
        journal = await repo.journal(key)
        snapshot = journal[0]
        assert isinstance(snapshot, ev.StreamSnapshotted) and len(journal) == 1
        stored = await repo.load(key)
        assert snapshot.version == stored.state.version == 8
        assert snapshot.state == stored.state and snapshot.state.head == 4
        assert snapshot.definition == stored.definition
        assert await journal_rows(key) in (1, 8)  # compacted inline, or once its job runs

    async def test_a_held_stream_keeps_its_whole_journal_until_the_hold_is_lifted(
        self, snapshotting_repo, compact, journal_rows
    ) -> None:
        repo, key = snapshotting_repo, new_key()
        await repo.create(key, definition(), NOW)
        await repo.update(key, [LegalHoldCommand(True, "audit", NOW)])
        for _ in range(4 * SNAPSHOT_EVERY):
            await repo.update(key, [append()])
        await compact(repo, key)
        version = (await repo.load(key)).state.version
        assert await journal_rows(key) == version  # every event since StreamCreated
        journal = await self.replays_into_the_stored_state(repo, key)
        assert isinstance(journal[0], ev.StreamSnapshotted)  # read from the latest snapshot
        await repo.update(key, [LegalHoldCommand(False, None, NOW)])
        await compact(repo, key)
        assert await journal_rows(key) <= SNAPSHOT_EVERY
        await self.replays_into_the_stored_state(repo, key)


class ObjectIntentsContract:
    """The intents projection, written with the stream's events, read back the same way."""

    async def test_intents_follow_their_events_and_expired_ones_are_found(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)

        def intent(object_id: str, expires_in: int) -> ObjectIntent:
            return ObjectIntent(
                object_id=object_id,
                idempotency_key=object_id,
                state="prepared",
                size=3,
                sha256="ab" * 32,
                content_type="x/y",
                schema={"type": "object"},
                storage_region="local",
                storage_key="/".join((*key, object_id)),
                receipt=AuthorizationReceipt("writer", ("streams:write",), NOW),
                expires_at=NOW + timedelta(seconds=expires_in),
                created_at=NOW,
            )

        kept, dropped, late = intent("o1", 60), intent("o2", 60), intent("o3", 1)
        for i in (kept, dropped, late):
            [done] = await repo.update(key, [PrepareCommand(i, WRITER, NOW)])
            assert isinstance(done, Done)
        await repo.update(key, [UploadedCommand("o1", NOW)])
        [committed] = await repo.update(key, [CommitCommand(kept, 3, "ab" * 32, NOW)])
        assert isinstance(committed, Done) and committed.answer.sequence == 1
        await repo.update(key, [AbortCommand("o2", NOW)])
        stored = await repo.intent(key, "o1")
        assert (stored.state, stored.sequence, stored.schema) == (
            "committed",
            1,
            {"type": "object"},
        )
        assert stored.receipt == kept.receipt and stored.expires_at == kept.expires_at
        assert (await repo.intent(key, "o2")).state == "aborted"
        assert await repo.intent(key, "nope") is None
        expired = await repo.expired_intents(NOW + timedelta(seconds=5), 100)
        assert (key, "o3") in expired and (key, "o1") not in expired
        _, records = await repo.page(key, 0, 10)
        assert records[0].size == 3 and b'"object_id":"o1"' in records[0].payload

        await repo.update(key, [DeleteCommand(NOW)])
        assert await repo.intent(key, "o1") is None and await repo.intent(key, "o3") is None
        assert (key, "o3") not in await repo.expired_intents(NOW + timedelta(seconds=5), 100)
        # Every body the stream named is queued for the deletion workers, once.
        assert sorted(await queued_bodies(repo, key)) == sorted(
            i.storage_key for i in (kept, dropped, late)
        )
