"""The client's workflow helpers: Idempotency-Keys that are the same on every run of a step."""

from __future__ import annotations

import pytest

from ductor_streams_client.workflows import (
    MAX_KEY_LENGTH,
    dbos_step_key,
    restate_append,
    restate_step_key,
    step_idempotency_key,
)


def test_a_step_key_names_the_engine_the_workflow_and_the_step() -> None:
    assert step_idempotency_key("dbos", "run-1", 3) == "dbos:run-1:3"
    assert step_idempotency_key("dbos", "run-1", 3) == step_idempotency_key("dbos", "run-1", 3)
    assert step_idempotency_key("dbos", "run-1", 4) != step_idempotency_key("dbos", "run-1", 3)


def test_a_key_too_long_or_unprintable_for_the_service_is_a_digest_of_it() -> None:
    long = step_idempotency_key("restate", "w" * 300, "append")
    assert len(long) <= MAX_KEY_LENGTH and long.startswith("restate:sha256:")
    assert long == step_idempotency_key("restate", "w" * 300, "append")
    assert long != step_idempotency_key("restate", "w" * 301, "append")
    assert step_idempotency_key("dbos", "run\n1", 1).startswith("dbos:sha256:")


def test_the_dbos_key_is_refused_outside_a_step() -> None:
    with pytest.raises(RuntimeError, match=r"inside a @DBOS\.step"):
        dbos_step_key()


class Ctx:
    """Restate's context as the helpers use it: the invocation id and a journaled `run`."""

    class _Request:
        id = "inv_1abc"

    def __init__(self) -> None:
        self.journal: dict[str, object] = {}

    def request(self) -> _Request:
        return self._Request()

    async def run(self, name: str, action):
        if name not in self.journal:  # a replay answers the journaled result
            self.journal[name] = await action()
        return self.journal[name]


class Client:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list, str]] = []

    async def append(self, run_id, stream_id, records, *, idempotency_key, content_type):
        from ductor_streams_client.models import AppendAnswer, Credit

        self.calls.append((run_id, stream_id, list(records), idempotency_key))
        return AppendAnswer(1, 1, 1, Credit(0, 0, 100, 1000))


async def test_a_restate_append_is_a_journaled_step_keyed_by_the_invocation() -> None:
    ctx, client = Ctx(), Client()
    assert restate_step_key(ctx, "out-1") == "restate:inv_1abc:out-1"
    answer = await restate_append(ctx, client, "run-1", "out", [{"a": 1}], "out-1")
    assert answer["last_sequence"] == 1
    assert client.calls == [("run-1", "out", [{"a": 1}], "restate:inv_1abc:out-1")]
    ctx.journal.clear()  # the step ran, its result was not journaled: Restate runs it again
    await restate_append(ctx, client, "run-1", "out", [{"a": 1}], "out-1")
    assert client.calls[1][3] == client.calls[0][3]  # the same key: the service answers once
