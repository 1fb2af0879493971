"""A DBOS system database that accepts connections and never answers: each send is given up
after its bound, as a PublishFailed whose reason says so, and the silent sends hold neither the
event loop's shared executor nor the sends beyond their bound."""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec

from adapters.wait_service.dbos import DbosWaitService
from application.input_delivery import PublishFailed


class SilentClient:
    """DBOSClient's `send`, on a database that never answers (until `release`)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.sends = 0

    def send(self, *args: object, **kwargs: object) -> None:
        self.sends += 1
        self.release.wait(30)

    def destroy(self) -> None:
        pass


def event(run: str) -> bytes:
    return msgspec.json.encode({"tenant": "t", "run_id": run, "stream_id": "s", "sequence": 1})


async def test_a_silent_system_database_is_a_publish_failed_within_the_bound() -> None:
    client = SilentClient()
    service = DbosWaitService("postgresql://unused", client=client, send_timeout=0.3)
    try:
        started = time.monotonic()
        # More sends than the adapter has threads: each is given up on at its bound.
        outcomes = await asyncio.gather(
            *(service.publish(f"wds:t:r{i}:s:1", event(f"r{i}")) for i in range(12)),
            return_exceptions=True,
        )
        elapsed = time.monotonic() - started
        assert all(isinstance(o, PublishFailed) for o in outcomes), outcomes
        assert "did not answer within 0.3 s" in str(outcomes[0])
        assert elapsed < 3, elapsed
        # The loop's shared executor is free meanwhile.
        assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), 2) == 42
    finally:
        client.release.set()
        await service.close()
