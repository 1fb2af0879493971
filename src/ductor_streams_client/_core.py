"""The sans-IO core both clients share: what to send, how to read the answer, when to retry.

Nothing here does I/O. An operation is a *flow*: a generator that yields `Call`s and is sent
back each call's decoded result (or has the call's `StreamsError` thrown into it), and returns
the operation's result. `StreamsClient` (asyncio) and `SyncStreamsClient` (threads) are thin
drivers that run flows over an httpx client; `Exchange` is the one retry loop they both step,
`Follower` the one subscription state machine, `Batcher` the producer's batching rules."""

from __future__ import annotations

import base64
import hashlib
import os
import random
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from ductor_streams_client import models
from ductor_streams_client.errors import (
    CursorExpired,
    DigestMismatch,
    NotFound,
    ObjectStateConflict,
    SizeMismatch,
    StreamsConnectionError,
    StreamsError,
    Unauthenticated,
    UnexpectedAnswer,
)

T = TypeVar("T")

API_PREFIX = "/api/workflow-streams"
USER_AGENT = "ductor-streams-client/0.2"
CHUNK = 256 * 1024
MAX_BATCH_RECORDS = 1_000  # the service's per-append ceiling
MAX_REQUEST_BYTES = 8 * 1024 * 1024  # its JSON body ceiling
MAX_INLINE_RECORD_BYTES = 65_536  # its ceiling of one record's stored bytes (larger: an object)

# Answers that say the service did nothing and will take the request later.
NOTHING_DONE = frozenset({429, 503})
# Answers of a proxy or gateway: the request may or may not have been applied.
MAYBE_DONE = frozenset({502, 504})
# Transport errors before the request left: never applied.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Transport errors after it may have reached the service.
MAYBE_SENT = (httpx.ReadTimeout, httpx.WriteTimeout, httpx.NetworkError, httpx.RemoteProtocolError)

Progress = Callable[[int, int], None]
"""Called as `progress(bytes_sent, total_bytes)` while an object body uploads."""

_encode = msgspec.json.Encoder().encode


# -- retry policy ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How a call retries: at most `attempts` tries, all within `total_seconds` of the first.

    Between tries it sleeps what the service's `Retry-After` says (seconds or an HTTP date),
    else a full-jitter exponential backoff: uniformly random in `[0, min(max_delay, base_delay *
    2 ** (retry - 1))]`. A `Retry-After` that would end past `total_seconds` gives up at once.
    `RetryPolicy.none()` never retries."""

    attempts: int = 8
    total_seconds: float = 60.0
    base_delay: float = 0.2
    max_delay: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.total_seconds < 0 or self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("delays must be 0 or more")

    @classmethod
    def none(cls) -> RetryPolicy:
        return cls(attempts=1)

    def cap(self, retry: int) -> float:
        """The largest backoff before retry number `retry` (1 for the first retry)."""
        return min(self.max_delay, self.base_delay * (2.0 ** max(0, retry - 1)))

    def backoff(self, retry: int, rng: random.Random | None = None) -> float:
        """A full-jitter backoff before retry number `retry`."""
        return (rng or random).uniform(0.0, self.cap(retry))


class Retry:
    """Step result of `Exchange`: sleep `delay` seconds, then send the call again."""

    __slots__ = ("delay",)

    def __init__(self, delay: float) -> None:
        self.delay = delay


# -- calls -----------------------------------------------------------------------------------------


@dataclass
class Upload:
    """An object body to send: bytes or a file (re-readable, so the upload may be retried), or
    an iterable the caller gave (read once: never retried)."""

    source: bytes | Path | Any
    size: int
    progress: Progress | None = None

    @property
    def replayable(self) -> bool:
        return isinstance(self.source, bytes | Path)

    def count(self, sent: int, chunk: bytes) -> int:
        """`sent` plus the chunk about to go, which may not pass the declared size (it is the
        Content-Length: the HTTP layer would fail on its own terms)."""
        sent += len(chunk)
        if sent > self.size:
            raise SizeMismatch(
                0,
                "size-mismatch",
                f"the body comes to more than the {self.size} bytes given as its size "
                f"({sent} so far); nothing was stored",
            )
        return sent

    def check_end(self, sent: int) -> None:
        """After the last chunk: the body may not fall short of its declared size either."""
        if sent != self.size:
            raise SizeMismatch(
                0,
                "size-mismatch",
                f"the body comes to {sent} bytes, not the {self.size} given as its size; "
                "nothing was stored",
            )

    def sync_chunks(self) -> Iterable[bytes]:
        sent = 0
        if self.progress:
            self.progress(0, self.size)
        for chunk in self._sync_source():
            sent = self.count(sent, chunk)
            yield chunk
            if self.progress:
                self.progress(sent, self.size)
        self.check_end(sent)

    def _sync_source(self) -> Iterable[bytes]:
        if isinstance(self.source, bytes):
            data = self.source
            for start in range(0, len(data), CHUNK):
                yield data[start : start + CHUNK]
        elif isinstance(self.source, Path):
            with self.source.open("rb") as file:
                while chunk := file.read(CHUNK):
                    yield chunk
        else:
            yield from self.source


@dataclass
class Call:
    """One HTTP exchange: the request, and how to read and retry it.

    `idempotent`: repeating it after a lost answer does no harm (GET, PUT, DELETE; a POST only
    when the service dedupes it, e.g. by an idempotency key). Answers that say nothing was done
    (429, 503) and connections that never opened are retried whatever it is. `done_on_retry`:
    codes that, on a retry after a try that may have been applied (its answer lost, or a 502 /
    504), mean that it was (a DELETE that finds nothing).
    `answer`: the type the body decodes to (None: no body); `stream`: hand the open response
    to the driver instead."""

    method: str
    path: str
    answer: Any = None
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] | None = None
    body: bytes | None = None
    upload: Upload | None = None
    read_timeout: float | None = None  # the read timeout, instead of the client's
    extra_read: float = 0.0  # seconds added to the client's read timeout (a long poll)
    idempotent: bool = True
    done_on_retry: frozenset[str] = frozenset()
    stream: bool = False

    @property
    def replayable(self) -> bool:
        return self.upload is None or self.upload.replayable

    def request_headers(self, base: Mapping[str, str]) -> dict[str, str]:
        headers = dict(base)
        if self.body is not None:
            headers["Content-Type"] = "application/json"
        if self.headers:
            headers.update(self.headers)
        return headers

    def decode(self, response: httpx.Response) -> Any:
        if self.answer is None:
            return None
        try:
            return msgspec.json.decode(response.content, type=self.answer)
        except msgspec.ValidationError as error:
            raise UnexpectedAnswer(
                response.status_code,
                "unexpected-answer",
                f"{self.method} {self.path} answered a body this client cannot read: {error}",
            ) from error
        except msgspec.DecodeError as error:
            raise UnexpectedAnswer(
                response.status_code,
                "unexpected-answer",
                f"{self.method} {self.path} answered something that is not JSON: {error}",
            ) from error


def undecodable(
    call: Call, response: httpx.Response, error: httpx.DecodingError
) -> UnexpectedAnswer:
    """The error of an answer whose body cannot even be decoded (a `Content-Encoding` it does
    not hold to, typically from a proxy): not transient, so never retried."""
    encoding = response.headers.get("content-encoding") or "its content encoding"
    return UnexpectedAnswer(
        response.status_code,
        "unexpected-answer",
        f"{call.method} {call.path} answered a body that cannot be decoded ({encoding}): {error}",
    )


def may_retry(call: Call, failure: StreamsError, error: Exception | None = None) -> bool:
    """Whether `call` may be sent again after `failure` (the transport `error` when no answer
    arrived)."""
    if not call.replayable:
        return False
    if error is not None:
        if isinstance(error, NOT_SENT):
            return True
        return isinstance(error, MAYBE_SENT) and call.idempotent
    if did_nothing(failure):
        return True
    return (failure.status in MAYBE_DONE or outcome_unknown(failure)) and call.idempotent


def outcome_unknown(failure: StreamsError) -> bool:
    """A 503 whose write's COMMIT went unanswered (`outcome: "unknown"`): it may have been
    applied, like a gateway's 502 or 504."""
    return failure.problem.get("outcome") == "unknown"


def did_nothing(failure: StreamsError) -> bool:
    return failure.status in NOTHING_DONE and not outcome_unknown(failure)


class Exchange:
    """The retry loop of one call, stepped by a driver:

        exchange = Exchange(call, policy, url)
        while True:
            request = <build from call>
            try: response = <send>
            except httpx.TransportError as error: step = exchange.failed(error)
            else: step = exchange.answered(response)   # the body read unless call.stream
            if not isinstance(step, Retry): return step
            <sleep step.delay>

    `answered` returns the decoded result (the response itself for a `stream` call), or a
    `Retry`, or raises the call's `StreamsError` once it may not or need not retry."""

    def __init__(
        self,
        call: Call,
        policy: RetryPolicy,
        where: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.call = call
        self.policy = policy
        self.where = where
        self.clock = clock
        self.rng = rng
        self.tries = 0
        self.started = clock()
        # An earlier try may have been applied (its answer was lost, or a gateway's 502/504
        # stood in for it); only then does a `done_on_retry` code mean it was.
        self.maybe_applied = False

    def attempt(self) -> None:
        """Count a try (drivers call it just before sending)."""
        self.tries += 1

    def answered(self, response: httpx.Response) -> Any:
        if response.status_code < 400:
            if self.call.stream:
                return response
            return self.call.decode(response)
        failure = StreamsError.from_response(response)
        if self.maybe_applied and failure.code in self.call.done_on_retry:
            return None
        return self._again(failure, None)

    def failed(self, error: httpx.TransportError) -> Retry:
        failure = StreamsError.from_transport(error, self.where)
        if not isinstance(error, NOT_SENT + MAYBE_SENT):
            raise failure from error
        return self._again(failure, error)

    def _again(self, failure: StreamsError, error: Exception | None) -> Retry:
        if not may_retry(self.call, failure, error) or self.tries >= self.policy.attempts:
            raise failure from error
        if failure.retry_after is not None:
            delay = failure.retry_after
        else:
            delay = self.policy.backoff(self.tries, self.rng)
        if self.clock() + delay - self.started > self.policy.total_seconds:
            raise failure from error
        if not isinstance(error, NOT_SENT) and not did_nothing(failure):
            self.maybe_applied = True
        return Retry(delay)


# -- paths and bodies -----------------------------------------------------------------------------


def segment(value: str) -> str:
    return quote(str(value), safe="._:-~")


def stream_path(run_id: str, stream_id: str | None = None, tail: str = "") -> str:
    path = f"{API_PREFIX}/runs/{segment(run_id)}/streams"
    if stream_id is not None:
        path += "/" + segment(stream_id)
    return path + tail


def object_path(run_id: str, stream_id: str, object_id: str, tail: str = "") -> str:
    return stream_path(run_id, stream_id, f"/objects/{segment(object_id)}{tail}")


def new_key() -> str:
    return str(uuid.uuid4())


def encode_record(value: Any, content_type: str | None = None) -> bytes:
    """One record of an append body, encoded: bytes go as `data_base64` (with `content_type`,
    default `application/octet-stream`), anything else as the JSON `data` (with `content_type`
    when given)."""
    if isinstance(value, bytes | bytearray | memoryview):
        record: dict[str, Any] = {"data_base64": base64.b64encode(bytes(value)).decode("ascii")}
        record["content_type"] = content_type or "application/octet-stream"
        return _encode(record)
    if content_type:
        return _encode({"data": value, "content_type": content_type})
    return b'{"data":' + _encode(value) + b"}"


def stored_size(value: Any) -> int:
    """The bytes the service stores for a record of `value`: the bytes themselves, or the
    compact JSON of the value (before any redaction)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return len(bytes(value))
    return len(_encode(value))


def append_body(parts: Iterable[bytes]) -> bytes:
    return b'{"records":[' + b",".join(parts) + b"]}"


class Settings:
    """What both clients are configured with, and how they turn a `Call` into a request."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        timeout: float | httpx.Timeout,
        idle_timeout: float,
        retry: RetryPolicy | None,
    ) -> None:
        root = base_url.rstrip("/").removesuffix(API_PREFIX)
        parts = httpx.URL(root)
        if parts.scheme not in ("http", "https") or not parts.host:
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        self.base_url = root
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self.idle_timeout = idle_timeout
        self.retry = retry or RetryPolicy()
        self.headers = {"User-Agent": USER_AGENT}
        # Surrounding whitespace is never part of a token: a token file's newline (`serve`
        # writes the development token with one) would otherwise make every header illegal.
        token = token.strip() if token else None
        if token:
            if not all(" " < char <= "~" for char in token):
                raise ValueError(
                    "token holds a character no Bearer token has (a space, a control "
                    "character or non-ASCII)"
                )
            self.headers["Authorization"] = f"Bearer {token}"

    def url(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            return path
        return self.base_url + path

    def timeout_of(self, call: Call) -> httpx.Timeout:
        t = self.timeout
        if call.read_timeout is not None:
            return httpx.Timeout(
                connect=t.connect, read=call.read_timeout, write=t.write, pool=t.pool
            )
        if call.extra_read:
            read = None if t.read is None else t.read + call.extra_read
            return httpx.Timeout(connect=t.connect, read=read, write=t.write, pool=t.pool)
        return t

    def exchange(self, call: Call) -> Exchange:
        return Exchange(call, self.retry, self.base_url)


def _setting(value: Any) -> Any:
    return msgspec.to_builtins(value) if isinstance(value, msgspec.Struct) else value


# -- flows -----------------------------------------------------------------------------------------

Flow = Generator[Call, Any, T]


def one(call: Call) -> Flow[Any]:
    return (yield call)


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
            f"{API_PREFIX}/runs/{segment(run_id)}",
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
    path = stream_path(run_id, stream_id, f"/consumers/{segment(consumer_id)}")
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


def list_tokens() -> Flow[models.TokenList]:
    return one(Call("GET", f"{API_PREFIX}/tokens", models.TokenList))


def revoke_token(token_id: str) -> Flow[None]:
    return one(Call("DELETE", f"{API_PREFIX}/tokens/{segment(token_id)}"))


def _subscription(subscription_id: str, tail: str = "") -> str:
    return f"{API_PREFIX}/subscriptions/{segment(subscription_id)}{tail}"


def _json_body(value: Any) -> bytes:
    return msgspec.json.encode(value)


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
    tail = f"/streams/{segment(run_id)}/{segment(stream_id)}"
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
        len(idempotency_key) <= 255 and all(" " <= char <= "~" for char in idempotency_key)
    ):
        raise ValueError("an idempotency_key is 1 to 255 printable ASCII characters")
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
            stream_path(run_id, stream_id, f"/consumers/{segment(consumer_id)}/ack"),
            models.AckAnswer,
            body=_encode({"sequence": sequence}),
        )
    )


def get_object(run_id: str, stream_id: str, object_id: str) -> Flow[models.ObjectIntent]:
    return one(Call("GET", object_path(run_id, stream_id, object_id), models.ObjectIntent))


def list_open_objects(
    run_id: str, stream_id: str, after: str | None, limit: int
) -> Flow[models.OpenObjectsPage]:
    params: dict[str, Any] = {"limit": limit}
    if after is not None:
        params["after"] = after
    return one(
        Call(
            "GET", stream_path(run_id, stream_id, "/objects"), models.OpenObjectsPage, params=params
        )
    )


def abort_object(run_id: str, stream_id: str, object_id: str) -> Flow[models.ObjectIntent]:
    return one(
        Call("POST", object_path(run_id, stream_id, object_id, "/abort"), models.ObjectIntent)
    )


@dataclass
class ObjectSource:
    """What `put_object` uploads, its size and SHA-256 (hex)."""

    body: bytes | Path | Any
    size: int
    sha256: str


def object_source(
    source: Any, size: int | None, sha256: str | None, *, iterable: type | tuple[type, ...]
) -> ObjectSource:
    """Bytes, a path (hashed here by reading it once, in chunks; blocking), or an iterable of
    `iterable` kind, for which `size` and `sha256` are required."""
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        return ObjectSource(
            data,
            len(data) if size is None else size,
            sha256 or hashlib.sha256(data).hexdigest(),
        )
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if size is None or sha256 is None:
            digest = hashlib.sha256()
            size = 0
            with path.open("rb") as file:
                while chunk := file.read(1024 * 1024):
                    digest.update(chunk)
                    size += len(chunk)
            sha256 = digest.hexdigest()
        return ObjectSource(path, size, sha256)
    if isinstance(source, iterable):
        if size is None or sha256 is None:
            raise ValueError("an iterable source needs size= and sha256=")
        return ObjectSource(source, size, sha256)
    raise TypeError(f"cannot upload a {type(source).__name__}: give bytes, a path or chunks")


def put_object(
    run_id: str,
    stream_id: str,
    source: ObjectSource,
    *,
    content_type: str,
    idempotency_key: str | None,
    schema: Any,
    expires_in_seconds: int | None,
    progress: Progress | None,
) -> Flow[models.CommitAnswer]:
    """Prepare (idempotent by its key), upload unless already uploaded, commit (idempotent)."""
    prepare: dict[str, Any] = {
        "idempotency_key": idempotency_key or new_key(),
        "size": source.size,
        "sha256": source.sha256.lower(),
        "content_type": content_type,
    }
    if schema is not None:
        prepare["schema"] = schema
    if expires_in_seconds is not None:
        prepare["expires_in_seconds"] = expires_in_seconds
    intent: models.ObjectIntent = yield Call(
        "POST",
        stream_path(run_id, stream_id, "/objects"),
        models.ObjectIntent,
        body=_encode(prepare),
    )
    if intent.state == "prepared":
        url = (intent.upload or {}).get("url") or object_path(
            run_id, stream_id, intent.object_id, "/body"
        )
        try:
            yield Call(
                "PUT",
                url,
                models.ObjectIntent,
                headers={"Content-Type": content_type, "Content-Length": str(source.size)},
                upload=Upload(source.body, source.size, progress),
            )
        except ObjectStateConflict:
            # An earlier try may have landed although its answer was lost.
            now: models.ObjectIntent = yield Call(
                "GET", object_path(run_id, stream_id, intent.object_id), models.ObjectIntent
            )
            if now.state not in ("uploaded", "committed"):
                raise
    committed: models.CommitAnswer = yield Call(
        "POST", object_path(run_id, stream_id, intent.object_id, "/commit"), models.CommitAnswer
    )
    return committed


def get_object_body(run_id: str, stream_id: str, object_id: str) -> Call:
    return Call("GET", object_path(run_id, stream_id, object_id, "/body"), stream=True)


class BodyCheck:
    """Checks a downloaded body against the SHA-256 its `Repr-Digest` announced."""

    def __init__(self, response: httpx.Response) -> None:
        self.status = response.status_code
        self.expected = repr_digest(response.headers.get("repr-digest"))
        self.digest = hashlib.sha256()

    def feed(self, chunk: bytes) -> bytes:
        self.digest.update(chunk)
        return chunk

    def finish(self) -> None:
        if self.expected is not None and self.digest.digest() != self.expected:
            raise DigestMismatch(
                self.status,
                "digest-mismatch",
                "the downloaded body does not match its Repr-Digest",
            )


def repr_digest(header: str | None) -> bytes | None:
    if not header:
        return None
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name.strip().lower() == "sha-256" and value.startswith(":") and value.endswith(":"):
            try:
                return base64.b64decode(value[1:-1])
            except ValueError:
                return None
    return None


# -- server-sent events ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str
    data: str
    id: str | None


class SseDecoder:
    """A `text/event-stream` decoder (WHATWG HTML, "Server-sent events"), fed one line at a
    time (without its line ending); comments (heartbeats) are skipped."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self.last_id: str | None = None

    def feed(self, line: str) -> SseEvent | None:
        line = line.rstrip("\r\n")
        if not line:
            event = None
            if self._data:
                event = SseEvent(self._event or "message", "\n".join(self._data), self.last_id)
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self.last_id = value
        # `retry` and unknown fields are ignored: reconnection is the client's own policy.
        return None


_EVENT_TYPES: dict[str, type[models.Event]] = {
    "closed": models.Closed,
    "gone": models.Gone,
    "deleted": models.Deleted,
    "revoked": models.Revoked,
}
_record_decoder = msgspec.json.Decoder(models.Record)


class Follower:
    """The state of one `follow()`: where to resume, and what each event or failure means.

    A driver loops: send `call()` (streamed); on an error answer, read its body and call
    `refused(response)`; on success `opened(response)`, then feed each line to `line()` and
    yield what it returns, until `done`; a transport error is `lost(error)`, a response that
    ends short of a final event `ended()`; then sleep `pause()` (which raises once it is time
    to give up) and go round again."""

    def __init__(
        self,
        run_id: str,
        stream_id: str,
        cursor: int,
        *,
        policy: RetryPolicy,
        where: str,
        give_up_after: float | None,
        on_reconnect: Callable[[StreamsError, float], None] | None,
        events: bool,
        read_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.path = stream_path(run_id, stream_id, "/subscribe")
        self.stream_id = stream_id
        self.last = cursor
        self.policy = policy
        self.where = where
        self.give_up_after = give_up_after
        self.on_reconnect = on_reconnect
        self.events = events
        self.read_timeout = read_timeout
        self.clock = clock
        self.rng = rng
        self.done = False
        self.connected = False  # a subscription has been open at least once
        self.failing_since: float | None = None
        self.retries = 0
        self._failure: StreamsError | None = None
        self._status = 200
        self._decoder = SseDecoder()

    def call(self) -> Call:
        self._decoder = SseDecoder()
        return Call(
            "GET",
            self.path,
            params={"cursor": self.last},
            headers={"Accept": "text/event-stream", "Last-Event-ID": str(self.last)},
            read_timeout=self.read_timeout,
            stream=True,
        )

    def refused(self, response: httpx.Response) -> None:
        failure = StreamsError.from_response(response)
        if response.status_code not in NOTHING_DONE | MAYBE_DONE:
            raise failure
        self._failure = failure

    def opened(self, response: httpx.Response) -> None:
        media_type = response.headers.get("content-type", "")
        if not media_type.startswith("text/event-stream"):
            raise UnexpectedAnswer(
                response.status_code,
                "unexpected-answer",
                f"subscribe answered {media_type or 'no content type'}, not text/event-stream",
            )
        self._status = response.status_code
        self.connected = True
        self.failing_since = None

    def line(self, text: str) -> models.FollowItem | None:
        event = self._decoder.feed(text)
        if event is None:
            return None
        kind = _EVENT_TYPES.get(event.event)
        if event.event != "record" and kind is None:
            return None  # an event this client does not know: ignored
        try:
            item = (
                _record_decoder.decode(event.data)
                if kind is None
                else msgspec.json.decode(event.data or "{}", type=kind)
            )
        except (msgspec.ValidationError, msgspec.DecodeError) as error:
            raise UnexpectedAnswer(
                self._status,
                "unexpected-answer",
                f"GET {self.path} (subscribe) sent a {event.event!r} event this client cannot "
                f"read: {error}",
            ) from error
        if isinstance(item, models.Record):
            record = item
            if record.sequence <= self.last:
                return None  # never deliver twice, whatever the wire does
            self.last = record.sequence
            self.retries = 0
            return record
        final = item
        self.done = True
        if self.events:
            return final
        if isinstance(final, models.Gone):
            raise CursorExpired(
                410,
                "cursor-expired",
                f"retention removed record {final.requested}; the earliest retained is "
                f"{final.earliest}",
                {"status": 410, "code": "cursor-expired", **msgspec.to_builtins(final)},
            )
        if isinstance(final, models.Deleted):
            raise NotFound(
                404,
                "not-found",
                f"stream {self.stream_id!r} was deleted",
                {"status": 404, "code": "not-found"},
            )
        if isinstance(final, models.Revoked):
            raise Unauthenticated(
                401,
                "unauthenticated",
                "the subscription's token was revoked or expired",
                {"status": 401, "code": "unauthenticated"},
            )
        return None  # closed: the follow just ends

    def lost(self, error: httpx.TransportError) -> None:
        failure = StreamsError.from_transport(error, self.where)
        if not isinstance(error, NOT_SENT + MAYBE_SENT):
            raise failure from error
        self._failure = failure

    def ended(self) -> None:
        self._failure = StreamsConnectionError(
            0, "connection-error", "the subscription ended before the stream closed"
        )

    def pause(self) -> float:
        failure = self._failure or StreamsConnectionError(0, "connection-error", "disconnected")
        self._failure = None
        self.retries += 1
        now = self.clock()
        if self.failing_since is None:
            self.failing_since = now
        if failure.retry_after is not None:
            delay = failure.retry_after
        else:
            delay = self.policy.backoff(self.retries, self.rng)
        limit = self.give_up_after if self.connected else self.policy.total_seconds
        if limit is not None and now + delay - self.failing_since > limit:
            raise failure
        if self.on_reconnect is not None:
            self.on_reconnect(failure, delay)
        return delay


# -- the producer's batching -----------------------------------------------------------------------


@dataclass
class Batch:
    """One append of the producer: its records (encoded) and its own idempotency key, which
    every retry of it reuses."""

    parts: list[bytes]
    nbytes: int
    key: str = field(default_factory=new_key)

    @property
    def count(self) -> int:
        return len(self.parts)

    def body(self) -> bytes:
        return append_body(self.parts)


class Batcher:
    """The producer's buffer: records wait here until a batch is full (`max_batch_records` or
    `max_batch_bytes`), or `linger` seconds passed since the oldest arrived, or a flush asks.
    It holds at most `max_buffered_records` / `max_buffered_bytes` (`room`): a full buffer makes
    `send` wait, which is how the stream's backpressure reaches the program."""

    def __init__(
        self,
        *,
        max_batch_records: int = MAX_BATCH_RECORDS,
        max_batch_bytes: int = 1024 * 1024,
        linger: float = 0.005,
        max_buffered_records: int = 10_000,
        max_buffered_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if not 1 <= max_batch_records <= MAX_BATCH_RECORDS:
            raise ValueError(f"max_batch_records must be 1 to {MAX_BATCH_RECORDS}")
        if not 1 <= max_batch_bytes <= MAX_REQUEST_BYTES - 64 * 1024:
            raise ValueError("max_batch_bytes must leave room under the 8 MiB request ceiling")
        if linger < 0:
            raise ValueError("linger must be 0 or more")
        self.max_batch_records = max_batch_records
        self.max_batch_bytes = max_batch_bytes
        self.linger = linger
        self.max_buffered_records = max(max_buffered_records, max_batch_records)
        self.max_buffered_bytes = max(max_buffered_bytes, max_batch_bytes)
        self._parts: deque[bytes] = deque()
        self.buffered_bytes = 0
        self.oldest_at: float | None = None
        self.added = 0  # records ever added
        self.taken = 0  # records ever taken into batches

    def __len__(self) -> int:
        return len(self._parts)

    def room(self, nbytes: int) -> bool:
        """Whether a record of `nbytes` fits now (an empty buffer takes any record)."""
        if not self._parts:
            return True
        return (
            len(self._parts) < self.max_buffered_records
            and self.buffered_bytes + nbytes <= self.max_buffered_bytes
        )

    def add(self, part: bytes, now: float) -> bool:
        """Buffer one encoded record; True when that made a batch ready (the first record, or a
        full batch), so the sender knows to wake the flusher."""
        if len(part) > self.max_batch_bytes:
            raise ValueError(
                f"a record of {len(part)} bytes encoded is over max_batch_bytes "
                f"({self.max_batch_bytes}); send it as an object"
            )
        first = not self._parts
        self._parts.append(part)
        self.buffered_bytes += len(part) + 1
        self.added += 1
        if first:
            self.oldest_at = now
        return first or self.full()

    def full(self) -> bool:
        return (
            len(self._parts) >= self.max_batch_records
            or self.buffered_bytes >= self.max_batch_bytes
        )

    def wait(self, now: float, flushing: bool) -> float | None:
        """Seconds until a batch is due (0: now), or None when nothing is buffered."""
        if not self._parts:
            return None
        if flushing or self.full() or self.oldest_at is None:
            return 0.0
        return max(0.0, self.oldest_at + self.linger - now)

    def drop(self) -> None:
        """Forget what is buffered (it counts as never appended)."""
        self._parts.clear()
        self.buffered_bytes = 0
        self.oldest_at = None

    def take(self, now: float) -> Batch:
        """The next batch, oldest records first, within both batch ceilings."""
        parts: list[bytes] = []
        nbytes = 0
        while self._parts and len(parts) < self.max_batch_records:
            size = len(self._parts[0]) + 1
            if parts and nbytes + size > self.max_batch_bytes:
                break
            parts.append(self._parts.popleft())
            nbytes += size
        self.buffered_bytes -= nbytes
        self.taken += len(parts)
        self.oldest_at = now if self._parts else None
        return Batch(parts, nbytes)
