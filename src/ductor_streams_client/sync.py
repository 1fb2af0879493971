"""`SyncStreamsClient`: the same client without asyncio, over an `httpx.Client`.

It runs the same flows as `StreamsClient` (the sans-IO core builds every request, reads every
answer and decides every retry); only sending, sleeping and iterating are its own. Thread-safe
as far as its `httpx.Client` is (one may be shared by threads)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterable
from typing import Any, TypeVar

import httpx

from ductor_streams_client import _core as core
from ductor_streams_client import models
from ductor_streams_client._core import CHUNK, Progress, RetryPolicy
from ductor_streams_client.errors import StreamsError
from ductor_streams_client.producer import SyncProducer

__all__ = ["SyncStreamsClient"]

T = TypeVar("T")


class SyncStreamsClient:
    """A blocking client of one ductor-streams deployment, with `StreamsClient`'s methods.

    ```python
    with SyncStreamsClient("http://127.0.0.1:8080", token) as client:
        client.create_stream("run-1", "tokens")
        client.append("run-1", "tokens", [{"text": "hi"}])
        for item in client.follow("run-1", "tokens"):
            ...
    ```

    The arguments are `StreamsClient`'s; `http_client` is an `httpx.Client` of yours (not
    closed by this client), `transport` an `httpx.BaseTransport`."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float | httpx.Timeout = 30.0,
        idle_timeout: float = 45.0,
        retry: RetryPolicy | None = None,
        http_client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._s = core.Settings(base_url, token, timeout, idle_timeout, retry)
        self.base_url = self._s.base_url
        self.retry = self._s.retry
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(transport=transport)

    def __enter__(self) -> SyncStreamsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP client, unless it was given (`http_client=`). (A stream is closed
        with `close_stream`.)"""
        if self._owns_http:
            self._http.close()

    # -- the driver -------------------------------------------------------------------------------

    def _request(self, call: core.Call) -> httpx.Request:
        return self._http.build_request(
            call.method,
            self._s.url(call.path),
            params=call.params,
            headers=call.request_headers(self._s.headers),
            content=call.upload.sync_chunks() if call.upload is not None else call.body,
            timeout=self._s.timeout_of(call),
        )

    def _send(self, call: core.Call) -> Any:
        exchange = self._s.exchange(call)
        while True:
            request = self._request(call)
            exchange.attempt()
            try:
                response = self._http.send(request, stream=True)
            except httpx.TransportError as error:
                step = exchange.failed(error)
            else:
                if call.stream and response.status_code < 400:
                    return response
                try:
                    response.read()
                except httpx.TransportError as error:
                    step = exchange.failed(error)
                except httpx.DecodingError as error:
                    raise core.undecodable(call, response, error) from error
                else:
                    step = exchange.answered(response)
                finally:
                    response.close()
            if not isinstance(step, core.Retry):
                return step
            time.sleep(step.delay)

    def _run(self, flow: core.Flow[T]) -> T:
        try:
            call = next(flow)
            while True:
                try:
                    result = self._send(call)
                except StreamsError as error:
                    call = flow.throw(error)
                else:
                    call = flow.send(result)
        except StopIteration as stop:
            answer: T = stop.value  # what the flow returned: a Flow[T]'s answer
            return answer

    # -- runs and streams -------------------------------------------------------------------------

    def create_stream(
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
        """Create a stream; see `StreamsClient.create_stream`."""
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
        return self._run(core.create_stream(run_id, stream_id, direction, settings))

    def get_stream(self, run_id: str, stream_id: str) -> models.StreamDocument:
        """The stream document."""
        return self._run(core.get_stream(run_id, stream_id))

    def list_streams(
        self, run_id: str, *, after: str | None = None, limit: int = 100
    ) -> models.StreamList:
        """One page of the run's streams; see `StreamsClient.list_streams`."""
        return self._run(core.list_streams(run_id, after, limit))

    def iter_streams(
        self, run_id: str, *, page_size: int = 100
    ) -> Generator[models.StreamDocument, None, None]:
        """Every stream of the run that the caller may read, page after page."""
        after = None
        while True:
            page = self.list_streams(run_id, after=after, limit=page_size)
            yield from page.streams
            if page.next_after is None:
                return
            after = page.next_after

    def close_stream(self, run_id: str, stream_id: str) -> models.StreamDocument:
        """Close the stream (a no-op when already closed)."""
        return self._run(core.close(run_id, stream_id))

    def set_legal_hold(
        self, run_id: str, stream_id: str, enabled: bool, reason: str | None = None
    ) -> models.LegalHold:
        """Set or lift the legal hold."""
        return self._run(core.set_legal_hold(run_id, stream_id, enabled, reason))

    def delete_stream(self, run_id: str, stream_id: str) -> None:
        """Erase the stream."""
        self._run(core.delete_stream(run_id, stream_id))

    def delete_run(self, run_id: str) -> None:
        """Erase every stream of the run, all or nothing."""
        self._run(core.delete_run(run_id))

    def list_runs(
        self, *, prefix: str | None = None, after: str | None = None, limit: int = 100
    ) -> models.RunsPage:
        """One page of the tenant's runs; see `StreamsClient.list_runs`."""
        return self._run(core.list_runs(prefix, after, limit))

    def iter_runs(
        self, *, prefix: str | None = None, page_size: int = 100
    ) -> Generator[models.RunSummary, None, None]:
        """Every run of the tenant (whose ID starts with `prefix`), page after page."""
        after = None
        while True:
            page = self.list_runs(prefix=prefix, after=after, limit=page_size)
            yield from page.runs
            if page.next_after is None:
                return
            after = page.next_after

    # -- tokens -----------------------------------------------------------------------------------

    def mint_token(
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
        return self._run(core.mint_token(scopes, expires_in_seconds, principal, runs))

    def list_tokens(self, *, after: str | None = None, limit: int = 100) -> models.TokenList:
        """One page of the tenant's tokens; see `StreamsClient.list_tokens`."""
        return self._run(core.list_tokens(after, limit))

    def iter_tokens(self, *, page_size: int = 100) -> Generator[models.TokenInfo, None, None]:
        """Every token of the tenant this client may list, page after page."""
        after = None
        while True:
            page = self.list_tokens(after=after, limit=page_size)
            yield from page.tokens
            if page.next_after is None:
                return
            after = page.next_after

    def revoke_token(self, token_id: str) -> None:
        """Revoke a token by its id: refused everywhere within 2 seconds."""
        self._run(core.revoke_token(token_id))

    # -- usage ------------------------------------------------------------------------------------

    def usage(self) -> models.Usage:
        """What the tenant holds against its limits; see `StreamsClient.usage`."""
        return self._run(core.usage())

    # -- subscriptions ----------------------------------------------------------------------------

    def put_subscription(
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
        return self._run(
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

    def get_subscription(self, subscription_id: str) -> models.Subscription:
        """A subscription, its streams with their acknowledged sequences, and its wake."""
        return self._run(core.get_subscription(subscription_id))

    def delete_subscription(self, subscription_id: str) -> None:
        self._run(core.delete_subscription(subscription_id))

    def link_subscription_streams(
        self, subscription_id: str, streams: Iterable[tuple[str, str]]
    ) -> None:
        """Link (run, stream) pairs explicitly, from their current head."""
        self._run(core.link_subscription_streams(subscription_id, list(streams)))

    def unlink_subscription_stream(self, subscription_id: str, run_id: str, stream_id: str) -> None:
        """Remove a stream's explicit link (a matching pattern keeps it linked)."""
        self._run(core.unlink_subscription_stream(subscription_id, run_id, stream_id))

    def stream_subscriptions(self, run_id: str, stream_id: str) -> models.SubscriptionList:
        """The subscriptions that link this stream."""
        return self._run(core.stream_subscriptions(run_id, stream_id))

    def claim_subscription(self, subscription_id: str, worker: str) -> models.WakeClaim:
        """Claim a pull-wake subscription's wake (AlreadyClaimed names the holder)."""
        return self._run(core.claim_subscription(subscription_id, worker))

    def ack_subscription(
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
        return self._run(flow)

    def subscription_callback(
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
        return self._run(flow)

    def release_subscription(
        self, subscription_id: str, token: str, wake_id: str, generation: int
    ) -> None:
        """Give a claimed pull-wake back without acknowledging."""
        self._run(core.release_subscription(subscription_id, token, wake_id, generation))

    def webhook_jwks(self) -> dict[str, Any]:
        """The service's webhook signing keys (a JWKS), for `verify_webhook`."""
        return self._run(core.webhook_jwks())

    # -- records ----------------------------------------------------------------------------------

    def append(
        self,
        run_id: str,
        stream_id: str,
        records: Iterable[Any],
        *,
        idempotency_key: str | None = None,
        content_type: str | None = None,
    ) -> models.AppendAnswer:
        """Append one atomic batch; see `StreamsClient.append`."""
        return self._run(core.append(run_id, stream_id, records, idempotency_key, content_type))

    def read(
        self, run_id: str, stream_id: str, cursor: int = 0, limit: int = 100, wait: float = 0
    ) -> models.RecordsPage:
        """One page of records with `sequence > cursor` (a long poll with `wait`)."""
        return self._run(core.read(run_id, stream_id, cursor, limit, wait))

    def ack(self, run_id: str, stream_id: str, consumer_id: str, sequence: int) -> models.AckAnswer:
        """Acknowledge `consumer_id` through `sequence`."""
        return self._run(core.ack(run_id, stream_id, consumer_id, sequence))

    def list_consumers(
        self, run_id: str, stream_id: str, *, after: str | None = None, limit: int = 100
    ) -> models.ConsumersPage:
        """One page of the stream's consumers; see `StreamsClient.list_consumers`."""
        return self._run(core.list_consumers(run_id, stream_id, after, limit))

    def iter_consumers(
        self, run_id: str, stream_id: str, *, page_size: int = 100
    ) -> Generator[models.Consumer, None, None]:
        """Every consumer of the stream, page after page."""
        after = None
        while True:
            page = self.list_consumers(run_id, stream_id, after=after, limit=page_size)
            yield from page.consumers
            if page.next_after is None:
                return
            after = page.next_after

    def delete_consumer(self, run_id: str, stream_id: str, consumer_id: str) -> None:
        """Remove the consumer, releasing what it held back (needs `streams:admin`)."""
        self._run(core.delete_consumer(run_id, stream_id, consumer_id))

    def follow(
        self,
        run_id: str,
        stream_id: str,
        cursor: int = 0,
        *,
        events: bool = True,
        give_up_after: float | None = 300.0,
        on_reconnect: Callable[[StreamsError, float], None] | None = None,
    ) -> Generator[models.FollowItem, None, None]:
        """Every record after `cursor`, live, then the final event; see
        `StreamsClient.follow`. A plain generator: `close()` it (or use
        `contextlib.closing`) when you stop early."""
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
                response = self._http.send(self._request(call), stream=True)
            except httpx.TransportError as error:
                follower.lost(error)
            else:
                try:
                    if response.status_code >= 400:
                        response.read()
                        follower.refused(response)
                    else:
                        follower.opened(response)
                        for line in response.iter_lines():
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
                    response.close()
            time.sleep(follower.pause())

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
    ) -> SyncProducer:
        """A `SyncProducer`: `send` buffers, a background thread appends in batches."""
        return SyncProducer(
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

    def _append_encoded(
        self, run_id: str, stream_id: str, body: bytes, key: str
    ) -> models.AppendAnswer:
        return self._run(core.append_encoded(run_id, stream_id, body, key))

    # -- objects ----------------------------------------------------------------------------------

    def put_object(
        self,
        run_id: str,
        stream_id: str,
        source: str | os.PathLike[str] | bytes | bytearray | memoryview | Iterable[bytes],
        *,
        content_type: str = "application/octet-stream",
        idempotency_key: str | None = None,
        size: int | None = None,
        sha256: str | None = None,
        schema: Any = None,
        expires_in_seconds: int | None = None,
        progress: Progress | None = None,
    ) -> models.CommitAnswer:
        """Store an object and append its record; see `StreamsClient.put_object` (an iterable
        of bytes instead of an async one)."""
        body = core.object_source(source, size, sha256, iterable=Iterable)
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
        return self._run(flow)

    def get_object(self, run_id: str, stream_id: str, object_id: str) -> models.ObjectIntent:
        """An object's metadata and state."""
        return self._run(core.get_object(run_id, stream_id, object_id))

    def list_open_objects(
        self, run_id: str, stream_id: str, *, after: str | None = None, limit: int = 100
    ) -> models.OpenObjectsPage:
        """One page of the stream's open object intents; see `StreamsClient.list_open_objects`."""
        return self._run(core.list_open_objects(run_id, stream_id, after, limit))

    def abort_object(self, run_id: str, stream_id: str, object_id: str) -> models.ObjectIntent:
        """Abort an object not yet committed."""
        return self._run(core.abort_object(run_id, stream_id, object_id))

    def get_object_body(
        self, run_id: str, stream_id: str, object_id: str, *, chunk_size: int = CHUNK
    ) -> Generator[bytes, None, None]:
        """A committed object's body in chunks, checked against `Repr-Digest` at the end."""
        call = core.get_object_body(run_id, stream_id, object_id)
        response: httpx.Response = self._send(call)
        try:
            check = core.BodyCheck(response)
            for chunk in response.iter_bytes(chunk_size):
                yield check.feed(chunk)
            check.finish()
        except httpx.TransportError as error:
            raise StreamsError.from_transport(error, self.base_url) from error
        except httpx.DecodingError as error:
            raise core.undecodable(call, response, error) from error
        finally:
            response.close()
