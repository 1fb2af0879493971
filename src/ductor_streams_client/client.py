"""`StreamsClient`: the asyncio client of the ductor-streams HTTP API.

Each method builds its request and reads its answer in the sans-IO core (`_core`), which
`SyncStreamsClient` shares; this module only sends and sleeps. Every call that changes state is
safe to retry, and retried by the one policy (`RetryPolicy`): appends and object prepares carry
an idempotency key (generated when the caller gives none, reused by every retry of that call),
create (with a `stream_id`), ack, close, commit, abort and the deletes are idempotent."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from ductor_streams_client import _core as core
from ductor_streams_client import models
from ductor_streams_client._core import API_PREFIX, CHUNK, Progress, RetryPolicy
from ductor_streams_client.errors import StreamsError
from ductor_streams_client.producer import Producer

__all__ = ["API_PREFIX", "Progress", "RetryPolicy", "StreamsClient"]

T = TypeVar("T")


class StreamsClient:
    """An asyncio client of one ductor-streams deployment.

    ```python
    async with StreamsClient("http://127.0.0.1:8080", token) as client:
        await client.create_stream("run-1", "tokens")
        await client.append("run-1", "tokens", [{"text": "hi"}])
        async for item in client.follow("run-1", "tokens"):
            ...
    ```

    `base_url` is the deployment's root (a trailing `/api/workflow-streams` is accepted too).
    `token` is sent as `Authorization: Bearer` (None: send none, e.g. when `http_client`
    already does). `timeout` bounds each HTTP exchange (seconds or an `httpx.Timeout`; a long
    poll's read gets its `wait` on top); `idle_timeout` is how long a subscription may stay
    silent (the service sends a heartbeat at least every 15 s) before it counts as broken and
    reconnects. `retry` is the retry policy of every call. `http_client` is an
    `httpx.AsyncClient` of yours to send through (its limits, proxies, event hooks...); the
    client does not close it. `transport` (without `http_client`) is the transport of the
    `httpx.AsyncClient` made here."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float | httpx.Timeout = 30.0,
        idle_timeout: float = 45.0,
        retry: RetryPolicy | None = None,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._s = core.Settings(base_url, token, timeout, idle_timeout, retry)
        self.base_url = self._s.base_url
        self.retry = self._s.retry
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(transport=transport)

    async def __aenter__(self) -> StreamsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client, unless it was given (`http_client=`)."""
        if self._owns_http:
            await self._http.aclose()

    # -- the driver -------------------------------------------------------------------------------

    def _request(self, call: core.Call) -> httpx.Request:
        return self._http.build_request(
            call.method,
            self._s.url(call.path),
            params=call.params,
            headers=call.request_headers(self._s.headers),
            content=self._content(call),
            timeout=self._s.timeout_of(call),
        )

    def _content(self, call: core.Call) -> Any:
        if call.upload is not None:
            return _chunks(call.upload)
        return call.body

    async def _send(self, call: core.Call) -> Any:
        """One call, retried by the policy: its decoded answer (an open response for a
        `stream` call: close it), or its `StreamsError`."""
        exchange = self._s.exchange(call)
        while True:
            request = self._request(call)
            exchange.attempt()
            try:
                response = await self._http.send(request, stream=True)
            except httpx.TransportError as error:
                step = exchange.failed(error)
            else:
                if call.stream and response.status_code < 400:
                    return response
                try:
                    await response.aread()
                except httpx.TransportError as error:
                    step = exchange.failed(error)
                except httpx.DecodingError as error:
                    raise core.undecodable(call, response, error) from error
                else:
                    step = exchange.answered(response)
                finally:
                    await response.aclose()
            if not isinstance(step, core.Retry):
                return step
            await asyncio.sleep(step.delay)

    async def _run(self, flow: core.Flow[T]) -> T:
        try:
            call = next(flow)
            while True:
                try:
                    result = await self._send(call)
                except StreamsError as error:
                    call = flow.throw(error)
                else:
                    call = flow.send(result)
        except StopIteration as stop:
            answer: T = stop.value  # what the flow returned: a Flow[T]'s answer
            return answer

    # -- runs and streams -------------------------------------------------------------------------

    async def create_stream(
        self,
        run_id: str,
        stream_id: str | None = None,
        *,
        direction: str = "output",
        content_class: str | None = None,
        schema: Any = None,
        limits: models.Limits | dict[str, Any] | None = None,
        retention: models.Retention | dict[str, Any] | None = None,
        redaction: models.Redaction | dict[str, Any] | None = None,
        placement: models.Placement | dict[str, Any] | None = None,
        authorization: models.Authorization | dict[str, Any] | None = None,
        expiry: models.Expiry | dict[str, Any] | None = None,
    ) -> models.StreamDocument:
        """Create a stream (the service makes up an ID when `stream_id` is None). The same ID
        with an identical definition again answers the stream as it is; another definition is
        `DefinitionConflict`. Left-out settings take the service's defaults."""
        settings = {
            "content_class": content_class,
            "schema": schema,
            "limits": limits,
            "retention": retention,
            "redaction": redaction,
            "placement": placement,
            "authorization": authorization,
            "expiry": expiry,
        }
        return await self._run(core.create_stream(run_id, stream_id, direction, settings))

    async def get_stream(self, run_id: str, stream_id: str) -> models.StreamDocument:
        """The stream document: its definition, `run_id`, `created_at` and `state`."""
        return await self._run(core.get_stream(run_id, stream_id))

    async def list_streams(
        self, run_id: str, *, after: str | None = None, limit: int = 100
    ) -> models.StreamList:
        """One page of the run's streams that the caller may read, ascending by ID: those after
        `after`, at most `limit` (1 to 1,000); `page.next_after` is the next `after`
        (`NotFound` when the run has no stream)."""
        return await self._run(core.list_streams(run_id, after, limit))

    async def iter_streams(
        self, run_id: str, *, page_size: int = 100
    ) -> AsyncGenerator[models.StreamDocument, None]:
        """Every stream of the run that the caller may read, page after page."""
        after = None
        while True:
            page = await self.list_streams(run_id, after=after, limit=page_size)
            for stream in page.streams:
                yield stream
            if page.next_after is None:
                return
            after = page.next_after

    async def close_stream(self, run_id: str, stream_id: str) -> models.StreamDocument:
        """Close the stream (a no-op when already closed); answers the stream document."""
        return await self._run(core.close(run_id, stream_id))

    async def close(self, run_id: str, stream_id: str) -> models.StreamDocument:
        """Deprecated: `close_stream`, under the name of earlier versions. On the sync client
        `close()` closes the client, so this one warns (`DeprecationWarning`) and will go."""
        warnings.warn(
            "StreamsClient.close(run_id, stream_id) is deprecated: call close_stream(run_id, "
            "stream_id) (the client itself closes with aclose())",
            DeprecationWarning,
            stacklevel=2,
        )
        return await self.close_stream(run_id, stream_id)

    async def set_legal_hold(
        self, run_id: str, stream_id: str, enabled: bool, reason: str | None = None
    ) -> models.LegalHold:
        """Set or lift the legal hold (needs `streams:admin`)."""
        return await self._run(core.set_legal_hold(run_id, stream_id, enabled, reason))

    async def delete_stream(self, run_id: str, stream_id: str) -> None:
        """Erase the stream (`LegalHoldActive` while a hold is on; needs `streams:admin`)."""
        await self._run(core.delete_stream(run_id, stream_id))

    async def delete_run(self, run_id: str) -> None:
        """Erase every stream of the run, all or nothing."""
        await self._run(core.delete_run(run_id))

    async def list_runs(
        self, *, prefix: str | None = None, after: str | None = None, limit: int = 100
    ) -> models.RunsPage:
        """One page of the tenant's runs, ascending by ID: those after `after`, whose ID starts
        with `prefix`, at most `limit` (1 to 1,000). `page.next_after` is the next `after`."""
        return await self._run(core.list_runs(prefix, after, limit))

    async def iter_runs(
        self, *, prefix: str | None = None, page_size: int = 100
    ) -> AsyncGenerator[models.RunSummary, None]:
        """Every run of the tenant (whose ID starts with `prefix`), page after page."""
        after = None
        while True:
            page = await self.list_runs(prefix=prefix, after=after, limit=page_size)
            for run in page.runs:
                yield run
            if page.next_after is None:
                return
            after = page.next_after

    # -- tokens -----------------------------------------------------------------------------------

    async def mint_token(
        self,
        *,
        scopes: Iterable[str],
        expires_in_seconds: int,
        principal: str | None = None,
        runs: Iterable[str] | None = None,
    ) -> models.MintedToken:
        """Mint a token in this client's tenant (needs streams:admin): never more `scopes` than
        this client's token has, expiring in `expires_in_seconds` (at most the service's cap,
        and never after this client's own token), optionally restricted to `runs` (within this
        client's runs if it is restricted itself). The answer's `token` is shown this once.
        Not retried after a lost answer (a repeat would mint a second token)."""
        return await self._run(core.mint_token(scopes, expires_in_seconds, principal, runs))

    async def list_tokens(self, *, after: str | None = None, limit: int = 100) -> models.TokenList:
        """One page of the tenant's tokens (revoked and expired ones too) by creation, never a
        token itself: those after the token `after` (an id), read `limit` at a time (1 to
        1,000). `page.next_after` is the next `after` (None on the last page); a client
        restricted to runs may get a page with fewer tokens, even none, before the last."""
        return await self._run(core.list_tokens(after, limit))

    async def iter_tokens(self, *, page_size: int = 100) -> AsyncGenerator[models.TokenInfo, None]:
        """Every token of the tenant this client may list, page after page."""
        after = None
        while True:
            page = await self.list_tokens(after=after, limit=page_size)
            for token in page.tokens:
                yield token
            if page.next_after is None:
                return
            after = page.next_after

    async def revoke_token(self, token_id: str) -> None:
        """Revoke a token by its id: refused everywhere within 2 seconds."""
        await self._run(core.revoke_token(token_id))

    # -- usage ------------------------------------------------------------------------------------

    async def usage(self) -> models.Usage:
        """What the tenant holds against its limits (needs `streams:admin`, and a token not
        restricted to runs). Past a limit, a creation or an append is `QuotaExhausted`."""
        return await self._run(core.usage())

    # -- subscriptions ----------------------------------------------------------------------------

    async def put_subscription(
        self,
        subscription_id: str,
        *,
        type: str,
        pattern: tuple[str, str] | None = None,
        streams: Iterable[tuple[str, str]] | None = None,
        webhook_url: str | None = None,
        wake_stream: tuple[str, str] | None = None,
        lease_ttl_ms: int | None = None,
        description: str | None = None,
    ) -> models.Subscription:
        """Create a subscription (needs streams:admin), or re-confirm the same configuration;
        another one under the same id raises SubscriptionConflict. `type` is `webhook` (with
        `webhook_url`) or `pull-wake` (with `wake_stream`, a (run, stream) pair); `pattern` is
        a (run glob, stream glob) pair, `streams` (run, stream) pairs linked explicitly."""
        return await self._run(
            core.put_subscription(
                subscription_id,
                type,
                pattern,
                None if streams is None else list(streams),
                webhook_url,
                wake_stream,
                lease_ttl_ms,
                description,
            )
        )

    async def get_subscription(self, subscription_id: str) -> models.Subscription:
        """A subscription, its streams with their acknowledged sequences, and its wake."""
        return await self._run(core.get_subscription(subscription_id))

    async def delete_subscription(self, subscription_id: str) -> None:
        await self._run(core.delete_subscription(subscription_id))

    async def link_subscription_streams(
        self, subscription_id: str, streams: Iterable[tuple[str, str]]
    ) -> None:
        """Link (run, stream) pairs explicitly, from their current head."""
        await self._run(core.link_subscription_streams(subscription_id, list(streams)))

    async def unlink_subscription_stream(
        self, subscription_id: str, run_id: str, stream_id: str
    ) -> None:
        """Remove a stream's explicit link (a matching pattern keeps it linked)."""
        await self._run(core.unlink_subscription_stream(subscription_id, run_id, stream_id))

    async def stream_subscriptions(self, run_id: str, stream_id: str) -> models.SubscriptionList:
        """The subscriptions that link this stream."""
        return await self._run(core.stream_subscriptions(run_id, stream_id))

    async def claim_subscription(self, subscription_id: str, worker: str) -> models.WakeClaim:
        """Claim a pull-wake subscription's wake (AlreadyClaimed names the holder)."""
        return await self._run(core.claim_subscription(subscription_id, worker))

    async def ack_subscription(
        self,
        subscription_id: str,
        token: str,
        wake_id: str,
        generation: int,
        acks: Iterable[tuple[str, str, int]] = (),
        *,
        done: bool = False,
    ) -> models.WakeAnswer:
        """A pull-wake worker's ack ((run, stream, sequence) triples) and heartbeat; `done`
        ends the wake. `token` is the claim's."""
        flow = core.wake_ack(subscription_id, "/ack", token, wake_id, generation, list(acks), done)
        return await self._run(flow)

    async def subscription_callback(
        self,
        subscription_id: str,
        token: str,
        wake_id: str,
        generation: int,
        acks: Iterable[tuple[str, str, int]] = (),
        *,
        done: bool = False,
    ) -> models.WakeAnswer:
        """A webhook receiver's callback, by sequence; `token` is the notification's
        `callback_token`."""
        route = "/callback"
        flow = core.wake_ack(subscription_id, route, token, wake_id, generation, list(acks), done)
        return await self._run(flow)

    async def release_subscription(
        self, subscription_id: str, token: str, wake_id: str, generation: int
    ) -> None:
        """Give a claimed pull-wake back without acknowledging."""
        await self._run(core.release_subscription(subscription_id, token, wake_id, generation))

    async def webhook_jwks(self) -> dict[str, Any]:
        """The service's webhook signing keys (a JWKS), for `verify_webhook`."""
        return await self._run(core.webhook_jwks())

    # -- records ----------------------------------------------------------------------------------

    async def append(
        self,
        run_id: str,
        stream_id: str,
        records: Iterable[Any],
        *,
        idempotency_key: str | None = None,
        content_type: str | None = None,
    ) -> models.AppendAnswer:
        """Append one atomic batch (1 to 1,000 records). Each item is a JSON value (stored as
        `data`) or bytes (`data_base64`). `content_type` applies to every record (default
        `application/json` for JSON, `application/octet-stream` for bytes). The call carries an
        `Idempotency-Key` (a fresh UUID unless given) that all its retries reuse, so a retry
        never appends twice."""
        return await self._run(
            core.append(run_id, stream_id, records, idempotency_key, content_type)
        )

    async def read(
        self, run_id: str, stream_id: str, cursor: int = 0, limit: int = 100, wait: float = 0
    ) -> models.RecordsPage:
        """One page of records with `sequence > cursor`. With `wait` (0-60 s) and nothing past
        the cursor, waits that long for an append (a long poll)."""
        return await self._run(core.read(run_id, stream_id, cursor, limit, wait))

    async def ack(
        self, run_id: str, stream_id: str, consumer_id: str, sequence: int
    ) -> models.AckAnswer:
        """Acknowledge `consumer_id` through `sequence` (acks only advance; equal is a no-op),
        freeing credit for the writers."""
        return await self._run(core.ack(run_id, stream_id, consumer_id, sequence))

    async def list_consumers(
        self, run_id: str, stream_id: str, *, after: str | None = None, limit: int = 100
    ) -> models.ConsumersPage:
        """One page of the stream's consumers, ascending by ID: those after `after`, at most
        `limit` (1 to 1,000). `page.next_after` is the next `after`."""
        return await self._run(core.list_consumers(run_id, stream_id, after, limit))

    async def iter_consumers(
        self, run_id: str, stream_id: str, *, page_size: int = 100
    ) -> AsyncGenerator[models.Consumer, None]:
        """Every consumer of the stream, page after page."""
        after = None
        while True:
            page = await self.list_consumers(run_id, stream_id, after=after, limit=page_size)
            for consumer in page.consumers:
                yield consumer
            if page.next_after is None:
                return
            after = page.next_after

    async def delete_consumer(self, run_id: str, stream_id: str, consumer_id: str) -> None:
        """Remove the consumer, releasing what it held back (needs `streams:admin`; works
        under a legal hold)."""
        await self._run(core.delete_consumer(run_id, stream_id, consumer_id))

    async def follow(
        self,
        run_id: str,
        stream_id: str,
        cursor: int = 0,
        *,
        events: bool = True,
        give_up_after: float | None = 300.0,
        on_reconnect: Callable[[StreamsError, float], None] | None = None,
    ) -> AsyncGenerator[models.FollowItem, None]:
        """Every record with `sequence > cursor`, live, in order, each exactly once; then the
        final event: `Closed` (closed and all delivered), `Gone` (retention overtook the
        follower), `Deleted` or `Revoked`, after which the iteration ends.

        With `events=False` only records are yielded: `Closed` just ends the iteration, and the
        others raise `CursorExpired`, `NotFound` and `Unauthenticated`.

        Subscribes over SSE and, on any disconnect (network, idle timeout, server restart),
        reconnects from the last delivered sequence with `Last-Event-ID`, backing off by the
        retry policy (429/503 honour `Retry-After`). Refusals raise at once (`NotFound`,
        `CursorAheadOfHead`, `CursorExpired`, ...); `StreamsConnectionError` after
        `give_up_after` seconds without a working connection (None: never give up), or, before
        the first connection ever succeeds, after the policy's `total_seconds`.
        `on_reconnect(failure, delay)` is told of each disconnect before the pause.

        Use it under `contextlib.aclosing(...)` when you may stop early, so the connection is
        released at once."""
        follower = core.Follower(
            run_id,
            stream_id,
            cursor,
            policy=self.retry,
            where=self.base_url,
            give_up_after=give_up_after,
            on_reconnect=on_reconnect,
            events=events,
            read_timeout=self._s.idle_timeout,
        )
        while True:
            call = follower.call()
            try:
                response = await self._http.send(self._request(call), stream=True)
            except httpx.TransportError as error:
                follower.lost(error)
            else:
                try:
                    if response.status_code >= 400:
                        await response.aread()
                        follower.refused(response)
                    else:
                        follower.opened(response)
                        async for line in response.aiter_lines():
                            item = follower.line(line)
                            if item is not None:
                                yield item
                            if follower.done:
                                return
                        follower.ended()
                except httpx.TransportError as error:
                    follower.lost(error)
                except httpx.DecodingError as error:
                    raise core.undecodable(call, response, error) from error
                finally:
                    await response.aclose()
            await asyncio.sleep(follower.pause())

    def producer(
        self,
        run_id: str,
        stream_id: str,
        *,
        max_batch_records: int = 1000,
        max_batch_bytes: int = 1024 * 1024,
        linger: float = 0.005,
        max_buffered_records: int = 10_000,
        content_type: str | None = None,
        backpressure_timeout: float | None = 300.0,
    ) -> Producer:
        """A `Producer` that batches `send(value)`s into appends in the background (see
        `Producer`). Use it as `async with client.producer(...) as producer:`."""
        return Producer(
            self,
            run_id,
            stream_id,
            max_batch_records=max_batch_records,
            max_batch_bytes=max_batch_bytes,
            linger=linger,
            max_buffered_records=max_buffered_records,
            content_type=content_type,
            backpressure_timeout=backpressure_timeout,
        )

    async def _append_encoded(
        self, run_id: str, stream_id: str, body: bytes, key: str
    ) -> models.AppendAnswer:
        return await self._run(core.append_encoded(run_id, stream_id, body, key))

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
    ) -> models.CommitAnswer:
        """Store an object (up to 32 MiB) and append the record that carries it: prepare,
        streamed upload, commit. `source` is a file path, bytes, or an async iterable of bytes
        (then `size` and `sha256` (hex) are required, and the upload is not retried: it cannot
        be read twice). For a file they are computed by reading it once; it is read again, in
        chunks, to upload (and again on a retry). Safe to call again with the same
        `idempotency_key`: it resumes (or replays) the same object."""
        if isinstance(source, str | os.PathLike) and (size is None or sha256 is None):
            body = await asyncio.to_thread(
                core.object_source, source, size, sha256, iterable=AsyncIterable
            )
        else:
            body = core.object_source(source, size, sha256, iterable=AsyncIterable)
        flow = core.put_object(
            run_id,
            stream_id,
            body,
            content_type=content_type,
            idempotency_key=idempotency_key,
            schema=schema,
            expires_in_seconds=expires_in_seconds,
            progress=progress,
        )
        return await self._run(flow)

    async def get_object(self, run_id: str, stream_id: str, object_id: str) -> models.ObjectIntent:
        """An object's metadata and state."""
        return await self._run(core.get_object(run_id, stream_id, object_id))

    async def list_open_objects(
        self, run_id: str, stream_id: str, *, after: str | None = None, limit: int = 100
    ) -> models.OpenObjectsPage:
        """One page of the stream's open (prepared or uploaded) object intents, oldest first:
        those after `after`, at most `limit` (1 to 1,000). `page.next_after` is the next
        `after`. (The stream document shows only the first 20, and their count.)"""
        return await self._run(core.list_open_objects(run_id, stream_id, after, limit))

    async def abort_object(
        self, run_id: str, stream_id: str, object_id: str
    ) -> models.ObjectIntent:
        """Abort an object not yet committed (aborting again changes nothing)."""
        return await self._run(core.abort_object(run_id, stream_id, object_id))

    async def get_object_body(
        self, run_id: str, stream_id: str, object_id: str, *, chunk_size: int = CHUNK
    ) -> AsyncGenerator[bytes, None]:
        """A committed object's body, streamed in chunks. The SHA-256 announced in
        `Repr-Digest` is checked at the end: a mismatch raises `DigestMismatch` after the last
        chunk. Opening the download is retried like any read; a break once bytes have been
        delivered raises `StreamsConnectionError` (a retry would repeat them)."""
        call = core.get_object_body(run_id, stream_id, object_id)
        response: httpx.Response = await self._send(call)
        try:
            check = core.BodyCheck(response)
            async for chunk in response.aiter_bytes(chunk_size):
                yield check.feed(chunk)
            check.finish()
        except httpx.TransportError as error:
            raise StreamsError.from_transport(error, self.base_url) from error
        except httpx.DecodingError as error:
            raise core.undecodable(call, response, error) from error
        finally:
            await response.aclose()


async def _chunks(upload: core.Upload) -> AsyncIterator[bytes]:
    """An upload's body as the async client sends it (file reads in a thread)."""
    if isinstance(upload.source, bytes):
        for chunk in upload.sync_chunks():
            yield chunk
        return
    sent = 0
    if upload.progress:
        upload.progress(0, upload.size)
    if isinstance(upload.source, Path):
        file = await asyncio.to_thread(upload.source.open, "rb")
        try:
            while chunk := await asyncio.to_thread(file.read, CHUNK):
                sent = upload.count(sent, chunk)
                yield chunk
                if upload.progress:
                    upload.progress(sent, upload.size)
        finally:
            file.close()
    else:
        async for chunk in upload.source:
            sent = upload.count(sent, chunk)
            yield chunk
            if upload.progress:
                upload.progress(sent, upload.size)
    upload.check_end(sent)
