"""A query or path parameter of the native API that is not what it must be is 400 invalid-input
with `field` naming it and a detail that says what it must be, with the bounds the OpenAPI
document gives it (docs/http-api.md "Conventions"): "limit must be a whole number from 1 to
1000, not '1.5'", never the decoder's "limit: Expected `int`, got `str`". Every integer and
number query parameter of the document's native routes is tried, so a new one is held to it
too. On the application itself, over the memory adapters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from entrypoints.container import memory_container
from entrypoints.http.app import create_app
from entrypoints.http.streams import API_PREFIX

HUGE = "1" + "0" * 4999  # 5,000 digits: quoted cut short
# Path parameters filled in: a parameter is refused before the route reads its path.
PATH_VALUES = {
    "run_id": "r",
    "stream_id": "s",
    "consumer_id": "c",
    "object_id": "obj-" + "0" * 32,
}


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[AsyncTestClient[Litestar]]:
    async with AsyncTestClient(app=create_app(memory_container())) as client:
        yield client


async def numeric_query_parameters(
    client: AsyncTestClient[Litestar],
) -> list[tuple[str, str, dict[str, Any]]]:
    """(path, name, schema) of each integer or number query parameter of the native routes."""
    document = (await client.get("/schema/openapi.json")).json()
    found = []
    for path, item in document["paths"].items():
        if not path.startswith(API_PREFIX):
            continue
        for operation in item.values():
            for parameter in operation.get("parameters", ()):
                schema = parameter["schema"]
                if parameter["in"] == "query" and schema.get("type") in ("integer", "number"):
                    found.append((path.format(**PATH_VALUES), parameter["name"], schema))
    return found


def bound(value: float, schema: dict[str, Any]) -> str:
    return str(int(value)) if schema["type"] == "integer" else f"{value:g}"


async def test_every_numeric_query_parameter_says_what_it_must_be(
    client: AsyncTestClient[Litestar],
) -> None:
    parameters = await numeric_query_parameters(client)
    # The ones there are today, at least: cursor, limit and wait of a read, and the limits of
    # every listing.
    assert {name for _, name, _ in parameters} == {"cursor", "limit", "wait"}
    assert len(parameters) >= 7
    for path, name, schema in parameters:
        low, high = bound(schema["minimum"], schema), bound(schema["maximum"], schema)
        kind = "a whole number" if schema["type"] == "integer" else "a number"
        wrong = ["abc", "", str(int(schema["minimum"]) - 1), str(int(schema["maximum"]) + 1)]
        wrong += ["1.5"] if schema["type"] == "integer" else ["nan"]
        for value in wrong:
            answer = await client.get(path, params={name: value})
            assert answer.status_code == 400, (path, name, value, answer.text)
            body = answer.json()
            assert body["code"] == "invalid-input"
            assert body["field"] == name, (path, body)
            expected = f"{name} must be {kind} from {low} to {high}, not {value!r}"
            assert body["detail"] == expected, (path, body)
        huge = (await client.get(path, params={name: HUGE})).json()
        assert huge["field"] == name
        assert huge["detail"].endswith(f", not '{HUGE[:40]}…'"), huge


async def test_the_last_of_a_repeated_parameter_is_the_one_judged(
    client: AsyncTestClient[Litestar],
) -> None:
    answer = await client.get(f"{API_PREFIX}/runs?limit=5&limit=1.5")
    assert answer.status_code == 400
    assert answer.json()["detail"] == "limit must be a whole number from 1 to 1000, not '1.5'"


async def test_a_parameter_off_its_pattern_is_named_with_the_pattern(
    client: AsyncTestClient[Litestar],
) -> None:
    listed = await client.get(f"{API_PREFIX}/runs", params={"after": "-x"})
    assert listed.status_code == 400
    body = listed.json()
    assert (body["code"], body["field"]) == ("invalid-input", "after")
    assert body["detail"] == "after must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$, not '-x'"
    revoked = await client.delete(f"{API_PREFIX}/tokens/nope")
    assert revoked.status_code == 400
    body = revoked.json()
    assert (body["code"], body["field"]) == ("invalid-input", "token_id")
    assert body["detail"] == "token_id must match ^tok_[0-9a-f]{16}$, not 'nope'"
