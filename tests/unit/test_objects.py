"""Large objects on the memory adapters: every state transition and every refusal."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import timedelta

import msgspec
import pytest

from application import objects as objects_module
from application.access import Caller
from application.errors import Forbidden
from domain import errors
from domain.definition import DefinitionRequest
from domain.objects import ObjectRequest
from domain.records import RecordInput
from domain.stream import Stream
from entrypoints.config import Settings
from entrypoints.container import memory_container, start, stop, utc_now

SCOPES = frozenset({"streams:read", "streams:write", "streams:admin"})
ALICE = Caller(tenant="acme", principal="alice", scopes=SCOPES)
BOB = Caller(tenant="acme", principal="bob", scopes=SCOPES)
BODY = b"large body " * 1000


async def chunks(data: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def prepare_request(body: bytes = BODY, key: str = "k1", **extra) -> ObjectRequest:
    fields = {
        "idempotency_key": key,
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "content_type": "application/pdf",
        **extra,
    }
    return msgspec.convert(fields, ObjectRequest)


@pytest.fixture
async def app():
    container = memory_container()
    services = await start(container)
    definition = msgspec.convert({"direction": "output", "stream_id": "s"}, DefinitionRequest)
    await services.create_stream(ALICE, "r", definition)
    yield container, services
    await stop(container)


async def test_prepare_upload_commit_appends_a_record_that_carries_the_object(app) -> None:
    _container, s = app
    view, created = await s.objects.prepare(ALICE, "r", "s", prepare_request())
    assert created and view.state == "prepared"
    uploaded = await s.objects.upload(ALICE, "r", "s", view.object_id, chunks(BODY))
    assert uploaded.state == "uploaded"
    answer, appended = await s.objects.commit(ALICE, "r", "s", view.object_id)
    assert appended and answer.sequence == 1
    page = await s.read_records(ALICE, "r", "s")
    reference = msgspec.json.decode(bytes(page.records[0].object))
    assert reference["object_id"] == view.object_id and reference["size"] == len(BODY)
    assert page.records[0].size == len(BODY)  # credit counts the body
    body = await s.objects.download(ALICE, "r", "s", view.object_id)
    assert b"".join([c async for c in body.read()]) == BODY
    assert b"".join([c async for c in body.read(5, 100)]) == BODY[5:105]
    again, appended_again = await s.objects.commit(ALICE, "r", "s", view.object_id)
    assert (again.sequence, appended_again) == (1, False)


async def test_prepare_is_idempotent_by_key_and_refuses_other_fields(app) -> None:
    _, s = app
    first, created = await s.objects.prepare(ALICE, "r", "s", prepare_request())
    again, created_again = await s.objects.prepare(ALICE, "r", "s", prepare_request())
    assert created and not created_again and again.object_id == first.object_id
    with pytest.raises(errors.IdempotencyKeyReused):
        await s.objects.prepare(ALICE, "r", "s", prepare_request(body=b"other"))


async def test_a_body_that_does_not_match_leaves_the_intent_prepared(app) -> None:
    _, s = app
    view, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request())
    tampered = BODY[:-1] + b"X"
    with pytest.raises(errors.DigestMismatch) as refused:
        await s.objects.upload(ALICE, "r", "s", view.object_id, chunks(tampered))
    # Both digests, in the hex of the prepare's `sha256`, as a size-mismatch gives both sizes.
    assert refused.value.extra == {
        "expected": hashlib.sha256(BODY).hexdigest(),
        "received": hashlib.sha256(tampered).hexdigest(),
    }
    with pytest.raises(errors.SizeMismatch):
        await s.objects.upload(ALICE, "r", "s", view.object_id, chunks(BODY[:-1]))
    with pytest.raises(errors.SizeMismatch):
        await s.objects.upload(ALICE, "r", "s", view.object_id, chunks(BODY + b"x"))
    assert (await s.objects.describe(ALICE, "r", "s", view.object_id)).state == "prepared"
    await s.objects.upload(ALICE, "r", "s", view.object_id, chunks(BODY))


async def test_commit_before_upload_and_after_abort_are_state_conflicts(app) -> None:
    container, s = app
    view, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request())
    with pytest.raises(errors.ObjectStateConflict):
        await s.objects.commit(ALICE, "r", "s", view.object_id)
    aborted = await s.objects.abort(ALICE, "r", "s", view.object_id)
    assert aborted.state == "aborted"
    assert (await s.objects.abort(ALICE, "r", "s", view.object_id)).state == "aborted"
    with pytest.raises(errors.ObjectStateConflict):
        await s.objects.commit(ALICE, "r", "s", view.object_id)
    streams = container.streams()
    assert [d[3] for d in streams.deletions] == ["aborted"]


async def test_a_committed_object_cannot_be_aborted(app) -> None:
    _, s = app
    view, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request())
    await s.objects.upload(ALICE, "r", "s", view.object_id, chunks(BODY))
    await s.objects.commit(ALICE, "r", "s", view.object_id)
    with pytest.raises(errors.ObjectStateConflict):
        await s.objects.abort(ALICE, "r", "s", view.object_id)


async def test_an_abort_that_a_commit_overtakes_is_a_conflict_not_an_abort(
    app, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The abort finds the object open, and a commit lands before its own decision: the
    commit won (its record stays), so the abort is 409, never a 200 showing `committed`."""
    _, s = app
    view, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request())
    await s.objects.upload(ALICE, "r", "s", view.object_id, chunks(BODY))
    real = objects_module.run_one

    async def commit_first(commits, key, command):  # type: ignore[no-untyped-def]
        if isinstance(command, objects_module.AbortCommand):
            await s.objects.commit(ALICE, "r", "s", view.object_id)
        return await real(commits, key, command)

    monkeypatch.setattr(objects_module, "run_one", commit_first)
    with pytest.raises(errors.ObjectStateConflict, match="committed"):
        await s.objects.abort(ALICE, "r", "s", view.object_id)
    assert (await s.objects.describe(ALICE, "r", "s", view.object_id)).state == "committed"


async def test_only_the_preparing_principal_may_upload_commit_or_abort(app) -> None:
    _, s = app
    view, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request())
    with pytest.raises(Forbidden):
        await s.objects.upload(BOB, "r", "s", view.object_id, chunks(BODY))
    with pytest.raises(Forbidden):
        await s.objects.commit(BOB, "r", "s", view.object_id)
    with pytest.raises(Forbidden):
        await s.objects.abort(BOB, "r", "s", view.object_id)


async def test_a_closed_stream_refuses_prepare_and_commit(app) -> None:
    _, s = app
    view, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request())
    await s.objects.upload(ALICE, "r", "s", view.object_id, chunks(BODY))
    await s.close_stream(ALICE, "r", "s")
    with pytest.raises(errors.StreamClosed):
        await s.objects.commit(ALICE, "r", "s", view.object_id)
    with pytest.raises(errors.StreamClosed):
        await s.objects.prepare(ALICE, "r", "s", prepare_request(key="k2"))


async def test_only_committed_bodies_are_served(app) -> None:
    _, s = app
    view, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request())
    await s.objects.upload(ALICE, "r", "s", view.object_id, chunks(BODY))
    with pytest.raises(errors.ObjectStateConflict):
        await s.objects.download(ALICE, "r", "s", view.object_id)


async def test_the_sweeper_expires_open_intents_and_queues_their_bodies(app) -> None:
    container, s = app
    view, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request(expires_in_seconds=1))
    await s.objects.upload(ALICE, "r", "s", view.object_id, chunks(BODY))
    objects = container.objects()
    objects._clock = lambda: utc_now() + timedelta(seconds=5)  # five seconds later
    assert await objects.expire_due() == 1
    assert (await s.objects.describe(ALICE, "r", "s", view.object_id)).state == "expired"
    assert [d[3] for d in container.streams().deletions] == ["expired"]
    journal = await container.streams().journal(ALICE.key("r", "s"))
    replayed = Stream.replay(ALICE.key("r", "s"), journal)
    assert replayed.state == (await container.streams().load(ALICE.key("r", "s"))).state


async def test_the_sweeper_expires_every_due_intent_in_rounds_of_its_batch(app) -> None:
    """One batch a sweep fell behind anything above a batch of abandoned intents a sweep."""
    container, s = app
    for n in range(7):
        await s.objects.prepare(ALICE, "r", "s", prepare_request(key=f"k{n}", expires_in_seconds=1))
    objects = container.objects()
    objects._clock = lambda: utc_now() + timedelta(seconds=5)
    assert await objects.expire_due(limit=2) == 7
    assert (await s.get_stream(ALICE, "r", "s")).state.open_objects == []


async def test_an_uploaded_intent_past_its_deadline_is_not_committed(app) -> None:
    """Its deadline is to upload and commit: past it, the sweep may expire it at any moment,
    and a commit is refused as an upload is (it was accepted until the sweep came)."""
    container, s = app
    view, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request(expires_in_seconds=1))
    await s.objects.upload(ALICE, "r", "s", view.object_id, chunks(BODY))
    container.objects()._clock = lambda: utc_now() + timedelta(seconds=5)
    with pytest.raises(errors.ObjectStateConflict, match="expired"):
        await s.objects.commit(ALICE, "r", "s", view.object_id)
    assert (await s.get_stream(ALICE, "r", "s")).state.head == 0


async def test_expires_at_is_the_open_intents_deadline_and_null_once_it_is_settled(app) -> None:
    _, s = app
    view, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request(expires_in_seconds=600))
    assert view.expires_at is not None
    assert view.expires_at - view.created_at == timedelta(seconds=600)
    uploaded = await s.objects.upload(ALICE, "r", "s", view.object_id, chunks(BODY))
    assert uploaded.expires_at == view.expires_at  # the commit is still due by then
    await s.objects.commit(ALICE, "r", "s", view.object_id)
    committed = await s.objects.describe(ALICE, "r", "s", view.object_id)
    assert committed.state == "committed" and committed.expires_at is None
    other, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request(key="k2"))
    aborted = await s.objects.abort(ALICE, "r", "s", other.object_id)
    assert aborted.state == "aborted" and aborted.expires_at is None


async def test_the_stream_document_lists_the_open_intents_oldest_first(app) -> None:
    _, s = app

    async def open_objects() -> list[tuple[str, str]]:
        document = await s.get_stream(ALICE, "r", "s")
        return [(o.object_id, o.state) for o in document.state.open_objects]

    assert await open_objects() == []
    first, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request(key="a"))
    second, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request(key="b"))
    third, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request(key="c"))
    await s.objects.upload(ALICE, "r", "s", second.object_id, chunks(BODY))
    assert await open_objects() == [
        (first.object_id, "prepared"),
        (second.object_id, "uploaded"),
        (third.object_id, "prepared"),
    ]
    document = await s.get_stream(ALICE, "r", "s")
    view = document.state.open_objects[0]
    assert (view.size, view.content_type, view.expires_at) == (
        len(BODY),
        "application/pdf",
        first.expires_at,
    )
    await s.objects.commit(ALICE, "r", "s", second.object_id)
    await s.objects.abort(ALICE, "r", "s", first.object_id)
    assert await open_objects() == [(third.object_id, "prepared")]


async def test_a_prepare_pledges_its_size_against_the_total_ceiling_with_the_open_ones() -> None:
    container = memory_container()
    s = await start(container)
    try:
        definition = msgspec.convert(
            {"direction": "output", "stream_id": "t", "limits": {"max_total_bytes": 2500}},
            DefinitionRequest,
        )
        await s.create_stream(ALICE, "r", definition)
        small = b"x" * 1000
        await s.objects.prepare(ALICE, "r", "t", prepare_request(small, key="a"))
        await s.objects.prepare(ALICE, "r", "t", prepare_request(small, key="b"))
        with pytest.raises(errors.QuotaExhausted) as refused:
            await s.objects.prepare(ALICE, "r", "t", prepare_request(small, key="c"))
        assert refused.value.extra["pledged_bytes"] == 2000
        # 402 bytes stored (the JSON string and its quotes)
        await s.append_records(
            ALICE, "r", "t", [RecordInput(data=msgspec.Raw(msgspec.json.encode("y" * 400)))]
        )
        fits, _ = await s.objects.prepare(ALICE, "r", "t", prepare_request(b"z" * 98, key="d"))
        document = await s.get_stream(ALICE, "r", "t")
        assert (document.state.open_objects_count, document.state.open_objects_bytes) == (3, 2098)
        # The same request again is answered, though nothing more would fit now.
        again, created = await s.objects.prepare(ALICE, "r", "t", prepare_request(small, key="a"))
        assert not created and again.state == "prepared"
        assert fits.state == "prepared"
    finally:
        await stop(container)


async def test_a_stream_has_at_most_the_configured_open_intents() -> None:
    container = memory_container(Settings(max_open_objects_per_stream=2))
    s = await start(container)
    try:
        definition = msgspec.convert({"direction": "output", "stream_id": "s"}, DefinitionRequest)
        await s.create_stream(ALICE, "r", definition)
        first, _ = await s.objects.prepare(ALICE, "r", "s", prepare_request(key="a"))
        await s.objects.prepare(BOB, "r", "s", prepare_request(key="b"))
        with pytest.raises(errors.TooManyOpenObjects) as refused:
            await s.objects.prepare(ALICE, "r", "s", prepare_request(key="c"))
        assert refused.value.extra == {"open_objects": 2, "max_open_objects": 2}
        await s.objects.upload(ALICE, "r", "s", first.object_id, chunks(BODY))
        with pytest.raises(errors.TooManyOpenObjects):  # uploaded is still open
            await s.objects.prepare(ALICE, "r", "s", prepare_request(key="c"))
        await s.objects.commit(ALICE, "r", "s", first.object_id)
        await s.objects.prepare(ALICE, "r", "s", prepare_request(key="c"))
    finally:
        await stop(container)


async def test_open_intents_page_oldest_first_and_resume_after_one_that_closed(app) -> None:
    _, s = app
    prepared = [
        (await s.objects.prepare(ALICE, "r", "s", prepare_request(key=f"k{n}")))[0].object_id
        for n in range(5)
    ]
    first = await s.list_objects(ALICE, "r", "s", None, 2)
    assert [o.object_id for o in first.objects] == prepared[:2]
    assert first.next_after == prepared[1]
    await s.objects.abort(ALICE, "r", "s", prepared[1])
    rest = await s.list_objects(ALICE, "r", "s", first.next_after, 10)
    assert [o.object_id for o in rest.objects] == prepared[2:] and rest.next_after is None
    with pytest.raises(errors.CursorUnknown):
        await s.list_objects(ALICE, "r", "s", "obj-none", 10)
    with pytest.raises(errors.InvalidInput):
        await s.list_objects(ALICE, "r", "s", None, 0)
