"""The leader that does requests of one kind together (adapters/postgres/together.py): turns,
their bounds, and each request's own answer."""

from __future__ import annotations

import asyncio

import pytest

from adapters.postgres.together import Together
from application import waiting
from application.waiting import Unanswered


class Recorded:
    """`do`: each turn's items recorded; an item "boom" fails alone; "all" fails the turn."""

    def __init__(self) -> None:
        self.turns: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, items: list[str]) -> list[str | BaseException]:
        self.turns.append(list(items))
        await self.gate.wait()
        if "all" in items:
            raise RuntimeError("the turn failed")
        return [ValueError(i) if i == "boom" else i.upper() for i in items]


def together(do: Recorded, **options: object) -> Together[str, str]:
    return Together(
        do,
        key_of=lambda item: item.rstrip("0123456789"),
        group_of=lambda item: None,
        name="test",
        **options,  # type: ignore[arg-type]
    )


async def test_what_waits_meanwhile_goes_in_the_next_turn_each_key_once_a_turn() -> None:
    do = Recorded()
    do.gate.clear()
    leader = together(do)
    first = asyncio.create_task(leader.submit("a"))
    await asyncio.sleep(0)  # the first turn has started, alone
    rest = [asyncio.create_task(leader.submit(i)) for i in ("b", "c", "b2", "boom")]
    await asyncio.sleep(0)
    do.gate.set()
    assert await first == "A"
    answers = await asyncio.gather(*rest, return_exceptions=True)
    assert answers[:2] == ["B", "C"]
    assert answers[2] == "B2" and isinstance(answers[3], ValueError)
    # "b2" is of the key "b": not in the turn that took "b".
    assert do.turns == [["a"], ["b", "c", "boom"], ["b2"]]


async def test_a_turn_stops_at_its_weight_but_takes_one_item_at_least() -> None:
    do = Recorded()
    do.gate.clear()
    leader = together(do, weigh=len, most_weight=6)
    first = asyncio.create_task(leader.submit("x"))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(leader.submit(i)) for i in ("aaa", "bbb", "ccc", "dddddddddd")]
    await asyncio.sleep(0)
    do.gate.set()
    await asyncio.gather(first, *rest)
    assert do.turns == [["x"], ["aaa", "bbb"], ["ccc"], ["dddddddddd"]]


async def test_a_turn_that_raises_fails_its_own_items_only() -> None:
    do = Recorded()
    do.gate.clear()
    leader = together(do)
    failing = [asyncio.create_task(leader.submit(i)) for i in ("all", "p")]
    await asyncio.sleep(0)
    later = asyncio.create_task(leader.submit("q"))
    do.gate.set()
    answers = await asyncio.gather(*failing, return_exceptions=True)
    assert all(isinstance(a, RuntimeError) for a in answers)
    assert await later == "Q"


async def test_a_request_past_its_bound_is_withdrawn_if_queued_or_unknown_if_taken() -> None:
    do = Recorded()
    do.gate.clear()
    leader = together(do)

    async def within(item: str) -> str:
        with waiting.request_budget(0.05):
            return await leader.submit(item)

    taken = asyncio.create_task(within("t"))
    await asyncio.sleep(0)
    queued = asyncio.create_task(within("u"))
    with pytest.raises(Unanswered) as unknown:
        await taken
    with pytest.raises(Unanswered) as withdrawn:
        await queued
    assert unknown.value.outcome_unknown and not withdrawn.value.outcome_unknown
    cancelled = asyncio.create_task(leader.submit("v"))
    await asyncio.sleep(0)
    cancelled.cancel()
    do.gate.set()
    await asyncio.sleep(0.01)
    assert do.turns == [["t"]]  # neither the withdrawn one nor the cancelled one was done
