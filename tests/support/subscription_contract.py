"""The subscription store's contract (application.subscriptions.SubscriptionStore), held through
the use cases on every adapter: a subclass provides the fixture `app`, a container's built
services (`Services`) and its store, over one adapter's streams.

Each test uses subscription and run IDs of its own, so a shared database is fine."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import msgspec
import pytest

from application.access import Caller
from application.subscriptions import (
    WAKE_EVENT,
    WEBHOOK,
    AckRequest,
    SubscriptionStore,
    job_key,
)
from application.workers import Job
from domain.definition import DefinitionRequest
from domain.errors import InvalidInput
from domain.records import RecordInput
from domain.subscriptions import (
    AlreadyClaimed,
    Fenced,
    NoPendingWork,
    StreamPath,
    SubscriptionConflict,
    SubscriptionNotFound,
    SubscriptionRequest,
    WakeTokenInvalid,
    WebhookConfig,
    WrongSubscriptionType,
    configure,
)

ALL = frozenset({"streams:read", "streams:write", "streams:admin"})
ADMIN = Caller(tenant="acme", principal="alice", scopes=ALL)
OTHER = Caller(tenant="evil", principal="eve", scopes=ALL)
WRITER = Caller(tenant="acme", principal="alice", scopes=frozenset({"streams:write"}))
BASE = "http://127.0.0.1:1/api/durable-streams/v1/stream"


def uid(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def webhook(pattern: str | None = None, streams: list[str] | None = None, ttl: int = 1000) -> Any:
    return configure(
        SubscriptionRequest(
            type="webhook",
            pattern=pattern,
            streams=streams,
            webhook=WebhookConfig(url="https://hooks.example/hook"),  # (never delivered)
            lease_ttl_ms=ttl,
        )
    )


def pull_wake(pattern: str, wake: str, ttl: int = 1000) -> Any:
    return configure(
        SubscriptionRequest(type="pull-wake", pattern=pattern, wake_stream=wake, lease_ttl_ms=ttl)
    )


async def create(services: Any, caller: Caller, run: str, stream: str) -> None:
    body = b'{"direction":"output","stream_id":"%s"}' % stream.encode()
    await services.create_stream(caller, run, msgspec.json.decode(body, type=DefinitionRequest))


async def append(services: Any, caller: Caller, run: str, stream: str, n: int = 1) -> None:
    records = [RecordInput(data=msgspec.Raw(b'{"n":%d}' % i)) for i in range(n)]
    await services.append_records(caller, run, stream, records)


def delivery_job(tenant: str, subscription_id: str, generation: int) -> Job:
    return Job(key=job_key(tenant, subscription_id), attempts=0, id=generation)


class SubscriptionStoreContract:
    async def test_pull_wakes_that_would_wake_each_other_in_a_ring_are_refused(
        self, app: tuple[Any, SubscriptionStore]
    ) -> None:
        """The store hands the tenant's pull-wake subscriptions, with what each watches (its
        pattern and the streams linked by name since), to the decision: a ring is refused."""
        services, _ = app
        run, a, b, web = uid("run"), uid("a"), uid("b"), uid("web")
        await services.subscriptions.put(ADMIN, a, pull_wake(f"{run}/x*", f"{run}/wa"), BASE)
        # A webhook watching `wa` writes nothing: no ring, and it is no watcher for b.
        await services.subscriptions.put(ADMIN, web, webhook(f"{run}/w*"), BASE)
        await services.subscriptions.put(ADMIN, b, pull_wake(f"{run}/wa", f"{run}/wb"), BASE)
        # Another tenant's subscription naming acme's paths is no part of acme's ring.
        await services.subscriptions.put(OTHER, a, pull_wake(f"{run}/w*", f"{run}/xo"), BASE)
        with pytest.raises(InvalidInput, match="wake each other"):
            await services.subscriptions.add_streams(ADMIN, a, (StreamPath(run, "wb"),))
        await services.subscriptions.add_streams(ADMIN, a, (StreamPath(run, "other"),))
        c = uid("c")
        with pytest.raises(InvalidInput, match="wake each other"):
            await services.subscriptions.put(ADMIN, c, pull_wake(f"{run}/wb", f"{run}/xc"), BASE)
        await services.subscriptions.put(ADMIN, c, pull_wake(f"{run}/wb", f"{run}/yc"), BASE)
        # Named by a: c's wake event would wake a, whose wake wakes b, whose wake wakes c.
        with pytest.raises(InvalidInput, match="wake each other"):
            await services.subscriptions.add_streams(ADMIN, a, (StreamPath(run, "yc"),))
        sub, _ = await services.subscriptions.get(ADMIN, a)
        assert StreamPath(run, "yc") not in {k.path for k in sub.links}

    async def test_a_ring_through_a_stream_linked_before_it_was_a_wake_stream_is_refused(
        self, app: tuple[Any, SubscriptionStore]
    ) -> None:
        """x links `wy` by name while no subscription writes there; y, made with `wy` as its
        wake stream and watching x's, would close the ring. An unlinked stream is watched no
        more: once x unlinks `wy`, y is served."""
        services, _ = app
        run, x, y = uid("run"), uid("x"), uid("y")
        await services.subscriptions.put(ADMIN, x, pull_wake(f"{run}/s*", f"{run}/wx"), BASE)
        await services.subscriptions.add_streams(ADMIN, x, (StreamPath(run, "wy"),))
        closing = configure(
            SubscriptionRequest(type="pull-wake", streams=[f"{run}/wx"], wake_stream=f"{run}/wy")
        )
        with pytest.raises(InvalidInput, match="wake each other"):
            await services.subscriptions.put(ADMIN, y, closing, BASE)
        await services.subscriptions.remove_stream(ADMIN, x, StreamPath(run, "wy"))
        _, _, made = await services.subscriptions.put(ADMIN, y, closing, BASE)
        assert made

    async def test_a_put_creates_then_reconfirms_and_a_different_configuration_conflicts(
        self, app: tuple[Any, SubscriptionStore]
    ) -> None:
        services, _ = app
        sid = uid("sub")
        _, _, created = await services.subscriptions.put(ADMIN, sid, webhook("r/*"), BASE)
        _, _, again = await services.subscriptions.put(ADMIN, sid, webhook("r/*"), BASE)
        assert (created, again) == (True, False)
        with pytest.raises(SubscriptionConflict):
            await services.subscriptions.put(ADMIN, sid, webhook("r/x*"), BASE)

    async def test_existing_streams_link_at_their_tail_and_new_ones_from_their_start(
        self, app: tuple[Any, SubscriptionStore]
    ) -> None:
        services, store = app
        run = uid("run")
        await create(services, ADMIN, run, "old")
        await append(services, ADMIN, run, "old", 3)
        sid = uid("sub")
        await services.subscriptions.put(ADMIN, sid, webhook(f"{run}/*"), BASE)
        sub, heads = await services.subscriptions.get(ADMIN, sid)
        assert [(k.path, k.acked) for k in sub.links] == [(StreamPath(run, "old"), 3)]
        assert not sub.has_pending(heads)
        assert (ADMIN.tenant, sid) not in await store.due(1000)
        await create(services, ADMIN, run, "new")
        await append(services, ADMIN, run, "new", 2)
        sub, heads = await services.subscriptions.get(ADMIN, sid)
        new = sub.link(StreamPath(run, "new"))
        assert new is not None and (new.acked, new.glob, new.explicit) == (0, True, False)
        assert (ADMIN.tenant, sid) in await store.due(1000)
        # Asked about the streams a notification named: due for `new`, not for `old` alone.
        key = ADMIN.key(run, "new")
        assert (ADMIN.tenant, sid) in await store.due(1000, [key])
        assert (ADMIN.tenant, sid) not in await store.due(1000, [ADMIN.key(run, "old")])
        assert (ADMIN.tenant, sid) not in await store.due(1000, [])

    async def test_a_wake_is_issued_once_with_its_delivery_and_done_acks_its_snapshot(
        self, app: tuple[Any, SubscriptionStore]
    ) -> None:
        services, store = app
        run, sid = uid("run"), uid("sub")
        await services.subscriptions.put(ADMIN, sid, webhook(f"{run}/*"), BASE)
        await create(services, ADMIN, run, "s")
        await append(services, ADMIN, run, "s", 2)
        assert await store.update(ADMIN.tenant, sid, services.subscriptions.tick) is True
        assert await store.update(ADMIN.tenant, sid, services.subscriptions.tick) is False
        sub, _ = await services.subscriptions.get(ADMIN, sid)
        assert sub.wake is not None and sub.generation == 1
        delivery = await store.delivery(delivery_job(ADMIN.tenant, sid, 1))
        assert delivery is not None and delivery.kind == WEBHOOK
        body = msgspec.json.decode(delivery.payload)
        assert body["wake_id"] == sub.wake.wake_id and body["generation"] == 1
        assert body["streams"][0]["tail_offset"].endswith("2")
        token = body["callback_token"]
        acks = [AckRequest(StreamPath(run, "s"), 2)]
        # The callback token sent to the pull-wake ack is told the subscription's type.
        with pytest.raises(WrongSubscriptionType):
            await services.subscriptions.callback(
                token, sid, 1, sub.wake.wake_id, acks, True, WAKE_EVENT
            )
        woke = await services.subscriptions.callback(
            token, sid, 1, sub.wake.wake_id, acks, True, WEBHOOK
        )
        assert woke is False
        sub, _ = await services.subscriptions.get(ADMIN, sid)
        assert sub.wake is None and sub.links[0].acked == 2
        with pytest.raises(Fenced):  # the same callback again: its wake is over
            await services.subscriptions.callback(
                token, sid, 1, body["wake_id"], acks, True, WEBHOOK
            )
        with pytest.raises(WrongSubscriptionType):  # sent to the pull-wake ack: not fenced
            await services.subscriptions.callback(
                token, sid, 1, body["wake_id"], acks, True, WAKE_EVENT
            )
        with pytest.raises(WakeTokenInvalid):
            await services.subscriptions.callback(
                token[:-2] + "xx", sid, 1, body["wake_id"], acks, True, WEBHOOK
            )

    async def test_pull_wake_claims_are_exclusive_and_a_lapsed_lease_is_taken_over(
        self, app: tuple[Any, SubscriptionStore]
    ) -> None:
        services, store = app
        run, sid = uid("run"), uid("pull")
        await create(services, ADMIN, run, "wake")
        await services.subscriptions.put(ADMIN, sid, pull_wake(f"{run}/e*", f"{run}/wake"), BASE)
        with pytest.raises(NoPendingWork):
            await services.subscriptions.claim(WRITER, sid, "w1")
        await create(services, ADMIN, run, "e1")
        await append(services, ADMIN, run, "e1")
        results = await asyncio.gather(
            services.subscriptions.claim(WRITER, sid, "w1"),
            services.subscriptions.claim(WRITER, sid, "w2"),
            return_exceptions=True,
        )
        won = [r for r in results if not isinstance(r, BaseException)]
        lost = [r for r in results if isinstance(r, AlreadyClaimed)]
        assert len(won) == 1 and len(lost) == 1
        sub, _, token = won[0]
        assert sub.wake is not None
        assert lost[0].extra["current_holder"] == sub.wake.holder
        event = await store.delivery(delivery_job(ADMIN.tenant, sid, sub.generation))
        assert event is not None and event.kind == WAKE_EVENT
        await asyncio.sleep(1.1)  # the 1 s lease runs out: another worker takes over
        sub2, _, token2 = await services.subscriptions.claim(WRITER, sid, "w3")
        assert sub2.wake is not None and sub2.generation == sub.generation + 1
        with pytest.raises(Fenced):
            await services.subscriptions.release(token, sid, sub.generation, sub.wake.wake_id)
        await services.subscriptions.release(token2, sid, sub2.generation, sub2.wake.wake_id)
        again, _ = await services.subscriptions.get(ADMIN, sid)
        assert again.wake is not None and again.generation == sub2.generation + 1  # still pending

    async def test_explicit_links_come_and_go_and_a_glob_link_stays(
        self, app: tuple[Any, SubscriptionStore]
    ) -> None:
        services, _ = app
        run, sid = uid("run"), uid("sub")
        await create(services, ADMIN, run, "g")
        await services.subscriptions.put(ADMIN, sid, webhook(f"{run}/*"), BASE)
        both = (StreamPath(run, "g"), StreamPath(run, "x"))
        await services.subscriptions.add_streams(ADMIN, sid, both)
        sub, _ = await services.subscriptions.get(ADMIN, sid)
        assert [(k.path.stream_id, k.link_type) for k in sub.links] == [
            ("g", "explicit"),
            ("x", "explicit"),
        ]
        for path in both:
            await services.subscriptions.remove_stream(ADMIN, sid, path)
        sub, _ = await services.subscriptions.get(ADMIN, sid)
        assert [(k.path.stream_id, k.link_type) for k in sub.links] == [("g", "glob")]

    async def test_a_subscription_is_its_tenants_alone_and_gone_when_deleted(
        self, app: tuple[Any, SubscriptionStore]
    ) -> None:
        services, _ = app
        run, sid = uid("run"), uid("sub")
        await create(services, OTHER, run, "theirs")
        await services.subscriptions.put(ADMIN, sid, webhook(f"{run}/*"), BASE)
        sub, _ = await services.subscriptions.get(ADMIN, sid)
        assert sub.links == ()  # another tenant's stream of the same path is never linked
        with pytest.raises(SubscriptionNotFound):
            await services.subscriptions.get(OTHER, sid)
        with pytest.raises(SubscriptionNotFound):
            await services.subscriptions.delete(OTHER, sid)
        await services.subscriptions.delete(ADMIN, sid)
        with pytest.raises(SubscriptionNotFound):
            await services.subscriptions.get(ADMIN, sid)

    async def test_a_wake_names_a_few_pending_streams_each_in_its_turn(
        self, app: tuple[Any, SubscriptionStore], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A decision reads the links with pending work, a few at a time (WAKE_STREAMS; 3
        here), never all: a wake names those, its `done` acknowledges them, and the next wake
        names the next ones, even while the first keep growing. A linked stream with nothing
        pending is in no wake, and `get` still shows it."""
        services, store = app
        monkeypatch.setattr(store, "_wake_streams", 3)
        run, sid = uid("run"), uid("sub")
        names = [f"s{i}" for i in range(6)]
        for name in names:
            await create(services, ADMIN, run, name)
        await services.subscriptions.put(ADMIN, sid, webhook(f"{run}/*"), BASE)
        for name in names[:5]:
            await append(services, ADMIN, run, name)

        async def woken(generation: int) -> tuple[list[tuple[str, str]], str, str]:
            delivery = await store.delivery(delivery_job(ADMIN.tenant, sid, generation))
            assert delivery is not None
            body = msgspec.json.decode(delivery.payload)
            assert all(s["has_pending"] for s in body["streams"])
            named = [(s["path"].split("/")[1], s["tail_offset"][-1]) for s in body["streams"]]
            return named, body["callback_token"], body["wake_id"]

        def acks(named: list[tuple[str, str]]) -> list[AckRequest]:
            return [AckRequest(StreamPath(run, name), int(tail)) for name, tail in named]

        assert await store.update(ADMIN.tenant, sid, services.subscriptions.tick) is True
        first, token, wake = await woken(1)
        assert first == [("s0", "1"), ("s1", "1"), ("s2", "1")]
        await append(services, ADMIN, run, "s0")  # grows before the next wake
        assert await services.subscriptions.callback(
            token, sid, 1, wake, acks(first), True, WEBHOOK
        )
        second, token, wake = await woken(2)
        assert second == [("s0", "2"), ("s3", "1"), ("s4", "1")]
        assert not await services.subscriptions.callback(
            token, sid, 2, wake, acks(second), True, WEBHOOK
        )
        sub, heads = await services.subscriptions.get(ADMIN, sid)
        assert [(k.path.stream_id, k.acked) for k in sub.links] == [
            ("s0", 2),
            ("s1", 1),
            ("s2", 1),
            ("s3", 1),
            ("s4", 1),
            ("s5", 0),
        ]
        assert sub.wake is None and not sub.has_pending(heads)

    async def test_a_claim_shows_the_streams_of_its_wake(
        self, app: tuple[Any, SubscriptionStore]
    ) -> None:
        """A claim names what its wake names: the streams with pending work, not every stream
        the subscription links."""
        services, _ = app
        run, sid = uid("run"), uid("pull")
        for name in ("wake", "e0", "e1", "e2"):
            await create(services, ADMIN, run, name)
        await services.subscriptions.put(ADMIN, sid, pull_wake(f"{run}/e*", f"{run}/wake"), BASE)
        await append(services, ADMIN, run, "e1", 2)
        sub, heads, token = await services.subscriptions.claim(WRITER, sid, "w1")
        assert [s.path.stream_id for s in sub.streams(heads)] == ["e1"]
        assert sub.wake is not None
        await services.subscriptions.callback(
            token,
            sid,
            sub.generation,
            sub.wake.wake_id,
            [AckRequest(StreamPath(run, "e1"), 2)],
            True,
            WAKE_EVENT,
        )
        shown, heads = await services.subscriptions.get(ADMIN, sid)
        assert [(k.path.stream_id, k.acked) for k in shown.links] == [
            ("e0", 0),
            ("e1", 2),
            ("e2", 0),
        ]
        assert shown.wake is None
