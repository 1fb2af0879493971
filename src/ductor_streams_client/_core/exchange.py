"""One HTTP exchange: the `Call` a flow yields, when a failed try may be sent again, and
`Exchange`, the one retry loop both drivers step. A *flow* is a generator of `Call`s."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import msgspec

from ductor_streams_client.errors import (
    StreamsError,
    UnexpectedAnswer,
)

if TYPE_CHECKING:
    from ductor_streams_client._core.objects import Upload

T = TypeVar("T")

# Answers that say the service did nothing and will take the request later.
NOTHING_DONE = frozenset({429, 503})
# Answers of a proxy or gateway: the request may or may not have been applied.
MAYBE_DONE = frozenset({502, 504})
# Transport errors before the request left: never applied.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Transport errors after it may have reached the service.
MAYBE_SENT = (httpx.ReadTimeout, httpx.WriteTimeout, httpx.NetworkError, httpx.RemoteProtocolError)


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


# -- calls ----------------------------------------------------------------------------------------


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


# -- flows ----------------------------------------------------------------------------------------

Flow = Generator[Call, Any, T]


def one(call: Call) -> Flow[Any]:
    return (yield call)
