"""`StreamsClient`: an async client of the ductor-streams HTTP API (docs/http-api.md).

It speaks HTTP only. Every call that changes state is safe to retry: appends and object
prepares carry an idempotency key (generated when the caller gives none, and reused on every
retry of that call), create/ack/close/commit are idempotent on the server. Retries happen on
connection errors, 502/503/504 and 429 (honouring `Retry-After`), bounded both in attempts and
in total time; every other error answer raises `StreamsError` at once."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import random
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from ductor_streams_client._sse import events
from ductor_streams_client.errors import StreamsError

API_PREFIX = "/api/workflow-streams"
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
# Errors where the request may be sent again; not UnsupportedProtocol / LocalProtocolError.
RETRYABLE_TRANSPORT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
CHUNK = 256 * 1024
USER_AGENT = "ductor-streams-client/0.1"

Progress = Callable[[int, int], None]
"""Called as `progress(bytes_sent, total_bytes)` while an object body uploads."""


@dataclass(frozen=True)
class RetryPolicy:
    """How a single call retries: at most `attempts` tries within `total_seconds`, sleeping
    `Retry-After` when the service sends one, else exponential backoff from `base_delay` capped
    at `max_delay` (with jitter)."""

    attempts: int = 8
    total_seconds: float = 60.0
    base_delay: float = 0.2
    max_delay: float = 5.0

    def backoff(self, attempt: int) -> float:
        delay = min(self.max_delay, self.base_delay * (2 ** max(0, attempt - 1)))
        return delay * random.uniform(0.5, 1.0)


def _segment(value: str) -> str:
    return quote(str(value), safe="._:-~")


def _record(value: Any, content_type: str) -> dict[str, Any]:
    if isinstance(value, bytes | bytearray | memoryview):
        return {
            "data_base64": base64.b64encode(bytes(value)).decode("ascii"),
            "content_type": content_type,
        }
    return {"data": value}


def _new_key() -> str:
    return str(uuid.uuid4())


def _digest_of_file(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as file:
        while chunk := file.read(1024 * 1024):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


class StreamsClient:
    """An async client of one ductor-streams deployment.

    ```python
    async with StreamsClient("http://127.0.0.1:8080", token) as client:
        await client.create_stream("run-1", stream_id="tokens", direction="output")
        await client.append("run-1", "tokens", [{"text": "hi"}])
        async for record in client.follow("run-1", "tokens"):
            ...
    ```

    `base_url` is the deployment's root (a trailing `/api/workflow-streams` is accepted too).
    `timeout` bounds each HTTP exchange (connect, write, and a read that is not a long poll);
    `idle_timeout` is how long a subscription may stay silent (the service sends a heartbeat at
    least every 15 s) before it counts as broken and reconnects."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        idle_timeout: float = 45.0,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        root = base_url.rstrip("/")
        root = root.removesuffix(API_PREFIX)
        self.base_url = root
        self._timeout = timeout
        self._idle_timeout = idle_timeout
        self._retry = retry or RetryPolicy()
        self._http = httpx.AsyncClient(
            base_url=root,
            headers={"Authorization": f"Bearer {token}", "User-Agent": USER_AGENT},
            timeout=httpx.Timeout(timeout),
            transport=transport,
        )

    async def __aenter__(self) -> StreamsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- plumbing ---------------------------------------------------------------------------------

    @staticmethod
    def _path(run_id: str, stream_id: str | None = None, tail: str = "") -> str:
        path = f"{API_PREFIX}/runs/{_segment(run_id)}/streams"
        if stream_id is not None:
            path += "/" + _segment(stream_id)
        return path + tail

    async def _request(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        content: Callable[[], Any] | None = None,
        timeout: httpx.Timeout | float | None = None,
        attempts: int | None = None,
    ) -> httpx.Response:
        """Send, retrying what is retryable; the answer when it is a success, else raise.
        `content` builds a fresh body for each attempt (a stream can be replayed only so)."""
        policy = self._retry
        attempts = attempts or policy.attempts
        deadline = time.monotonic() + policy.total_seconds
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(
                    method,
                    url,
                    json=json_body,
                    params=params,
                    headers=headers,
                    content=content() if content is not None else None,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except RETRYABLE_TRANSPORT as error:
                failure = StreamsError.from_transport(error, self.base_url)
                delay = policy.backoff(attempt)
            except httpx.TransportError as error:
                raise StreamsError.from_transport(error, self.base_url) from error
            else:
                if response.status_code < 400:
                    return response
                failure = StreamsError.from_response(response)
                if response.status_code not in RETRYABLE_STATUSES:
                    raise failure
                delay = (
                    failure.retry_after
                    if failure.retry_after is not None
                    else policy.backoff(attempt)
                )
            if attempt >= attempts or time.monotonic() + delay > deadline:
                raise failure
            await asyncio.sleep(delay)

    async def _json(self, method: str, url: str, **kwargs: Any) -> Any:
        return (await self._request(method, url, **kwargs)).json()

    # -- streams ----------------------------------------------------------------------------------

    async def create_stream(self, run_id: str, **definition: Any) -> dict[str, Any]:
        """Create a stream definition (`stream_id`, `direction`, `content_class`, `limits`, ...;
        docs/http-api.md "Stream definition"); `direction` defaults to `output`. Returns the stream
        document, whether it was created now (201) or already existed identically (200)."""
        definition.setdefault("direction", "output")
        return await self._json("POST", self._path(run_id), json_body=definition)

    async def get_stream(self, run_id: str, stream_id: str) -> dict[str, Any]:
        """The stream document: the definition plus `run_id`, `created_at` and `state`."""
        return await self._json("GET", self._path(run_id, stream_id))

    async def list_streams(self, run_id: str) -> Any:
        """The run's streams, as the service answers them."""
        return await self._json("GET", self._path(run_id))

    async def close(self, run_id: str, stream_id: str) -> dict[str, Any]:
        """Close the stream (a no-op when already closed); returns the stream document."""
        return await self._json("POST", self._path(run_id, stream_id, "/close"))

    async def set_legal_hold(
        self, run_id: str, stream_id: str, enabled: bool, reason: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"enabled": enabled}
        if reason is not None:
            body["reason"] = reason
        return await self._json("PUT", self._path(run_id, stream_id, "/legal-hold"), json_body=body)

    async def delete_stream(self, run_id: str, stream_id: str) -> None:
        """Erase the stream (409 `legal-hold-active` while a hold is on). A retry after a lost
        answer may find it gone already: not-found then means it was deleted."""
        await self._request("DELETE", self._path(run_id, stream_id))

    async def delete_run(self, run_id: str) -> None:
        """Erase every stream of the run, all or nothing."""
        await self._request("DELETE", f"{API_PREFIX}/runs/{_segment(run_id)}")

    async def list_runs(self, after: str | None = None, limit: int = 100) -> dict[str, Any]:
        """One page of the tenant's runs: `{"runs": [...], "next_after"}` (null at the end)."""
        params: dict[str, Any] = {"limit": limit}
        if after is not None:
            params["after"] = after
        return await self._json("GET", f"{API_PREFIX}/runs", params=params)

    # -- records ----------------------------------------------------------------------------------

    async def append(
        self,
        run_id: str,
        stream_id: str,
        records: list[Any],
        *,
        idempotency_key: str | None = None,
        content_type: str = "application/octet-stream",
    ) -> dict[str, Any]:
        """Append one atomic batch. Each item is a JSON value (stored as `data`) or bytes (stored
        as `data_base64` with `content_type`). Every call carries an `Idempotency-Key` (a fresh
        UUID unless given) that all its retries reuse, so a retry never appends twice. Returns
        `{"first_sequence", "last_sequence", "head", "credit"}`."""
        key = idempotency_key or _new_key()
        body = {"records": [_record(r, content_type) for r in records]}
        return await self._json(
            "POST",
            self._path(run_id, stream_id, "/records"),
            json_body=body,
            headers={"Idempotency-Key": key},
        )

    async def read(
        self, run_id: str, stream_id: str, cursor: int = 0, limit: int = 100, wait: float = 0
    ) -> dict[str, Any]:
        """One page of records with `sequence > cursor`: `{"records", "next_cursor", "head",
        "earliest", "closed"}`. With `wait` (0-60 s) and nothing past the cursor, long-polls."""
        params: dict[str, Any] = {"cursor": cursor, "limit": limit}
        if wait:
            params["wait"] = wait
        return await self._json(
            "GET",
            self._path(run_id, stream_id, "/records"),
            params=params,
            timeout=httpx.Timeout(self._timeout, read=self._timeout + float(wait)),
        )

    async def ack(
        self, run_id: str, stream_id: str, consumer_id: str, sequence: int
    ) -> dict[str, Any]:
        """Acknowledge `consumer_id` through `sequence` (acks only advance; equal is a no-op)."""
        return await self._json(
            "POST",
            self._path(run_id, stream_id, f"/consumers/{_segment(consumer_id)}/ack"),
            json_body={"sequence": sequence},
        )

    async def follow(
        self,
        run_id: str,
        stream_id: str,
        cursor: int = 0,
        *,
        give_up_after: float | None = 300.0,
        on_reconnect: Callable[[StreamsError, float], None] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every record with `sequence > cursor`, live, in order, each exactly once.

        Subscribes over SSE and, on any disconnect (network, idle timeout, server restart, a
        response that ends without `closed`), reconnects from the last delivered sequence with
        `Last-Event-ID`, with capped exponential backoff (429/503 honour `Retry-After`). Ends
        when the stream is closed and fully delivered. Raises `StreamsError`: 410
        `cursor-expired` when retention overtook the cursor (`gone`, with `requested`,
        `earliest`, `latest`), any other 4xx problem at once, and `connection-error` after
        `give_up_after` seconds without a working connection (None: never give up); before
        the first connection ever succeeds, the retry policy's `total_seconds` bounds it.
        `on_reconnect(failure, delay)` is told of each disconnect before the pause.

        Use it under `contextlib.aclosing(...)` when you may stop early, so the connection is
        released at once."""
        last = cursor
        url = self._path(run_id, stream_id, "/subscribe")
        timeout = httpx.Timeout(self._timeout, read=self._idle_timeout)
        policy = self._retry
        failing_since: float | None = None
        connected = False
        attempt = 0
        while True:
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(last)}
            failure: StreamsError
            delay: float | None = None
            try:
                async with self._http.stream(
                    "GET", url, params={"cursor": last}, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        failure = StreamsError.from_response(response)
                        if response.status_code not in RETRYABLE_STATUSES:
                            raise failure
                        delay = failure.retry_after
                    else:
                        media_type = response.headers.get("content-type", "")
                        if not media_type.startswith("text/event-stream"):
                            raise StreamsError(
                                response.status_code,
                                "unexpected-answer",
                                f"subscribe answered {media_type or 'no content type'}, "
                                "not text/event-stream",
                            )
                        failing_since, connected = None, True
                        async for event in events(response):
                            if event.event == "record":
                                record = json.loads(event.data)
                                sequence = int(record["sequence"])
                                if sequence <= last:
                                    continue  # never deliver twice, whatever the wire does
                                last = sequence
                                attempt = 0
                                yield record
                            elif event.event == "closed":
                                return
                            elif event.event == "deleted":
                                raise StreamsError(
                                    404,
                                    "not-found",
                                    f"stream {stream_id!r} was deleted",
                                    {"status": 404, "code": "not-found"},
                                )
                            elif event.event == "gone":
                                fields = json.loads(event.data or "{}")
                                raise StreamsError(
                                    410,
                                    "cursor-expired",
                                    f"retention removed record {fields.get('requested')}; "
                                    f"the earliest retained is {fields.get('earliest')}",
                                    {"status": 410, "code": "cursor-expired", **fields},
                                )
                        failure = StreamsError(
                            0,
                            "connection-error",
                            "the subscription ended before the stream closed",
                        )
            except RETRYABLE_TRANSPORT as error:
                failure = StreamsError.from_transport(error, self.base_url)
            except httpx.TransportError as error:
                raise StreamsError.from_transport(error, self.base_url) from error
            attempt += 1
            now = time.monotonic()
            failing_since = failing_since if failing_since is not None else now
            if delay is None:
                delay = policy.backoff(attempt)
            limit = give_up_after if connected else policy.total_seconds
            if limit is not None and now + delay - failing_since > limit:
                raise failure
            if on_reconnect is not None:
                on_reconnect(failure, delay)
            await asyncio.sleep(delay)

    # -- objects ----------------------------------------------------------------------------------

    async def put_object(
        self,
        run_id: str,
        stream_id: str,
        source: str | os.PathLike[str] | bytes | bytearray | memoryview | AsyncIterable[bytes],
        *,
        content_type: str = "application/octet-stream",
        idempotency_key: str | None = None,
        size: int | None = None,
        sha256: str | None = None,
        schema: Any = None,
        expires_in_seconds: int | None = None,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Store an object and append the record that carries it: prepare, streamed PUT of the
        body, commit. `source` is a file path, bytes, or an async iterable of bytes (then `size`
        and `sha256` (hex) are required, and the upload cannot be retried). For a file they are
        computed by reading it once in chunks; it is read again, in chunks, to upload. Returns
        the commit answer `{"sequence", "object_id"}`. Safe to call again with the same
        `idempotency_key`: it resumes (or replays) the same object."""
        replayable = True
        if isinstance(source, bytes | bytearray | memoryview):
            data = bytes(source)
            if size is None:
                size = len(data)
            if sha256 is None:
                sha256 = hashlib.sha256(data).hexdigest()

            async def chunks() -> AsyncIterator[bytes]:
                for start in range(0, len(data), CHUNK):
                    yield data[start : start + CHUNK]

            body_factory: Callable[[], AsyncIterable[bytes]] = chunks
        elif isinstance(source, str | os.PathLike):
            path = Path(source)
            if size is None or sha256 is None:
                size, sha256 = await asyncio.to_thread(_digest_of_file, path)

            async def file_chunks() -> AsyncIterator[bytes]:
                with path.open("rb") as file:  # noqa: ASYNC230 - chunked reads via a thread
                    while chunk := await asyncio.to_thread(file.read, CHUNK):
                        yield chunk

            body_factory = file_chunks
        else:
            if size is None or sha256 is None:
                raise ValueError("an async-iterator source needs size= and sha256=")
            stream = source
            replayable = False

            def once() -> AsyncIterable[bytes]:
                return stream

            body_factory = once
        assert size is not None and sha256 is not None

        prepare: dict[str, Any] = {
            "idempotency_key": idempotency_key or _new_key(),
            "size": size,
            "sha256": sha256.lower(),
            "content_type": content_type,
        }
        if schema is not None:
            prepare["schema"] = schema
        if expires_in_seconds is not None:
            prepare["expires_in_seconds"] = expires_in_seconds
        objects = self._path(run_id, stream_id, "/objects")
        intent = await self._json("POST", objects, json_body=prepare)
        object_id = intent["object_id"]
        object_path = f"{objects}/{_segment(object_id)}"

        if intent.get("state") == "prepared":
            upload = intent.get("upload") or {}
            url = str(httpx.URL(self.base_url).join(upload.get("url") or object_path + "/body"))
            total = size

            def counted() -> AsyncIterator[bytes]:
                async def gen() -> AsyncIterator[bytes]:
                    sent = 0
                    if progress:
                        progress(0, total)
                    async for chunk in body_factory():
                        sent += len(chunk)
                        yield chunk
                        if progress:
                            progress(sent, total)

                return gen()

            try:
                await self._request(
                    "PUT",
                    url,
                    content=counted,
                    headers={"Content-Type": content_type, "Content-Length": str(size)},
                    attempts=None if replayable else 1,
                )
            except StreamsError as error:
                # An earlier attempt may have landed although its answer was lost.
                if error.code != "object-state-conflict":
                    raise
                state = (await self._json("GET", object_path)).get("state")
                if state not in ("uploaded", "committed"):
                    raise
        return await self._json("POST", object_path + "/commit")

    async def get_object(self, run_id: str, stream_id: str, object_id: str) -> dict[str, Any]:
        """An object's metadata and state."""
        path = self._path(run_id, stream_id, f"/objects/{_segment(object_id)}")
        return await self._json("GET", path)

    async def abort_object(self, run_id: str, stream_id: str, object_id: str) -> dict[str, Any]:
        path = self._path(run_id, stream_id, f"/objects/{_segment(object_id)}/abort")
        return await self._json("POST", path)

    async def get_object_body(
        self, run_id: str, stream_id: str, object_id: str, *, chunk_size: int = CHUNK
    ) -> AsyncIterator[bytes]:
        """A committed object's body, streamed in chunks. The SHA-256 announced in
        `Repr-Digest` is checked at the end: a mismatch raises `StreamsError` (`digest-mismatch`)
        after the last chunk. Opening the download is retried like any read."""
        path = self._path(run_id, stream_id, f"/objects/{_segment(object_id)}/body")
        policy = self._retry
        deadline = time.monotonic() + policy.total_seconds
        attempt = 0
        started = False
        while True:
            attempt += 1
            try:
                async with self._http.stream("GET", path) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        failure = StreamsError.from_response(response)
                        if response.status_code not in RETRYABLE_STATUSES:
                            raise failure
                        delay = failure.retry_after or policy.backoff(attempt)
                    else:
                        expected = _repr_digest(response.headers.get("repr-digest"))
                        digest = hashlib.sha256()
                        async for chunk in response.aiter_bytes(chunk_size):
                            digest.update(chunk)
                            started = True
                            yield chunk
                        if expected is not None and digest.digest() != expected:
                            raise StreamsError(
                                response.status_code,
                                "digest-mismatch",
                                "the downloaded body does not match its Repr-Digest",
                            )
                        return
            except RETRYABLE_TRANSPORT as error:
                if started:  # bytes were delivered: a retry would repeat them
                    raise StreamsError.from_transport(error, self.base_url) from error
                failure = StreamsError.from_transport(error, self.base_url)
                delay = policy.backoff(attempt)
            if attempt >= policy.attempts or time.monotonic() + delay > deadline:
                raise failure
            await asyncio.sleep(delay)


def _repr_digest(header: str | None) -> bytes | None:
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
