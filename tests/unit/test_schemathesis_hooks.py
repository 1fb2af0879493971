"""The schemathesis hooks (tests/support/schemathesis_hooks.py) set aside a created stream not
found (ST302) only when a request in between erased it, on either surface."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from schemathesis.openapi.checks import EnsureResourceAvailability

from tests.support import schemathesis_hooks as hooks

NOT_FOUND = {"code": "not-found", "status": 404, "detail": "no stream 's' in run 'r'"}


def case(operation: str, **path: str) -> Any:
    raw = {"operationId": operation}
    return SimpleNamespace(
        operation=SimpleNamespace(definition=SimpleNamespace(raw=raw)), path_parameters=path
    )


def answer(status: int, body: dict[str, Any] | None = None) -> Any:
    kind = "application/problem+json" if status >= 400 else "application/json"
    return SimpleNamespace(
        status_code=status,
        content=json.dumps(body or {}).encode(),
        headers={"content-type": [kind]},
    )


def not_found_after_create() -> EnsureResourceAvailability:
    return EnsureResourceAvailability(
        operation="POST /api/workflow-streams/runs/{run_id}/streams",
        message="The API returned `404 Not Found` for a resource that was just created.",
        created_with="POST /api/workflow-streams/runs/{run_id}/streams",
        not_available_with="POST /api/workflow-streams/runs/{run_id}/streams/{stream_id}/close",
    )


@pytest.fixture(autouse=True)
def fresh_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "ERASURES", hooks.Erasures())


def call(operation: str, status: int, body: dict[str, Any] | None = None, **path: str) -> None:
    hooks.after_call(None, case(operation, **path), answer(status, body))


def kept(**path: str) -> bool:
    close = case("closeStream", **path)
    return hooks.filter_failure(None, not_found_after_create(), close, answer(404, NOT_FOUND))


def test_a_stream_erased_through_its_durable_streams_url_is_state() -> None:
    # The sequence schemathesis found (seed 871925298): create natively, delete through the
    # Durable Streams route it linked by inference, close through the native link.
    call("createStream", 201, {"stream_id": "C-.m.zNp"}, run_id="d0..t34h")
    call("dsDeleteInRun", 204, run_id="d0..t34h", stream_id="C-.m.zNp")
    assert not kept(run_id="d0..t34h", stream_id="C-.m.zNp")


def test_the_default_run_and_a_run_deletion_erase_it_too() -> None:
    call("createStream", 201, {"stream_id": "s"}, run_id="default")
    call("dsDelete", 204, stream_id="s")
    assert not kept(run_id="default", stream_id="s")
    call("createStream", 201, {"stream_id": "s"}, run_id="r")
    call("deleteRun", 204, run_id="r")
    assert not kept(run_id="r", stream_id="s")


def test_a_created_stream_not_found_is_still_a_failure() -> None:
    call("createStream", 201, {"stream_id": "s"}, run_id="r")
    assert kept(run_id="r", stream_id="s")
    call("dsDeleteInRun", 404, NOT_FOUND, run_id="r", stream_id="s")  # erased nothing
    call("dsDeleteInRun", 204, run_id="r", stream_id="other")
    assert kept(run_id="r", stream_id="s")


def test_a_stream_created_again_after_its_erasure_must_be_found() -> None:
    call("createStream", 201, {"stream_id": "s"}, run_id="r")
    call("dsDeleteInRun", 204, run_id="r", stream_id="s")
    call("dsCreateInRun", 201, run_id="r", stream_id="s")
    assert kept(run_id="r", stream_id="s")
