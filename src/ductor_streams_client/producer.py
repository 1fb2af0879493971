"""Producers: many small `send`s, few appends.

A program that streams tokens would send one request per token with `append`; a producer
buffers them and a background task (a thread for `SyncProducer`) appends them in batches: when
`max_batch_records` or `max_batch_bytes` is reached, or `linger` seconds after the oldest
buffered record arrived, or on `flush()`. Each batch is one append with its own idempotency
key, which every retry of it reuses, so a retry never duplicates a record. One batch is in
flight at a time, so records land in the order they were sent. When the stream pushes back
(429 `backpressure`), the batch is retried after `Retry-After` for up to
`backpressure_timeout` seconds, and meanwhile the buffer fills: once it holds
`max_buffered_records`, `send` waits (blocks) until there is room again.

The first error of an append (anything but backpressure within its timeout, after the client's
own retries) stops the producer: it is raised by the next `send`, `flush` or `close`, and the
records not appended yet stay unsent (`unsent`).

A producer should be closed (`close()`, or leaving its `with` / `async with` block). One that
is not: a `SyncProducer` still open when the interpreter exits is closed then (an `atexit`
hook: what it buffers is appended, and an error is printed rather than lost with its daemon
thread); a `Producer` whose event loop stops first cannot append any more, and says how many
records it drops in a `RuntimeWarning`."""

from __future__ import annotations

import asyncio
import atexit
import threading
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any

from ductor_streams_client import _core as core
from ductor_streams_client import models
from ductor_streams_client.errors import Backpressure

if TYPE_CHECKING:
    from ductor_streams_client.client import StreamsClient
    from ductor_streams_client.sync import SyncStreamsClient

__all__ = ["Producer", "ProducerClosed", "SyncProducer"]


def _wait_of(error: Backpressure) -> float:
    """What the service asked to wait (1 s, its usual, when it did not say)."""
    return 1.0 if error.retry_after is None else error.retry_after


def _not_closed(producer: _Common) -> str:
    return (
        f"the producer of stream {producer.stream_id!r} of run {producer.run_id!r} was not "
        f"closed: {producer.unsent} records sent to it were not appended"
    )


class ProducerClosed(RuntimeError):
    """`send` after `close()`."""


class _Common:
    """What both producers keep and report."""

    def __init__(
        self,
        run_id: str,
        stream_id: str,
        *,
        max_batch_records: int,
        max_batch_bytes: int,
        linger: float,
        max_buffered_records: int,
        content_type: str | None,
        backpressure_timeout: float | None,
    ) -> None:
        core.stream_path(run_id, stream_id)  # an ID no path can carry: InvalidInput now
        self.run_id = run_id
        self.stream_id = stream_id
        self.content_type = content_type
        self.backpressure_timeout = backpressure_timeout
        self._batcher = core.Batcher(
            max_batch_records=max_batch_records,
            max_batch_bytes=max_batch_bytes,
            linger=linger,
            max_buffered_records=max_buffered_records,
        )
        self._error: BaseException | None = None
        self._closed = False
        self._flush_to = 0  # a flush wants every record added before it appended
        self.appended = 0  # records appended so far
        self.batches = 0  # appends made so far
        self.last_answer: models.AppendAnswer | None = None

    @property
    def unsent(self) -> int:
        """Records sent to the producer and not appended (yet, or ever after an error)."""
        return self._batcher.added - self.appended

    def _encode(self, value: Any) -> bytes:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ProducerClosed("the producer is closed")
        part = core.encode_record(value, self.content_type)
        # Refused here, not by the service: its 413 would fail the whole batch, and the producer.
        if len(part) > core.MAX_INLINE_RECORD_BYTES:  # only then can the record be too large
            size = core.stored_size(value)
            if size > core.MAX_INLINE_RECORD_BYTES:
                raise ValueError(
                    f"a record of {size} bytes is over the service's inline limit "
                    f"({core.MAX_INLINE_RECORD_BYTES}); send it as an object (put_object)"
                )
        return part

    def _done(self, batch: core.Batch, answer: models.AppendAnswer) -> None:
        self.appended += batch.count
        self.batches += 1
        self.last_answer = answer

    def _gave_up(self, started: float, now: float, error: Backpressure) -> bool:
        limit = self.backpressure_timeout
        return limit is not None and now + _wait_of(error) - started > limit


class Producer(_Common):
    """Batches records into appends in an asyncio task (made by `StreamsClient.producer`).

    ```python
    async with client.producer("run-1", "tokens", linger=0.01) as producer:
        async for token in model.stream():
            await producer.send({"text": token})
    # leaving the block flushed everything (or raised the first error)
    ```"""

    def __init__(self, client: StreamsClient, run_id: str, stream_id: str, **options: Any) -> None:
        super().__init__(run_id, stream_id, **options)
        self._client = client
        self._wake = asyncio.Event()  # the flusher has something to do
        self._moved = asyncio.Event()  # a batch was taken or appended, or the producer failed
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, kind: object, *exc: object) -> None:
        if kind is None:
            await self.close()
        else:
            await self.aclose_quietly()

    async def send(self, value: Any) -> None:
        """Buffer one record (a JSON value, or bytes): returns at once unless the buffer is
        full, then waits for room. Raises the producer's first error."""
        part = self._encode(value)
        batcher = self._batcher
        while not batcher.room(len(part)):
            self._moved.clear()
            await self._moved.wait()
            if self._error is not None:
                raise self._error
        loop = asyncio.get_running_loop()
        if batcher.add(part, loop.time()):
            self._wake.set()
        if self._task is None:
            self._task = loop.create_task(self._flusher(), name="ductor-streams-producer")
            self._task.add_done_callback(self._flusher_ended)
        if batcher.full():
            # A full batch is handed over now, even to a sender that never awaits anything
            # else: the flusher runs once the sender yields.
            await asyncio.sleep(0)

    async def flush(self) -> None:
        """Append everything sent so far; raises the producer's first error."""
        target = self._batcher.added
        self._flush_to = max(self._flush_to, target)
        self._wake.set()
        while self.appended < target and self._error is None:
            if self._task is None or self._task.done():
                break
            self._moved.clear()
            await self._moved.wait()
        if self._error is not None:
            raise self._error

    async def close(self) -> None:
        """Flush, then stop the background task. Raises the producer's first error."""
        try:
            await self.flush()
        finally:
            self._closed = True
            await self._stop()

    async def aclose_quietly(self) -> None:
        """Stop at once, dropping what is buffered (on the way out of an exception)."""
        self._closed = True
        self._batcher.drop()
        await self._stop()

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise

    def _flusher_ended(self, task: asyncio.Task[None]) -> None:
        # Cancelled while not closed: its event loop is stopping (asyncio.run cancels what is
        # left) and what is buffered will never be appended. Say so rather than lose it quietly.
        if task.cancelled() and not self._closed and self.unsent:
            message = _not_closed(self) + " before its event loop stopped"
            warnings.warn(message, RuntimeWarning, stacklevel=1)  # no caller to point at

    async def _flusher(self) -> None:
        batcher = self._batcher
        loop = asyncio.get_running_loop()
        try:
            while True:
                now = loop.time()
                delay = batcher.wait(now, flushing=self._flush_to > batcher.taken)
                if delay is None or delay > 0:
                    self._wake.clear()
                    try:
                        async with asyncio.timeout(delay):
                            await self._wake.wait()
                    except TimeoutError:
                        pass
                    continue
                batch = batcher.take(now)
                self._moved.set()  # room in the buffer
                answer = await self._append(batch)
                self._done(batch, answer)
                self._moved.set()
        except Exception as error:  # kept, and raised by the next send, flush or close
            self._error = error
            self._moved.set()

    async def _append(self, batch: core.Batch) -> models.AppendAnswer:
        body = batch.body()
        started = time.monotonic()
        while True:
            try:
                return await self._client._append_encoded(
                    self.run_id, self.stream_id, body, batch.key
                )
            except Backpressure as error:
                now = time.monotonic()
                if self._gave_up(started, now, error):
                    raise
                await asyncio.sleep(_wait_of(error))


class SyncProducer(_Common):
    """Batches records into appends in a background thread (made by
    `SyncStreamsClient.producer`).

    ```python
    with client.producer("run-1", "tokens") as producer:
        for token in tokens:
            producer.send({"text": token})
    ```"""

    def __init__(
        self, client: SyncStreamsClient, run_id: str, stream_id: str, **options: Any
    ) -> None:
        super().__init__(run_id, stream_id, **options)
        self._client = client
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._dropping = False  # close_quietly: the batch in flight is given up too

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is None:
            self.close()
        else:
            self.close_quietly()

    def send(self, value: Any) -> None:
        """Buffer one record: returns at once unless the buffer is full, then blocks until
        there is room. Raises the producer's first error."""
        part = self._encode(value)
        batcher = self._batcher
        with self._lock:
            while not batcher.room(len(part)):
                self._lock.wait()
                if self._error is not None:
                    raise self._error
            if batcher.add(part, time.monotonic()):
                self._lock.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._flusher, name="ductor-streams-producer", daemon=True
                )
                self._thread.start()
                _open_sync_producers.add(self)

    def flush(self) -> None:
        """Append everything sent so far (blocks); raises the producer's first error."""
        with self._lock:
            target = self._batcher.added
            self._flush_to = max(self._flush_to, target)
            self._lock.notify_all()
            while self.appended < target and self._error is None and self._thread is not None:
                self._lock.wait()
            if self._error is not None:
                raise self._error

    def close(self) -> None:
        """Flush, then stop the background thread. Raises the producer's first error."""
        try:
            self.flush()
        finally:
            self._closed = True
            self._stop()

    def close_quietly(self) -> None:
        """Stop without flushing: what is buffered is dropped."""
        self._closed = True
        with self._lock:
            self._dropping = True
            self._batcher.drop()
        self._stop()

    def _stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
            thread, self._thread = self._thread, None
        _open_sync_producers.discard(self)
        if thread is not None:
            thread.join()

    def _flusher(self) -> None:
        batcher = self._batcher
        try:
            while True:
                with self._lock:
                    while True:
                        if self._stopping and (not batcher or self._error is not None):
                            return
                        now = time.monotonic()
                        flushing = self._stopping or self._flush_to > batcher.taken
                        delay = batcher.wait(now, flushing=flushing)
                        if delay == 0:
                            batch = batcher.take(now)
                            self._lock.notify_all()  # room in the buffer
                            break
                        self._lock.wait(delay)
                answer = self._append(batch)
                if answer is None:
                    return  # dropped while waiting out backpressure
                with self._lock:
                    self._done(batch, answer)
                    self._lock.notify_all()
        except Exception as error:  # kept, and raised by the next send, flush or close
            with self._lock:
                self._error = error
                self._lock.notify_all()

    def _append(self, batch: core.Batch) -> models.AppendAnswer | None:
        """The batch appended, or None when `close_quietly` gave it up during a wait."""
        body = batch.body()
        started = time.monotonic()
        while True:
            try:
                return self._client._append_encoded(self.run_id, self.stream_id, body, batch.key)
            except Backpressure as error:
                now = time.monotonic()
                if self._gave_up(started, now, error):
                    raise
                with self._lock:  # a wait that close_quietly cuts short
                    if self._lock.wait_for(lambda: self._dropping, _wait_of(error)):
                        return None


_open_sync_producers: weakref.WeakSet[SyncProducer] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Close every sync producer still open when the interpreter exits (its daemon flusher
    still runs while `atexit` hooks do): what they buffer is appended, as `close()` would. The
    first error is raised, which `atexit` prints on stderr."""
    first: Exception | None = None
    for producer in list(_open_sync_producers):
        try:
            producer.close()
        except Exception as error:
            first = first or error
    if first is not None:
        raise first
