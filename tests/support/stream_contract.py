"""One contract for every StreamRepository adapter, subclassed per adapter.

A subclass provides the `repo` fixture; every test here then runs against that adapter, races
included, so the memory fake and PostgreSQL are held to the same behaviour. The journal's tests
also need `snapshotting_repo` (the same adapter, snapshotting every `SNAPSHOT_EVERY` versions),
`compact` (run what compacts a stream's journal, as its worker would; nothing where the adapter
compacts inline) and `journal_rows` (how many journal events the adapter stores for a stream)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from datetime import UTC, timedelta

import msgspec
import pytest

from application.acknowledge import AckCommand
from application.append_records import AppendCommand, ProduceCommand, Produced
from application.close_stream import CloseCommand
from application.consumers import RemoveConsumerCommand
from application.delete_stream import DeleteCommand
from application.deletions import ERASED_STREAM, UPLOADING
from application.errors import NotFound
from application.expiry import ExpireCommand
from application.objects import (
    AbortCommand,
    CommitCommand,
    PrepareCommand,
    UploadedCommand,
    storage_key_for,
)
from application.ports import Done, Failed, ForkLink, Replayed
from application.retention import PruneCommand
from application.set_legal_hold import LegalHoldCommand
from domain import errors
from domain import events as ev
from domain.definition import Expiry, Fork, StreamDefinition
from domain.objects import AuthorizationReceipt, ObjectIntent
from domain.producers import ProducerClaim
from domain.records import NewRecord, RecordKind
from domain.stream import Stream
from tests.support.builders import NOW, READER, WRITER, append, definition, new_key, record

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

    async def test_an_ack_of_a_record_appended_in_the_same_commit_is_decided(self, repo) -> None:
        """The ack's offset is of a record its own group appends: not stored yet when the
        group's offsets were read (it answered 500)."""
        key = new_key()
        await repo.create(key, definition(), NOW)
        await repo.update(key, [append([record(b"ab")])])
        appended_answer, acked = await repo.update(
            key,
            [append([record(b"cde"), record(b"f")]), AckCommand(WRITER, "c", 3, NOW)],
        )
        assert isinstance(appended_answer, Done) and isinstance(acked, Done), acked
        assert acked.answer.acked_sequence == 3 and acked.answer.credit.unread_bytes == 0
        [later] = await repo.update(key, [AckCommand(WRITER, "d", 2, NOW)])
        assert later.answer.credit.unread_bytes == 1  # "f", after the slowest consumer's 2

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

    async def test_a_page_within_a_byte_budget_ends_before_the_record_that_would_pass_it(
        self, repo
    ) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        sizes = [300, 300, 300, 50, 900, 10]
        await repo.update(key, [append([record(b"x" * n) for n in sizes])])
        _, records = await repo.page(key, 0, 100, 950)  # 300 + 300 + 300 + 50 = 950
        assert [r.sequence for r in records] == [1, 2, 3, 4]
        _, records = await repo.page(key, 4, 100, 899)  # the first record always
        assert [r.sequence for r in records] == [5]
        _, records = await repo.page(key, 0, 2, 10_000)  # the limit still holds
        assert [r.sequence for r in records] == [1, 2]
        _, records = await repo.page(key, 0, 100)  # no budget: every record
        assert [len(r.payload) for r in records] == sizes

    async def test_a_page_reads_each_records_time_and_kind_as_appended(self, repo) -> None:
        """The PostgreSQL adapter decodes appended_at from its binary form, once per distinct
        value, and kinds by lookup: they must read as the datetimes and kinds appended."""
        key = new_key()
        await repo.create(key, definition(), NOW)
        times = [NOW, NOW + timedelta(microseconds=1), NOW + timedelta(days=400, seconds=1.5)]
        kinds = [RecordKind.JSON, RecordKind.BINARY, RecordKind.JSON]
        for at, kind in zip(times, kinds, strict=True):
            content_type = "application/json" if kind == RecordKind.JSON else "image/png"
            made = NewRecord(kind, content_type, b"[1]", 3)
            command = AppendCommand(WRITER, [made, made], None, at)
            [done] = await repo.update(key, [command])
            assert isinstance(done, Done)
        _, records = await repo.page(key, 0, 100)
        assert [(r.appended_at, r.kind) for r in records] == [
            (at, kind) for at, kind in zip(times, kinds, strict=True) for _ in range(2)
        ]
        assert all(r.appended_at.tzinfo is UTC and type(r.kind) is RecordKind for r in records)

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

    async def test_a_readers_consumer_tracks_its_position_and_holds_no_writer_back(
        self, repo
    ) -> None:
        key = new_key()
        await repo.create(key, definition(max_unread_items=2), NOW)
        await repo.update(key, [append([record(), record()])])
        [held] = await repo.update(key, [AckCommand(WRITER, "w", 2, NOW)])
        [tracked] = await repo.update(key, [AckCommand(READER, "r", 0, NOW)])
        assert held.answer.credit.unread_items == tracked.answer.credit.unread_items == 0
        [appended, refused] = await repo.update(key, [append(), append([record()] * 2)])
        assert isinstance(appended, Done)
        assert isinstance(refused, Failed) and isinstance(refused.error, errors.Backpressure)
        stored = await repo.load(key)
        assert {c: v.holds_credit for c, v in stored.state.consumers.items()} == {
            "w": True,
            "r": False,
        }
        assert (stored.state.consumer_count, stored.state.holding_count) == (2, 1)
        page = await repo.consumers(key, None, 10)
        assert [(c.consumer_id, c.acked_sequence, c.holds_credit) for c in page] == [
            ("r", 0, False),
            ("w", 2, True),
        ]
        assert [c.consumer_id for c in await repo.consumers(key, "r", 10)] == ["w"]
        assert Stream.replay(key, await repo.journal(key)).state == stored.state

    async def test_removing_a_consumer_releases_its_credit_and_replays(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(max_unread_items=2), NOW)
        await repo.update(key, [AckCommand(WRITER, "slow", 0, NOW)])
        await repo.update(key, [append([record(), record()])])
        [refused] = await repo.update(key, [append()])
        assert isinstance(refused, Failed) and isinstance(refused.error, errors.Backpressure)
        await repo.update(key, [LegalHoldCommand(True, "audit", NOW)])  # does not refuse it
        # Removed, created again and removed again in one group: the last word is written.
        outcomes = await repo.update(
            key,
            [
                RemoveConsumerCommand("slow", NOW),
                AckCommand(WRITER, "slow", 1, NOW),
                AckCommand(WRITER, "other", 2, NOW),
                RemoveConsumerCommand("slow", NOW),
                RemoveConsumerCommand("slow", NOW),
            ],
        )
        assert [type(o) for o in outcomes] == [Done, Done, Done, Done, Failed]
        assert isinstance(outcomes[-1].error, errors.UnknownConsumer)
        [appended] = await repo.update(key, [append()])
        assert isinstance(appended, Done)
        stored = await repo.load(key)
        assert list(stored.state.consumers) == ["other"]
        assert [c.consumer_id for c in await repo.consumers(key, None, 10)] == ["other"]
        assert Stream.replay(key, await repo.journal(key)).state == stored.state

    async def test_consumers_are_bounded_per_kind(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        for n in range(2):
            await repo.update(key, [AckCommand(WRITER, f"w{n}", 0, NOW, max_consumers=2)])
        [refused] = await repo.update(key, [AckCommand(WRITER, "w2", 0, NOW, max_consumers=2)])
        assert isinstance(refused, Failed) and isinstance(refused.error, errors.TooManyConsumers)
        # The readers' own room is untouched by the writers'.
        [tracked] = await repo.update(key, [AckCommand(READER, "r0", 0, NOW, max_consumers=2)])
        assert isinstance(tracked, Done)
        assert (await repo.load(key)).state.consumer_count == 3

    async def test_a_run_lists_its_streams(self, repo) -> None:
        key = new_key()
        await repo.create(key._replace(stream_id="b"), definition("b"), NOW)
        await repo.create(key._replace(stream_id="a"), definition("a"), NOW)
        listed = await repo.list_run(key.tenant, key.run_id)
        assert [s.key.stream_id for s in listed] == ["a", "b"]
        assert await repo.list_run("other-tenant", key.run_id) == []

    async def test_a_run_lists_its_streams_by_keyset_in_ascending_stream_id(self, repo) -> None:
        key = new_key()
        for stream_id in ("s-d", "s-b", "s-e", "s-a", "s-c"):
            await repo.create(key._replace(stream_id=stream_id), definition(stream_id), NOW)
        await repo.create(key._replace(run_id=key.run_id + "x", stream_id="s-0"), definition(), NOW)

        async def ids(after: str | None, limit: int | None) -> list[str]:
            listed = await repo.list_run(key.tenant, key.run_id, after, limit)
            return [s.key.stream_id for s in listed]

        assert await ids(None, 2) == ["s-a", "s-b"]
        assert await ids("s-b", 2) == ["s-c", "s-d"]
        assert await ids("s-d", 2) == ["s-e"]
        assert await ids("s-e", 2) == []
        assert await ids("s-bb", None) == ["s-c", "s-d", "s-e"]  # after need not be a stream
        assert await ids(None, None) == ["s-a", "s-b", "s-c", "s-d", "s-e"]

    async def test_a_run_page_within_bytes_stops_before_the_stream_past_them(self, repo) -> None:
        key = new_key()
        for stream_id in ("s-a", "s-b", "s-c"):
            await repo.create(key._replace(stream_id=stream_id), definition(stream_id), NOW)
        whole = await repo.list_run_within(key.tenant, key.run_id, None, 10, 10**9)
        assert [s.key.stream_id for s in whole.streams] == ["s-a", "s-b", "s-c"]
        assert not whole.cut and whole.size > 0
        one = whole.size // 3  # (about one stream's stored bytes: three alike)
        first = await repo.list_run_within(key.tenant, key.run_id, None, 10, 1)
        assert [s.key.stream_id for s in first.streams] == ["s-a"] and first.cut  # never none
        two = await repo.list_run_within(key.tenant, key.run_id, "s-a", 10, 2 * one + 1)
        assert [s.key.stream_id for s in two.streams] == ["s-b", "s-c"] and not two.cut
        limited = await repo.list_run_within(key.tenant, key.run_id, None, 2, 10**9)
        assert [s.key.stream_id for s in limited.streams] == ["s-a", "s-b"]
        assert not limited.cut  # (its limit, not its bytes)
        empty = await repo.list_run_within(key.tenant, key.run_id, "s-c", 10, 10**9)
        assert empty.streams == [] and not empty.cut
        # A stream's consumers count too (stored apart from its state, or in it).
        a = key._replace(stream_id="s-a")
        for n in range(20):
            consumer = f"consumer-{n:02d}-" + "x" * 88  # 100 characters
            [done] = await repo.update(a, [AckCommand(WRITER, consumer, 0, NOW)])
            assert isinstance(done, Done)
        grown = await repo.list_run_within(key.tenant, key.run_id, None, 10, 10**9)
        assert grown.size - whole.size >= 20 * 100

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


def prepared_intent(key, object_id: str, expires_in: int, **fields: object) -> ObjectIntent:
    """A prepared intent of a 3-byte body on `key` (its storage key `key/object_id` unless
    given), expiring `expires_in` seconds after NOW."""
    intent = ObjectIntent(
        object_id=object_id,
        idempotency_key=object_id,
        state="prepared",
        size=3,
        sha256="ab" * 32,
        content_type="x/y",
        schema=None,
        storage_region="local",
        storage_key="/".join((*key, object_id)),
        receipt=AuthorizationReceipt("writer", ("streams:write",), NOW),
        expires_at=NOW + timedelta(seconds=expires_in),
        created_at=NOW,
    )
    return msgspec.structs.replace(intent, **fields)


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


async def queued_reasons(repo, key) -> dict[str, str]:
    """Each storage key on the deletion outbox for this stream, not done, with its reason."""
    if hasattr(repo, "deletions"):
        return {k: why for stream, _, k, why in repo.deletions if stream == key}
    rows = await repo._pool.fetch(
        "SELECT storage_key, reason FROM deletion_outbox WHERE tenant = $1 AND run_id = $2 "
        "AND stream_id = $3 AND done_at IS NULL",
        *key,
    )
    return {r[0]: r[1] for r in rows}


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
            return prepared_intent(key, object_id, expires_in, schema={"type": "object"})

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

    async def test_an_armed_upload_is_disarmed_by_its_upload_and_taken_over_by_a_deletion(
        self, repo
    ) -> None:
        """An upload arms its body's deletion before the put: the end of every put that armed
        it (the last one reaching `uploaded`) disarms it, and an abort (or expiry, pruning,
        erasure) queued meanwhile takes the one row over."""
        key = new_key()
        await repo.create(key, definition(), NOW)
        due = NOW + timedelta(hours=1)
        intents = {}
        for object_id in ("up", "gone", "erased"):
            intents[object_id] = prepared_intent(
                key, object_id, 3600, storage_key=storage_key_for(key, object_id)
            )
            [done] = await repo.update(key, [PrepareCommand(intents[object_id], WRITER, NOW)])
            assert isinstance(done, Done)
            await repo.uploading(key, "local", intents[object_id].storage_key, due)
            await repo.uploading(key, "local", intents[object_id].storage_key, due)  # twice
        assert await queued_reasons(repo, key) == {
            i.storage_key: UPLOADING for i in intents.values()
        }
        # Two puts under way: one ends (a refused body), the other marks the intent uploaded.
        await repo.upload_ended(key, "local", intents["up"].storage_key)
        assert intents["up"].storage_key in await queued_reasons(repo, key)
        await repo.update(key, [UploadedCommand("up", NOW)])
        await repo.update(key, [AbortCommand("gone", NOW)])
        assert await queued_reasons(repo, key) == {
            intents["gone"].storage_key: "aborted",
            intents["erased"].storage_key: UPLOADING,
        }
        await repo.update(key, [DeleteCommand(NOW)])
        reasons = await queued_reasons(repo, key)
        assert reasons.pop(intents["gone"].storage_key) == "aborted"
        assert set(reasons) == {intents["up"].storage_key, intents["erased"].storage_key}
        assert all(r.startswith(ERASED_STREAM) for r in reasons.values())


def forked(source: Stream, stream_id: str, through: int, **changes: object) -> StreamDefinition:
    """The definition of a fork of `source` through sequence `through`."""
    fork = Fork(
        run_id=source.key.run_id,
        stream_id=source.key.stream_id,
        source_created_at=source.state.created_at,
        through=through,
        offset=through,
    )
    return msgspec.structs.replace(definition(stream_id), fork=fork, **changes)


async def payloads(repo, key, cursor: int = 0, limit: int = 100) -> list[bytes]:
    found = await repo.page(key, cursor, limit)
    assert found is not None
    return [r.payload for r in found[1]]


def rec(n: int) -> NewRecord:
    return record(b'{"n":%d}' % n)


class ForkContract:
    """Forks: inherited prefixes read through the source chain, reference counting, soft
    delete and the cascade of erasures, on every adapter."""

    async def source(self, repo, n: int, stream_id: str = "src", key=None) -> Stream:
        key = (key or new_key())._replace(stream_id=stream_id)
        await repo.create(key, definition(stream_id), NOW)
        if n:
            await repo.update(key, [append([rec(i) for i in range(1, n + 1)])])
        return await repo.load(key)

    async def fork(self, repo, source: Stream, stream_id: str, through: int, **changes) -> Stream:
        key = source.key._replace(stream_id=stream_id)
        stream, created = await repo.create(key, forked(source, stream_id, through, **changes), NOW)
        assert created
        return stream

    async def test_a_fork_reads_the_inherited_prefix_then_its_own_records(self, repo) -> None:
        src = await self.source(repo, 4)
        fork = await self.fork(repo, src, "f", 2)
        assert (fork.head, fork.state.total_items) == (2, 0)
        await repo.update(src.key, [append([rec(5)])])  # after the fork: never in it
        [done] = await repo.update(fork.key, [append([rec(30), rec(40)])])
        assert (done.answer.first_sequence, done.answer.last_sequence) == (3, 4)
        assert done.answer.credit.unread_items == 2  # only its own records count
        position, records = await repo.page(fork.key, 0, 100)
        assert (position.head, position.earliest, position.soft_deleted) == (4, 1, False)
        assert [r.sequence for r in records] == [1, 2, 3, 4]
        assert [r.payload for r in records] == [
            rec(1).payload,
            rec(2).payload,
            *[rec(n).payload for n in (30, 40)],
        ]
        # Pages cross the boundary by keyset, at any cursor and limit.
        assert await payloads(repo, fork.key, 1, 2) == [rec(2).payload, rec(30).payload]
        assert await payloads(repo, fork.key, 0, 1) == [rec(1).payload]
        assert await payloads(repo, fork.key, 2, 10) == [rec(30).payload, rec(40).payload]
        assert await payloads(repo, fork.key, 4, 10) == []
        assert await payloads(repo, src.key) == [rec(n).payload for n in range(1, 6)]

    async def test_a_forks_page_within_a_byte_budget_ends_where_its_bytes_do(self, repo) -> None:
        """The budget counts the inherited records and the fork's own as one page."""
        src = await self.source(repo, 0)
        await repo.update(src.key, [append([record(b"s" * 400) for _ in range(3)])])
        src = await repo.load(src.key)
        fork = await self.fork(repo, src, "f", 2)
        await repo.update(fork.key, [append([record(b"f" * 400) for _ in range(3)])])
        _, records = await repo.page(fork.key, 0, 100, 1_000)
        assert [r.payload[:1] for r in records] == [b"s", b"s"]
        _, records = await repo.page(fork.key, 1, 100, 1_000)
        assert [(r.sequence, r.payload[:1]) for r in records] == [(2, b"s"), (3, b"f")]
        _, records = await repo.page(fork.key, 2, 100, 1_000)
        assert [r.sequence for r in records] == [3, 4]

    async def test_forks_at_the_start_and_at_the_head(self, repo) -> None:
        src = await self.source(repo, 3)
        empty = await self.fork(repo, src, "at-zero", 0)
        whole = await self.fork(repo, src, "at-head", 3)
        assert await payloads(repo, empty.key) == []
        assert (await repo.page(empty.key, 0, 10))[0].head == 0
        assert await payloads(repo, whole.key) == [rec(n).payload for n in (1, 2, 3)]

    async def test_a_chain_of_forks_reads_through_every_level(self, repo) -> None:
        a = await self.source(repo, 3, "a")
        b = await self.fork(repo, a, "b", 2)
        await repo.update(b.key, [append([rec(20), rec(21)])])  # b: 1 2 20 21
        b = await repo.load(b.key)
        c = await self.fork(repo, b, "c", 3)  # c: 1 2 20 | own
        await repo.update(c.key, [append([rec(30)])])
        await repo.update(a.key, [append([rec(4)])])
        assert await payloads(repo, c.key) == [rec(n).payload for n in (1, 2, 20, 30)]
        assert await payloads(repo, c.key, 1, 2) == [rec(2).payload, rec(20).payload]
        assert await payloads(repo, b.key) == [rec(n).payload for n in (1, 2, 20, 21)]
        assert await payloads(repo, a.key) == [rec(n).payload for n in (1, 2, 3, 4)]

    async def test_a_chain_is_its_links_up_to_the_root(self, repo) -> None:
        a = await self.source(repo, 3, "a")
        b = await self.fork(repo, a, "b", 2)
        c = await self.fork(repo, b, "c", 1)
        assert await repo.chain(c.key) == [
            ForkLink(b.key, b.state.created_at, 1),
            ForkLink(a.key, a.state.created_at, 2),
        ]
        assert await repo.chain(b.key) == [ForkLink(a.key, a.state.created_at, 2)]
        assert await repo.chain(a.key) == []
        assert await repo.chain(a.key._replace(stream_id="none")) == []

    async def test_a_chain_deeper_than_the_stack_reads_in_one_go(self, repo) -> None:
        """Read without recursion: a page once went down the chain a call per level."""
        stream = await self.source(repo, 1, "c0")
        depth = sys.getrecursionlimit() + 50
        for level in range(1, depth + 1):
            stream = await self.fork(repo, stream, f"c{level}", stream.head)
            if level % 2 == 0:  # every other level adds a record of its own
                await repo.update(stream.key, [append([rec(level)])])
                stream = await repo.load(stream.key)
        expected = [rec(1).payload] + [rec(level).payload for level in range(2, depth + 1, 2)]
        assert stream.head == len(expected)
        assert await payloads(repo, stream.key, 0, 10_000) == expected
        position, records = await repo.page(stream.key, 3, 4)
        assert [r.sequence for r in records] == [4, 5, 6, 7]
        assert (position.head, position.earliest) == (stream.head, 1)
        assert len(await repo.chain(stream.key)) == depth

    async def test_creating_a_fork_rechecks_its_source_and_a_refused_one_links_nothing(
        self, repo
    ) -> None:
        src = await self.source(repo, 2)
        with pytest.raises(errors.InvalidInput):
            await repo.create(src.key._replace(stream_id="far"), forked(src, "far", 3), NOW)
        stale = msgspec.structs.replace(
            forked(src, "stale", 1),
            fork=msgspec.structs.replace(
                forked(src, "stale", 1).fork, source_created_at=NOW - timedelta(days=1)
            ),
        )
        with pytest.raises(NotFound):  # another incarnation of the source's ID
            await repo.create(src.key._replace(stream_id="stale"), stale, NOW)
        missing = msgspec.structs.replace(
            stale, fork=msgspec.structs.replace(stale.fork, stream_id="nothing-here")
        )
        with pytest.raises(NotFound):
            await repo.create(src.key._replace(stream_id="lost"), missing, NOW)
        for stream_id in ("far", "stale", "lost"):
            assert await repo.load(src.key._replace(stream_id=stream_id)) is None
        # No reference leaked: the source is erased outright, not soft-deleted.
        [deleted] = await repo.update(src.key, [DeleteCommand(NOW)])
        assert isinstance(deleted, Done) and isinstance(deleted.events[0], ev.StreamDeleted)
        assert await repo.page(src.key, 0, 10) is None

    async def test_a_source_with_forks_is_soft_deleted_and_gone_for_direct_use(self, repo) -> None:
        src = await self.source(repo, 3)
        fork = await self.fork(repo, src, "f", 2)
        [deleted] = await repo.update(src.key, [DeleteCommand(NOW)])
        assert isinstance(deleted, Done)
        assert [type(e) for e in deleted.events] == [ev.StreamSoftDeleted]
        position, records = await repo.page(src.key, 0, 10)
        assert position.soft_deleted and len(records) == 3  # kept for the forks
        assert (await repo.load(src.key)).state.soft_deleted
        for command in (append(), DeleteCommand(NOW), CloseCommand(WRITER, NOW)):
            [refused] = await repo.update(src.key, [command])
            assert isinstance(refused, Failed) and isinstance(refused.error, errors.StreamGone)
        again, created = await repo.create(src.key, definition("src"), NOW)
        assert not created and again.state.soft_deleted  # CreateStream answers 409 for it
        assert await payloads(repo, fork.key) == [rec(1).payload, rec(2).payload]
        outcomes = await repo.update(fork.key, [append([rec(9)]), CloseCommand(WRITER, NOW)])
        assert all(isinstance(o, Done) for o in outcomes)  # the fork lives on its own
        assert (await repo.page(fork.key, 0, 10))[0].closed

    async def test_a_soft_deleted_source_cannot_be_forked(self, repo) -> None:
        src = await self.source(repo, 1)
        await self.fork(repo, src, "f", 1)
        await repo.update(src.key, [DeleteCommand(NOW)])
        with pytest.raises(errors.DefinitionConflict):
            await repo.create(src.key._replace(stream_id="g"), forked(src, "g", 1), NOW)

    async def test_deleting_the_last_fork_erases_its_soft_deleted_source(self, repo) -> None:
        src = await self.source(repo, 2)
        f1 = await self.fork(repo, src, "f1", 1)
        f2 = await self.fork(repo, src, "f2", 2)
        await repo.update(src.key, [DeleteCommand(NOW)])
        await repo.update(f1.key, [DeleteCommand(NOW)])
        assert (await repo.page(src.key, 0, 10))[0].soft_deleted  # f2 still reads it
        assert await payloads(repo, f2.key) == [rec(1).payload, rec(2).payload]
        await repo.update(f2.key, [DeleteCommand(NOW)])
        assert await repo.page(src.key, 0, 10) is None
        assert await repo.load(src.key) is None
        stream, created = await repo.create(src.key, definition("src"), NOW)
        assert created and stream.head == 0  # the ID is free again

    async def test_the_cascade_goes_up_a_chain_of_three(self, repo) -> None:
        a = await self.source(repo, 2, "a")
        b = await self.fork(repo, a, "b", 2)
        c = await self.fork(repo, b, "c", 2)
        await repo.update(a.key, [DeleteCommand(NOW)])
        await repo.update(b.key, [DeleteCommand(NOW)])
        assert await payloads(repo, c.key) == [rec(1).payload, rec(2).payload]
        await repo.update(c.key, [DeleteCommand(NOW)])
        for key in (a.key, b.key, c.key):
            assert await repo.page(key, 0, 10) is None

    async def test_deleting_the_middle_of_a_chain_keeps_what_its_fork_reads(self, repo) -> None:
        a = await self.source(repo, 2, "a")
        b = await self.fork(repo, a, "b", 1)
        await repo.update(b.key, [append([rec(10)])])
        c = await self.fork(repo, await repo.load(b.key), "c", 2)
        await repo.update(b.key, [DeleteCommand(NOW)])
        assert (await repo.page(b.key, 0, 10))[0].soft_deleted
        assert await payloads(repo, c.key) == [rec(1).payload, rec(10).payload]
        assert await payloads(repo, a.key) == [rec(1).payload, rec(2).payload]
        [erased] = await repo.update(c.key, [DeleteCommand(NOW)])
        assert isinstance(erased.events[0], ev.StreamDeleted)
        assert await repo.page(b.key, 0, 10) is None  # released with its last fork
        position, _ = await repo.page(a.key, 0, 10)  # never deleted: stays as it was
        assert not position.soft_deleted and position.head == 2

    async def test_a_live_source_stays_when_all_its_forks_are_deleted(self, repo) -> None:
        src = await self.source(repo, 2)
        for name in ("f1", "f2"):
            fork = await self.fork(repo, src, name, 1)
            await repo.update(fork.key, [DeleteCommand(NOW)])
        [deleted] = await repo.update(src.key, [DeleteCommand(NOW)])  # no fork left: erased
        assert isinstance(deleted.events[0], ev.StreamDeleted)
        assert await repo.page(src.key, 0, 10) is None

    async def test_expiry_soft_deletes_a_forked_source_and_a_forks_expiry_releases_it(
        self, repo
    ) -> None:
        key = new_key()._replace(stream_id="src")
        idle = Expiry(idle_seconds=10)
        await repo.create(key, msgspec.structs.replace(definition("src"), expiry=idle), NOW)
        await repo.update(key, [append([rec(1), rec(2)])])
        src = await repo.load(key)
        fork = await self.fork(repo, src, "f", 2, expiry=idle)
        later = NOW + timedelta(minutes=5)
        [expired] = await repo.update(key, [ExpireCommand(later, NOW, timedelta(0))])
        assert [type(e) for e in expired.events] == [ev.StreamSoftDeleted]
        assert (await repo.page(key, 0, 10))[0].soft_deleted
        [again] = await repo.update(key, [ExpireCommand(later, NOW, timedelta(0))])
        assert again.events == []  # nothing more until its fork goes
        assert await payloads(repo, fork.key) == [rec(1).payload, rec(2).payload]
        [fork_expired] = await repo.update(fork.key, [ExpireCommand(later, NOW, timedelta(0))])
        assert isinstance(fork_expired.events[0], ev.StreamDeleted)
        assert await repo.page(fork.key, 0, 10) is None
        assert await repo.page(key, 0, 10) is None

    async def test_a_fork_pins_the_prefix_it_inherits_against_its_sources_retention(
        self, repo
    ) -> None:
        src = await self.source(repo, 4)
        fork = await self.fork(repo, src, "f", 2)
        await repo.update(fork.key, [LegalHoldCommand(True, "case", NOW)])  # changes nothing
        await repo.update(fork.key, [append([rec(40)])])
        [kept] = await repo.update(src.key, [PruneCommand(3, "retention", NOW)])
        assert isinstance(kept, Done) and kept.events == []  # the fork reads 1..2: nothing goes
        position, records = await repo.page(src.key, 0, 10)
        assert position.earliest == 1 and [r.sequence for r in records] == [1, 2, 3, 4]
        position, records = await repo.page(fork.key, 0, 10)
        assert (position.head, position.earliest) == (3, 1)
        assert [r.payload for r in records] == [rec(1).payload, rec(2).payload, rec(40).payload]
        assert (await repo.load(src.key)).state.earliest == 1
        # Decided again under the lock, the group's other commands stand.
        outcomes = await repo.update(src.key, [append([rec(5)]), PruneCommand(4, "age", NOW)])
        assert [type(o) for o in outcomes] == [Done, Done] and outcomes[1].events == []
        assert (await repo.load(src.key)).state.head == 5
        await repo.update(fork.key, [LegalHoldCommand(False, None, NOW)])
        await repo.update(fork.key, [DeleteCommand(NOW)])  # no fork left: retention resumes
        [pruned] = await repo.update(src.key, [PruneCommand(4, "retention", NOW)])
        assert [type(e) for e in pruned.events] == [ev.RecordsPruned]
        position, records = await repo.page(src.key, 0, 10)
        assert position.earliest == 5 and [r.sequence for r in records] == [5]

    async def test_every_fork_pins_its_prefix_soft_deleted_or_down_a_chain(self, repo) -> None:
        a = await self.source(repo, 3, "a")
        b = await self.fork(repo, a, "b", 1)
        await repo.update(b.key, [append([rec(20), rec(30)])])
        c = await self.fork(repo, await repo.load(b.key), "c", 3)
        await repo.update(b.key, [DeleteCommand(NOW)])  # soft-deleted: c still reads it
        for key in (a.key, b.key):
            [kept] = await repo.update(key, [PruneCommand(3, "retention", NOW)])
            assert isinstance(kept, Done) and kept.events == []
        position, records = await repo.page(c.key, 0, 10)
        assert position.earliest == 1
        assert [r.payload for r in records] == [rec(n).payload for n in (1, 20, 30)]
        # A fork whose prefix retention had already taken before it was created pins nothing.
        lone = await self.source(repo, 4, "lone")
        await repo.update(lone.key, [PruneCommand(2, "retention", NOW)])
        late = await self.fork(repo, await repo.load(lone.key), "late", 1)
        [pruned] = await repo.update(lone.key, [PruneCommand(3, "retention", NOW)])
        assert [type(e) for e in pruned.events] == [ev.RecordsPruned]
        assert (await repo.page(late.key, 0, 10))[0].earliest == 2  # nothing of 1..1 is left

    async def test_a_fork_created_while_its_source_is_pruned_never_loses_its_prefix(
        self, repo
    ) -> None:
        for _ in range(5):
            src = await self.source(repo, 4)

            async def one_fork(n: int, src: Stream = src) -> Stream:
                key = src.key._replace(stream_id=f"f{n}")
                stream, _ = await repo.create(key, forked(src, f"f{n}", 3), NOW)
                return stream

            results = await asyncio.gather(
                *(one_fork(n) for n in range(3)),
                repo.update(src.key, [PruneCommand(2, "retention", NOW)]),
                *(one_fork(n) for n in range(3, 6)),
            )
            forks = [f for f in results if isinstance(f, Stream)]
            assert len(forks) == 6
            # Whichever came first, each fork reads every record the source kept of its prefix,
            # and no later prune takes one of them.
            earliest = (await repo.load(src.key)).state.earliest
            assert earliest in (1, 3)
            await repo.update(src.key, [PruneCommand(4, "retention", NOW)])
            assert (await repo.load(src.key)).state.earliest == earliest
            for fork in forks:
                position, records = await repo.page(fork.key, 0, 10)
                assert position.earliest == earliest
                assert [r.sequence for r in records] == list(range(earliest, 4))

    async def test_deleting_a_run_soft_deletes_the_sources_forks_outside_it_read(
        self, repo
    ) -> None:
        src = await self.source(repo, 2, "src")
        inside = await self.fork(repo, src, "inside", 1)
        outside_key = new_key()._replace(stream_id="outside")
        await repo.create(outside_key, forked(src, "outside", 2), NOW)
        only_inside = await self.source(repo, 1, "lonely", key=src.key)
        await self.fork(repo, only_inside, "lonely-fork", 1)
        await repo.delete_run(src.key.tenant, src.key.run_id, NOW)
        assert (await repo.page(src.key, 0, 10))[0].soft_deleted
        for gone in (inside.key, only_inside.key, src.key._replace(stream_id="lonely-fork")):
            assert await repo.page(gone, 0, 10) is None
        assert await payloads(repo, outside_key) == [rec(1).payload, rec(2).payload]
        await repo.update(outside_key, [DeleteCommand(NOW)])
        assert await repo.page(src.key, 0, 10) is None

    async def test_concurrent_forks_and_delete_of_the_source_never_lose_a_prefix(
        self, repo
    ) -> None:
        for _ in range(5):
            src = await self.source(repo, 2)

            async def one_fork(n: int, src: Stream = src) -> Stream | None:
                key = src.key._replace(stream_id=f"f{n}")
                try:
                    stream, _ = await repo.create(key, forked(src, f"f{n}", 2), NOW)
                except (NotFound, errors.DefinitionConflict):  # erased, or soft-deleted first
                    return None
                return stream

            results = await asyncio.gather(
                *(one_fork(n) for n in range(4)),
                repo.update(src.key, [DeleteCommand(NOW)]),
                *(one_fork(n) for n in range(4, 8)),
            )
            forks = [f for f in results[:4] + results[5:] if f is not None]
            found = await repo.page(src.key, 0, 10)
            if forks:
                assert found is not None and found[0].soft_deleted
                for fork in forks:
                    assert await payloads(repo, fork.key) == [rec(1).payload, rec(2).payload]
                    await repo.update(fork.key, [DeleteCommand(NOW)])
            assert await repo.page(src.key, 0, 10) is None


def produce(
    records: Sequence[NewRecord] | None = None,
    producer: ProducerClaim | None = None,
    writer_seq: str | None = None,
    close: bool = False,
) -> ProduceCommand:
    """A Durable Streams write; `records` defaults to one record (to none when closing)."""
    if records is None:
        records = [] if close else [record()]
    return ProduceCommand(
        WRITER, list(records), NOW, producer=producer, writer_seq=writer_seq, close=close
    )


def claim(seq: int, epoch: int = 0, producer_id: str = "p") -> ProducerClaim:
    return ProducerClaim(producer_id=producer_id, epoch=epoch, seq=seq)


async def all_payloads(repo, key) -> list[bytes]:
    _, records = await repo.page(key, 0, 1000)
    return [r.payload for r in records]


class DurableStreamsContract:
    """The Durable Streams write path: producer claims, `Stream-Seq`, append-and-close, close-only
    and creation with initial records, decided under the row lock like every other command.

    Needs, besides `repo`: `reopen` (a new adapter on the same storage, keeping nothing in
    memory: a restarted process) and `waking_repo` (an adapter and the WakeRegistry its commits
    reach, through the wake bus where there is one)."""

    async def test_every_producer_outcome(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        [first] = await repo.update(key, [produce([record(b"0")], claim(0))])
        assert isinstance(first, Done)
        assert first.answer == Produced(
            head=1, closed=False, duplicate=False, producer_epoch=0, created_at=NOW, producer_seq=0
        )
        await repo.update(key, [produce([record(b"1")], claim(1))])
        await repo.update(key, [produce([record(b"2")], claim(2))])
        [duplicate] = await repo.update(key, [produce([record(b"again")], claim(1))])
        assert duplicate.answer == Produced(
            head=3, closed=False, duplicate=True, producer_epoch=0, created_at=NOW, producer_seq=2
        )
        [gap] = await repo.update(key, [produce(producer=claim(4))])
        assert isinstance(gap.error, errors.ProducerSequenceGap)
        assert gap.error.extra == {"expected_seq": 3, "received_seq": 4}
        [new_gap] = await repo.update(key, [produce(producer=claim(1, producer_id="q"))])
        assert new_gap.error.extra == {"expected_seq": 0, "received_seq": 1}
        [bad_epoch] = await repo.update(key, [produce(producer=claim(3, epoch=1))])
        assert isinstance(bad_epoch.error, errors.InvalidInput)
        [bumped] = await repo.update(key, [produce([record(b"e1")], claim(0, epoch=1))])
        assert (bumped.answer.producer_epoch, bumped.answer.producer_seq) == (1, 0)
        [stale] = await repo.update(key, [produce(producer=claim(3))])
        assert isinstance(stale.error, errors.ProducerEpochStale)
        assert stale.error.extra == {"current_epoch": 1}
        assert await all_payloads(repo, key) == [b"0", b"1", b"2", b"e1"]

    async def test_claims_in_one_group_are_decided_in_order(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        outcomes = await repo.update(
            key,
            [
                produce([record(b"a0")], claim(0, producer_id="a")),
                produce([record(b"a1")], claim(1, producer_id="a")),
                produce([record(b"a0 again")], claim(0, producer_id="a")),
                produce([record(b"b0")], claim(0, producer_id="b")),
                produce([record(b"a3")], claim(3, producer_id="a")),
                produce([record(b"a2")], claim(2, producer_id="a")),
            ],
        )
        kinds = [
            type(o).__name__ if isinstance(o, Failed) else o.answer.duplicate for o in outcomes
        ]
        assert kinds == [False, False, True, False, "Failed", False]
        assert await all_payloads(repo, key) == [b"a0", b"a1", b"b0", b"a2"]

    async def test_concurrent_producers_and_their_retries_append_each_batch_once(
        self, repo
    ) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)

        async def producer(name: str) -> list[bool]:
            """Each batch sent twice at once (a retry racing its original), in order."""
            duplicates = []
            for seq in range(5):
                command = produce([record(b"%s%d" % (name.encode(), seq))], claim(seq, 0, name))
                outcomes = await asyncio.gather(
                    repo.update(key, [command]), repo.update(key, [command])
                )
                duplicates += sorted(o[0].answer.duplicate for o in outcomes)
            return duplicates

        results = await asyncio.gather(*(producer(name) for name in "abcd"))
        assert all(r == [False, True] * 5 for r in results)
        stored = await all_payloads(repo, key)
        expected = [b"%s%d" % (name, seq) for name in (b"a", b"b", b"c", b"d") for seq in range(5)]
        assert sorted(stored) == expected
        for name in b"abcd":  # each producer's batches in its own order
            own = [p for p in stored if p[0] == name]
            assert own == sorted(own)
        stream = await repo.load(key)
        assert {p: v.last_seq for p, v in stream.state.producers.items()} == dict.fromkeys(
            "abcd", 4
        )

    async def test_writer_state_survives_a_restart_and_replays_from_the_journal(
        self, repo, reopen
    ) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        await repo.update(key, [produce(producer=claim(0), writer_seq="001")])
        await repo.update(key, [produce(producer=claim(0, epoch=2, producer_id="q"))])
        await repo.update(key, [produce(producer=claim(1), writer_seq="002")])
        restarted = reopen()
        [duplicate] = await restarted.update(key, [produce(producer=claim(1))])
        assert duplicate.answer.duplicate and duplicate.answer.producer_seq == 1
        [stale] = await restarted.update(key, [produce(producer=claim(1, producer_id="q"))])
        assert isinstance(stale.error, errors.ProducerEpochStale)
        [regression] = await restarted.update(key, [produce(writer_seq="002")])
        assert regression.error.extra == {"last_seq": "002"}
        stored = await restarted.load(key)
        assert Stream.replay(key, await restarted.journal(key)).state == stored.state
        assert (stored.state.writer_seq, stored.head) == ("002", 3)

    async def test_stream_seq_must_increase(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        first, same, lower, higher = await repo.update(
            key,
            [
                produce([record(b"1")], writer_seq="b"),
                produce([record(b"2")], writer_seq="b"),
                produce([record(b"3")], writer_seq="a"),
                produce([record(b"4")], writer_seq="ba"),
            ],
        )
        assert isinstance(first, Done) and isinstance(higher, Done)
        for refused in (same, lower):
            assert isinstance(refused.error, errors.WriterSequenceRegression)
            assert refused.error.extra == {"last_seq": "b"}
        assert await all_payloads(repo, key) == [b"1", b"4"]

    async def test_append_and_close_is_atomic_and_only_its_claim_is_a_duplicate_after(
        self, repo
    ) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        await repo.update(key, [produce([record(b"first")])])
        [closing] = await repo.update(key, [produce([record(b"final")], claim(0), close=True)])
        assert closing.answer == Produced(
            head=2, closed=True, duplicate=False, producer_epoch=0, created_at=NOW, producer_seq=0
        )
        position, _ = await repo.page(key, 0, 10)
        assert position.closed and position.head == 2
        [retry] = await repo.update(key, [produce([record(b"other")], claim(0), close=True)])
        assert retry.answer.duplicate and retry.answer.closed and retry.answer.producer_seq == 0
        for command in (
            produce([record(b"late")]),
            produce([record(b"late")], close=True),
            produce([record(b"late")], claim(1), close=True),
            produce([record(b"late")], claim(0, producer_id="other")),
            produce(producer=claim(1), close=True),
        ):
            [refused] = await repo.update(key, [command])
            assert isinstance(refused.error, errors.StreamClosed)
            assert refused.error.extra == {"head": 2}
        [native] = await repo.update(key, [append()])
        assert isinstance(native.error, errors.StreamClosed)
        assert await all_payloads(repo, key) == [b"first", b"final"]

    async def test_close_only_is_idempotent(self, repo) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        await repo.update(key, [produce()])
        first, again = await repo.update(key, [produce(close=True), produce(close=True)])
        closing = Produced(
            head=1,
            closed=True,
            duplicate=False,
            producer_epoch=None,
            created_at=NOW,
            producer_seq=None,
        )
        assert first.answer == closing
        assert again.answer == msgspec.structs.replace(closing, duplicate=True)
        [later] = await repo.update(key, [produce(close=True)])
        assert later.answer.duplicate and (await repo.load(key)).state.version == 3

    async def test_close_only_with_a_claim_advances_the_producer_and_is_idempotent(
        self, repo
    ) -> None:
        key = new_key()
        await repo.create(key, definition(), NOW)
        await repo.update(key, [produce(producer=claim(0))])
        [closed] = await repo.update(key, [produce(producer=claim(1), close=True)])
        assert (closed.answer.closed, closed.answer.duplicate, closed.answer.producer_seq) == (
            True,
            False,
            1,
        )
        [again] = await repo.update(key, [produce(producer=claim(1), close=True)])
        assert again.answer.duplicate and again.answer.producer_seq == 1
        stream = await repo.load(key)
        assert stream.state.closed_by == claim(1) and stream.state.producers["p"].last_seq == 1

    async def test_a_stream_is_created_with_its_initial_records_and_closure_at_once(
        self, repo
    ) -> None:
        key = new_key()
        initial = [record(b"%d" % i) for i in range(100)]  # past the PostgreSQL COPY threshold
        stream, created = await repo.create(key, definition(), NOW, [produce(initial, close=True)])
        assert created and stream.head == 100 and stream.state.closed
        assert stream.state.version == 3  # created, appended, closed
        assert await all_payloads(repo, key) == [r.payload for r in initial]
        stored = await repo.load(key)
        assert stored.state == stream.state
        assert Stream.replay(key, await repo.journal(key)).state == stored.state
        [ack] = await repo.update(key, [AckCommand(WRITER, "c", 60, NOW)])
        assert ack.answer.credit.unread_bytes == sum(r.size for r in initial[60:])
        again, created_again = await repo.create(key, definition(), NOW, [produce(initial)])
        assert not created_again and again.head == 100  # an existing stream is left as it is

    async def test_a_creation_whose_initial_records_are_refused_creates_nothing(self, repo) -> None:
        key = new_key()
        with pytest.raises(errors.InvalidInput):
            await repo.create(key, definition(max_unread_items=2), NOW, [produce([record()] * 3)])
        assert await repo.load(key) is None and await repo.page(key, 0, 10) is None
        stream, created = await repo.create(key, definition(), NOW)
        assert created and stream.head == 0 and await all_payloads(repo, key) == []

    async def test_concurrent_creations_with_initial_records_append_them_once(self, repo) -> None:
        key = new_key()
        results = await asyncio.gather(
            *(repo.create(key, definition(), NOW, [produce([record(b"x")] * 3)]) for _ in range(8))
        )
        assert sorted(created for _, created in results) == [False] * 7 + [True]
        assert await all_payloads(repo, key) == [b"x"] * 3

    async def test_initial_records_wake_live_readers(self, waking_repo) -> None:
        repo, registry = waking_repo
        key = new_key()
        with registry.listen(key) as listener:
            await repo.create(key, definition(), NOW, [produce([record()])])
            assert await listener.wait(5)

    async def test_writer_state_rides_through_snapshots_and_compaction(
        self, snapshotting_repo, compact
    ) -> None:
        repo, key = snapshotting_repo, new_key()
        await repo.create(key, definition(), NOW)
        for seq in range(4 * SNAPSHOT_EVERY):
            await repo.update(key, [produce(producer=claim(seq))])
            await compact(repo, key)
        await repo.update(key, [produce(producer=claim(0, producer_id="q"), writer_seq="9")])
        await compact(repo, key)
        journal = await repo.journal(key)
        assert isinstance(journal[0], ev.StreamSnapshotted)
        stored = await repo.load(key)
        assert Stream.replay(key, journal).state == stored.state
        assert stored.state.producers["p"].last_seq == 4 * SNAPSHOT_EVERY - 1
        assert (stored.state.producers["q"].epoch, stored.state.writer_seq) == (0, "9")
        [duplicate] = await repo.update(key, [produce(producer=claim(3))])
        assert duplicate.answer.duplicate

    async def test_a_snapshot_carries_every_producer_not_only_those_of_its_group(
        self, snapshotting_repo, compact
    ) -> None:
        repo, key = snapshotting_repo, new_key()
        await repo.create(key, definition(), NOW)
        for producer_id in ("a", "b", "c"):
            await repo.update(key, [produce(producer=claim(0, producer_id=producer_id))])
        for _ in range(2 * SNAPSHOT_EVERY):  # snapshots taken by appends that name no producer
            await repo.update(key, [append()])
        await repo.update(key, [produce(producer=claim(1, producer_id="b"))])
        await compact(repo, key)
        journal = await repo.journal(key)
        assert isinstance(journal[0], ev.StreamSnapshotted)
        assert set(journal[0].state.producers) == {"a", "b", "c"}
        stored = await repo.load(key)
        assert Stream.replay(key, journal).state == stored.state
        assert {p: v.last_seq for p, v in stored.state.producers.items()} == {
            "a": 0,
            "b": 1,
            "c": 0,
        }
        [again] = await repo.update(key, [produce(producer=claim(0, producer_id="c"))])
        assert again.answer.duplicate  # c is remembered, though no group named it since

    async def test_past_the_bound_the_least_recent_producer_is_forgotten(
        self, repo, monkeypatch
    ) -> None:
        for where in ("domain.stream.MAX_PRODUCERS", "adapters.postgres.producers.MAX_PRODUCERS"):
            monkeypatch.setattr(where, 3)
        key = new_key()
        await repo.create(key, definition(), NOW)

        def at(seconds: int, seq: int, producer_id: str) -> ProduceCommand:
            command = produce(producer=claim(seq, producer_id=producer_id))
            command.now = NOW + timedelta(seconds=seconds)
            return command

        for n, producer_id in enumerate(("a", "b", "c")):
            await repo.update(key, [at(n, 0, producer_id)])
        # a writes again (so b is now the least recent) and d is new, in one group.
        await repo.update(key, [at(5, 1, "a"), at(6, 0, "d")])
        stored = await repo.load(key)
        assert sorted(stored.state.producers) == ["a", "c", "d"]
        [gap] = await repo.update(key, [at(7, 1, "b")])  # b was forgotten: new again
        assert isinstance(gap, Failed) and isinstance(gap.error, errors.ProducerSequenceGap)
        # Tied at the same instant, the lowest producer ID goes first.
        await repo.update(key, [at(8, 0, "z"), at(8, 0, "y"), at(8, 0, "x")])
        await repo.update(key, [at(9, 0, "w")])
        stored = await repo.load(key)
        assert sorted(stored.state.producers) == ["w", "y", "z"]
        assert Stream.replay(key, await repo.journal(key)).state == stored.state


class CrossStreamContract:
    """`update_many`: many streams decided each under its own lock and committed together, each
    stream's answer its own (a refused or missing stream fails nothing else of the batch)."""

    async def test_one_commit_over_many_streams_answers_each_request_alone(self, repo) -> None:
        run = new_key()
        key = {
            name: run._replace(stream_id=name)
            for name in ("open", "closed", "full", "gone", "held", "keyed", "producer", "expired")
        }
        for name, k in key.items():
            limits = {"max_unread_items": 1} if name == "full" else {}
            d = definition(name, **limits)
            if name == "expired":
                d = msgspec.structs.replace(d, expiry=Expiry(idle_seconds=10))
            await repo.create(k, d, NOW)
        await repo.update(key["closed"], [CloseCommand(WRITER, NOW)])
        await repo.update(key["full"], [append()])
        await repo.update(key["gone"], [DeleteCommand(NOW)])
        await repo.update(key["held"], [LegalHoldCommand(True, "case", NOW)])
        await repo.update(key["keyed"], [append(key="k1")])
        await repo.update(key["producer"], [produce(producer=claim(0, epoch=2))])
        later = NOW + timedelta(minutes=5)
        results = await repo.update_many(
            [
                (key["open"], [append(), append([record(), record()]), append()]),
                (key["closed"], [append()]),
                (key["full"], [append(), CloseCommand(WRITER, NOW)]),
                (key["gone"], [append()]),
                (key["held"], [DeleteCommand(NOW), append()]),
                (key["keyed"], [append(key="k1"), append([record(b"2")], key="k1"), append()]),
                (key["producer"], [produce(None, claim(1, epoch=1)), produce(None, claim(1, 2))]),
                (key["expired"], [ExpireCommand(later, NOW, timedelta(0)), append()]),
            ]
        )
        opened, closed, full, gone, held, keyed, producer, expired = results
        assert [o.answer.first_sequence for o in opened] == [1, 2, 4]
        assert [o.answer.last_sequence for o in opened] == [1, 3, 4]
        assert isinstance(closed[0].error, errors.StreamClosed)
        assert isinstance(full[0].error, errors.Backpressure) and isinstance(full[1], Done)
        assert isinstance(gone, NotFound)
        assert isinstance(held[0].error, errors.LegalHoldActive) and isinstance(held[1], Done)
        assert isinstance(keyed[0], Replayed) and isinstance(keyed[2], Done)
        assert isinstance(keyed[1].error, errors.IdempotencyKeyReused)
        assert isinstance(producer[0].error, errors.ProducerEpochStale)
        assert isinstance(producer[1], Done) and producer[1].answer.head == 2
        assert [type(e) for e in expired[0].events] == [ev.StreamDeleted]
        assert isinstance(expired[1], Failed) and isinstance(expired[1].error, NotFound)
        # What each stream committed, and nothing of what it refused.
        heads = {name: (await repo.page(k, 0, 10)) for name, k in key.items()}
        assert [r.sequence for r in heads["open"][1]] == [1, 2, 3, 4]
        assert heads["closed"][0].head == 0
        assert heads["full"][0].head == 1 and heads["full"][0].closed
        assert heads["gone"] is None and heads["expired"] is None
        assert heads["held"][0].head == 1
        assert [r.sequence for r in heads["keyed"][1]] == [1, 2]
        assert heads["producer"][0].head == 2
        stream = await repo.load(key["open"])
        assert (stream.head, stream.state.total_items) == (4, 4)

    async def test_overlapping_batches_commit_every_append_once_in_order(self, repo) -> None:
        run = new_key()
        keys = [run._replace(stream_id=f"s{i:02d}") for i in range(12)]
        for k in keys:
            await repo.create(k, definition(k.stream_id), NOW)

        async def batch(n: int) -> list[list[int]]:
            # Each batch names its streams in another order: the adapter locks in one order.
            chosen = keys[n % 4 :: 2] if n % 2 else list(reversed(keys[n % 3 :]))
            results = await repo.update_many([(k, [append([record(b'"%d"' % n)])]) for k in chosen])
            return [[o.answer.first_sequence for o in r] for r in results]

        answered = await asyncio.gather(*(batch(n) for n in range(24)))
        assert all(all(len(r) == 1 for r in a) for a in answered)
        for k in keys:
            position, records = await repo.page(k, 0, 1000)
            assert [r.sequence for r in records] == list(range(1, position.head + 1))

    async def test_a_delete_in_a_batch_soft_deletes_a_forked_source_and_releases_it_later(
        self, repo
    ) -> None:
        run = new_key()
        src, _ = await repo.create(run._replace(stream_id="src"), definition("src"), NOW)
        await repo.update(src.key, [append([record(), record()])])
        src = await repo.load(src.key)
        fork_key = run._replace(stream_id="f")
        await repo.create(fork_key, forked(src, "f", 2), NOW)
        other = run._replace(stream_id="other")
        await repo.create(other, definition("other"), NOW)
        first = await repo.update_many([(src.key, [DeleteCommand(NOW)]), (other, [append()])])
        assert isinstance(first[0][0], Done) and isinstance(first[1][0], Done)
        assert (await repo.page(src.key, 0, 10))[0].soft_deleted
        assert [r.sequence for r in (await repo.page(fork_key, 0, 10))[1]] == [1, 2]
        # The fork's delete, in a batch with its source's neighbour, erases the source too.
        second = await repo.update_many([(other, [append()]), (fork_key, [DeleteCommand(NOW)])])
        assert isinstance(second[0][0], Done) and isinstance(second[1][0], Done)
        assert await repo.load(fork_key) is None and await repo.load(src.key) is None
        assert (await repo.page(other, 0, 10))[0].head == 2

    async def test_consumers_receipts_and_input_deliveries_of_a_batch_are_written_per_stream(
        self, repo
    ) -> None:
        run = new_key()
        a, b = run._replace(stream_id="a"), run._replace(stream_id="b")
        inbox = run._replace(stream_id="inbox")
        await repo.create(a, definition("a", max_unread_items=2), NOW)
        await repo.create(b, definition("b"), NOW)
        await repo.create(
            inbox, msgspec.structs.replace(definition("inbox"), direction="input"), NOW
        )
        await repo.update(a, [append([record(), record()]), AckCommand(WRITER, "gone", 0, NOW)])
        results = await repo.update_many(
            [
                (
                    a,
                    [
                        AckCommand(WRITER, "w", 2, NOW),
                        RemoveConsumerCommand("gone", NOW),
                        append(key="x"),
                    ],
                ),
                (b, [AckCommand(READER, "r", 0, NOW), append(key="x")]),
                (inbox, [append([record(), record()])]),
            ]
        )
        assert all(isinstance(o, Done) for r in results for o in r), results
        assert [c.consumer_id for c in await repo.consumers(a, None, 10)] == ["w"]
        assert [(c.consumer_id, c.acked_sequence) for c in await repo.consumers(b, None, 10)] == [
            ("r", 0)
        ]
        for k in (a, b):
            stored = await repo.load(k)
            assert Stream.replay(k, await repo.journal(k)).state == stored.state
            [again] = await repo.update(k, [append(key="x")])
            assert isinstance(again, Replayed)
        assert (await repo.page(inbox, 0, 10))[0].head == 2
