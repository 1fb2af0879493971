"""Consumers and acknowledgements over HTTP (docs/http-api.md "Consumers and credit")."""

from __future__ import annotations

from typing import Any

import httpx

PROBLEM_JSON = "application/problem+json"


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body = response.json()
    for field in ("type", "title", "status", "detail", "code"):
        assert field in body, body
    assert body["status"] == status
    assert body["code"] == code, body
    return body


async def create_with_records(
    api: httpx.AsyncClient, run_id: str, stream_id: str, *data: Any
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "output"}
    )
    assert created.status_code == 201, created.text
    if data:
        appended = await api.post(
            f"/runs/{run_id}/streams/{stream_id}/records",
            json={"records": [{"data": d} for d in data]},
        )
        assert appended.status_code == 201, appended.text


async def ack(
    api: httpx.AsyncClient,
    run_id: str,
    stream_id: str,
    consumer: str,
    sequence: int,
    **kwargs: Any,
) -> httpx.Response:
    return await api.post(
        f"/runs/{run_id}/streams/{stream_id}/consumers/{consumer}/ack",
        json={"sequence": sequence},
        **kwargs,
    )


async def state(api: httpx.AsyncClient, run_id: str, stream_id: str) -> dict[str, Any]:
    response = await api.get(f"/runs/{run_id}/streams/{stream_id}")
    assert response.status_code == 200, response.text
    return response.json()["state"]


def acked(current: dict[str, Any]) -> dict[str, int]:
    return {c["consumer_id"]: c["acked_sequence"] for c in current["consumers"]}


async def test_the_first_ack_creates_the_consumer(api: httpx.AsyncClient, run_id: str) -> None:
    await create_with_records(api, run_id, "s", 1, 2, 3)
    response = await ack(api, run_id, "s", "reader-1", 2)
    assert response.status_code in (200, 201), response.text
    body = response.json()
    assert set(body) == {"consumer_id", "acked_sequence", "credit"}
    assert body["consumer_id"] == "reader-1"
    assert body["acked_sequence"] == 2
    assert body["credit"] == {
        "unread_items": 1,
        "unread_bytes": 1,
        "max_unread_items": 10_000,
        "max_unread_bytes": 67_108_864,
    }
    assert (await state(api, run_id, "s"))["consumers"] == [
        {"consumer_id": "reader-1", "acked_sequence": 2, "holds_credit": True}
    ]


async def test_ack_of_zero_on_an_empty_stream_creates_the_consumer(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create_with_records(api, run_id, "empty")
    response = await ack(api, run_id, "empty", "early", 0)
    assert response.status_code in (200, 201), response.text
    assert response.json()["acked_sequence"] == 0
    assert acked(await state(api, run_id, "empty")) == {"early": 0}


async def test_an_equal_ack_is_a_200_no_op(api: httpx.AsyncClient, run_id: str) -> None:
    await create_with_records(api, run_id, "s", 1, 2, 3)
    first = await ack(api, run_id, "s", "c", 2)
    assert first.status_code in (200, 201)
    before = await state(api, run_id, "s")
    again = await ack(api, run_id, "s", "c", 2)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert (await state(api, run_id, "s")) == before


async def test_acks_advance(api: httpx.AsyncClient, run_id: str) -> None:
    await create_with_records(api, run_id, "s", 1, 2, 3)
    assert (await ack(api, run_id, "s", "c", 1)).status_code in (200, 201)
    advanced = await ack(api, run_id, "s", "c", 3)
    assert advanced.status_code == 200, advanced.text
    assert advanced.json()["acked_sequence"] == 3
    assert advanced.json()["credit"]["unread_items"] == 0
    assert acked(await state(api, run_id, "s")) == {"c": 3}


async def test_a_lower_ack_is_409_ack_regression(api: httpx.AsyncClient, run_id: str) -> None:
    await create_with_records(api, run_id, "s", 1, 2, 3)
    assert (await ack(api, run_id, "s", "c", 2)).status_code in (200, 201)
    assert_problem(await ack(api, run_id, "s", "c", 1), 409, "ack-regression")
    assert_problem(await ack(api, run_id, "s", "c", 0), 409, "ack-regression")
    assert acked(await state(api, run_id, "s")) == {"c": 2}


async def test_an_ack_above_the_head_is_400_ack_ahead_of_head(
    api: httpx.AsyncClient, run_id: str
) -> None:
    await create_with_records(api, run_id, "s", 1, 2, 3)
    assert_problem(await ack(api, run_id, "s", "new", 4), 400, "ack-ahead-of-head")
    assert (await state(api, run_id, "s"))["consumers"] == []
    assert (await ack(api, run_id, "s", "c", 1)).status_code in (200, 201)
    assert_problem(await ack(api, run_id, "s", "c", 10), 400, "ack-ahead-of-head")
    assert acked(await state(api, run_id, "s")) == {"c": 1}


async def test_another_principals_ack_is_403_cross_scope_ack(
    api: httpx.AsyncClient, run_id: str, tokens: Any
) -> None:
    await create_with_records(api, run_id, "s", 1, 2, 3)
    assert (await ack(api, run_id, "s", "mine", 1)).status_code in (200, 201)
    intruder = await tokens.create(tenant="default", principal="mallory")
    headers = {"Authorization": f"Bearer {intruder}"}
    assert_problem(await ack(api, run_id, "s", "mine", 2, headers=headers), 403, "cross-scope-ack")
    assert_problem(await ack(api, run_id, "s", "mine", 1, headers=headers), 403, "cross-scope-ack")
    assert acked(await state(api, run_id, "s")) == {"mine": 1}
    # The intruder may still have consumers of its own; the owner's stays bound to the owner.
    own = await ack(api, run_id, "s", "malloryz", 3, headers=headers)
    assert own.status_code in (200, 201), own.text
    assert_problem(await ack(api, run_id, "s", "malloryz", 3), 403, "cross-scope-ack")
    assert (await ack(api, run_id, "s", "mine", 2)).status_code == 200
    assert acked(await state(api, run_id, "s")) == {"mine": 2, "malloryz": 3}


async def test_the_stream_document_lists_its_consumers(api: httpx.AsyncClient, run_id: str) -> None:
    await create_with_records(api, run_id, "s", 1, 2, 3, 4)
    for consumer, sequence in (("b", 3), ("a", 1), ("c", 0)):
        assert (await ack(api, run_id, "s", consumer, sequence)).status_code in (200, 201)
    consumers = (await state(api, run_id, "s"))["consumers"]
    assert sorted(consumers, key=lambda c: c["consumer_id"]) == [
        {"consumer_id": "a", "acked_sequence": 1, "holds_credit": True},
        {"consumer_id": "b", "acked_sequence": 3, "holds_credit": True},
        {"consumer_id": "c", "acked_sequence": 0, "holds_credit": True},
    ]


async def test_unread_credit_counts_after_the_minimum_acknowledgement(
    api: httpx.AsyncClient, run_id: str
) -> None:
    # Sizes 1, 2, 3, 4, 5 bytes (compact JSON of each integer).
    await create_with_records(api, run_id, "s", 1, 22, 333, 4444, 55555)

    def credit(items: int, size: int) -> dict[str, int]:
        return {
            "unread_items": items,
            "unread_bytes": size,
            "max_unread_items": 10_000,
            "max_unread_bytes": 67_108_864,
        }

    assert (await state(api, run_id, "s"))["credit"] == credit(5, 15)  # no consumer: all
    assert (await ack(api, run_id, "s", "slow", 1)).json()["credit"] == credit(4, 14)
    assert (await ack(api, run_id, "s", "fast", 3)).json()["credit"] == credit(4, 14)
    assert (await state(api, run_id, "s"))["credit"] == credit(4, 14)
    assert (await ack(api, run_id, "s", "slow", 4)).json()["credit"] == credit(2, 9)
    assert (await ack(api, run_id, "s", "fast", 5)).json()["credit"] == credit(1, 5)
    assert (await ack(api, run_id, "s", "slow", 5)).json()["credit"] == credit(0, 0)
    # A new consumer at 0 holds every record unread again.
    assert (await ack(api, run_id, "s", "late", 0)).json()["credit"] == credit(5, 15)
    appended = await api.post(
        f"/runs/{run_id}/streams/s/records", json={"records": [{"data": "x"}]}
    )
    assert appended.json()["credit"] == credit(6, 18)
    assert (await state(api, run_id, "s"))["credit"] == credit(6, 18)


async def test_ack_of_an_unknown_stream_is_404(api: httpx.AsyncClient, run_id: str) -> None:
    assert_problem(await ack(api, run_id, "nope", "c", 0), 404, "not-found")
