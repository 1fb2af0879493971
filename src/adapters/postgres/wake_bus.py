"""The process-wide wake bus: one LISTEN connection per process, never one per subscriber.

A notification carries only "tenant/run/stream head" (or "… deleted") and is sent by the
committing transaction, so it can never precede the commit; it only tells the WakeRegistry that a
stream may have moved (or is gone).
Two repairs keep a lost notification from costing more than latency:

* every `head_check_seconds` the bus rereads the heads of every stream someone in this process is
  following and wakes those that moved without a notification; if that notification still has
  not arrived by the next check, it is written down as gap evidence;
* when the LISTEN connection drops, it reconnects, wakes every followed stream (whatever was
  committed meanwhile is reread) and writes evidence for those that moved; and it asks which of
  the tokens open connections hold were revoked meanwhile, and ends those connections.

A followed stream the check no longer finds was deleted: its listeners hear that as if notified
(one created again since is woken, and its readers see another creation time), and a reconnect
tells the caches that deletions may have been missed.

While PostgreSQL is down, a connection attempt is refused at once (a closed port, a removed
socket file, or 57P03 while it starts), so retrying every `RECONNECT_CAP_SECONDS` costs it
nothing worth saving; a longer backoff only delays live delivery after the outage by as much.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from adapters.postgres.erasure import DELETED
from adapters.postgres.streams import WAKE_CHANNEL
from adapters.postgres.tokens import STILL_VALID, TOKENS_CHANNEL
from application.tokens import TokenCache
from application.wake import WakeRegistry
from domain.stream import StreamKey

log = logging.getLogger("ductor_streams.wake_bus")

_HEADS = """
SELECT s.tenant, s.run_id, s.stream_id, s.head, s.created_at
FROM streams s
JOIN unnest($1::text[], $2::text[], $3::text[]) AS f(tenant, run_id, stream_id)
  USING (tenant, run_id, stream_id)
"""

_EVIDENCE = """
INSERT INTO gap_evidence (tenant, run_id, stream_id, expected, seen, detected_by)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[])
"""

_CONNECTION_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)

RECONNECT_FIRST_SECONDS = 0.05
RECONNECT_CAP_SECONDS = 0.5
# A server that accepts the TCP connection but never answers (a network partition) holds an
# attempt this long, instead of asyncpg's default minute.
CONNECT_TIMEOUT_SECONDS = 5.0


def parse_notification(payload: str) -> tuple[StreamKey, int | None] | None:
    """(key, head), or (key, None) when the stream was deleted."""
    path, _, head = payload.rpartition(" ")
    parts = path.split("/")
    if len(parts) != 3 or not (head.isdigit() or head == DELETED):
        return None
    return StreamKey(*parts), None if head == DELETED else int(head)


class PostgresWakeBus:
    def __init__(
        self,
        url: str,
        registry: WakeRegistry,
        head_check_seconds: float = 2.0,
        application_name: str = "ductor-streams-listen",
        tokens: TokenCache | None = None,
    ) -> None:
        # Token revocations arrive on TOKENS_CHANNEL on the same connection (with the token's
        # id); each (re)connection forgets the whole cache, since one may have been missed.
        self._tokens = tokens
        self._url = url
        self._registry = registry
        self._interval = head_check_seconds
        self._application_name = application_name
        self._notified: dict[StreamKey, int] = {}
        self._suspect: dict[StreamKey, int] = {}
        self._created: dict[StreamKey, object] = {}  # the incarnation each followed key had
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.connected = asyncio.Event()
        self.reconnects = 0
        self.gaps_repaired = 0
        # Tests drop notifications on purpose to prove the repairs; never set in service.
        self.drop: Callable[[StreamKey], bool] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="wake-bus")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.connected.wait(), 10)

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _on_notification(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        parsed = parse_notification(payload)
        if parsed is None:
            return
        key, head = parsed
        if self.drop is not None and self.drop(key):
            return
        if head is None:
            self._forget(key)
            self._registry.notify_deleted(key)
            return
        if head > self._notified.get(key, -1):
            self._notified[key] = head
        self._registry.notify(key)

    def _on_token_revoked(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if self._tokens is not None:
            self._tokens.forget(payload)

    async def _run(self) -> None:
        backoff = RECONNECT_FIRST_SECONDS
        first = True
        while not self._stopping:
            try:
                conn = await asyncpg.connect(
                    self._url,
                    timeout=CONNECT_TIMEOUT_SECONDS,
                    server_settings={"application_name": self._application_name},
                )
            except _CONNECTION_ERRORS as error:
                if backoff == RECONNECT_CAP_SECONDS:
                    log.debug("wake bus still cannot connect (%s)", type(error).__name__)
                else:
                    log.warning("wake bus cannot connect (%s); retrying", error)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_CAP_SECONDS)
                continue
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _c, lost=lost: lost.set())
            try:
                await conn.add_listener(WAKE_CHANNEL, self._on_notification)
                if self._tokens is not None:
                    await conn.add_listener(TOKENS_CHANNEL, self._on_token_revoked)
                    self._tokens.listening()
                    await self._recheck_held_tokens(conn)
                self.connected.set()
                backoff = RECONNECT_FIRST_SECONDS
                if not first:
                    self.reconnects += 1
                    log.warning("wake bus reconnected; rereading every followed stream")
                    self._registry.missed()
                    self._registry.notify_all()
                    await self._check_heads(conn, "reconnect")
                first = False
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), self._interval)
                    if not lost.is_set():
                        await self._check_heads(conn, "head-check")
            except _CONNECTION_ERRORS as error:
                log.warning("wake bus lost its connection (%s)", type(error).__name__)
            finally:
                self.connected.clear()
                if self._tokens is not None:
                    self._tokens.not_listening()
                conn.terminate()

    async def _recheck_held_tokens(self, conn: asyncpg.Connection) -> None:
        """End the open connections of tokens revoked while no revocation was heard (the
        notification went to a connection that was gone): one query per (re)connection."""
        assert self._tokens is not None
        held = self._tokens.held_ids()
        if held:
            valid = {row[0] for row in await conn.fetch(STILL_VALID, held)}
            for token_id in set(held) - valid:
                self._tokens.forget(token_id)

    def _forget(self, key: StreamKey) -> None:
        self._notified.pop(key, None)
        self._suspect.pop(key, None)
        self._created.pop(key, None)

    async def _check_heads(self, conn: asyncpg.Connection, detected_by: str) -> None:
        followed = self._registry.followed()
        for gone in (set(self._notified) | set(self._created)) - set(followed):
            self._forget(gone)
        if not followed:
            return
        rows = await conn.fetch(
            _HEADS,
            [k.tenant for k in followed],
            [k.run_id for k in followed],
            [k.stream_id for k in followed],
        )
        evidence: list[tuple[StreamKey, int, int]] = []
        found = {StreamKey(r[0], r[1], r[2]): r[4] for r in rows}
        for key in followed:
            created, seen = found.get(key), self._created.get(key)
            if created is None:  # gone without its deleted notification reaching us
                log.warning("stream %s was deleted (%s)", key, detected_by)
                self._forget(key)
                self._registry.notify_deleted(key)
            elif seen is not None and seen != created:  # deleted, and created again since
                self._forget(key)
                self._registry.forget(key)
                self._registry.notify(key)
        for tenant, run_id, stream_id, head, created_at in rows:
            key = StreamKey(tenant, run_id, stream_id)
            self._created.setdefault(key, created_at)
            notified = self._notified.get(key)
            if notified is None:  # newly followed: start from what is there
                self._notified[key] = head
                continue
            suspect = self._suspect.pop(key, None)
            if suspect is not None and notified < suspect:
                # A whole interval later, the notification for `suspect` never came.
                evidence.append((key, notified + 1, suspect))
                self._notified[key] = notified = suspect
            if head > notified:
                self._registry.notify(key)  # repair delivery now, judge it next check
                if detected_by == "reconnect":
                    evidence.append((key, notified + 1, head))
                    self._notified[key] = head
                else:
                    self._suspect[key] = head
        if evidence:
            self.gaps_repaired += len(evidence)
            for key, expected, seen in evidence:
                log.warning(
                    "gap repaired on %s: expected %d, saw %d (%s)", key, expected, seen, detected_by
                )
            await conn.execute(
                _EVIDENCE,
                [k.tenant for k, _, _ in evidence],
                [k.run_id for k, _, _ in evidence],
                [k.stream_id for k, _, _ in evidence],
                [e for _, e, _ in evidence],
                [s for _, _, s in evidence],
                [detected_by] * len(evidence),
            )
