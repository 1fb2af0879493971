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

A connection can also go silent without closing (a network path that drops packets: no RST, no
FIN). The bus proves its connection alive by a heartbeat it sends itself through PostgreSQL
(`pg_notify` on a channel of its own, which it LISTENs to) whenever the connection has said
nothing for `heartbeat_seconds`; any notification counts as proof too. After two such intervals
of silence the bus is *not live*: it wakes every follower every half heartbeat, so the tails
reread on that interval instead of waiting for a notification, and the token cache stops
trusting what a revocation notification would have corrected. After `dead_seconds` of silence
the connection is replaced (terminated: nothing is waited for on it) and the reconnection's
repairs run. A heartbeat, not TCP keepalives: keepalives are kernel settings (idle, interval,
count) that asyncpg does not expose for its client socket, they take tens of seconds with sane
values, and a peer's kernel answers them while its PostgreSQL hangs; a notification round trip
proves what the bus relies on. The repairs (head checks, gap evidence, the token recheck) run
on a pool connection, never on the connection they back up.

While PostgreSQL is down, a connection attempt is refused at once (a closed port, a removed
socket file, or 57P03 while it starts), so retrying every `RECONNECT_CAP_SECONDS` costs it
nothing worth saving; a longer backoff only delays live delivery after the outage by as much.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable

import asyncpg

from adapters.postgres.bounded import BoundedPool
from adapters.postgres.erasure import DELETED
from adapters.postgres.streams import WAKE_CHANNEL
from adapters.postgres.tokens import STILL_VALID, TOKENS_CHANNEL
from adapters.postgres.traces import TRACES_CHANNEL, heard_trace
from adapters.webhook_signing import KEYS_CHANNEL
from application import tracing
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
# attempt at most this long (or the dead bound, when shorter), instead of asyncpg's minute.
CONNECT_TIMEOUT_SECONDS = 5.0
# The server's side of a connection this process gave up (replaced) on a silent network stays
# open until its TCP notices; a LISTEN backend that never reads on holds the server's
# notification queue back meanwhile. Keepalives asked of the server end it within ~20 s of
# silence (they do nothing on a Unix socket).
SERVER_KEEPALIVES = {
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "3",
    "tcp_keepalives_count": "3",
}


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
        *,
        pool: asyncpg.Pool | BoundedPool | None = None,
        heartbeat_seconds: float = 0.5,
        dead_seconds: float = 5.0,
        keys_changed: Callable[[], None] | None = None,
    ) -> None:
        # Token revocations arrive on TOKENS_CHANNEL on the same connection (with the token's
        # id); each (re)connection forgets the whole cache, since one may have been missed.
        self._tokens = tokens
        # A webhook key rotation arrives on KEYS_CHANNEL: the keys are read again at their next
        # use (and at each reconnection, since one may have been missed).
        self._keys_changed = keys_changed
        self._url = url
        self._registry = registry
        self._interval = head_check_seconds
        self._application_name = application_name
        # The repair path's queries (head checks, evidence, revocations) go through the pool,
        # never through the connection they back up. Without one, the bus opens a small pool.
        self._pool = pool
        self._own_pool: asyncpg.Pool | None = None
        self._heartbeat = heartbeat_seconds
        self._suspect = 2 * heartbeat_seconds
        self._dead = max(dead_seconds, self._suspect + heartbeat_seconds)
        self.poll_seconds = heartbeat_seconds / 2
        self._channel = f"ductor_streams_bus_{secrets.token_hex(6)}"
        self._notified: dict[StreamKey, int] = {}
        self._suspected: dict[StreamKey, int] = {}
        self._created: dict[StreamKey, object] = {}  # the incarnation each followed key had
        self._checking = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.connected = asyncio.Event()
        self._not_live = asyncio.Event()
        self._not_live.set()
        self._heard = 0.0  # monotonic: when the connection last delivered anything
        self.live = False  # heard from within the suspicion bound
        self._silent_since = time.monotonic()
        self.reconnects = 0
        self.replacements = 0  # connections replaced because they went silent
        self.not_live_episodes = 0  # times the bus was not known alive, and tails polled
        self.gaps_repaired = 0
        # Tests drop notifications on purpose to prove the repairs; never set in service.
        self.drop: Callable[[StreamKey], bool] | None = None

    async def start(self) -> None:
        if self._pool is None:
            self._own_pool = self._pool = await asyncpg.create_pool(
                self._url,
                min_size=0,
                max_size=1,
                timeout=CONNECT_TIMEOUT_SECONDS,
                command_timeout=self._dead,
                server_settings={"application_name": self._application_name + "-repair"},
            )
        self._tasks = [
            asyncio.create_task(self._run(), name="wake-bus"),
            asyncio.create_task(self._check_periodically(), name="wake-bus head check"),
            asyncio.create_task(self._poll_while_not_live(), name="wake-bus polling"),
        ]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.connected.wait(), 10)

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._own_pool is not None:
            self._own_pool.terminate()

    def _hear(self) -> None:
        self._heard = time.monotonic()
        if not self.live and self.connected.is_set():
            self._set_live(True)

    def _on_heartbeat(self, _conn: object, _pid: int, _channel: str, _payload: object) -> None:
        self._hear()

    def _on_notification(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        self._hear()
        assert isinstance(payload, str)  # asyncpg hands a NOTIFY's payload over as text
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

    def _on_trace(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        self._hear()
        assert isinstance(payload, str)
        heard_trace(payload)

    def _on_token_revoked(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        self._hear()
        assert isinstance(payload, str)
        if self._tokens is not None:
            self._tokens.forget(payload)

    def _on_keys_changed(self, _conn: object, _pid: int, _channel: str, _payload: object) -> None:
        self._hear()
        if self._keys_changed is not None:
            self._keys_changed()

    def _set_live(self, live: bool, why: str = "") -> None:
        """Live: the connection delivered something within the suspicion bound, so a commit's
        notification would have been heard. Not live: every follower is woken every
        `poll_seconds` to reread (the tails fall back to polling), and the token cache trusts an
        entry for no longer than while revocations are not heard."""
        if live == self.live:
            return
        self.live = live
        now = time.monotonic()
        if live:
            self._not_live.clear()
            if self._tokens is not None:
                self._tokens.live = True  # heard again, in order: nothing was missed
            if self.not_live_episodes:
                log.warning(
                    "wake bus live again after %.1f s; polling stops", now - self._silent_since
                )
            return
        self._silent_since = now
        self.not_live_episodes += 1
        self._not_live.set()
        if self._tokens is not None:
            self._tokens.not_listening()
        log.warning(
            "wake bus not live: polling every %.2f s (%s)",
            self.poll_seconds,
            why or f"its connection said nothing for {now - self._heard:.1f} s",
        )

    async def _run(self) -> None:
        backoff = RECONNECT_FIRST_SECONDS
        first = True
        while not self._stopping:
            try:
                conn = await asyncpg.connect(
                    self._url,
                    timeout=min(CONNECT_TIMEOUT_SECONDS, self._dead),
                    server_settings={
                        "application_name": self._application_name,
                        **SERVER_KEEPALIVES,
                    },
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
            beat: asyncio.Task[object] | None = None
            try:
                async with asyncio.timeout(self._dead):  # a connection silent from the start
                    await conn.add_listener(self._channel, self._on_heartbeat)
                    await conn.add_listener(WAKE_CHANNEL, self._on_notification)
                    if tracing.on():  # before the wakes it precedes (adapters/postgres/traces.py)
                        await conn.add_listener(TRACES_CHANNEL, self._on_trace)
                    if self._tokens is not None:
                        await conn.add_listener(TOKENS_CHANNEL, self._on_token_revoked)
                        self._tokens.listening()
                    if self._keys_changed is not None:
                        await conn.add_listener(KEYS_CHANNEL, self._on_keys_changed)
                        self._keys_changed()  # a rotation may have come while not listening
                self.connected.set()
                self._hear()
                backoff = RECONNECT_FIRST_SECONDS
                if not first:
                    self.reconnects += 1
                    log.warning("wake bus reconnected; rereading every followed stream")
                    self._registry.missed()
                    self._registry.notify_all()
                first = False
                try:  # on the pool: its failure is no reason to give up this connection
                    if self._tokens is not None:
                        await self._recheck_held_tokens()
                    if self.reconnects:
                        await self._check_heads("reconnect")
                except _CONNECTION_ERRORS as error:
                    log.warning("wake bus could not recheck after connecting (%s)", error)
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), self.poll_seconds / 2)
                    silent = time.monotonic() - self._heard
                    if silent >= self._dead:
                        self.replacements += 1
                        log.warning(
                            "wake connection replaced: it said nothing for %.1f s "
                            "(heartbeats unanswered); connecting again",
                            silent,
                        )
                        break
                    if silent >= self._suspect:
                        self._set_live(False)
                    if silent >= self._heartbeat and (beat is None or beat.done()):
                        # To itself, through PostgreSQL: the answer proves the whole path, the
                        # server's notification queue included, not just the socket.
                        beat = asyncio.create_task(
                            conn.execute("SELECT pg_notify($1, '')", self._channel)
                        )
                        beat.add_done_callback(_retrieve)
            except _CONNECTION_ERRORS as error:
                log.warning("wake bus lost its connection (%s)", type(error).__name__)
            finally:
                self.connected.clear()
                if not self._stopping:
                    self._set_live(False, "its connection is gone; connecting again")
                if self._tokens is not None:
                    self._tokens.not_listening()
                conn.terminate()
                if beat is not None:
                    beat.cancel()

    async def _poll_while_not_live(self) -> None:
        """While the bus is not known to be alive, wake every follower every `poll_seconds`
        (each stream's tail rereads once, whatever its subscribers), and once a second end the
        open connections of tokens revoked meanwhile (their notification may not come)."""
        polls = 0
        while True:
            await self._not_live.wait()
            while self._not_live.is_set():
                self._registry.notify_all()
                polls += 1
                if self._tokens is not None and polls % max(1, round(1 / self.poll_seconds)) == 0:
                    with contextlib.suppress(*_CONNECTION_ERRORS):
                        await self._recheck_held_tokens()
                await asyncio.sleep(self.poll_seconds)

    async def _check_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            if not self.connected.is_set():
                continue  # the reconnection checks when it comes
            try:
                await self._check_heads("head-check")
            except _CONNECTION_ERRORS as error:
                log.warning("wake bus head check failed (%s)", type(error).__name__)

    async def _recheck_held_tokens(self) -> None:
        """End the open connections of tokens revoked while no revocation was heard (the
        notification went to a connection that was gone, or is silent): one query."""
        assert self._tokens is not None and self._pool is not None
        held = self._tokens.held_ids()
        if held:
            valid = {row[0] for row in await self._pool.fetch(STILL_VALID, held)}
            for token_id in set(held) - valid:
                self._tokens.forget(token_id)

    def _forget(self, key: StreamKey) -> None:
        self._notified.pop(key, None)
        self._suspected.pop(key, None)
        self._created.pop(key, None)

    async def _check_heads(self, detected_by: str) -> None:
        async with self._checking:  # the periodic check and a reconnection's, one at a time
            await self._check_heads_once(detected_by)

    async def _check_heads_once(self, detected_by: str) -> None:
        assert self._pool is not None
        followed = self._registry.followed()
        for gone in (set(self._notified) | set(self._created)) - set(followed):
            self._forget(gone)
        if not followed:
            return
        rows = await self._pool.fetch(
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
            suspect = self._suspected.pop(key, None)
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
                    self._suspected[key] = head
        if evidence:
            self.gaps_repaired += len(evidence)
            for key, expected, seen in evidence:
                log.warning(
                    "gap repaired on %s: expected %d, saw %d (%s)", key, expected, seen, detected_by
                )
            await self._pool.execute(
                _EVIDENCE,
                [k.tenant for k, _, _ in evidence],
                [k.run_id for k, _, _ in evidence],
                [k.stream_id for k, _, _ in evidence],
                [e for _, e, _ in evidence],
                [s for _, _, s in evidence],
                [detected_by] * len(evidence),
            )


def _retrieve(task: asyncio.Task[object]) -> None:
    if not task.cancelled():
        task.exception()  # a heartbeat on a dead connection: the silence is what counts
