"""Live delivery over Server-Sent Events, end to end against real server processes
(docs/http-api.md "Subscribe"; seed "Exact cursor rule" and "Continuity loop").

Every read here is bounded in time, so a delivery bug fails a test instead of hanging it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from httpx_sse import ServerSentEvent, aconnect_sse

PROBLEM_JSON = "application/problem+json"
EVENT_STREAM = "text/event-stream"
LISTEN_APP = "ductor-streams-listen"
SUBSCRIPTION_CAP = 50  # DUCTOR_STREAMS_MAX_SUBSCRIPTIONS_PER_PRINCIPAL of the test servers
HEAD_CHECK_SECONDS = 0.5  # DUCTOR_STREAMS_HEAD_CHECK_SECONDS of the test servers


# -- helpers --------------------------------------------------------------------------------------


def path(run_id: str, stream_id: str, tail: str = "") -> str:
    return f"/runs/{run_id}/streams/{stream_id}{tail}"


async def create(api: httpx.AsyncClient, run_id: str, stream_id: str = "s", **extra: Any) -> None:
    response = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "output", **extra}
    )
    assert response.status_code == 201, response.text


async def append(api: httpx.AsyncClient, run_id: str, stream_id: str, *data: Any) -> dict:
    response = await api.post(
        path(run_id, stream_id, "/records"), json={"records": [{"data": d} for d in data]}
    )
    assert response.status_code == 201, response.text
    return response.json()


async def close(api: httpx.AsyncClient, run_id: str, stream_id: str) -> None:
    response = await api.post(path(run_id, stream_id, "/close"))
    assert response.status_code == 200, response.text


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON), response.headers
    body = response.json()
    for field in ("type", "title", "status", "detail", "code"):
        assert field in body, body
    assert body["status"] == status
    assert body["code"] == code, body
    return body


async def subscribe_answer(
    client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    """The answer of a subscribe that must fail before streaming: status, headers and a body that
    ends (a bug that starts streaming instead fails on the timeout, not by hanging)."""
    async with asyncio.timeout(10):
        async with client.stream("GET", url, headers=headers) as response:
            await response.aread()
            return response


def records_of(events: list[ServerSentEvent]) -> list[ServerSentEvent]:
    return [e for e in events if e.event == "record"]


def ids_of(events: list[ServerSentEvent]) -> list[int]:
    return [int(e.id) for e in records_of(events)]


class Subscriber:
    """One SSE subscription read in a background task: every event in arrival order, with the
    time it arrived, and whether the response ended by itself."""

    def __init__(
        self, client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None
    ) -> None:
        self.client = client
        self.url = url
        self.headers = headers or {}
        self.events: list[ServerSentEvent] = []
        self.arrived: dict[int, float] = {}  # record id -> monotonic arrival time
        self.response: httpx.Response | None = None
        self.body: bytes = b""
        self.opened = asyncio.Event()
        self.ended = False  # the server ended the response
        self.task: asyncio.Task[None] = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async with aconnect_sse(self.client, "GET", self.url, headers=self.headers) as source:
                self.response = source.response
                if source.response.status_code != 200:
                    self.body = await source.response.aread()
                    self.opened.set()
                    self.ended = True
                    return
                self.opened.set()
                async for event in source.aiter_sse():
                    self.events.append(event)
                    if event.event == "record":
                        self.arrived[int(event.id)] = time.monotonic()
                self.ended = True
        finally:
            self.opened.set()

    @property
    def ids(self) -> list[int]:
        return ids_of(self.events)

    async def status(self, timeout: float = 10) -> int:
        async with asyncio.timeout(timeout):
            await self.opened.wait()
        if self.task.done() and self.task.exception() is not None:
            raise self.task.exception()  # type: ignore[misc]
        assert self.response is not None
        return self.response.status_code

    async def until(self, condition: Any, timeout: float, what: str = "") -> None:
        """Wait until `condition(self)` holds, failing with what was received so far."""
        deadline = time.monotonic() + timeout
        while not condition(self):
            if self.task.done() and self.task.exception() is not None:
                raise self.task.exception()  # type: ignore[misc]
            if self.task.done() and not condition(self):
                break
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        others = [(e.event, e.data) for e in self.events if e.event != "record"]
        assert condition(self), (
            f"{what or 'condition'} not met within {timeout}s on {self.url}: "
            f"ids={self.ids} other events={others} ended={self.ended}"
        )

    async def until_ids(self, last: int, timeout: float = 15) -> None:
        await self.until(lambda s: bool(s.ids) and s.ids[-1] >= last, timeout, f"ids up to {last}")

    async def until_ended(self, timeout: float = 15) -> None:
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self.task)
        except TimeoutError:
            pytest.fail(
                f"response on {self.url} did not end within {timeout}s: ids={self.ids} "
                f"events={[(e.event, e.data) for e in self.events if e.event != 'record']}"
            )
        assert self.ended

    async def disconnect(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


class Subscribers:
    """Opens subscribers and disconnects whatever is left open when the test ends."""

    def __init__(self) -> None:
        self.open: list[Subscriber] = []

    def __call__(
        self, client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None
    ) -> Subscriber:
        subscriber = Subscriber(client, url, headers)
        self.open.append(subscriber)
        return subscriber

    async def disconnect_all(self) -> None:
        await asyncio.gather(*(s.disconnect() for s in self.open))


@pytest.fixture
async def subscribers() -> AsyncIterator[Subscribers]:
    opened = Subscribers()
    try:
        yield opened
    finally:
        await opened.disconnect_all()


def wide_client(base: httpx.AsyncClient, token: str | None = None) -> httpx.AsyncClient:
    """A client like `base` with room for many concurrent streaming connections."""
    headers = dict(base.headers)  # (its names in lower case)
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return httpx.AsyncClient(
        base_url=base.base_url,
        headers=headers,
        timeout=30,
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
    )


def assert_exact(events: list[ServerSentEvent], first: int, last: int) -> None:
    """Records `first..last`, each once, ascending, every id equal to its record's sequence."""
    records = records_of(events)
    ids = [int(e.id) for e in records]
    assert ids == list(range(first, last + 1)), ids
    for event in records:
        assert json.loads(event.data)["sequence"] == int(event.id), event


# -- ordered backfill, then live ------------------------------------------------------------------


async def test_every_record_after_the_cursor_arrives_in_order_then_live_appends_arrive(
    api: httpx.AsyncClient, run_id: str, subscribers: Subscribers
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", *range(1, 6))  # 1..5
    sub = subscribers(api, path(run_id, "s", "/subscribe") + "?cursor=2")
    assert await sub.status() == 200
    assert sub.response is not None
    assert sub.response.headers["content-type"].startswith(EVENT_STREAM)
    await sub.until_ids(5)
    for batch in ([6], [7, 8, 9], list(range(10, 21))):
        await append(api, run_id, "s", *batch)
    await sub.until_ids(20)
    await asyncio.sleep(0.3)  # nothing extra arrives afterwards
    assert_exact(sub.events, 3, 20)
    for event in records_of(sub.events):
        record = json.loads(event.data)
        assert record["data"] == record["sequence"]
        assert {"sequence", "appended_at", "size", "content_type"} <= set(record)
    assert not sub.ended


async def test_a_subscriber_at_the_head_receives_only_what_is_appended_later(
    api: httpx.AsyncClient, run_id: str, subscribers: Subscribers
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", "a", "b", "c")
    sub = subscribers(api, path(run_id, "s", "/subscribe") + "?cursor=3")
    assert await sub.status() == 200
    await asyncio.sleep(0.5)
    assert sub.ids == []
    await append(api, run_id, "s", "d", "e")
    await sub.until_ids(5)
    assert_exact(sub.events, 4, 5)
    assert [json.loads(e.data)["data"] for e in records_of(sub.events)] == ["d", "e"]


# -- Last-Event-ID --------------------------------------------------------------------------------


async def test_last_event_id_wins_over_the_cursor_parameter(
    api: httpx.AsyncClient, run_id: str, subscribers: Subscribers
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", *range(1, 11))
    sub = subscribers(
        api, path(run_id, "s", "/subscribe") + "?cursor=2", headers={"Last-Event-ID": "7"}
    )
    assert await sub.status() == 200
    await sub.until_ids(10)
    await asyncio.sleep(0.3)
    assert_exact(sub.events, 8, 10)


async def test_resuming_with_last_event_id_after_a_disconnect_gives_exactly_the_missing_records(
    api: httpx.AsyncClient, run_id: str, subscribers: Subscribers
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", *range(1, 11))  # 1..10
    first = subscribers(api, path(run_id, "s", "/subscribe"))
    await first.until_ids(10)
    await append(api, run_id, "s", 11, 12)
    await first.until_ids(12)
    await first.disconnect()
    assert_exact(first.events, 1, 12)
    last_seen = first.events[-1]
    assert last_seen.event == "record"

    # Appended while nobody is connected.
    await append(api, run_id, "s", *range(13, 20))  # 13..19
    await append(api, run_id, "s", 20)

    resumed = subscribers(
        api, path(run_id, "s", "/subscribe") + "?cursor=0", headers={"Last-Event-ID": last_seen.id}
    )
    await resumed.until_ids(20)
    await append(api, run_id, "s", 21, 22)  # and live again
    await resumed.until_ids(22)
    await asyncio.sleep(0.3)
    assert_exact(resumed.events, 13, 22)
    assert sorted(set(first.ids) | set(resumed.ids)) == list(range(1, 23))
    assert not set(first.ids) & set(resumed.ids)


# -- errors before streaming ----------------------------------------------------------------------


async def test_a_cursor_ahead_of_the_head_is_400_problem_json_before_streaming(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", 1, 2, 3)
    response = await subscribe_answer(api, path(run_id, "s", "/subscribe") + "?cursor=4")
    assert_problem(response, 400, "cursor-ahead-of-head")
    response = await subscribe_answer(
        api, path(run_id, "s", "/subscribe"), headers={"Last-Event-ID": "99"}
    )
    assert_problem(response, 400, "cursor-ahead-of-head")


@pytest.mark.parametrize("last_event_id", ["abc", "-1", "1.5", "0x10", ""])
async def test_a_last_event_id_that_is_not_a_sequence_is_400(
    api: httpx.AsyncClient, run_id: str, last_event_id: str
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", 1, 2, 3)
    response = await subscribe_answer(
        api, path(run_id, "s", "/subscribe"), headers={"Last-Event-ID": last_event_id}
    )
    assert_problem(response, 400, "invalid-input")


@pytest.mark.parametrize("cursor", ["-1", "abc"])
async def test_a_cursor_parameter_that_is_not_a_sequence_is_400(
    api: httpx.AsyncClient, run_id: str, cursor: str
) -> None:
    await create(api, run_id)
    response = await subscribe_answer(api, path(run_id, "s", "/subscribe") + f"?cursor={cursor}")
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)


async def test_an_unknown_stream_or_run_is_404(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id)
    response = await subscribe_answer(api, path(run_id, "missing", "/subscribe"))
    assert_problem(response, 404, "not-found")
    response = await subscribe_answer(api, path(run_id + "-other", "s", "/subscribe"))
    assert_problem(response, 404, "not-found")


async def test_another_tenants_stream_is_404(api: httpx.AsyncClient, run_id: str, tokens) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", 1)
    other = await tokens.create(tenant="other-tenant", principal="intruder")
    response = await subscribe_answer(
        api, path(run_id, "s", "/subscribe"), headers={"Authorization": f"Bearer {other}"}
    )
    assert_problem(response, 404, "not-found")


async def test_a_token_without_streams_read_is_403(
    api: httpx.AsyncClient, run_id: str, tokens
) -> None:
    await create(api, run_id)
    writer = await tokens.create(principal="writer-only", scopes=("streams:write",))
    response = await subscribe_answer(
        api, path(run_id, "s", "/subscribe"), headers={"Authorization": f"Bearer {writer}"}
    )
    assert_problem(response, 403, "forbidden")


async def test_a_principal_not_among_the_pinned_readers_is_403(
    api: httpx.AsyncClient, run_id: str, tokens
) -> None:
    await create(api, run_id, authorization={"readers": ["bootstrap"], "writers": ["*"]})
    outsider = await tokens.create(principal="outsider", scopes=("streams:read",))
    response = await subscribe_answer(
        api, path(run_id, "s", "/subscribe"), headers={"Authorization": f"Bearer {outsider}"}
    )
    assert_problem(response, 403, "forbidden")


async def test_no_token_or_an_unknown_token_is_401(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id)
    async with httpx.AsyncClient(base_url=api.base_url, timeout=30) as anonymous:
        for headers in ({}, {"Authorization": "Bearer dst_not_a_real_token"}):
            response = await subscribe_answer(
                anonymous, path(run_id, "s", "/subscribe"), headers=headers
            )
            assert_problem(response, 401, "unauthenticated")
            assert response.headers.get("www-authenticate", "").startswith("Bearer")


# -- heartbeat ------------------------------------------------------------------------------------


async def test_a_keep_alive_comment_arrives_while_idle(api: httpx.AsyncClient, run_id: str) -> None:
    await create(api, run_id)
    lines: list[str] = []
    started = time.monotonic()
    async with asyncio.timeout(10), api.stream("GET", path(run_id, "s", "/subscribe")) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith(EVENT_STREAM)
        async for line in response.aiter_lines():
            lines.append(line)
            if line.startswith(": keep-alive"):
                break
    elapsed = time.monotonic() - started
    assert lines[0] == ": subscribed", lines
    assert ": keep-alive" in lines
    assert elapsed < 3.0, f"first keep-alive after {elapsed:.2f}s (heartbeat is 1s)"
    assert not any(line.startswith(("id:", "event:", "data:")) for line in lines), lines


# -- close ----------------------------------------------------------------------------------------


async def test_close_ends_every_connected_subscriber_after_every_record(
    api: httpx.AsyncClient, run_id: str, subscribers: Subscribers
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", *range(1, 4))  # 1..3
    async with wide_client(api) as client:
        subs = [
            subscribers(client, path(run_id, "s", "/subscribe") + f"?cursor={c}")
            for c in (0, 0, 1, 2, 3)
        ]
        for sub in subs:
            assert await sub.status() == 200
        await append(api, run_id, "s", *range(4, 9))  # 4..8
        await append(api, run_id, "s", 9, 10)
        await close(api, run_id, "s")
        for cursor, sub in zip((0, 0, 1, 2, 3), subs, strict=True):
            await sub.until_ended()
            assert_exact(sub.events, cursor + 1, 10)
            assert sub.events[-1].event == "closed", sub.events[-1]
            assert json.loads(sub.events[-1].data) == {"head": 10}
            assert [e.event for e in sub.events].count("closed") == 1


async def test_subscribing_to_a_closed_stream_delivers_the_rest_then_closed(
    api: httpx.AsyncClient, run_id: str, subscribers: Subscribers
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", *range(1, 6))
    await close(api, run_id, "s")
    backfill = subscribers(api, path(run_id, "s", "/subscribe") + "?cursor=2")
    at_head = subscribers(api, path(run_id, "s", "/subscribe") + "?cursor=5")
    await backfill.until_ended()
    await at_head.until_ended()
    assert_exact(backfill.events, 3, 5)
    assert [(e.event, json.loads(e.data)) for e in backfill.events[-1:]] == [
        ("closed", {"head": 5})
    ]
    assert [(e.event, json.loads(e.data)) for e in at_head.events] == [("closed", {"head": 5})]


async def test_an_empty_stream_closed_while_followed_ends_with_head_zero(
    api: httpx.AsyncClient, run_id: str, subscribers: Subscribers
) -> None:
    await create(api, run_id)
    sub = subscribers(api, path(run_id, "s", "/subscribe"))
    assert await sub.status() == 200
    await asyncio.sleep(0.3)
    await close(api, run_id, "s")
    await sub.until_ended()
    assert [(e.event, json.loads(e.data)) for e in sub.events] == [("closed", {"head": 0})]


# -- two server processes -------------------------------------------------------------------------


async def append_concurrently(
    api: httpx.AsyncClient, run_id: str, stream_id: str, total: int, tasks: int
) -> list[tuple[int, int, float]]:
    """`total` records appended by `tasks` concurrent tasks in batches of 1-3; returns
    (first, last, time committed) per batch."""
    remaining = list(range(total))
    batches: list[tuple[int, int, float]] = []
    lock = asyncio.Lock()

    async def worker(seed: int) -> None:
        rng = random.Random(seed)
        while True:
            async with lock:
                if not remaining:
                    return
                size = min(rng.randint(1, 3), len(remaining))
                del remaining[:size]
            answer = await append(api, run_id, stream_id, *(["x"] * size))
            batches.append((answer["first_sequence"], answer["last_sequence"], time.monotonic()))
            await asyncio.sleep(rng.uniform(0, 0.02))

    await asyncio.gather(*(worker(i) for i in range(tasks)))
    return batches


async def test_a_subscriber_on_server_b_gets_every_record_appended_through_server_a(
    api: httpx.AsyncClient,
    api_b: httpx.AsyncClient,
    run_id: str,
    subscribers: Subscribers,
    pool: asyncpg.Pool,
) -> None:
    await create(api, run_id)
    async with wide_client(api_b) as client_b, wide_client(api) as client_a:
        on_b = [subscribers(client_b, path(run_id, "s", "/subscribe")) for _ in range(3)]
        on_a = subscribers(client_a, path(run_id, "s", "/subscribe"))
        for sub in [*on_b, on_a]:
            assert await sub.status() == 200
        await asyncio.sleep(0.3)  # let the tails start following
        batches = await append_concurrently(api, run_id, "s", total=200, tasks=10)
        assert sorted(b for first, last, _ in batches for b in range(first, last + 1)) == list(
            range(1, 201)
        )
        for sub in [*on_b, on_a]:
            await sub.until_ids(200, timeout=30)
            assert_exact(sub.events, 1, 200)

    latencies = sorted(
        max(0.0, on_b[0].arrived[last] - committed) for _, last, committed in batches
    )
    median = latencies[len(latencies) // 2]
    # Wake-ups cross processes by NOTIFY, not by the head check: no gap was ever judged lost.
    evidence = await pool.fetch(
        "SELECT expected, seen, detected_by FROM gap_evidence WHERE run_id = $1", run_id
    )
    assert [dict(r) for r in evidence] == [], f"median latency {median:.3f}s"
    assert median < 5 * HEAD_CHECK_SECONDS, f"median cross-process latency {median:.3f}s"


async def test_a_long_poll_on_server_b_returns_promptly_when_server_a_appends(
    api: httpx.AsyncClient, api_b: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", 1, 2, 3)
    started = time.monotonic()
    poll = asyncio.create_task(
        api_b.get(path(run_id, "s", "/records"), params={"cursor": 3, "wait": 10})
    )
    try:
        await asyncio.sleep(0.5)
        assert not poll.done(), poll.result().text
        appended_at = time.monotonic()
        await append(api, run_id, "s", "four")
        async with asyncio.timeout(9):
            response = await poll
    finally:
        poll.cancel()
    returned_after = time.monotonic() - appended_at
    assert response.status_code == 200, response.text
    body = response.json()
    assert [r["sequence"] for r in body["records"]] == [4]
    assert body["records"][0]["data"] == "four"
    assert returned_after < 3.0, f"long-poll returned {returned_after:.2f}s after the append"
    assert time.monotonic() - started < 5.0


async def test_a_blocked_producer_on_server_a_is_released_by_an_ack_through_server_b(
    api: httpx.AsyncClient, api_b: httpx.AsyncClient, run_id: str
) -> None:
    await create(
        api,
        run_id,
        limits={"max_unread_items": 1, "unread_policy": "block", "block_timeout_seconds": 10},
    )
    await append(api, run_id, "s", "first")
    started = time.monotonic()
    blocked = asyncio.create_task(
        api.post(path(run_id, "s", "/records"), json={"records": [{"data": "second"}]})
    )
    try:
        await asyncio.sleep(1.0)
        assert not blocked.done(), blocked.result().text  # waiting for credit
        acked = await api_b.post(path(run_id, "s", "/consumers/c1/ack"), json={"sequence": 1})
        assert acked.status_code == 200, acked.text
        acked_at = time.monotonic()
        async with asyncio.timeout(9):
            response = await blocked
    finally:
        blocked.cancel()
    released_after = time.monotonic() - acked_at
    assert response.status_code == 201, response.text
    assert response.json()["first_sequence"] == 2
    assert released_after < 3.0, f"released {released_after:.2f}s after the ack"
    assert time.monotonic() - started < 8.0


# -- the LISTEN connection dies -------------------------------------------------------------------


async def listen_pids(pool: asyncpg.Pool) -> set[int]:
    rows = await pool.fetch(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1", LISTEN_APP
    )
    return {r["pid"] for r in rows}


async def test_killing_the_listen_connection_mid_stream_loses_nothing(
    api: httpx.AsyncClient,
    api_b: httpx.AsyncClient,
    run_id: str,
    subscribers: Subscribers,
    pool: asyncpg.Pool,
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", *range(5))  # 1..5
    killed = await listen_pids(pool)
    assert len(killed) >= 2, killed  # one per server process
    async with wide_client(api) as client_a, wide_client(api_b) as client_b:
        subs = [
            subscribers(client_a, path(run_id, "s", "/subscribe")),
            subscribers(client_a, path(run_id, "s", "/subscribe") + "?cursor=3"),
            subscribers(client_b, path(run_id, "s", "/subscribe")),
            subscribers(client_b, path(run_id, "s", "/subscribe") + "?cursor=5"),
        ]
        for sub in subs:
            assert await sub.status() == 200
        total = 5
        stop = asyncio.Event()

        async def producer() -> None:
            nonlocal total
            i = 0
            while not stop.is_set():
                answer = await append((api, api_b)[i % 2], run_id, "s", i, i)
                total = answer["last_sequence"]
                i += 1
                await asyncio.sleep(0.02)

        producing = asyncio.create_task(producer())
        try:
            await asyncio.sleep(0.5)
            terminated = await pool.fetch(
                "SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity "
                "WHERE application_name = $1",
                LISTEN_APP,
            )
            assert terminated and all(r["ok"] for r in terminated), terminated
            await asyncio.sleep(2.0)  # appends go on while the wake bus reconnects
        finally:
            stop.set()
            async with asyncio.timeout(10):
                await producing
        for cursor, sub in zip((0, 3, 0, 5), subs, strict=True):
            await sub.until_ids(total, timeout=15)
            await asyncio.sleep(0.1)
            assert_exact(sub.events, cursor + 1, total)

    # The wake bus of both processes reconnected.
    deadline = time.monotonic() + 10
    while True:
        now = await listen_pids(pool)
        if len(now - killed) >= 2 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert len(now - killed) >= 2, f"killed {killed}, now {now}"
    assert not now & killed

    # A long-poll across processes still wakes promptly afterwards.
    head = total
    poll = asyncio.create_task(
        api_b.get(path(run_id, "s", "/records"), params={"cursor": head, "wait": 10})
    )
    try:
        await asyncio.sleep(0.5)
        assert not poll.done(), poll.result().text
        appended_at = time.monotonic()
        await append(api, run_id, "s", "after")
        async with asyncio.timeout(9):
            response = await poll
    finally:
        poll.cancel()
    assert response.status_code == 200, response.text
    assert [r["sequence"] for r in response.json()["records"]] == [head + 1]
    assert time.monotonic() - appended_at < 3.0


# -- the per-principal subscription cap -----------------------------------------------------------


async def test_the_subscription_cap_refuses_one_more_and_a_disconnect_frees_a_slot(
    api: httpx.AsyncClient, run_id: str, tokens, subscribers: Subscribers
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", 1, 2)
    token = await tokens.create(principal="capped-" + run_id, scopes=("streams:read",))
    url = path(run_id, "s", "/subscribe")
    async with wide_client(api, token) as client:
        held = [subscribers(client, url) for _ in range(SUBSCRIPTION_CAP)]
        statuses = await asyncio.gather(*(s.status(timeout=20) for s in held))
        assert statuses == [200] * SUBSCRIPTION_CAP, {s.body for s in held if s.body}
        for sub in held:
            await sub.until_ids(2)

        refused = await subscribe_answer(client, url)
        assert_problem(refused, 429, "too-many-subscriptions")
        retry_after = refused.headers.get("retry-after")
        assert retry_after is not None and retry_after.isdigit() and int(retry_after) >= 1

        # Another principal is not affected by this one's cap.
        other_token = await tokens.create(principal="other-" + run_id, scopes=("streams:read",))
        other = subscribers(api, url, headers={"Authorization": f"Bearer {other_token}"})
        assert await other.status() == 200, other.body
        await other.disconnect()

        await held.pop().disconnect()
        admitted: Subscriber | None = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            attempt = subscribers(client, url)
            if await attempt.status() == 200:
                admitted = attempt
                break
            assert attempt.response is not None
            assert_problem(attempt.response, 429, "too-many-subscriptions")
            await asyncio.sleep(0.2)
        assert admitted is not None, "no slot freed within 10s of a client disconnect"
        await admitted.until_ids(2)
        assert_exact(admitted.events, 1, 2)

        refused = await subscribe_answer(client, url)
        assert_problem(refused, 429, "too-many-subscriptions")


async def test_subscriptions_ended_by_close_free_their_slots(
    api: httpx.AsyncClient, run_id: str, tokens, subscribers: Subscribers
) -> None:
    """A response the server ended (`closed`) must give its principal's slot back, like a client
    disconnect does: a principal that follows streams to their end is never refused for it."""
    token = await tokens.create(principal="finisher-" + run_id, scopes=("streams:read",))
    await create(api, run_id, "ends")
    await create(api, run_id, "next")
    await append(api, run_id, "ends", 1)
    async with wide_client(api, token) as client:
        ended = [subscribers(client, path(run_id, "ends", "/subscribe")) for _ in range(10)]
        assert await asyncio.gather(*(s.status() for s in ended)) == [200] * 10
        await close(api, run_id, "ends")
        for sub in ended:
            await sub.until_ended()
            assert [e.event for e in sub.events] == ["record", "closed"]

        # All ten responses are over: the principal holds no subscription at all now.
        deadline = time.monotonic() + 5
        admitted: list[Subscriber] = []
        while len(admitted) < SUBSCRIPTION_CAP and time.monotonic() < deadline:
            attempt = subscribers(client, path(run_id, "next", "/subscribe"))
            if await attempt.status() == 200:
                admitted.append(attempt)
            else:
                await attempt.disconnect()
                await asyncio.sleep(0.2)
        count = len(admitted)
        assert count == SUBSCRIPTION_CAP, (
            f"only {count} of {SUBSCRIPTION_CAP} admitted 5s after every earlier "
            "subscription of this principal had ended with `closed`"
        )
