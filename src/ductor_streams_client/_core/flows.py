"""The operations' flows: streams, runs, tokens, appends, reads and acknowledgements. Each
builds its `Call` and names the type its answer decodes to; the drivers run them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from ductor_streams_client import models
from ductor_streams_client._core.exchange import Call, Flow, one
from ductor_streams_client._core.wire import (
    API_PREFIX,
    append_body,
    encode_record,
    new_key,
    segment,
    stream_path,
)
from ductor_streams_client._core.wire import encode_json as _encode


def _setting(value: Any) -> Any:
    return msgspec.to_builtins(value) if isinstance(value, msgspec.Struct) else value


def create_stream(
    run_id: str,
    stream_id: str | None,
    direction: str,
    settings: Mapping[str, Any],
) -> Flow[models.StreamDocument]:
    body: dict[str, Any] = {"direction": direction}
    if stream_id is not None:
        body["stream_id"] = stream_id
    for name, value in settings.items():
        if value is not None:
            body[name] = _setting(value)
    # Without a stream ID the service makes one: a repeat after a lost answer would make two.
    return one(
        Call(
            "POST",
            stream_path(run_id),
            models.StreamDocument,
            body=_encode(body),
            idempotent=stream_id is not None,
        )
    )


def get_stream(run_id: str, stream_id: str) -> Flow[models.StreamDocument]:
    return one(Call("GET", stream_path(run_id, stream_id), models.StreamDocument))


def list_streams(run_id: str, after: str | None, limit: int) -> Flow[models.StreamList]:
    params: dict[str, Any] = {"limit": limit}
    if after is not None:
        params["after"] = after
    return one(Call("GET", stream_path(run_id), models.StreamList, params=params))


def close(run_id: str, stream_id: str) -> Flow[models.StreamDocument]:
    return one(Call("POST", stream_path(run_id, stream_id, "/close"), models.StreamDocument))


def set_legal_hold(
    run_id: str, stream_id: str, enabled: bool, reason: str | None
) -> Flow[models.LegalHold]:
    body: dict[str, Any] = {"enabled": enabled}
    if reason is not None:
        body["reason"] = reason
    return one(
        Call(
            "PUT",
            stream_path(run_id, stream_id, "/legal-hold"),
            models.LegalHold,
            body=_encode(body),
        )
    )


def delete_stream(run_id: str, stream_id: str) -> Flow[None]:
    # A retry after a lost answer finds the stream gone: that is the delete having worked.
    return one(
        Call("DELETE", stream_path(run_id, stream_id), done_on_retry=frozenset({"not-found"}))
    )


def delete_run(run_id: str) -> Flow[None]:
    return one(
        Call(
            "DELETE",
            f"{API_PREFIX}/runs/{segment(run_id, 'run_id')}",
            done_on_retry=frozenset({"not-found"}),
        )
    )


def list_consumers(
    run_id: str, stream_id: str, after: str | None, limit: int
) -> Flow[models.ConsumersPage]:
    params: dict[str, Any] = {"limit": limit}
    if after is not None:
        params["after"] = after
    path = stream_path(run_id, stream_id, "/consumers")
    return one(Call("GET", path, models.ConsumersPage, params=params))


def delete_consumer(run_id: str, stream_id: str, consumer_id: str) -> Flow[None]:
    # A retry after a lost answer finds the consumer gone: that is the removal having worked.
    path = stream_path(run_id, stream_id, f"/consumers/{segment(consumer_id, 'consumer_id')}")
    return one(Call("DELETE", path, done_on_retry=frozenset({"not-found"})))


def list_runs(prefix: str | None, after: str | None, limit: int) -> Flow[models.RunsPage]:
    params: dict[str, Any] = {"limit": limit}
    if after is not None:
        params["after"] = after
    if prefix:
        params["prefix"] = prefix
    return one(Call("GET", f"{API_PREFIX}/runs", models.RunsPage, params=params))


def mint_token(
    scopes: Iterable[str],
    expires_in_seconds: int,
    principal: str | None,
    runs: Iterable[str] | None,
) -> Flow[models.MintedToken]:
    body: dict[str, Any] = {"scopes": list(scopes), "expires_in_seconds": expires_in_seconds}
    if principal is not None:
        body["principal"] = principal
    if runs is not None:
        body["runs"] = list(runs)
    # Not retried after a lost answer: a repeat would mint a second token (the first one
    # unseen, but working until it expires).
    return one(
        Call(
            "POST", f"{API_PREFIX}/tokens", models.MintedToken, body=_encode(body), idempotent=False
        )
    )


def list_tokens(after: str | None, limit: int) -> Flow[models.TokenList]:
    params: dict[str, Any] = {"limit": limit}
    if after is not None:
        params["after"] = after
    return one(Call("GET", f"{API_PREFIX}/tokens", models.TokenList, params=params))


def usage() -> Flow[models.Usage]:
    return one(Call("GET", f"{API_PREFIX}/usage", models.Usage))


def revoke_token(token_id: str) -> Flow[None]:
    return one(Call("DELETE", f"{API_PREFIX}/tokens/{segment(token_id, 'token_id')}"))


def append_encoded(
    run_id: str, stream_id: str, body: bytes, idempotency_key: str
) -> Flow[models.AppendAnswer]:
    return one(
        Call(
            "POST",
            stream_path(run_id, stream_id, "/records"),
            models.AppendAnswer,
            headers={"Idempotency-Key": idempotency_key},
            body=body,
        )
    )


def append(
    run_id: str,
    stream_id: str,
    records: Iterable[Any],
    idempotency_key: str | None,
    content_type: str | None,
) -> Flow[models.AppendAnswer]:
    if idempotency_key and not (
        len(idempotency_key) <= 255
        and all(" " <= char <= "~" for char in idempotency_key)
        and idempotency_key == idempotency_key.strip()  # a header value's ends are no spaces
    ):
        raise ValueError(
            "an idempotency_key is 1 to 255 printable ASCII characters, neither starting nor "
            "ending with a space"
        )
    parts = [encode_record(r, content_type) for r in records]
    if not parts:
        raise ValueError("an append needs at least one record")
    return append_encoded(run_id, stream_id, append_body(parts), idempotency_key or new_key())


def read(
    run_id: str, stream_id: str, cursor: int, limit: int, wait: float
) -> Flow[models.RecordsPage]:
    params: dict[str, Any] = {"cursor": cursor, "limit": limit}
    if wait:
        params["wait"] = wait
    return one(
        Call(
            "GET",
            stream_path(run_id, stream_id, "/records"),
            models.RecordsPage,
            params=params,
            extra_read=float(wait),
        )
    )


def ack(run_id: str, stream_id: str, consumer_id: str, sequence: int) -> Flow[models.AckAnswer]:
    # Acknowledging the same sequence again is a no-op: safe to repeat.
    return one(
        Call(
            "POST",
            stream_path(run_id, stream_id, f"/consumers/{segment(consumer_id, 'consumer_id')}/ack"),
            models.AckAnswer,
            body=_encode({"sequence": sequence}),
        )
    )
