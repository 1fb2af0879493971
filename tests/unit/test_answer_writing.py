"""Large answers written in pieces, within a bound, charged to their tenant while written
(entrypoints/edge/writing.py; the tenant's cap in application/waiting.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from litestar import Litestar, get
from litestar.response import Stream

from application import waiting
from application.tokens import TokenCache
from entrypoints.edge import writing
from entrypoints.edge.turns import with_turns


@pytest.fixture(autouse=True)
def bounds() -> Iterator[None]:
    waiting.configure_turns(4, waiting_per_tenant=4, answer_bytes_per_tenant=1_000_000)
    writing.configure(0.2)
    yield
    writing.configure(writing.WRITE_STALL_SECONDS)
    waiting.configure_turns(0)
    assert not waiting._turns and not waiting._answer_bytes  # all given back
    assert waiting._answer_bytes_total[0] == 0


class Client:
    """A client's connection: takes `reads` pieces, then nothing."""

    def __init__(self, reads: int) -> None:
        self.reads = reads
        self.sent: list[dict] = []

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.body" and len(self.sent) >= self.reads:
            await asyncio.Event().wait()  # a client that does not read: the server waits
        self.sent.append(message)


async def request(tenant: str, work) -> object:
    with waiting.request_budget(5.0):
        waiting.act_for(tenant)
        await waiting.take_turn(tenant)
        return await work()


async def test_a_large_body_goes_in_pieces_and_ends_with_its_last() -> None:
    client = Client(reads=100)
    body = bytes(range(256)) * 1_000  # 256,000 bytes: four pieces
    await request("a", lambda: writing.in_pieces(client.send, {"body": body}))
    sizes = [len(m["body"]) for m in client.sent]
    assert sizes == [65_536, 65_536, 65_536, 59_392]
    assert b"".join(m["body"] for m in client.sent) == body
    assert [m["more_body"] for m in client.sent] == [True] * 3 + [False]  # within the bound
    client.sent.clear()  # a piece of a body that goes on: every piece says more follows
    await request("a", lambda: writing.in_pieces(client.send, {"body": body, "more_body": True}))
    assert [m["more_body"] for m in client.sent] == [True] * 4


async def test_a_client_that_takes_nothing_has_its_answer_cut_and_its_bytes_freed() -> None:
    client = Client(reads=1)
    body = b"x" * 600_000

    async def write() -> None:
        charged = asyncio.ensure_future(writing.in_pieces(client.send, {"body": body}))
        await asyncio.sleep(0.05)
        assert waiting._answer_bytes == {"a": 600_000}  # charged to its tenant meanwhile
        await charged

    with pytest.raises(writing.AnswerTooSlow) as cut:
        await request("a", write)
    assert not writing.cut_short(RuntimeError("another error"))
    wrapped = RuntimeError("Exception caught after response started")
    wrapped.__cause__ = cut.value
    assert writing.cut_short(wrapped)  # as Litestar reraises it
    assert not waiting._answer_bytes


async def test_past_its_bytes_of_answers_not_taken_a_tenants_next_request_is_refused() -> None:
    stalled = [Client(reads=0) for _ in range(2)]
    body = b"y" * 600_000
    writers = [
        asyncio.ensure_future(request("a", lambda c=c: writing.in_pieces(c.send, {"body": body})))
        for c in stalled
    ]
    await asyncio.sleep(0.05)  # 1.2 MB held for tenant a: past its 1 MB
    refused = waiting.answers_refused[0]
    with pytest.raises(waiting.AnswersNotTaken) as no:
        await request("a", lambda: asyncio.sleep(0))
    assert no.value.code == "too-many-requests" and no.value.retry_after == 1
    assert waiting.answers_refused[0] == refused + 1
    await request("b", lambda: asyncio.sleep(0))  # another tenant is served
    # Cut short after their stall, their bytes freed: the tenant is served again.
    for w in writers:
        with pytest.raises(writing.AnswerTooSlow):
            await w
    await request("a", lambda: asyncio.sleep(0))


async def test_a_stopping_server_ends_the_answers_still_being_written() -> None:
    writing.configure(60.0)
    client = Client(reads=0)
    writer = asyncio.ensure_future(
        request("a", lambda: writing.in_pieces(client.send, {"body": b"z" * 200_000}))
    )
    await asyncio.sleep(0.01)
    writing.stop_all(grace_seconds=0.05)
    with pytest.raises(writing.AnswerTooSlow):
        await asyncio.wait_for(writer, 1.0)


async def test_a_streamed_answer_cut_short_ends_quietly_and_frees_its_bytes() -> None:
    """An object's body goes out as a Litestar Stream: its chunks (1 MiB) are sent from an anyio
    task group, which raises what the send raised inside an ExceptionGroup."""

    async def chunks():
        for _ in range(3):
            yield b"o" * (1 << 20)

    @get("/object")
    async def download() -> Stream:
        return Stream(chunks(), media_type="application/octet-stream")

    app = Litestar([download], debug=False, logging_config=None)
    gated = with_turns(app, TokenCache(), [])
    scope = {
        "type": "http", "method": "GET", "path": "/object", "raw_path": b"/object",
        "headers": [], "query_string": b"", "http_version": "1.1", "scheme": "http",
        "server": ("test", 80), "client": ("client", 1), "root_path": "",
    }  # fmt: skip

    async def receive() -> dict:
        await asyncio.Event().wait()  # the client neither reads nor leaves
        return {}

    client = Client(reads=1)

    async def serve() -> None:
        await gated(scope, receive, client.send)

    await request("a", serve)  # no error: the answer was cut short, its connection to close
    assert client.sent[0]["type"] == "http.response.start"
    assert not waiting._answer_bytes


def test_an_error_raised_while_an_answer_was_cut_short_is_not_swallowed() -> None:
    real = KeyError("a bug in a clean-up")
    real.__context__ = writing.AnswerTooSlow("the client did not take its answer in time")
    assert not writing.cut_short(real)
    both = ExceptionGroup("two", [writing.AnswerTooSlow("slow"), ValueError("a bug")])
    wrapped = RuntimeError("Exception caught after response started")
    wrapped.__cause__ = both
    assert not writing.cut_short(wrapped)
    wrapped.__cause__ = ExceptionGroup("one", [writing.AnswerTooSlow("slow")])
    assert writing.cut_short(wrapped)


async def test_the_cap_on_answers_not_taken_holds_without_turns_at_work() -> None:
    """DUCTOR_STREAMS_REQUESTS_AT_WORK_PER_TENANT=0 turns the turns off, not the answers' cap."""
    waiting.configure_turns(0, answer_bytes_per_tenant=1_000_000)
    stalled = Client(reads=0)
    writer = asyncio.ensure_future(
        request("a", lambda: writing.in_pieces(stalled.send, {"body": b"n" * 1_200_000}))
    )
    await asyncio.sleep(0.05)
    assert waiting._answer_bytes == {"a": 1_200_000}
    with pytest.raises(waiting.AnswersNotTaken):
        await request("a", lambda: asyncio.sleep(0))
    await request("b", lambda: asyncio.sleep(0))
    with pytest.raises(writing.AnswerTooSlow):
        await writer
    await request("a", lambda: asyncio.sleep(0))


async def test_past_the_process_cap_a_tenant_at_its_share_is_refused_and_one_below_served() -> None:
    """Each tenant under its own cap, all together past the process's: the tenants holding at
    least their equal share are refused, a tenant holding less (or nothing) is served."""
    waiting.configure_turns(
        8,
        waiting_per_tenant=8,
        answer_bytes_per_tenant=1_000_000,
        answer_bytes_per_process=1_500_000,
    )
    body = b"w" * 800_000
    stalled = [Client(reads=0) for _ in range(2)]
    writers = [
        asyncio.ensure_future(request(t, lambda c=c: writing.in_pieces(c.send, {"body": body})))
        for t, c in zip(("a", "b"), stalled, strict=True)
    ]
    await asyncio.sleep(0.05)  # 1.6 MB held, 0.8 MB each: past the process's 1.5 MB
    for tenant in ("a", "b"):
        with pytest.raises(waiting.AnswersNotTaken) as no:
            await request(tenant, lambda: asyncio.sleep(0))
        assert "its share" in no.value.detail
    await request("c", lambda: asyncio.sleep(0))  # holding nothing: served
    for w in writers:
        with pytest.raises(writing.AnswerTooSlow):
            await w
    await request("a", lambda: asyncio.sleep(0))  # freed: served again


async def test_an_answer_of_a_tenant_already_at_its_cap_is_not_written_at_all() -> None:
    """A request let in before its tenant's answers reached the cap still answers; but a large
    answer is not written past the cap: it ends at once (its connection closed), holding
    nothing, where it would otherwise be held until its own stall."""
    body = b"v" * 600_000
    stalled = [Client(reads=0) for _ in range(2)]
    writers = [
        asyncio.ensure_future(request("a", lambda c=c: writing.in_pieces(c.send, {"body": body})))
        for c in stalled
    ]
    await asyncio.sleep(0.05)  # 1.2 MB held: past tenant a's 1 MB
    late = Client(reads=100)

    async def let_in_before() -> None:
        with waiting.request_budget(5.0):
            waiting.act_for("a")
            waiting._own_budget().tenant = "a"  # (as a request at work before the cap was hit)
            await writing.in_pieces(late.send, {"body": body})

    with pytest.raises(writing.AnswerTooSlow):
        await let_in_before()
    assert late.sent == [] and waiting._answer_bytes == {"a": 1_200_000}
    for w in writers:
        with pytest.raises(writing.AnswerTooSlow):
            await w
