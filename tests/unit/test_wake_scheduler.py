"""The wake scheduler while the database is out of reach: it backs off whatever it hears, and
says so once (and once again when it can decide wakes again), not at every notification."""

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

    async def wake_due(self) -> int:
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
