"""The wake scheduler: a notification decides the subscriptions pending on the streams it names,
every subscription is looked at only every sweep; while the database is out of reach it backs
off whatever it hears, and says so once (and once again when it can decide wakes again), not at
every notification."""

from __future__ import annotations

import asyncio
import logging

import pytest

from application.subscriptions import WakeScheduler
from application.wake import WakeRegistry
from domain.stream import StreamKey


class Unreachable:
    def __init__(self) -> None:
        self.down = True
        self.calls = 0

    async def wake_due(self, limit: int = 100, streams: object = None) -> int:
        self.calls += 1
        if self.down:
            raise ConnectionRefusedError(111, "Connection refused")
        return 0


async def test_an_outage_is_retried_with_backoff_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    wake = WakeRegistry()
    subscriptions = Unreachable()
    scheduler = WakeScheduler(subscriptions, wake, poll_seconds=0.01)  # type: ignore[arg-type]
    stopping = asyncio.Event()
    running = asyncio.create_task(scheduler.run(stopping))
    key = StreamKey("t", "r", "s")
    for _ in range(40):  # notifications every 25 ms for a second, as a polling wake bus makes
        wake.notify(key)
        await asyncio.sleep(0.025)
    # Backing off from 50 ms (jittered, doubling): a handful of attempts, not forty.
    assert 2 <= subscriptions.calls <= 8, subscriptions.calls
    assert caplog.text.count("cannot decide wakes") == 1
    subscriptions.down = False
    async with asyncio.timeout(10):
        while "can decide wakes again" not in caplog.text:
            await asyncio.sleep(0.05)
    stopping.set()
    await running


class Recording:
    """What each tick asked for: None for every subscription, else the streams notified."""

    def __init__(self, due: int = 0) -> None:
        self.asked: list[frozenset[StreamKey] | None] = []
        self.due = due

    async def wake_due(self, limit: int = 100, streams: object = None) -> int:
        self.asked.append(None if streams is None else frozenset(streams))  # type: ignore[arg-type]
        return self.due


async def test_a_notification_decides_only_its_streams_and_every_subscription_is_swept_rarely() -> (
    None
):
    wake = WakeRegistry()
    subscriptions = Recording()
    now = [0.0]
    scheduler = WakeScheduler(
        subscriptions,  # type: ignore[arg-type]
        wake,
        poll_seconds=0.01,
        sweep_seconds=5.0,
        clock=lambda: now[0],
    )
    stopping = asyncio.Event()
    running = asyncio.create_task(scheduler.run(stopping))
    await asyncio.sleep(0.05)
    a, b = StreamKey("t", "r", "a"), StreamKey("t", "r", "b")
    wake.notify(a)
    wake.notify(b)
    async with asyncio.timeout(5):
        while frozenset({a, b}) not in subscriptions.asked:
            await asyncio.sleep(0.005)
    assert subscriptions.asked[0] is None  # the first tick sweeps
    assert subscriptions.asked.count(None) == 1  # and no other, within the sweep interval
    now[0] = 5.0
    async with asyncio.timeout(5):
        while subscriptions.asked.count(None) < 2:
            await asyncio.sleep(0.005)
    stopping.set()
    await running


async def test_a_tick_that_finds_its_limit_due_sweeps_next() -> None:
    wake = WakeRegistry()
    subscriptions = Recording(due=100)  # a full tick: more may be due than it took
    scheduler = WakeScheduler(
        subscriptions,  # type: ignore[arg-type]
        wake,
        poll_seconds=0.01,
        sweep_seconds=3600.0,
        clock=lambda: 0.0,
    )
    stopping = asyncio.Event()
    running = asyncio.create_task(scheduler.run(stopping))
    async with asyncio.timeout(5):
        while len(subscriptions.asked) < 3:
            await asyncio.sleep(0.005)
    assert subscriptions.asked[:3] == [None, None, None]
    stopping.set()
    await running


class SweepFails:
    """Every look at every subscription fails (past its bound, say); ticks for the streams
    announced succeed, and say which streams they decided."""

    def __init__(self) -> None:
        self.decided: set[StreamKey] = set()
        self.sweeps = 0

    async def wake_due(self, limit: int = 100, streams: object = None) -> int:
        if streams is None:
            self.sweeps += 1
            raise TimeoutError
        self.decided |= set(streams)  # type: ignore[call-overload]
        return 0


async def test_a_sweep_that_keeps_failing_holds_up_no_announced_stream() -> None:
    """A failed sweep made the next tick a sweep again: failing at every tick, it held up
    every announced wake, of every tenant (a tenant's 10,000 pending marks, when a mark's look-up
    was a pass over every link). The streams announced are now decided between the attempts."""
    wake = WakeRegistry()
    subscriptions = SweepFails()
    scheduler = WakeScheduler(subscriptions, wake, poll_seconds=0.01)  # type: ignore[arg-type]
    stopping = asyncio.Event()
    running = asyncio.create_task(scheduler.run(stopping))
    keys = [StreamKey("t", "r", f"s{i}") for i in range(3)]
    async with asyncio.timeout(10):
        for key in keys:
            wake.notify(key)
            while key not in subscriptions.decided:
                await asyncio.sleep(0.01)
    assert subscriptions.sweeps >= 1
    stopping.set()
    await running
