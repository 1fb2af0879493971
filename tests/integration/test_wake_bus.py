"""The LISTEN wake bus on real PostgreSQL: lost notifications and lost connections are repaired."""

from __future__ import annotations

import asyncio
import secrets

import asyncpg
import pytest

from adapters.postgres.streams import PostgresStreams
from adapters.postgres.tokens import PostgresTokens
from adapters.postgres.wake_bus import PostgresWakeBus
from adapters.webhook_signing import PostgresKeyRows, WebhookKeys
from application.access import SCOPES, Caller
from application.delete_stream import DeleteCommand
from application.live import LiveTails, RecordsDelivered, StreamGone
from application.tokens import TokenCache, token_hash, token_id
from application.wake import WakeRegistry
from tests.support.builders import NOW, append, definition, new_key
from tests.support.partition_proxy import PartitionProxy


@pytest.fixture
async def bus(database_url: str):
    registry = WakeRegistry()
    bus = PostgresWakeBus(
        database_url,
        registry,
        head_check_seconds=0.3,
        application_name="ds-test-bus-" + secrets.token_hex(3),
    )
    await bus.start()
    yield bus, registry
    await bus.stop()


async def test_a_commit_wakes_a_listener_through_notify(pool: asyncpg.Pool, bus) -> None:
    bus, registry = bus
    streams = PostgresStreams(pool)
    key = new_key()
    await streams.create(key, definition(), NOW)
    with registry.listen(key) as listener:
        await streams.update(key, [append()])
        assert await listener.wait(5)
    assert bus.gaps_repaired == 0


async def test_a_lost_notification_is_repaired_by_the_head_check_and_written_down(
    pool: asyncpg.Pool, bus
) -> None:
    bus, registry = bus
    streams = PostgresStreams(pool)
    key = new_key()
    await streams.create(key, definition(), NOW)
    tails = LiveTails(streams, registry)
    follow = tails.follow(key, 0, 5.0)
    waiting = asyncio.ensure_future(anext(follow))
    await asyncio.sleep(0.5)  # the stream is followed and its head known to the bus
    bus.drop = lambda k: k == key
    await streams.update(key, [append()])
    delivery = await asyncio.wait_for(waiting, 5)  # within a head-check interval or so
    assert isinstance(delivery, RecordsDelivered)
    assert [r.sequence for r in delivery.records] == [1]
    async with asyncio.timeout(5):
        while True:
            rows = await pool.fetch(
                "SELECT expected, seen, detected_by FROM gap_evidence "
                "WHERE tenant = $1 AND run_id = $2 AND stream_id = $3",
                *key,
            )
            if rows:
                break
            await asyncio.sleep(0.1)
    assert [tuple(r) for r in rows] == [(1, 1, "head-check")]
    await follow.aclose()


async def test_after_its_connection_is_killed_the_bus_reconnects_and_rereads(
    pool: asyncpg.Pool, bus
) -> None:
    bus, registry = bus
    streams = PostgresStreams(pool)
    key = new_key()
    await streams.create(key, definition(), NOW)
    with registry.listen(key) as listener:
        await asyncio.sleep(0.5)
        await pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            bus._application_name,
        )
        await streams.update(key, [append()])  # committed while nobody listens
        assert await listener.wait(10)
        async with asyncio.timeout(10):
            while bus.reconnects < 1:
                await asyncio.sleep(0.05)
        await streams.update(key, [append()])
        assert await listener.wait(5)  # notifications flow again


async def test_a_deletion_is_heard_by_listeners_and_drops_the_kept_definition(
    pool: asyncpg.Pool, bus
) -> None:
    bus, registry = bus
    here, there = PostgresStreams(pool), PostgresStreams(pool, registry)  # two "replicas"
    key = new_key()
    await here.create(key, definition(), NOW)
    assert await there.definition(key) == definition()  # kept by the other one
    with registry.listen(key) as listener:
        await here.update(key, [DeleteCommand(NOW)])
        assert await listener.wait(5) and listener.deleted
    await here.create(key, definition(max_unread_items=3), NOW)
    assert (await there.definition(key)).limits.max_unread_items == 3


async def test_a_lost_deleted_notification_is_noticed_by_the_head_check(
    pool: asyncpg.Pool, bus
) -> None:
    bus, registry = bus
    streams = PostgresStreams(pool)
    key = new_key()
    await streams.create(key, definition(), NOW)
    tails = LiveTails(streams, registry, recheck_seconds=60)  # only the bus can tell the tail
    follow = tails.follow(key, 0, 60.0)
    waiting = asyncio.ensure_future(anext(follow))
    await asyncio.sleep(0.5)  # followed, and known to the bus
    bus.drop = lambda k: k == key
    await streams.update(key, [DeleteCommand(NOW)])
    assert await asyncio.wait_for(waiting, 5) == StreamGone()
    await follow.aclose()


async def test_a_revocation_missed_while_disconnected_ends_the_open_connections_on_reconnect(
    pool: asyncpg.Pool, database_url: str
) -> None:
    cache = TokenCache()
    bus = PostgresWakeBus(
        database_url,
        WakeRegistry(),
        head_check_seconds=0.3,
        application_name="ds-test-bus-" + secrets.token_hex(3),
        tokens=cache,
    )
    await bus.start()
    try:
        doomed, kept = ("dst_" + secrets.token_hex(8) for _ in range(2))
        leases = {}
        for token in (doomed, kept):
            caller = Caller("t1", "p", frozenset(SCOPES), token_id=token_id(token_hash(token)))
            await PostgresTokens(pool).put(token_hash(token), caller)
            leases[token] = cache.hold(caller)
        # Revoked without the notification, as if it went to a bus that was not connected.
        await pool.execute(
            "UPDATE api_tokens SET revoked_at = now() WHERE token_id = $1",
            token_id(token_hash(doomed)),
        )
        await pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            bus._application_name,
        )
        async with asyncio.timeout(10):
            while not leases[doomed].ended:
                await asyncio.sleep(0.05)
        assert not leases[kept].ended
    finally:
        await bus.stop()


async def test_a_key_rotation_elsewhere_is_signed_with_at_once(
    pool: asyncpg.Pool, database_url: str
) -> None:
    """Another process (the `webhook-key rotate` command) rotates the signing key: this one
    hears it on the bus and signs with the new key at its next use, not up to 30 s later."""
    ours, theirs = WebhookKeys(PostgresKeyRows(pool)), WebhookKeys(PostgresKeyRows(pool))
    heard: list[None] = []

    def changed() -> None:
        heard.append(None)
        ours.forget()

    bus = PostgresWakeBus(
        database_url,
        WakeRegistry(),
        application_name="ds-test-bus-" + secrets.token_hex(3),
        keys_changed=changed,
    )
    await bus.start()
    try:
        await ours.kid()  # loaded now: without the announcement, kept for 30 s
        connected = len(heard)  # (the bus forgets them once as it connects)
        kid = await theirs.rotate()
        async with asyncio.timeout(5):
            while len(heard) == connected:
                await asyncio.sleep(0.02)
        assert await ours.kid() == kid
        assert kid in {k["kid"] for k in (await ours.jwks())["keys"]}
    finally:
        await bus.stop()


async def test_a_quiet_bus_stays_live_on_its_heartbeats(bus) -> None:
    bus, _ = bus
    await asyncio.sleep(3)  # nothing committed: only heartbeats are heard
    assert bus.live
    assert bus.not_live_episodes == 0 and bus.replacements == 0 and bus.reconnects == 0


async def test_the_head_check_repairs_on_the_pool_while_the_listen_connection_is_silent(
    pool: asyncpg.Pool, database_url: str
) -> None:
    registry = WakeRegistry()
    with PartitionProxy(database_url) as proxy:
        bus = PostgresWakeBus(
            proxy.url(database_url),  # LISTEN through the proxy; the repairs on `pool`
            registry,
            head_check_seconds=0.3,
            application_name="ds-test-bus-" + secrets.token_hex(3),
            pool=pool,
            dead_seconds=60,  # not replaced during the test
        )
        await bus.start()
        try:
            streams = PostgresStreams(pool)
            key = new_key()
            await streams.create(key, definition(), NOW)
            with registry.listen(key):
                await asyncio.sleep(0.5)  # followed, its head known to the head check
                [silenced] = proxy.freeze_listen()
                await streams.update(key, [append()])  # its notification is held
                async with asyncio.timeout(5):
                    while not await pool.fetchval(
                        "SELECT count(*) FROM gap_evidence WHERE tenant = $1 AND run_id = $2"
                        " AND stream_id = $3 AND detected_by = 'head-check'",
                        *key,
                    ):
                        await asyncio.sleep(0.1)
                assert silenced.frozen and bus.replacements == 0
                async with asyncio.timeout(3):  # and the silence is noticed: followers poll
                    while bus.live:
                        await asyncio.sleep(0.05)
        finally:
            proxy.heal()
            await bus.stop()
