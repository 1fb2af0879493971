"""Each tenant's turns at work (application/waiting.py): taken by a request, handed over in
arrival order, given back when it ends or starts to wait for a live event, never lost."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest

from application import waiting
from application.access import Caller
from application.append_records import blocking
from application.live_slots import LiveSlots
from application.wake import WakeRegistry
from domain import errors
from tests.support.builders import definition, new_key


@pytest.fixture(autouse=True)
def two_turns() -> Iterator[None]:
    waiting.configure_turns(2)
    yield
    waiting.configure_turns(0)
    assert not waiting._turns  # every turn came back


async def request(
    tenant: str, work: asyncio.Event, log: list[str], name: str, budget: float = 5.0
) -> None:
    """A request of `tenant`: takes its turn, works until `work` is set."""
    with waiting.request_budget(budget):
        await waiting.take_turn(tenant)
        log.append(name)
        await work.wait()


async def test_past_its_turns_a_tenants_requests_wait_in_arrival_order() -> None:
    done = asyncio.Event()
    log: list[str] = []
    first = [asyncio.ensure_future(request("a", done, log, f"a{n}")) for n in range(2)]
    await asyncio.sleep(0)
    later = [asyncio.ensure_future(request("a", asyncio.Event(), log, f"a{n}")) for n in (2, 3)]
    other = asyncio.ensure_future(request("b", asyncio.Event(), log, "b0"))
    await asyncio.sleep(0.01)
    assert log == ["a0", "a1", "b0"]  # another tenant goes to work at once
    done.set()  # the first two end: their turns go to the next two, in order
    await asyncio.gather(*first)
    await asyncio.sleep(0.01)
    assert log == ["a0", "a1", "b0", "a2", "a3"]
    for task in [*later, other]:
        task.cancel()
    await asyncio.gather(*later, other, return_exceptions=True)


async def test_a_request_that_cannot_get_a_turn_within_its_budget_is_refused() -> None:
    busy = [asyncio.ensure_future(request("a", asyncio.Event(), [], "")) for _ in range(2)]
    await asyncio.sleep(0)
    waits = waiting.turn_waits[0]
    with pytest.raises(waiting.TooManyAtWork) as refused:
        await request("a", asyncio.Event(), [], "", budget=0.05)
    assert refused.value.code == "too-many-requests" and refused.value.retry_after == 1
    assert waiting.turn_waits[0] == waits + 1
    for task in busy:
        task.cancel()
    await asyncio.gather(*busy, return_exceptions=True)


async def test_a_request_cancelled_while_it_waits_or_as_it_is_handed_a_turn_loses_none() -> None:
    done = asyncio.Event()
    log: list[str] = []
    busy = [asyncio.ensure_future(request("a", done, log, f"a{n}")) for n in range(2)]
    await asyncio.sleep(0)
    gone = asyncio.ensure_future(request("a", asyncio.Event(), log, "gone"))
    handed = asyncio.ensure_future(request("a", asyncio.Event(), log, "handed"))
    last = asyncio.ensure_future(request("a", asyncio.Event(), log, "last"))
    await asyncio.sleep(0.01)
    gone.cancel()  # while it waits: skipped
    done.set()
    await asyncio.sleep(0)  # the turns are handed over ...
    handed.cancel()  # ... and this one is cancelled before it could run: handed on
    await asyncio.gather(*busy, gone, handed, return_exceptions=True)
    await asyncio.sleep(0.01)
    assert log == ["a0", "a1", "last"]
    last.cancel()
    await asyncio.gather(last, return_exceptions=True)


async def test_a_request_waiting_for_a_live_event_gives_its_turn_back_and_takes_one_again() -> None:
    slots = LiveSlots(10)
    caller = Caller(tenant="a", principal="p", scopes=frozenset({"streams:read"}))
    log: list[str] = []
    woken = asyncio.Event()

    async def long_poll(name: str) -> None:
        with waiting.request_budget(5.0):
            await waiting.take_turn("a")
            slot = slots.admit(caller)  # waits for records now: its turn goes back
            log.append(f"{name} waits")
            await woken.wait()
            slots.release(caller, slot)
            await waiting.back_to_work()
            log.append(f"{name} answers")
            await asyncio.sleep(0.01)  # at work on its answer

    polls = [asyncio.ensure_future(long_poll(f"p{n}")) for n in range(4)]
    await asyncio.sleep(0.01)
    assert log == [f"p{n} waits" for n in range(4)]  # four of them, on two turns
    log.clear()
    woken.set()
    await asyncio.sleep(0.005)
    assert log == ["p0 answers", "p1 answers"]  # two at work at once
    await asyncio.gather(*polls)
    assert log[2:] == ["p2 answers", "p3 answers"]


async def test_a_task_of_the_request_handed_a_turn_after_the_request_ended_gives_it_back() -> None:
    done = asyncio.Event()
    first = asyncio.ensure_future(request("a", done, [], ""))
    await asyncio.sleep(0)
    with waiting.request_budget(5.0):
        await waiting.take_turn("a")
        waiting.give_turn()  # waits for a live event
        second = asyncio.ensure_future(request("a", done, [], ""))
        await asyncio.sleep(0)  # both turns at work again
        # Its own work, in a task of its own that outlives the request, waits for a turn.
        helper = asyncio.ensure_future(waiting.back_to_work())
        await asyncio.sleep(0.01)
        assert not helper.done()
    done.set()  # the turns come back after the request ended: the helper's is given back
    await asyncio.gather(first, second, helper)


async def test_no_limit_and_no_request_take_no_turn() -> None:
    await waiting.take_turn("a")  # not a request's task: nothing to take
    assert not waiting._turns
    waiting.configure_turns(0)
    with waiting.request_budget(5.0):
        await waiting.take_turn("a")
        assert not waiting._turns


async def test_a_write_blocked_for_credit_gives_its_turn_back() -> None:
    """An append or an object commit waiting for credit waits for an acknowledgement, a
    request of the same tenant: holding its turn, it could keep the ack from running."""
    waiting.configure_turns(1)
    wake = WakeRegistry()
    key = new_key()
    block = definition(unread_policy="block", block_timeout_seconds=1)

    async def attempt():
        raise errors.Backpressure("no credit")

    async def object_commit() -> None:
        with waiting.request_budget(5.0):
            await waiting.take_turn("t1")
            with contextlib.suppress(errors.Backpressure):
                await blocking(wake, key, block, attempt)  # as an object commit does

    commit = asyncio.ensure_future(object_commit())
    await asyncio.sleep(0.05)
    with waiting.request_budget(0.3):  # the consumer's ack, same tenant
        await waiting.take_turn("t1")  # at once: the blocked write gave its turn back
    await commit


async def test_a_blocked_write_woken_tries_again_on_a_whole_budget_and_a_turn() -> None:
    """Its earlier attempts' waits on the database are not an outage (300 blocked writers once
    answered 503 within their block timeout), and an acknowledgement does not set every
    blocked writer of the tenant to work at once."""
    wake = WakeRegistry()
    key = new_key()
    block = definition(unread_policy="block", block_timeout_seconds=5)
    seen: list[tuple[float, bool]] = []

    async def attempt() -> str:
        budget = waiting._own_budget()
        assert budget is not None
        seen.append((waiting.allowance(), budget.turn is not None))
        if len(seen) == 1:
            budget.left = 0.01  # the first attempt spent its budget on the database
            raise errors.Backpressure("no credit")
        return "committed"

    async def write() -> str:
        with waiting.request_budget(1.0):
            await waiting.take_turn("t1")
            return await blocking(wake, key, block, attempt)

    writing = asyncio.ensure_future(write())
    await asyncio.sleep(0.05)
    wake.notify(key)  # an acknowledgement returned credit
    assert await asyncio.wait_for(writing, 5) == "committed"
    assert seen == [(1.0, True), (waiting.bound(), True)]


async def test_past_so_many_waiting_a_tenants_next_arriving_request_is_refused_at_once() -> None:
    """A client that sends requests and leaves without their answers is bound by no concurrency
    of its own: its tenant's queue for turns is capped, and the request past it is 429 at once,
    not after its budget. Another tenant is served; a request going back to work after a wait
    for a live event is not refused so; a place in the queue comes back as its request ends."""
    waiting.configure_turns(2, waiting_per_tenant=2)
    work, polled = asyncio.Event(), asyncio.Event()
    log: list[str] = []

    async def long_poll() -> str:
        with waiting.request_budget(5.0):
            waiting.act_for("a")
            await waiting.take_turn("a")
            waiting.give_turn()  # waits for a live event: not at work
            await polled.wait()  # (the tenant's turns and queue fill meanwhile)
            await waiting.back_to_work()  # queued past the cap: its wait is done
            return "answered"

    polling = asyncio.ensure_future(long_poll())
    await asyncio.sleep(0)
    at_work = [asyncio.ensure_future(request("a", work, log, f"a{n}")) for n in range(2)]
    await asyncio.sleep(0)
    queued = [asyncio.ensure_future(request("a", work, log, f"q{n}")) for n in range(2)]
    await asyncio.sleep(0.01)
    assert log == ["a0", "a1"]
    full = waiting.turn_queue_full[0]
    started = asyncio.get_running_loop().time()
    with pytest.raises(waiting.TooManyAtWork) as refused:
        await request("a", work, log, "refused", budget=5.0)
    assert asyncio.get_running_loop().time() - started < 1.0  # at once, not at its budget
    assert refused.value.retry_after == 1 and waiting.turn_queue_full[0] == full + 1
    done = asyncio.Event()
    done.set()
    await asyncio.wait_for(request("b", done, log, "b0"), 1.0)  # another tenant: at once
    polled.set()
    await asyncio.sleep(0.01)
    assert not polling.done()  # queued past the cap, not refused
    queued[0].cancel()  # a queued request gone: its place comes back
    await asyncio.sleep(0.01)
    later = asyncio.ensure_future(request("a", work, log, "later"))
    await asyncio.sleep(0.01)
    assert not later.done()  # queued, not refused
    work.set()
    assert await polling == "answered"
    await asyncio.gather(*at_work, *queued, later, return_exceptions=True)
    assert {"q1", "later"} <= set(log)


async def test_a_request_handed_its_turn_no_longer_counts_against_the_queue() -> None:
    """The turn given back goes to the request waiting; until that request's task runs again
    it still counted as waiting, and a request arriving in the same turn of the event loop (a
    group's commit answers many at once) was refused at once although nobody waited any more."""
    waiting.configure_turns(1, waiting_per_tenant=1)
    go, done = asyncio.Event(), asyncio.Event()
    done.set()
    log: list[str] = []

    async def holder() -> None:
        with waiting.request_budget(5.0):
            await waiting.take_turn("a")
            log.append("holder")
            await go.wait()  # then it ends: its turn goes to the one waiting

    async def arriving() -> None:
        await go.wait()  # woken in the same turn of the event loop, after the holder
        with waiting.request_budget(5.0):
            await waiting.take_turn("a")
            log.append("arrived")

    held = asyncio.ensure_future(holder())
    arrives = asyncio.ensure_future(arriving())
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(request("a", done, log, "waiting"))
    await asyncio.sleep(0.01)
    assert log == ["holder"]
    full = waiting.turn_queue_full[0]
    go.set()
    await asyncio.wait_for(asyncio.gather(held, queued, arrives), 2.0)
    assert log == ["holder", "waiting", "arrived"]
    assert waiting.turn_queue_full[0] == full


async def test_a_body_to_come_is_refused_before_it_is_read_when_the_queue_is_full() -> None:
    """Were its body in, it would be refused at once: so it is refused as it authenticates (at
    the edge's gate, for a token the process knows), its body never read. With room in the
    queue, it goes on to read its body as before."""
    waiting.configure_turns(1, waiting_per_tenant=1)
    work = asyncio.Event()
    holder = asyncio.ensure_future(request("a", work, [], "holder"))
    await asyncio.sleep(0)

    async def posting() -> str:
        with waiting.request_budget(5.0, body_to_come=True):
            waiting.act_for("a")
            await waiting.take_turn("a")
            return "reads its body"

    assert await posting() == "reads its body"  # the queue has room: its body is read
    queued = asyncio.ensure_future(request("a", work, [], "queued"))
    await asyncio.sleep(0.01)
    full = waiting.turn_queue_full[0]
    with pytest.raises(waiting.TooManyAtWork):
        await posting()
    assert waiting.turn_queue_full[0] == full + 1
    work.set()
    await asyncio.gather(holder, queued)


async def test_requests_admitted_with_their_body_to_come_count_until_it_is_in() -> None:
    """A request admitted before its body is in (at the edge's gate) counts in its tenant's
    turns from then: not counted, every request arriving before the first one's body was in
    was admitted, and under a flood of one tenant's acks each turn of the event loop admitted
    thousands, routed and then refused. Admitted, it is not refused for itself once its body
    is in (its authentication checking again); it is forgotten as it ends; an upload, whose
    body streams to the store and which takes no turn, is not counted."""
    waiting.configure_turns(1, waiting_per_tenant=1)
    bodies_in = asyncio.Event()
    log: list[str] = []

    async def posting(name: str, streamed: bool = False) -> None:
        with waiting.request_budget(5.0, body_to_come=True, streamed=streamed):
            waiting.act_for("a")
            await waiting.take_turn("a")  # the gate
            log.append(f"{name} admitted")
            await bodies_in.wait()
            await waiting.take_turn("a")  # as it authenticates: admitted already
            if not streamed:  # (an upload's body streams to the store: it takes no turn)
                await waiting.body_arrived()
            log.append(f"{name} at work")
            await asyncio.sleep(0.01)

    upload = asyncio.ensure_future(posting("upload", streamed=True))
    first = asyncio.ensure_future(posting("first"))  # its turn, once its body is in
    second = asyncio.ensure_future(posting("second"))  # the queue's one place
    await asyncio.sleep(0.01)
    assert log == ["upload admitted", "first admitted", "second admitted"]
    full = waiting.turn_queue_full[0]
    with pytest.raises(waiting.TooManyAtWork):  # its bodies still to come, a tenant is full
        await posting("third")
    assert waiting.turn_queue_full[0] == full + 1
    bodies_in.set()
    await asyncio.wait_for(asyncio.gather(upload, first, second), 2.0)
    assert log[3:] == ["upload at work", "first at work", "second at work"]
    done = asyncio.Event()
    done.set()
    await asyncio.wait_for(request("a", done, log, "later"), 1.0)  # all forgotten
    assert not waiting._turns


async def test_a_request_ended_before_its_body_came_is_forgotten() -> None:
    waiting.configure_turns(1, waiting_per_tenant=1)
    with waiting.request_budget(5.0, body_to_come=True):
        waiting.act_for("a")
        await waiting.take_turn("a")
    assert not waiting._turns


async def test_a_request_admitted_with_its_body_to_come_is_not_refused_once_it_is_in() -> None:
    """Admitted, its place in the queue counted from then (`_reserve`), it waits for its turn
    once its body is in, whatever was admitted after it: refused then, for a later request's
    place, its body was read for nothing and the later one went before it. (Here a request with
    no body took the turn free meanwhile, as it may: the bodies were still to come.)"""
    waiting.configure_turns(1, waiting_per_tenant=1)
    bodies = {"first": asyncio.Event(), "second": asyncio.Event()}
    log: list[str] = []
    done = asyncio.Event()

    async def posting(name: str) -> None:
        with waiting.request_budget(5.0, body_to_come=True):
            waiting.act_for("a")
            await waiting.take_turn("a")  # the gate
            await bodies[name].wait()
            await waiting.body_arrived()
            log.append(f"{name} at work")
            await done.wait()

    first = asyncio.ensure_future(posting("first"))
    second = asyncio.ensure_future(posting("second"))
    await asyncio.sleep(0.01)
    reading = asyncio.ensure_future(request("a", done, log, "no body"))
    await asyncio.sleep(0.01)
    bodies["first"].set()
    await asyncio.sleep(0.01)
    bodies["second"].set()
    await asyncio.sleep(0.01)
    done.set()
    await asyncio.wait_for(asyncio.gather(first, second, reading), 2.0)
    assert log == ["no body", "first at work", "second at work"]
