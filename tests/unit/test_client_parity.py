"""The async and the sync client are twins: the same public methods with the same parameters,
and the table below is the whole list of the names they do not share. A method added to one
and not the other fails here."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from ductor_streams_client import StreamsClient, SyncStreamsClient
from ductor_streams_client.producer import Producer, SyncProducer

# async name -> sync name: only the closing of the client itself (asyncio's `aclose`) and a
# producer's quiet stop differ. Nothing else may.
RENAMED = {"aclose": "close", "aclose_quietly": "close_quietly"}
# Kept on the async client for callers of earlier versions, and warning; never on the sync one
# (whose `close()` closes the client).
DEPRECATED = {StreamsClient: {"close"}}
TWINS = [(StreamsClient, SyncStreamsClient), (Producer, SyncProducer)]


def public(cls: type) -> dict[str, Any]:
    return {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_")}


def is_async(function: Any) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)


def differences(async_cls: type, sync_cls: type) -> list[str]:
    """Every way `sync_cls` is not `async_cls`'s twin, in words."""
    found: list[str] = []
    deprecated = {n for c, names in DEPRECATED.items() if issubclass(async_cls, c) for n in names}
    mine = {
        RENAMED.get(name, name): value
        for name, value in public(async_cls).items()
        if name not in deprecated
    }
    theirs = public(sync_cls)
    for name in sorted(mine.keys() - theirs.keys()):
        found.append(f"{sync_cls.__name__} lacks {name}")
    for name in sorted(theirs.keys() - mine.keys()):
        found.append(f"{async_cls.__name__} lacks {name}")
    for name in sorted(mine.keys() & theirs.keys()):
        a, s = mine[name], theirs[name]
        if isinstance(a, property) or isinstance(s, property):
            if not (isinstance(a, property) and isinstance(s, property)):
                found.append(f"{name} is a property on one side only")
            continue
        if is_async(s):
            found.append(f"{sync_cls.__name__}.{name} is async")
        shape = [
            [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]
            for f in (a, s)
        ]
        if shape[0] != shape[1]:
            found.append(f"{name}: {inspect.signature(a)} vs {inspect.signature(s)}")
    return found


@pytest.mark.parametrize("async_cls, sync_cls", TWINS, ids=lambda c: c.__name__)
def test_the_sync_twin_has_the_same_methods_with_the_same_parameters(
    async_cls: type, sync_cls: type
) -> None:
    assert differences(async_cls, sync_cls) == []


def test_the_async_client_methods_that_talk_to_the_service_are_async() -> None:
    sync_only = {"producer"}  # builds a Producer; sends nothing itself
    for name, method in public(StreamsClient).items():
        assert is_async(method) == (name not in sync_only), name


def test_a_method_on_one_twin_only_is_found() -> None:
    class Grown(SyncStreamsClient):
        def compact(self, run_id: str, stream_id: str) -> None: ...

    class Reshaped(SyncStreamsClient):
        def get_stream(self, run_id: str, stream: str) -> Any: ...  # type: ignore[override]

    class Shrunk(StreamsClient):
        async def compact(self, run_id: str) -> None: ...

    assert differences(StreamsClient, Grown) == ["StreamsClient lacks compact"]
    assert differences(Shrunk, SyncStreamsClient) == ["SyncStreamsClient lacks compact"]
    assert [d.split(":")[0] for d in differences(StreamsClient, Reshaped)] == ["get_stream"]
