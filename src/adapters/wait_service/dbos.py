"""The wait service is DBOS: each event is a message `DBOSClient.send`s to the run's workflow.

The destination workflow id and the topic come from templates over the event's `tenant`,
`run_id` and `stream_id` (defaults: the run ID, the stream ID); the message is the event object
in DBOS's portable JSON, so a workflow in any DBOS language reads it as a plain JSON object; the
idempotency key is the event id, so a publish repeated after a lost answer (or by a second
worker) inserts nothing: DBOS keeps consumed messages under their key. A workflow that calls
`DBOS.recv(topic)` gets the stream's records once each, in sequence order.

DBOS's client is synchronous (SQLAlchemy over psycopg): every send runs in a thread of the
adapter's own (never on the event loop, nor in the loop's shared executor, which one silent
database would fill), and is waited for `SEND_TIMEOUT_SECONDS` at most. Its own
retry-until-reconnected is off, so an unreachable or silent system database is a PublishFailed
that the dispatcher backs off from, with the delivery's `last_error` saying so. A send given
up on that commits later is harmless: its retry carries the same idempotency key.

DBOS delivers a topic's messages oldest first by the millisecond its insert transaction
started. So that two sends of one stream never share that millisecond (and so an order), the
adapter leaves `SPACING_SECONDS` between the sends of one destination and topic."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import msgspec

from adapters.wait_service.templates import Names, check_template
from application.input_delivery import PublishFailed

log = logging.getLogger("ductor_streams.dispatcher")

SPACING_SECONDS = 0.002
# How long a send may take (a system database that accepts connections and never answers held
# every input stream's delivery, with no error said, for as long as it stayed silent).
SEND_TIMEOUT_SECONDS = 10.0
SENDERS = 8  # threads, as many as the client's pool has connections
# A DBOS system database without DBOS's tables (no DBOS application has launched on it yet, or
# the wrong database): retried this often, recorded as the last error meanwhile.
MISCONFIGURED_RETRY_SECONDS = 60.0

_decode = msgspec.json.Decoder()


class DbosWaitService:
    def __init__(
        self,
        system_database_url: str,
        workflow_id: str = "{run_id}",
        topic: str = "{stream_id}",
        *,
        client: Any = None,
        send_timeout: float = SEND_TIMEOUT_SECONDS,
    ) -> None:
        self._send_timeout = send_timeout
        self._senders = ThreadPoolExecutor(SENDERS, thread_name_prefix="dbos-send")
        self._workflow_id = check_template("DBOS_WORKFLOW_ID", workflow_id)
        self._topic = check_template("DBOS_TOPIC", topic)
        if client is None:
            from dbos import DBOSClient  # the `dbos` extra, loaded only when configured

            # lazy: an engine that is down at start-up is a delivery to retry, not a crash
            client = DBOSClient(
                system_database_url=system_database_url,
                lazy=True,
                retry_connection_errors=False,
                system_database_pool_size=SENDERS,  # the streams one dispatcher sends to at once
            )
        self._client = client
        self._last_send: dict[tuple[str, str], float] = {}

    async def check(self) -> str | None:
        """None when the system database answers, else why not (for a start-up warning)."""
        try:
            await self._client.check_connection_async()
        except Exception as error:
            return f"{type(error).__name__}: {_first_line(error)}"
        return None

    async def publish(
        self, event_id: str, event: bytes, *, stream_created_at: datetime | None = None
    ) -> None:
        from dbos import WorkflowSerializationFormat
        from dbos._error import DBOSNonExistentWorkflowError

        fields = _decode.decode(event)  # (the message sent: the event object)
        names = Names(fields["tenant"], fields["run_id"], fields["stream_id"])
        destination = names.fill(self._workflow_id)
        topic = names.fill(self._topic)
        await self._space((destination, topic))
        send = functools.partial(
            self._client.send,
            destination,
            fields,
            topic,
            event_id,
            serialization_type=WorkflowSerializationFormat.PORTABLE,
        )
        try:
            sent = asyncio.get_running_loop().run_in_executor(self._senders, send)
            await asyncio.wait_for(sent, self._send_timeout)
        except TimeoutError:
            raise PublishFailed(
                f"DBOS system database did not answer within {self._send_timeout:g} s"
            ) from None
        except DBOSNonExistentWorkflowError:
            # Not yet started, perhaps: retried with the usual backoff, never dropped.
            raise PublishFailed(f"DBOS has no workflow {destination!r} (yet)") from None
        except Exception as error:
            detail = _first_line(error)
            if "does not exist" in detail and ("relation" in detail or "schema" in detail):
                raise PublishFailed(
                    f"not a DBOS system database (no DBOS application has launched on it): "
                    f"{detail}",
                    MISCONFIGURED_RETRY_SECONDS,
                ) from None
            raise PublishFailed(
                f"DBOS system database unreachable: {type(error).__name__}: {detail}"
            ) from None
        finally:
            self._last_send[(destination, topic)] = time.monotonic()

    async def _space(self, key: tuple[str, str]) -> None:
        last = self._last_send.get(key)
        if last is not None:
            wait = last + SPACING_SECONDS - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        if len(self._last_send) > 10_000:  # forget the streams that have gone quiet
            cutoff = time.monotonic() - 1.0
            self._last_send = {k: t for k, t in self._last_send.items() if t > cutoff}

    async def close(self) -> None:
        self._senders.shutdown(wait=False, cancel_futures=True)  # (a silent send is left)
        await asyncio.to_thread(self._client.destroy)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__
