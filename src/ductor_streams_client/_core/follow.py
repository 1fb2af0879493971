"""Following a stream: the server-sent events decoder and `Follower`, the one subscription
state machine both drivers step (where to resume, what each event or failure means)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import msgspec

from ductor_streams_client import models
from ductor_streams_client._core.exchange import (
    MAYBE_DONE,
    MAYBE_SENT,
    NOT_SENT,
    NOTHING_DONE,
    Call,
    RetryPolicy,
)
from ductor_streams_client._core.wire import stream_path
from ductor_streams_client.errors import (
    CursorExpired,
    NotFound,
    StreamsConnectionError,
    StreamsError,
    Unauthenticated,
    UnexpectedAnswer,
)


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
