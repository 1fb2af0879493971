"""The wake subscriptions' flows: define, link, claim, acknowledge and release, and the
webhook signing keys."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ductor_streams_client import models
from ductor_streams_client._core.exchange import Call, Flow, one
from ductor_streams_client._core.wire import API_PREFIX, encode_json, segment, stream_path


def _subscription(subscription_id: str, tail: str = "") -> str:
    return f"{API_PREFIX}/subscriptions/{segment(subscription_id, 'subscription_id')}{tail}"


def _json_body(value: Any) -> bytes:
    return encode_json(value)


def put_subscription(
    subscription_id: str,
    kind: str,
    pattern: tuple[str, str] | None,
    streams: Iterable[tuple[str, str]] | None,
    webhook_url: str | None,
    wake_stream: tuple[str, str] | None,
    lease_ttl_ms: int | None,
    description: str | None,
) -> Flow[models.Subscription]:
    body: dict[str, Any] = {"type": kind}
    if pattern is not None:
        body["pattern"] = {"run_id": pattern[0], "stream_id": pattern[1]}
    if streams is not None:
        body["streams"] = [{"run_id": r, "stream_id": s} for r, s in streams]
    if webhook_url is not None:
        body["webhook"] = {"url": webhook_url}
    if wake_stream is not None:
        body["wake_stream"] = {"run_id": wake_stream[0], "stream_id": wake_stream[1]}
    if lease_ttl_ms is not None:
        body["lease_ttl_ms"] = lease_ttl_ms
    if description is not None:
        body["description"] = description
    return one(
        Call("PUT", _subscription(subscription_id), models.Subscription, body=_json_body(body))
    )


def get_subscription(subscription_id: str) -> Flow[models.Subscription]:
    return one(Call("GET", _subscription(subscription_id), models.Subscription))


def delete_subscription(subscription_id: str) -> Flow[None]:
    return one(
        Call(
            "DELETE",
            _subscription(subscription_id),
            done_on_retry=frozenset({"subscription-not-found"}),
        )
    )


def link_subscription_streams(
    subscription_id: str, streams: Iterable[tuple[str, str]]
) -> Flow[None]:
    body = {"streams": [{"run_id": r, "stream_id": s} for r, s in streams]}
    return one(Call("POST", _subscription(subscription_id, "/streams"), body=_json_body(body)))


def unlink_subscription_stream(subscription_id: str, run_id: str, stream_id: str) -> Flow[None]:
    tail = f"/streams/{segment(run_id, 'run_id')}/{segment(stream_id, 'stream_id')}"
    return one(Call("DELETE", _subscription(subscription_id, tail)))


def stream_subscriptions(run_id: str, stream_id: str) -> Flow[models.SubscriptionList]:
    return one(
        Call("GET", stream_path(run_id, stream_id, "/subscriptions"), models.SubscriptionList)
    )


def claim_subscription(subscription_id: str, worker: str) -> Flow[models.WakeClaim]:
    # Not retried after a lost answer: the claim may have been made (409 to the retry).
    return one(
        Call(
            "POST",
            _subscription(subscription_id, "/claim"),
            models.WakeClaim,
            body=_json_body({"worker": worker}),
            idempotent=False,
        )
    )


def wake_ack(
    subscription_id: str,
    route: str,
    token: str,
    wake_id: str,
    generation: int,
    acks: Iterable[tuple[str, str, int]],
    done: bool,
) -> Flow[models.WakeAnswer]:
    body = {
        "wake_id": wake_id,
        "generation": generation,
        "acks": [{"run_id": r, "stream_id": s, "sequence": n} for r, s, n in acks],
        "done": done,
    }
    return one(
        Call(
            "POST",
            _subscription(subscription_id, route),
            models.WakeAnswer,
            headers={"Authorization": f"Bearer {token}"},
            body=_json_body(body),
            idempotent=not done,  # a done that is repeated is fenced: not retried
        )
    )


def release_subscription(
    subscription_id: str, token: str, wake_id: str, generation: int
) -> Flow[None]:
    return one(
        Call(
            "POST",
            _subscription(subscription_id, "/release"),
            headers={"Authorization": f"Bearer {token}"},
            body=_json_body({"wake_id": wake_id, "generation": generation}),
            idempotent=False,
        )
    )


JWKS_PATH = "/api/durable-streams/v1/stream/__ds/jwks.json"


def webhook_jwks() -> Flow[dict[str, Any]]:
    return one(Call("GET", JWKS_PATH, dict[str, Any]))
