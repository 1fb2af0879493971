"""The Python client (`ductor_streams_client`) and the client commands of the CLI (`tail`,
`append`, `put-object`), end to end against real server processes.

Every wait is bounded, so a client bug fails a test instead of hanging it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor_streams_client import (
    AckAnswer,
    AppendAnswer,
    Closed,
    CommitAnswer,
    Consumer,
    ConsumersPage,
    CursorAheadOfHead,
    CursorUnknown,
    Deleted,
    IdempotencyKeyReused,
    NotFound,
    ObjectIntent,
    Record,
    RecordsPage,
    RetryPolicy,
    RunsPage,
    StreamDocument,
    StreamList,
    StreamsClient,
    StreamsError,
    SyncStreamsClient,
    TokenList,
    Unauthenticated,
)
from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV, Tokens
from tests.support.server import ServerProcess

CLI = str(Path(sys.executable).parent / "ductor-streams")
BODY = os.urandom(2 * 1024 * 1024 + 5)  # several upload chunks, not a round number


class Recording(httpx.AsyncBaseTransport):
    """A real transport that remembers every request and answer; `lose_answers` makes the next
    N matching requests reach the server but fail on the way back (a lost answer)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.exchanges: list[tuple[httpx.Request, int, float]] = []
        self.lose_answers = 0
        self.lose_when = "POST"

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        self.exchanges.append((request, response.status_code, time.monotonic()))
        if self.lose_answers and request.method == self.lose_when:
            self.lose_answers -= 1
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("connection reset (simulated)", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()

    def requests(self, method: str, suffix: str) -> list[tuple[httpx.Request, int, float]]:
        return [
            e for e in self.exchanges if e[0].method == method and e[0].url.path.endswith(suffix)
        ]


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[StreamsClient]:
    async with StreamsClient(server.base_url, BOOTSTRAP_TOKEN, timeout=10) as client:
        yield client


async def collect(items: AsyncIterator[Any], timeout: float) -> list[Any]:
    async with asyncio.timeout(timeout), contextlib.aclosing(items):
        return [item async for item in items]


# -- the library ----------------------------------------------------------------------------------


async def test_the_full_flow(server: ServerProcess, run_id: str, tmp_path: Path) -> None:
    transport = Recording()
    async with StreamsClient(server.base_url, BOOTSTRAP_TOKEN, transport=transport) as client:
        document = await client.create_stream(run_id, stream_id="s")
        assert isinstance(document, StreamDocument)
        assert document.stream_id == "s" and document.state.head == 0
        assert document.limits.max_unread_items == 10_000 and document.direction == "output"
        again = await client.create_stream(run_id, stream_id="s")  # identical: 200, same doc
        assert again == document
        assert (await client.get_stream(run_id, "s")).run_id == run_id
        listed = await client.list_streams(run_id)
        assert isinstance(listed, StreamList) and [d.stream_id for d in listed.streams] == ["s"]
        assert listed.next_after is None
        await client.create_stream(run_id, stream_id="t")
        one = await client.list_streams(run_id, limit=1)
        assert [d.stream_id for d in one.streams] == ["s"] and one.next_after == "s"
        after = await client.list_streams(run_id, after="s")
        assert [d.stream_id for d in after.streams] == ["t"] and after.next_after is None
        paged = [d.stream_id async for d in client.iter_streams(run_id, page_size=1)]
        assert paged == ["s", "t"]
        await client.delete_stream(run_id, "t")

        answer = await client.append(run_id, "s", [{"n": 1}, "two", b"\x00\x01raw"])
        assert isinstance(answer, AppendAnswer)
        assert (answer.first_sequence, answer.last_sequence, answer.head) == (1, 3, 3)
        assert answer.credit.unread_items == 3
        [(request, status, _)] = transport.requests("POST", "/records")
        assert status == 201 and request.headers.get("idempotency-key")

        page = await client.read(run_id, "s", cursor=1, limit=10)
        assert isinstance(page, RecordsPage)
        assert [r.sequence for r in page.records] == [2, 3]
        assert page.records[0].data == "two" and page.records[0].kind == "json"
        assert page.records[1].kind == "bytes" and page.records[1].bytes == b"\x00\x01raw"
        assert page.records[1].data_base64 == "AAFyYXc="
        assert page.next_cursor == 3 and page.closed is False

        waited = time.monotonic()
        empty = await client.read(run_id, "s", cursor=3, wait=0.5)
        assert empty.records == () and time.monotonic() - waited >= 0.4

        ack = await client.ack(run_id, "s", "reader", 2)
        assert isinstance(ack, AckAnswer) and ack.acked_sequence == 2
        assert ack.credit.unread_items == 1
        assert (await client.ack(run_id, "s", "reader", 2)).acked_sequence == 2  # no-op
        await client.ack(run_id, "s", "another", 1)
        consumers = await client.list_consumers(run_id, "s", limit=1)
        assert isinstance(consumers, ConsumersPage) and consumers.next_after == "another"
        assert consumers.consumers == (Consumer(consumer_id="another", acked_sequence=1),)
        every = [c async for c in client.iter_consumers(run_id, "s", page_size=1)]
        assert [(c.consumer_id, c.holds_credit) for c in every] == [
            ("another", True),
            ("reader", True),
        ]
        await client.delete_consumer(run_id, "s", "another")
        with pytest.raises(NotFound):
            await client.delete_consumer(run_id, "s", "another")
        document = await client.get_stream(run_id, "s")
        assert document.state.consumer_count == 1
        assert [c.consumer_id for c in document.state.consumers] == ["reader"]

        file = tmp_path / "body.bin"
        file.write_bytes(BODY)
        seen: list[tuple[int, int]] = []
        committed = await client.put_object(
            run_id,
            "s",
            file,
            content_type="application/x-test",
            progress=lambda sent, total: seen.append((sent, total)),
        )
        assert isinstance(committed, CommitAnswer) and committed.sequence == 4
        assert seen[-1] == (len(BODY), len(BODY))
        [(upload, _, _)] = transport.requests("PUT", "/body")
        assert upload.headers["content-length"] == str(len(BODY))
        meta = await client.get_object(run_id, "s", committed.object_id)
        assert isinstance(meta, ObjectIntent) and meta.state == "committed"
        assert meta.sha256 == hashlib.sha256(BODY).hexdigest() and meta.sequence == 4
        body = b"".join([c async for c in client.get_object_body(run_id, "s", committed.object_id)])
        assert body == BODY

        follower = asyncio.create_task(collect(client.follow(run_id, "s"), timeout=20))
        await asyncio.sleep(0.3)
        await client.append(run_id, "s", [{"n": 5}])
        closed = await client.close_stream(run_id, "s")
        assert closed.state.closed is True and closed.state.closed_at is not None
        *records, end = await follower
        assert all(isinstance(r, Record) for r in records)
        assert [r.sequence for r in records] == [1, 2, 3, 4, 5]
        assert records[3].kind == "object" and records[3].object is not None
        assert records[3].object.object_id == committed.object_id
        assert records[3].object.size == len(BODY)
        assert records[4].data == {"n": 5}
        assert end == Closed(head=5)


async def test_problems_raise_streams_error(client: StreamsClient, run_id: str) -> None:
    with pytest.raises(NotFound) as caught:
        await client.get_stream(run_id, "nope")
    error = caught.value
    assert isinstance(error, StreamsError)
    assert (error.status, error.code) == (404, "not-found")
    assert error.detail and error.problem["code"] == "not-found"
    assert str(error).startswith("404 not-found: ")

    await client.create_stream(run_id, stream_id="s")
    with pytest.raises(CursorAheadOfHead) as ahead:
        await collect(client.follow(run_id, "s", cursor=5), timeout=10)
    assert (ahead.value.status, ahead.value.code, ahead.value.head) == (
        400,
        "cursor-ahead-of-head",
        0,
    )
    with pytest.raises(NotFound) as missing:
        await collect(client.follow(run_id, "missing"), timeout=10)
    assert missing.value.status == 404

    async with StreamsClient(client.base_url, "wrong-token") as stranger:
        with pytest.raises(Unauthenticated) as caught:
            await stranger.list_streams(run_id)
    assert (caught.value.status, caught.value.code) == (401, "unauthenticated")


async def test_an_append_retried_with_its_key_is_not_duplicated(
    server: ServerProcess, run_id: str
) -> None:
    transport = Recording()
    policy = RetryPolicy(base_delay=0.05, max_delay=0.2)
    async with StreamsClient(
        server.base_url, BOOTSTRAP_TOKEN, transport=transport, retry=policy
    ) as client:
        await client.create_stream(run_id, stream_id="s")
        transport.lose_answers = 2  # the append lands twice but its answers are lost
        answer = await client.append(run_id, "s", [{"n": 1}, {"n": 2}])
        appends = transport.requests("POST", "/records")
        assert [status for _, status, _ in appends] == [201, 200, 200]
        keys = {request.headers["idempotency-key"] for request, _, _ in appends}
        assert len(keys) == 1  # every retry reused the generated key
        assert (answer.first_sequence, answer.last_sequence) == (1, 2)

        # An explicit key: a second call with it replays, a new call appends anew.
        first = await client.append(run_id, "s", ["x"], idempotency_key="k-1")
        replay = await client.append(run_id, "s", ["x"], idempotency_key="k-1")
        assert first == replay and first.first_sequence == 3
        with pytest.raises(IdempotencyKeyReused) as caught:
            await client.append(run_id, "s", ["other"], idempotency_key="k-1")
        assert (caught.value.status, caught.value.code) == (422, "idempotency-key-reused")

        page = await client.read(run_id, "s")
        assert [r.data for r in page.records] == [{"n": 1}, {"n": 2}, "x"]
        assert (await client.get_stream(run_id, "s")).state.head == 3


async def test_backpressure_is_retried_honouring_retry_after(
    server: ServerProcess, run_id: str
) -> None:
    transport = Recording()
    async with StreamsClient(server.base_url, BOOTSTRAP_TOKEN, transport=transport) as client:
        await client.create_stream(run_id, stream_id="s", limits={"max_unread_items": 1})
        await client.append(run_id, "s", ["first"])

        async def ack_later() -> float:
            await asyncio.sleep(1.0)
            await client.ack(run_id, "s", "reader", 1)
            return time.monotonic()

        acker = asyncio.create_task(ack_later())
        async with asyncio.timeout(20):
            answer = await client.append(run_id, "s", ["second"])
        acked_at = await acker
        assert answer.first_sequence == 2
        appends = transport.requests("POST", "/records")[1:]
        statuses = [status for _, status, _ in appends]
        assert statuses[0] == 429 and statuses[-1] == 201, statuses
        assert set(statuses[:-1]) == {429}
        # Retry-After (whole seconds, at least 1) was honoured between attempts ...
        gaps = [b - a for a, b in itertools.pairwise(at for _, _, at in appends)]
        assert gaps and all(gap >= 0.95 for gap in gaps), gaps
        # ... and the append went through once the ack freed credit.
        assert appends[-1][2] >= acked_at - 0.05


async def test_follow_reconnects_across_a_server_restart(
    database_url: str, tmp_path_factory: pytest.TempPathFactory, run_id: str
) -> None:
    data_dir = tmp_path_factory.mktemp("client-restart")
    first = ServerProcess(database_url=database_url, data_dir=data_dir, env=SERVER_ENV).start()
    port = first.port
    restarted: ServerProcess | None = None
    try:
        policy = RetryPolicy(base_delay=0.1, max_delay=0.5, total_seconds=30)
        async with StreamsClient(first.base_url, BOOTSTRAP_TOKEN, retry=policy) as client:
            await client.create_stream(run_id, stream_id="s")
            await client.append(run_id, "s", [{"n": n} for n in range(1, 6)])
            reconnects: list[str] = []
            delivered: list[Any] = []
            got_five = asyncio.Event()

            async def follow() -> None:
                records = client.follow(
                    run_id, "s", on_reconnect=lambda failure, _: reconnects.append(failure.code)
                )
                async with contextlib.aclosing(records):
                    async for item in records:
                        delivered.append(item)
                        if len(delivered) == 5:
                            got_five.set()

            follower = asyncio.create_task(follow())
            async with asyncio.timeout(10):
                await got_five.wait()

            await asyncio.to_thread(first.kill)
            await asyncio.sleep(0.5)
            restarted = ServerProcess(
                database_url=database_url, data_dir=data_dir, env=SERVER_ENV, port=port
            )
            await asyncio.to_thread(restarted.start)
            await client.append(run_id, "s", [{"n": n} for n in range(6, 11)])
            await asyncio.sleep(0.5)
            await client.append(run_id, "s", [{"n": 11}])
            await client.close_stream(run_id, "s")
            async with asyncio.timeout(30):
                await follower

        assert reconnects, "the follower never saw the disconnect"
        *records, end = delivered
        assert [r.sequence for r in records] == list(range(1, 12))
        assert [r.data["n"] for r in records] == list(range(1, 12))
        assert end == Closed(head=11)
    finally:
        first.stop()
        if restarted is not None:
            restarted.stop()


# -- the CLI --------------------------------------------------------------------------------------


def cli_env(server: ServerProcess) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_STREAMS_")}
    env["DUCTOR_STREAMS_URL"] = server.base_url
    env["DUCTOR_STREAMS_TOKEN"] = BOOTSTRAP_TOKEN
    return env


def cli(
    server: ServerProcess, *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=cli_env(server),
        timeout=60,
        cwd=cwd,
    )


@pytest.fixture
def stream(server: ServerProcess, run_id: str) -> Iterator[str]:
    response = httpx.post(
        f"{server.base_url}/api/workflow-streams/runs/{run_id}/streams",
        json={"stream_id": "s", "direction": "output"},
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    yield "s"


def test_cli_append_from_arguments_and_stdin(server: ServerProcess, run_id: str, stream: str):
    done = cli(server, "append", run_id, stream, '{"a": 1}', '"two"', "3")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["first_sequence"], answer["last_sequence"]) == (1, 3)

    done = cli(server, "append", run_id, stream, stdin='{"b": 2}\n\n[1, 2]\nnull\n')
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert (json.loads(line)["first_sequence"], json.loads(line)["last_sequence"]) == (4, 6)

    done = cli(server, "append", run_id, stream, "{not json")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (
        "ductor-streams: error: argument 1 is not valid JSON: Expecting property name enclosed "
        "in double quotes: line 1 column 2 (char 1)"
    )


def test_cli_tail_prints_one_json_per_line_until_closed(
    server: ServerProcess, run_id: str, stream: str
) -> None:
    assert cli(server, "append", run_id, stream, '{"n": 1}', '{"n": 2}').returncode == 0
    tail = subprocess.Popen(
        [CLI, "tail", run_id, stream, "--cursor", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(server),
    )
    try:
        time.sleep(1.0)
        assert cli(server, "append", run_id, stream, '{"n": 3}').returncode == 0
        closed = httpx.post(
            f"{server.base_url}/api/workflow-streams/runs/{run_id}/streams/{stream}/close",
            headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
            timeout=10,
        )
        assert closed.status_code == 200
        out, err = tail.communicate(timeout=30)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait(10)
    assert tail.returncode == 0, err
    lines = out.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["sequence"] for r in records] == [2, 3]
    assert [r["data"] for r in records] == [{"n": 2}, {"n": 3}]
    # each line is the record as the service sends it, typed results or not
    assert set(records[0]) == {"sequence", "appended_at", "size", "content_type", "data"}


def test_cli_put_object_prints_the_commit_answer(
    server: ServerProcess, run_id: str, stream: str, tmp_path: Path
) -> None:
    file = tmp_path / "report.json"
    file.write_bytes(b'{"big": "' + b"x" * 300_000 + b'"}')
    done = cli(server, "put-object", run_id, stream, str(file))
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["sequence"] == 1 and answer["object_id"]
    assert "100%" in done.stderr  # the progress bar's last line

    meta = httpx.get(
        f"{server.base_url}/api/workflow-streams/runs/{run_id}/streams/{stream}"
        f"/objects/{answer['object_id']}",
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
        timeout=10,
    ).json()
    assert meta["content_type"] == "application/json"  # guessed from the name
    assert meta["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()

    done = cli(server, "put-object", run_id, stream, str(tmp_path / "absent.bin"))
    assert done.returncode == 2 and "no such file" in done.stderr


def test_cli_unknown_stream_exits_1_with_one_line(server: ServerProcess, run_id: str) -> None:
    for args in (("tail", run_id, "x"), ("append", run_id, "x", "1")):
        done = cli(server, *args)
        assert done.returncode == 1, done
        assert done.stdout == ""
        assert (
            done.stderr
            == f"ductor-streams: error: 404 not-found: no stream 'x' in run '{run_id}'\n"
        )


def test_cli_usage_and_configuration_errors(
    server: ServerProcess, run_id: str, tmp_path: Path
) -> None:
    done = cli(server, "tail", run_id)
    assert done.returncode == 2 and "usage:" in done.stderr
    done = cli(server, "tail", run_id, "s", "--cursor", "-1")
    assert done.returncode == 2 and "must be 0 or more" in done.stderr

    env = cli_env(server)
    del env["DUCTOR_STREAMS_TOKEN"]
    done = subprocess.run(
        [CLI, "append", run_id, "s", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("ductor-streams: error: no token")
    # ./.ductor-streams/dev-token is the fallback: with it the request reaches the server
    (tmp_path / ".ductor-streams").mkdir()
    (tmp_path / ".ductor-streams" / "dev-token").write_text(BOOTSTRAP_TOKEN + "\n")
    done = subprocess.run(
        [CLI, "append", run_id, "s", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        cwd=tmp_path,
    )
    assert done.returncode == 1 and done.stderr.startswith("ductor-streams: error: 404 not-found")

    done = subprocess.run([CLI, "--help"], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0 and "tail" in done.stdout and "put-object" in done.stdout


async def test_deletion_and_run_listing_through_the_library(
    client: StreamsClient, run_id: str
) -> None:
    await client.create_stream(run_id, stream_id="s")
    await client.create_stream(run_id, stream_id="t")
    await client.append(run_id, "s", ["one"])
    page = await client.list_runs(after=run_id[:-1], limit=1000)
    assert isinstance(page, RunsPage)
    [mine] = [r for r in page.runs if r.run_id == run_id]
    assert mine.stream_count == 2
    by_prefix = await client.list_runs(prefix=run_id)
    assert [r.run_id for r in by_prefix.runs] == [run_id] and by_prefix.next_after is None
    assert [r.run_id async for r in client.iter_runs(prefix=run_id, page_size=1)] == [run_id]
    following = asyncio.ensure_future(collect(client.follow(run_id, "s"), timeout=10))
    raising = asyncio.ensure_future(collect(client.follow(run_id, "s", events=False), 10))
    await asyncio.sleep(0.5)
    await client.delete_stream(run_id, "s")
    *records, end = await following
    assert [r.data for r in records] == ["one"] and end == Deleted()
    with pytest.raises(NotFound) as deleted:
        await raising
    assert (deleted.value.status, deleted.value.code) == (404, "not-found")
    await client.delete_run(run_id)
    with pytest.raises(NotFound) as gone:
        await client.get_stream(run_id, "t")
    assert gone.value.status == 404


async def test_token_pages_and_iter_tokens_through_the_library(
    server: ServerProcess, tokens: Tokens
) -> None:
    tenant = "client-tokens-" + os.urandom(4).hex()
    admin = await tokens.create(tenant=tenant, principal="admin")
    made = [admin] + [await tokens.create(tenant=tenant, principal=f"p{i}") for i in range(24)]
    ids = ["tok_" + hashlib.sha256(token.encode()).digest()[:8].hex() for token in made]
    async with StreamsClient(server.base_url, admin, timeout=10) as client:
        first = await client.list_tokens(limit=10)
        assert isinstance(first, TokenList)
        assert [t.id for t in first.tokens] == ids[:10] and first.next_after == ids[9]
        second = await client.list_tokens(after=first.next_after, limit=10)
        assert [t.id for t in second.tokens] == ids[10:20] and second.next_after == ids[19]
        last = await client.list_tokens(after=second.next_after)
        assert [t.id for t in last.tokens] == ids[20:] and last.next_after is None
        assert [t.id async for t in client.iter_tokens(page_size=10)] == ids
        assert [t.id async for t in client.iter_tokens()] == ids
        with pytest.raises(CursorUnknown):
            await client.list_tokens(after="tok_0000000000000000")
    with SyncStreamsClient(server.base_url, admin, timeout=10) as sync:
        assert [t.id for t in sync.iter_tokens(page_size=7)] == ids
        assert sync.list_tokens(after=ids[-2]).tokens[0].id == ids[-1]
