"""Subscriptions: create, read, delete, link streams; wake them (webhook or pull-wake); take
their callbacks, claims, acks and releases (PROTOCOL.md sections 6 and 7).

Every change is decided under the subscription's lock (`SubscriptionStore.update`: in
PostgreSQL its row, `SELECT ... FOR UPDATE`), from the subscription, its links and the heads of
its streams as locked, and what a wake must send is written to the outbox in that transaction.
The outbox rows are delivered by a leased worker (`DeliverWakes`), like input deliveries: a
process killed mid-delivery loses no wake (its lease runs out and another takes the row over)
and a retried delivery carries the same generation and wake id, which the receiver's callback
is fenced by. The scheduler (`WakeScheduler`) finds subscriptions that are idle with pending
work, or whose lease ran out, and decides each under its lock, so any number of processes may
run it side by side."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import msgspec

from application import tracing
from application.access import Caller, Scope, require_reader
from application.definitions import Definitions
from application.errors import Forbidden, NotFound
from application.jwts import JWT_ID_PREFIX
from application.offsets import minting_of
from application.ports import RecordReader, TokenStore
from application.wake import WakeRegistry
from application.workers import OUTAGE_LOG_SECONDS, Job, Outage, backoff, ensure_claimed
from domain import errors
from domain.offsets import Minting, spelled
from domain.offsets import parse as parse_offset
from domain.records import RecordInput
from domain.stream import StreamKey
from domain.subscriptions import (
    DEFAULT_RUN,
    MAX_EXPLICIT_STREAMS,
    MAX_WORKER,
    WAKE_STREAM_WATCHED,
    AlreadyClaimed,
    Fenced,
    NoPendingWork,
    StreamPath,
    StreamStatus,
    Subscription,
    SubscriptionConfig,
    SubscriptionConflict,
    SubscriptionNotFound,
    TooManyLinks,
    WakeTokenInvalid,
    Watcher,
    WrongSubscriptionType,
    check_subscription_id,
    matches,
    parse_path,
    refuse_wake_cycles,
    retry_seconds,
)
from domain.text import check_text

log = logging.getLogger("ductor_streams.subscriptions")
# How often the wake scheduler looks at every subscription, besides those notified streams
# name: for a notification lost (the wake bus reconnecting), and work left over from a tick.
SWEEP_SECONDS = 5.0
_T = TypeVar("_T")
Heads = dict[StreamPath, int]
# A job's key for a wake delivery: the run slot names no run, the stream slot the subscription.
JOB_RUN = "__subscription__"
WEBHOOK = "webhook"
WAKE_EVENT = "wake-event"
TOKEN_SECONDS = 86_400.0
# In a stored webhook payload, the paths whose offsets are stated with their stream's chain
# when it is sent (`as_its_creator_sees`); never sent.
CHAIN_KEY = "_stated_when_sent"


class Delivery(msgspec.Struct, frozen=True):
    """An outbox row: one wake to hand over (a webhook POST, or an event on a wake stream)."""

    tenant: str
    subscription_id: str
    generation: int
    wake_id: str
    kind: str  # WEBHOOK or WAKE_EVENT
    payload: bytes
    url: str | None = None
    wake_stream: StreamPath | None = None
    created_by: str = ""
    creator_runs: tuple[str, ...] | None = None  # Subscription.creator_runs


class Change(msgspec.Struct, frozen=True):
    """What a decision stores: the subscription (None: delete it) and the wakes to send."""

    subscription: Subscription | None
    deliveries: tuple[Delivery, ...] = ()


class Census(msgspec.Struct, frozen=True):
    """What a change sees of its tenant's subscriptions, under a lock of the tenant's held
    until it commits: how many there are, and its pull-wake subscriptions with what each
    watches (when asked; else empty)."""

    count: int
    watchers: list[Watcher]


class SubscriptionStore(Protocol):
    async def update(
        self,
        tenant: str,
        subscription_id: str,
        decide: Callable[[Subscription | None, Heads], tuple[Change | None, _T]],
        discover: str | None = None,
        extra: tuple[StreamPath, ...] = (),
        touching: Collection[StreamPath] = (),
        named_runs: bool = False,
        census: Callable[[Census], None] | None = None,
        watchers: Collection[StreamPath] | None = None,
        census_if_wakes: bool = False,
    ) -> _T:
        """Lock the subscription (absent: None), load the links a decision sees and the heads
        of their streams (and of the streams the glob `discover` matches, and of `extra`), call
        `decide`, store the change it answers (None: nothing) with its deliveries, commit, and
        answer the rest.

        A decision sees the links with pending work, up to WAKE_STREAMS of them (those after
        the subscription's `woken_up_to` first, then from the first), and the links of the
        streams of `extra`, of `touching` and of the current wake's snapshot; with `extra`,
        `named_elsewhere` counts the explicit links among the others; with `named_runs`, the
        subscription's `named_runs` holds the runs of all its explicit links. A link the change
        leaves out that the decision saw is removed; those it did not see are left as they
        are.

        With `census`, first the tenant's `Census` is passed to it, under a lock of the tenant's
        that every such call takes first, held until the change commits; it raises to refuse
        the change, or keeps it for `decide`. Its `count` is read only when the subscription is
        not there (0 otherwise). With `watchers` (given when it is not there, or is a pull-wake;
        else empty) its pull-wake subscriptions, all of them, each with its pattern and the
        streams it links by name now, among the tenant's wake streams and `watchers`. With
        `census_if_wakes`, only a pull-wake subscription's change that links (in `extra`) a
        stream that is a pull-wake's wake stream takes the lock and calls `census`: a webhook
        writes no wake event, and a link to a stream no wake is written to makes no ring, so
        neither waits on the tenant's other changes (the lock is shared among such links)."""

    async def get(self, tenant: str, subscription_id: str) -> tuple[Subscription, Heads] | None:
        """The subscription with every link (and `named_runs`), and their streams' heads (what
        `GET` shows)."""

    async def wake_id(self, tenant: str, subscription_id: str) -> str | None:
        """The ID of the subscription's wake in flight (None: no wake, or no subscription),
        without its links."""

    async def count(self, tenant: str) -> int:
        """The subscriptions the tenant holds."""

    async def due(
        self, limit: int, streams: Collection[StreamKey] | None = None
    ) -> list[tuple[str, str]]:
        """Subscriptions (tenant, id) with something to decide: idle with pending records,
        or leased past the lease. With `streams`, only those pending on one of them (and the
        leased past their lease): the cost of the streams, not of every subscription."""

    async def of_stream(
        self, key: StreamKey, named_runs: bool = False
    ) -> list[tuple[Subscription, Heads]]:
        """The subscriptions that link this stream (the console, the native API), with their
        `named_runs` if asked."""

    async def delivery(self, job: Job) -> Delivery | None: ...


class WakeTokens:
    """Callback and claim tokens: HMAC-signed (tenant, subscription, generation, wake id,
    expiry, and for a claim the id of the API token that claimed it and, for a JWT restricted
    to runs, those runs), so a token of an earlier wake still proves who it was for and is
    fenced (409), while a forged one is refused (401)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def issue(
        self,
        sub: Subscription,
        now: float,
        claimed_by: str | None = None,
        runs: Collection[str] | None = None,
    ) -> str:
        assert sub.wake is not None
        wake, until = sub.wake, int(now + TOKEN_SECONDS)
        fields: list[Any] = [sub.tenant, sub.id, wake.generation, wake.wake_id, until]
        if claimed_by is not None:
            fields.append(claimed_by)
            if runs is not None:
                fields.append(sorted(runs))
        claims = msgspec.json.encode(fields)
        body = base64.urlsafe_b64encode(claims).rstrip(b"=")
        mac = hmac.new(self._secret, body, hashlib.sha256).digest()
        return (body + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=")).decode()

    def verify(self, token: str, tenant: str | None, subscription_id: str, now: float) -> Any:
        """The token's claims [tenant, id, generation, wake_id, exp(, claimed_by(, runs))], or
        WakeTokenInvalid."""
        try:
            body, _, mac = token.encode("ascii").partition(b".")
            want = base64.urlsafe_b64encode(hmac.new(self._secret, body, hashlib.sha256).digest())
            if not hmac.compare_digest(want.rstrip(b"="), mac):
                raise ValueError("bad signature")
            claims = msgspec.json.decode(base64.urlsafe_b64decode(body + b"=" * (-len(body) % 4)))
            t, sid, _generation, _wake, exp = claims[:5]
            if len(claims) > 7:
                raise ValueError("too many claims")
        except (ValueError, UnicodeError, msgspec.DecodeError, TypeError):
            raise WakeTokenInvalid("the wake token is not valid") from None
        if sid != subscription_id or (tenant is not None and t != tenant):
            raise WakeTokenInvalid("the wake token is for another subscription")
        if exp < now:
            raise WakeTokenInvalid("the wake token expired")
        return claims


class UrlCheck(Protocol):
    def __call__(self, url: str) -> None:
        """Raise WebhookUrlRejected for a URL that may not be stored."""


class AckRequest(msgspec.Struct, frozen=True):
    stream: StreamPath
    sequence: int
    # The incarnation of the stream the ack's offset was issued by (domain/offsets.py), checked
    # against the linked stream's in the decision; 0: not stated (a native ack, by sequence).
    incarnation: int = 0


class StreamView(msgspec.Struct, frozen=True):
    path: str
    link_type: str
    acked: int
    tail: int
    pending: bool


def views(statuses: list[StreamStatus]) -> list[StreamView]:
    return [StreamView(s.path.path, s.link_type, s.acked, s.tail, s.pending) for s in statuses]


def _run_of_pattern(pattern: str) -> str | None:
    """The one run a glob's streams can be in, or None when it spans runs: a pattern of one
    segment names streams of the default run; of more, its first segment is the run (a literal
    one, without `*`, or it spans runs)."""
    segments = pattern.strip("/").split("/")
    if len(segments) == 1:
        return DEFAULT_RUN if segments[0] != "**" else None
    return None if "*" in segments[0] else segments[0]


def within_runs(caller: Caller, config: SubscriptionConfig) -> bool:
    """Whether everything a subscription names lies in the caller's runs (always, for a caller
    not restricted to runs): a run-scoped token sees and changes only such subscriptions, as if
    the others were another tenant's."""
    runs = caller.runs
    if runs is None:
        return True
    named = [p.run_id for p in config.streams]
    if config.wake_stream is not None:
        named.append(config.wake_stream.run_id)
    if config.pattern is not None:
        named.append(_run_of_pattern(config.pattern) or "")
    return all(run in runs for run in named)


def visible_to(caller: Caller, sub: Subscription) -> bool:
    """Whether a stored subscription lies in the caller's runs: what it was configured with
    (`within_runs`) and every stream it names (`named_runs`: `POST .../streams` by a caller
    not restricted to runs may link another run's): a subscription over another run's stream
    is not there for a run-scoped token, as another tenant's is not."""
    if not within_runs(caller, sub.config):
        return False
    return _names_within(caller.runs, sub)


def _names_within(runs: Collection[str] | None, sub: Subscription) -> bool:
    """Whether every stream `sub` names explicitly is in `runs` (None: any run)."""
    if runs is None:
        return True
    named = sub.named_runs  # (None, not read: not shown, rather than shown past its runs)
    return named is not None and all(run in runs for run in named)


def _configured(caller: Caller, sub: Subscription) -> Subscription:
    """`sub`'s configuration as `caller` may see it: a webhook's URL whole for a caller with
    `streams:admin` (who may set it), its address alone for others (a reader, a share link's
    token): what follows the path, or precedes the host, is often the receiver's credential."""
    if "streams:admin" in caller.scopes:
        return sub
    # A failure's text may name the receiver's address or what it resolved to: for those who
    # configure subscriptions.
    return msgspec.structs.replace(sub.with_webhook_address(), last_error=None)


Runs = tuple[str, ...] | None  # a subscription's creator's runs (Subscription.creator_runs)


def creator_caller(tenant: str, creator: str, runs: Runs, scope: Scope) -> Caller:
    """The caller a subscription acts as when it reads or writes streams for its creator."""
    return Caller(
        tenant=tenant,
        principal=creator,
        scopes=frozenset({scope}),
        runs=None if runs is None else frozenset(runs),
    )


def _visible(caller: Caller, sub: Subscription | None, subscription_id: str) -> Subscription:
    if sub is None or not visible_to(caller, sub):
        raise SubscriptionNotFound(f"no subscription {subscription_id!r}")
    return sub


class _Unchecked(Exception):
    """A decision met pending streams whose readability by the subscription's creator is not
    known yet: it is decided again once it is."""

    def __init__(self, tenant: str, creator: str, runs: Runs, paths: list[StreamPath]) -> None:
        super().__init__(tenant, creator, runs, paths)
        self.tenant, self.creator, self.runs, self.paths = tenant, creator, runs, paths


# How long a claiming API token found valid is taken as such (its revocation ends the claim's
# token within this long).
CLAIMER_SECONDS = 1.0
# How long whether a subscription's creator may read a stream is remembered (a definition, and
# so its readers, never changes; a stream erased and created again with other readers is seen
# after this long), and how many such answers a process keeps.
READABLE_SECONDS = 30.0
READABLE_KEPT = 100_000
DEFAULT_MAX_SUBSCRIPTIONS_PER_TENANT = 10_000


class Subscriptions:
    """The use cases over subscriptions, for both surfaces."""

    def __init__(
        self,
        store: SubscriptionStore,
        tokens: WakeTokens,
        check_url: UrlCheck,
        clock: Callable[[], float] = time.time,
        definitions: Definitions | None = None,
        api_tokens: TokenStore | None = None,
        reader: RecordReader | None = None,
        max_per_tenant: int = DEFAULT_MAX_SUBSCRIPTIONS_PER_TENANT,
    ) -> None:
        self._store = store
        # The subscriptions a tenant may hold (0: no limit): each costs every append to a
        # stream it links, and its links are rows of the database every tenant shares.
        self._max_per_tenant = max_per_tenant
        # The streams' incarnations, for the offsets a wake and a claim show (without one, the
        # offsets leave the incarnation unstated: domain/offsets.py).
        self._reader = reader
        self._tokens = tokens
        # The API tokens that claimed wakes: a claim's token holds no longer than they do.
        self._api_tokens = api_tokens
        # A claiming API token's id -> valid until (monotonic), and the runs it is restricted to.
        self._claimers: dict[str, tuple[float, list[str] | None]] = {}
        self._check_url = check_url
        self._clock = clock
        self._definitions = definitions
        # (tenant, creator, its runs, stream) -> (whether the creator may read it, until when)
        self._readable: dict[tuple[str, str, Runs, StreamPath], tuple[bool, float]] = {}

    @tracing.use_case("put subscription")
    async def put(
        self, caller: Caller, subscription_id: str, config: SubscriptionConfig, base_url: str
    ) -> tuple[Subscription, Heads, bool]:
        """Create (True) or re-confirm an identical configuration (False)."""
        caller.require("streams:admin")
        if not within_runs(caller, config):
            raise Forbidden(
                "a token restricted to runs subscribes only to streams of its runs: name them, "
                "or a pattern whose first segment is one of its runs"
            )
        if config.webhook_url is not None:
            self._check_url(config.webhook_url)
        now = self._clock()
        census: list[Census] = []  # the tenant's subscriptions (its pull-wakes, if one)

        def decide(
            sub: Subscription | None, heads: Heads
        ) -> tuple[Change | None, tuple[Subscription, bool]]:
            if sub is not None and not visible_to(caller, sub):
                raise SubscriptionConflict(f"subscription {subscription_id!r} exists")
            if sub is not None:
                if sub.config.digest() != config.digest():
                    raise SubscriptionConflict(
                        f"subscription {subscription_id!r} exists with another configuration"
                    )
                return None, (sub, False)
            new = Subscription(
                tenant=caller.tenant,
                id=subscription_id,
                config=config,
                created_at=now,
                created_by=caller.principal,
                base_url=base_url,
                creator_runs=None if caller.runs is None else tuple(sorted(caller.runs)),
            )
            limit = self._max_per_tenant
            if limit and census[-1].count >= limit:
                raise errors.QuotaExhausted(
                    f"the tenant holds its limit of {limit} subscriptions: delete some before "
                    "making more",
                    max_subscriptions=limit,
                )
            watcher = Watcher.of(subscription_id, config)
            if watcher is not None:
                refuse_wake_cycles(census[-1].watchers, watcher, named=caller.runs is None)
            # Existing streams are linked at their tail: creating one replays nothing. A stream
            # named and matched by the pattern is linked both ways, so that unlinking it by name
            # keeps its glob link while the pattern matches it.
            pattern = config.pattern
            globbed = {p: h for p, h in heads.items() if pattern and matches(pattern, p)}
            new = new.linked({p: heads.get(p, 0) for p in config.streams}, explicit=True)
            new = new.linked(globbed, explicit=False) if config.pattern else new
            return Change(new), (new, True)

        sub, created = await self._store.update(
            caller.tenant,
            subscription_id,
            decide,
            discover=config.pattern,
            extra=config.streams,
            named_runs=caller.runs is not None,
            census=census.append,
            watchers=() if config.wake_stream is None else (config.wake_stream,),
        )
        found = await self._store.get(caller.tenant, subscription_id)
        heads = found[1] if found else {}
        # The answer shows what `get` shows: no stream the caller may not read.
        return await self._shown(caller, found[0] if found else sub), heads, created

    async def held(self, tenant: str) -> tuple[int, int | None]:
        """The subscriptions `tenant` holds, and the most it may (None: no limit)."""
        return await self._store.count(tenant), self._max_per_tenant or None

    @tracing.use_case("get subscription")
    async def get(self, caller: Caller, subscription_id: str) -> tuple[Subscription, Heads]:
        caller.require("streams:read")
        check_subscription_id(subscription_id)
        found = await self._store.get(caller.tenant, subscription_id)
        sub = _visible(caller, found[0] if found else None, subscription_id)
        heads = found[1] if found else {}
        return await self._shown(caller, sub), heads

    async def _shown(self, caller: Caller, sub: Subscription) -> Subscription:
        """`sub` as `caller` may see it: a run-restricted caller sees only its runs' streams,
        and no caller a stream it may not read (a stream's pinned readers): a link's path and
        acknowledged offset are the stream's, not the subscription's. Only a caller who may
        configure subscriptions sees a webhook's whole URL (`_configured`)."""
        sub = _configured(caller, sub)
        if caller.runs is not None:
            sub = sub.with_links({k.path: k for k in sub.links if k.path.run_id in caller.runs})
        readable = {k.path: k for k in sub.links if await self._may_read(caller, k.path)}
        if len(readable) != len(sub.links):
            sub = sub.with_links(readable)
        return sub

    async def as_its_creator_sees(self, delivery: Delivery) -> bytes:
        """A webhook's payload without the streams its creator may not read (a pattern links
        every stream it matches, a stream's pinned readers included): a receiver is told of
        no stream's offsets that whoever configured it could not read.

        The decision that wrote it stated each stream's offsets with the stream's own
        incarnation; those it marked (`CHAIN_KEY`: a fork's positions within its inherited
        prefix) are stated here as a read of the stream states them, with its chain, where the
        stream is still the one the wake named (one deleted and created again since keeps the
        old stream's offsets, which no ack of the new one takes)."""
        body = msgspec.json.decode(delivery.payload)
        tenant, creator, runs = delivery.tenant, delivery.created_by, delivery.creator_runs
        chained = set(body.pop(CHAIN_KEY, None) or ())
        streams = body.get("streams", [])
        shown = [
            s
            for s in streams
            if await self._creator_may_read(tenant, creator, runs, parse_path(s["path"]))
        ]
        if len(shown) == len(streams) and not chained:
            return delivery.payload
        if chained:
            marked = [s for s in shown if s["path"] in chained]
            mintings = await self.offsets(tenant, [parse_path(s["path"]) for s in marked])
            for status in marked:
                minting = mintings.get(parse_path(status["path"]))
                if minting is None:
                    continue
                for field in ("acked_offset", "tail_offset"):
                    offset = parse_offset(status[field])
                    if offset is not None and offset.minted_by == minting.own:  # the same stream
                        status[field] = minting.text(offset.sequence)
        return msgspec.json.encode({**body, "streams": shown})

    async def offsets(
        self, tenant: str, paths: Collection[StreamPath]
    ) -> dict[StreamPath, Minting]:
        """The offsets of each stream of `paths` there is (domain/offsets.py): what a wake, a
        claim and a subscription's view show, and what an ack is resolved against."""
        if self._reader is None or self._definitions is None:
            return {}
        found: dict[StreamPath, Minting] = {}
        for path in paths:
            key = StreamKey(tenant, path.run_id, path.stream_id)
            try:
                definition = await self._definitions.get(key, touch=False, runs=None)
            except (NotFound, errors.DomainError):  # not there (yet), or served elsewhere
                continue
            created_at = await self._reader.created_at(key)
            fork = definition.fork is not None
            found[path] = await minting_of(self._reader, key, created_at, fork=fork)
        return found

    async def decide_seeing(
        self,
        tenant: str,
        subscription_id: str,
        decide: Callable[[Subscription | None, Heads], tuple[Change | None, _T]],
        touching: Collection[StreamPath] = (),
        named_runs: bool = False,
    ) -> _T:
        """`store.update`, with every pending stream the subscription's creator may not read
        (its pinned readers leave the creator out, though a pattern linked it) acknowledged at
        its head first: nothing of it is ever delivered, so nothing of it is ever pending. A
        wake for it was a wake no receiver or worker could end: a webhook's notification
        leaves it out, a claim does not show it, so no ack could reach it, and every `done`
        woke the subscription again at once (99 webhooks in 6 s)."""
        for _ in range(3):
            try:
                return await self._store.update(
                    tenant,
                    subscription_id,
                    self._seeing(decide),
                    touching=touching,
                    named_runs=named_runs,
                )
            except _Unchecked as unchecked:
                for path in unchecked.paths:
                    await self._creator_may_read(
                        unchecked.tenant, unchecked.creator, unchecked.runs, path
                    )
        # Streams linked faster than they could be checked (three rounds): those known hidden
        # are acknowledged, the others decided as they are.
        return await self._store.update(
            tenant,
            subscription_id,
            self._seeing(decide, check=False),
            touching=touching,
            named_runs=named_runs,
        )

    async def _creator_may_read(
        self, tenant: str, creator: str, runs: Runs, path: StreamPath
    ) -> bool:
        """Whether a subscription's creator (restricted to `runs`, or not) may read a stream,
        as remembered for `READABLE_SECONDS` (a webhook's every delivery and a pattern's every
        stream ask). That a stream is not there is not remembered: it may be created, as a
        stream the creator may not read, the next moment (a fork of another run's stream, for
        a creator restricted to runs), and its first records must not be shown or wake."""
        now = time.monotonic()
        known = self._readable.get((tenant, creator, runs, path))
        if known is not None and known[1] >= now:
            return known[0]
        caller = creator_caller(tenant, creator, runs, "streams:read")
        readable = await self._readability(caller, path)
        if readable is None:
            return True
        if len(self._readable) > READABLE_KEPT:
            self._readable.clear()
        self._readable[(tenant, creator, runs, path)] = readable, now + READABLE_SECONDS
        return readable

    def _seeing(
        self,
        decide: Callable[[Subscription | None, Heads], tuple[Change | None, _T]],
        check: bool = True,
    ) -> Callable[[Subscription | None, Heads], tuple[Change | None, _T]]:
        def seeing(sub: Subscription | None, heads: Heads) -> tuple[Change | None, _T]:
            if sub is None:
                return decide(sub, heads)
            pending = [k.path for k in sub.links if heads.get(k.path, 0) > k.acked]
            now = time.monotonic()
            who = (sub.tenant, sub.created_by, sub.creator_runs)
            known = {p: self._readable.get((*who, p)) for p in pending}
            unknown = [p for p, seen in known.items() if seen is None or seen[1] < now]
            if unknown and check:
                raise _Unchecked(*who, unknown)
            hidden = [(p, heads[p]) for p, seen in known.items() if seen and not seen[0]]
            if not hidden:
                return decide(sub, heads)
            seen_sub = sub.acknowledged(hidden, heads)
            change, answer = decide(seen_sub, heads)
            return (Change(seen_sub) if change is None else change), answer

        return seeing

    async def _may_read(self, caller: Caller, path: StreamPath) -> bool:
        """Whether a link to `path` may be shown to `caller`: not a stream its pinned readers
        leave the caller out of, nor, for a caller restricted to runs, a fork whose source
        chain leaves them (such a fork is not there for it: its offsets are the other run's)."""
        readable = await self._readability(caller, path)
        return readable is None or readable

    async def _readability(self, caller: Caller, path: StreamPath) -> bool | None:
        """`_may_read`, None when there is no such stream (yet, or any more): a link to it
        reveals nothing, and what the stream made under that ID will be is not known yet."""
        if self._definitions is None:
            return True
        if caller.runs is not None and path.run_id not in caller.runs:
            # A link to another run's stream (an admin may add one): not there for it.
            return False
        key = caller.key(path.run_id, path.stream_id)
        try:
            definition = await self._definitions.get(key, touch=False, runs=None)
        except NotFound:
            return None  # not there (yet, or any more: a link may name it before it is made)
        except errors.DomainError:
            return True  # served elsewhere: the link reveals no stream's content or pins
        if caller.runs is not None and not await self._definitions.within(
            key, definition, caller.runs
        ):
            return False
        return definition.authorization.may_read(caller.principal)

    @tracing.use_case("delete subscription")
    async def delete(self, caller: Caller, subscription_id: str) -> None:
        caller.require("streams:admin")
        check_subscription_id(subscription_id)

        def decide(sub: Subscription | None, heads: Heads) -> tuple[Change | None, bool]:
            if sub is None or not visible_to(caller, sub):
                return None, False
            return Change(None), True

        if not await self._store.update(
            caller.tenant, subscription_id, decide, named_runs=caller.runs is not None
        ):
            raise SubscriptionNotFound(f"no subscription {subscription_id!r}")

    @tracing.use_case("add subscription streams")
    async def add_streams(
        self, caller: Caller, subscription_id: str, paths: tuple[StreamPath, ...]
    ) -> None:
        caller.require("streams:admin")
        check_subscription_id(subscription_id)
        for path in paths:
            caller.run(path.run_id)  # another run's stream is not there for a run-scoped token
        census: list[Census] = []  # the tenant's pull-wake subscriptions

        def decide(sub: Subscription | None, heads: Heads) -> tuple[Change | None, None]:
            sub = _visible(caller, sub, subscription_id)
            if sub.config.wake_stream is not None and sub.config.wake_stream in paths:
                raise errors.InvalidInput(WAKE_STREAM_WATCHED, field="streams")
            watchers = census[-1].watchers if census else []  # (none for a webhook)
            for watcher in watchers:
                if watcher.id == subscription_id:  # (a webhook writes no wake event)
                    more = watcher.streams | set(paths)
                    changed = msgspec.structs.replace(watcher, streams=more)
                    refuse_wake_cycles(
                        watchers, changed, named=caller.runs is None, field="streams"
                    )
            linked = sub.linked({p: heads.get(p, 0) for p in paths}, explicit=True)
            if linked.named() > MAX_EXPLICIT_STREAMS and linked.named() > sub.named():
                raise TooManyLinks(
                    f"a subscription names at most {MAX_EXPLICIT_STREAMS} streams; it names "
                    f"{sub.named()}: unlink some, or link them by a pattern",
                    named=sub.named(),
                    max_named=MAX_EXPLICIT_STREAMS,
                )
            return Change(linked), None

        await self._store.update(
            caller.tenant,
            subscription_id,
            decide,
            extra=paths,
            named_runs=caller.runs is not None,
            census=census.append,
            watchers=(),
            census_if_wakes=True,
        )

    @tracing.use_case("remove subscription stream")
    async def remove_stream(self, caller: Caller, subscription_id: str, path: StreamPath) -> None:
        caller.require("streams:admin")
        check_subscription_id(subscription_id)
        caller.run(path.run_id)  # another run's stream is not there for a run-scoped token

        def decide(sub: Subscription | None, heads: Heads) -> tuple[Change | None, None]:
            sub = _visible(caller, sub, subscription_id)
            return Change(sub.unlinked(path)), None

        await self._store.update(
            caller.tenant,
            subscription_id,
            decide,
            touching=(path,),
            named_runs=caller.runs is not None,
        )

    # -- delivery ---------------------------------------------------------------------------

    def wake_change(self, sub: Subscription, heads: Heads) -> Change:
        """A new wake for pending work, and what delivers it."""
        now = self._clock()
        woken = sub.issue_wake(heads)
        assert woken.wake is not None
        if sub.config.type == WEBHOOK:
            statuses = woken.wake_streams(heads)
            body: dict[str, Any] = {
                "subscription_id": sub.id,
                "wake_id": woken.wake.wake_id,
                "generation": woken.wake.generation,
                "streams": [wire_status(s) for s in statuses],
                "callback_url": f"{sub.base_url}/__ds/subscriptions/{sub.id}/callback",
                "callback_token": self._tokens.issue(woken, now),
            }
            if chained := [s.path.path for s in statuses if s.needs_chain]:
                body[CHAIN_KEY] = chained  # stated with the chain when sent, then left out
            payload = msgspec.json.encode(body)
            delivery = Delivery(
                sub.tenant,
                sub.id,
                woken.wake.generation,
                woken.wake.wake_id,
                WEBHOOK,
                payload,
                url=sub.config.webhook_url,
                created_by=sub.created_by,
                creator_runs=sub.creator_runs,
            )
        else:
            first = next((s.path.path for s in woken.wake_streams(heads) if s.pending), "")
            payload = msgspec.json.encode(
                {
                    "type": "wake",
                    "subscription_id": sub.id,
                    "stream": first,
                    "generation": woken.wake.generation,
                    "ts": int(now * 1000),
                }
            )
            delivery = Delivery(
                sub.tenant,
                sub.id,
                woken.wake.generation,
                woken.wake.wake_id,
                WAKE_EVENT,
                payload,
                wake_stream=sub.config.wake_stream,
                created_by=sub.created_by,
                creator_runs=sub.creator_runs,
            )
        return Change(woken, (delivery,))

    def tick(self, sub: Subscription | None, heads: Heads) -> tuple[Change | None, bool]:
        """The scheduler's decision for one subscription: end a lease that ran out, and wake
        pending work when idle."""
        if sub is None:
            return None, False
        now = self._clock()
        if sub.wake is not None and sub.wake.lease_until is not None and sub.wake.lease_until < now:
            sub = sub.finished()
            if not sub.has_pending(heads):
                return Change(sub), False
        if sub.wake is None and sub.has_pending(heads):
            return self.wake_change(sub, heads), True
        return (Change(sub) if sub.wake is None else None), False

    async def wake_due(
        self,
        limit: int = 100,
        at_once: int = 8,
        streams: Collection[StreamKey] | None = None,
    ) -> int:
        """Decide every due subscription (with `streams`: those pending on them, see
        `SubscriptionStore.due`), `at_once` side by side: each is its own row lock and
        transaction, and one after another they made a busy tick take most of a second
        (`python -m bench subscriptions`: commit to webhook p50 854 ms with 100 due at once).
        Returns how many were due."""
        due = await self._store.due(limit, streams)
        gate = asyncio.Semaphore(at_once)

        async def one(tenant: str, subscription_id: str) -> bool:
            async with gate:
                woke: bool = await self.decide_seeing(tenant, subscription_id, self.tick)
                return woke

        results = await asyncio.gather(*(one(t, s) for t, s in due), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("deciding a due subscription failed: %s", result)
        return len(due)

    def _fenced_wake(
        self, sub: Subscription | None, subscription_id: str, token: str, generation: int, wake: str
    ) -> Subscription:
        if sub is None:
            raise SubscriptionNotFound(f"no subscription {subscription_id!r}")
        claims = self._tokens.verify(token, sub.tenant, subscription_id, self._clock())
        if claims[2] != sub.generation or claims[3] != wake:
            raise Fenced(
                "the wake named is not the current one (it ended, or a later one replaced it)",
                generation=sub.generation,
            )
        sub.check_wake(generation, wake)
        return sub

    async def _claimer_runs(self, claims: Any) -> list[str] | None:
        """The runs the token that claimed the wake is restricted to (None: not restricted, or
        not a claim): a JWT's as the claim's token carries them, an API token's from its row.
        A claim's token is refused (401) once the API token that claimed the wake is revoked or
        has expired: its holder may no longer ack or extend the wake (the next claim takes it
        over when its lease runs out). Looked up at most once a second."""
        if len(claims) > 6:
            return list(claims[6])  # a JWT's runs
        if len(claims) < 6 or self._api_tokens is None:
            return None
        token_id = claims[5]
        if token_id.startswith(JWT_ID_PREFIX):
            # A JWT is no row of the store (none was found: every ack was 401); it cannot be
            # revoked here, and its claim holds until the wake ends, as its lease says.
            return None
        now = time.monotonic()
        known = self._claimers.get(token_id)
        if known is not None and known[0] > now:
            return known[1]
        record = await self._api_tokens.get(token_id)
        ended = record is None or record.revoked_at is not None
        if record is not None and record.expires_at is not None:
            ended = ended or record.expires_at <= datetime.now(UTC)
        if ended or record is None:
            self._claimers.pop(token_id, None)
            raise WakeTokenInvalid(
                "the token that claimed this wake was revoked or has expired: claim again"
            )
        if len(self._claimers) > READABLE_KEPT:
            self._claimers.clear()
        runs = record.caller.runs
        self._claimers[token_id] = (now + CLAIMER_SECONDS, None if runs is None else sorted(runs))
        return self._claimers[token_id][1]

    def wake_tenant(self, token: str, subscription_id: str) -> str:
        """The tenant a wake token of this subscription was signed for, checked before its
        callback's body is read (so the body is charged to that tenant, and one with no valid
        token is refused 401 before any of it is held)."""
        tenant: str = self._tokens.verify(token, None, subscription_id, self._clock())[0]
        return tenant

    @tracing.use_case("wake callback")
    async def callback(
        self,
        token: str,
        subscription_id: str,
        generation: int,
        wake_id: str,
        acks: list[AckRequest],
        done: bool,
        kind: str,
    ) -> bool:
        """A webhook callback (kind WEBHOOK) or a pull-wake ack (WAKE_EVENT): apply the acks,
        extend the lease, and on `done` end the wake (and wake again at once when work is
        pending). Answers whether it woke again."""
        claims = self._tokens.verify(token, None, subscription_id, self._clock())
        tenant = claims[0]
        # A claim by a token restricted to runs: the subscription is not there for it once it
        # names another run's stream (an admin linked one since the claim), as for its claim.
        runs = await self._claimer_runs(claims)

        def decide(sub: Subscription | None, heads: Heads) -> tuple[Change | None, bool]:
            if sub is not None and not _names_within(runs, sub):
                raise SubscriptionNotFound(f"no subscription {subscription_id!r}")
            if sub is not None:
                # Before the fence: a webhook's callback token sent to the pull-wake ack (or a
                # claim's to the callback) is told so, not that its wake is not the current one.
                _of_type(sub, kind)
            sub = self._fenced_wake(sub, subscription_id, token, generation, wake_id)
            sub = sub.acknowledged(
                [(a.stream, a.sequence) for a in acks], heads, [a.incarnation for a in acks]
            )
            if not done:
                return Change(sub.leased(self._clock() + sub.config.lease_ttl_ms / 1000)), False
            sub = sub.finished()
            if sub.has_pending(heads):
                return self.wake_change(sub, heads), True
            return Change(sub), False

        return await self.decide_seeing(
            tenant,
            subscription_id,
            decide,
            touching={a.stream for a in acks},
            named_runs=runs is not None,
        )

    @tracing.use_case("claim wake")
    async def claim(
        self, caller: Caller, subscription_id: str, worker: str
    ) -> tuple[Subscription, Heads, str]:
        if not 1 <= len(worker) <= MAX_WORKER:
            raise errors.InvalidInput(f"worker: 1-{MAX_WORKER} characters", field="worker")
        check_text("worker", worker)
        caller.require("streams:write")
        check_subscription_id(subscription_id)
        now = self._clock()

        def decide(
            sub: Subscription | None, heads: Heads
        ) -> tuple[Change | None, tuple[Subscription, Heads, str] | None]:
            sub = _visible(caller, sub, subscription_id)
            _of_type(sub, WAKE_EVENT)
            wake = sub.wake
            held = wake is not None and wake.holder is not None
            if held and wake is not None and (wake.lease_until or 0) >= now:
                raise AlreadyClaimed(
                    "another worker holds this subscription",
                    current_holder=wake.holder,
                    generation=sub.generation,
                )
            deliveries: tuple[Delivery, ...] = ()
            ended = False
            if held:  # its lease ran out: the claim is taken over with a new wake
                sub = sub.finished()
            elif wake is not None and not sub.of_wake().links:
                # Every stream the unclaimed wake named was deleted since: nothing of it is
                # left to claim (a claim of it answered no streams, and held up the next wake
                # until a worker ended it).
                sub, ended = sub.finished(), True
            if sub.wake is None:
                if not sub.has_pending(heads):
                    if ended:  # stored, so that the next records wake anew; then 409
                        return Change(sub), None
                    raise NoPendingWork("the subscription has no pending work")
                change = self.wake_change(sub, heads)
                assert change.subscription is not None
                sub, deliveries = change.subscription, change.deliveries
            sub = sub.leased(now + sub.config.lease_ttl_ms / 1000, holder=worker)
            # A JWT's runs go in the claim's token (a JWT has no row to read them from; they
            # came in one of at most 8 KiB); an API token's are read from its row.
            jwt = caller.token_id is not None and caller.token_id.startswith(JWT_ID_PREFIX)
            token = self._tokens.issue(sub, now, caller.token_id, caller.runs if jwt else None)
            return Change(sub, deliveries), (sub, heads, token)

        claimed = await self.decide_seeing(
            caller.tenant, subscription_id, decide, named_runs=caller.runs is not None
        )
        if claimed is None:
            raise NoPendingWork("the subscription has no pending work")
        sub, heads, token = claimed
        # The wake's streams (its snapshot, as they are now), as the worker may see them, of
        # those its creator may read (the subscription's streams): a stream the creator may not
        # read is acknowledged as it grows, so a worker's ack of it would be refused as going
        # back, with the acks beside it.
        sub = sub.of_wake()
        shown = await self._shown(caller, sub)
        kept = {
            k.path: k
            for k in shown.links
            if await self._creator_may_read(sub.tenant, sub.created_by, sub.creator_runs, k.path)
        }
        if len(kept) != len(shown.links):
            shown = shown.with_links(kept)
        return shown, heads, token

    @tracing.use_case("release wake")
    async def release(
        self, token: str, subscription_id: str, generation: int, wake_id: str
    ) -> None:
        tenant = self._tokens.verify(token, None, subscription_id, self._clock())[0]

        def decide(sub: Subscription | None, heads: Heads) -> tuple[Change | None, None]:
            sub = self._fenced_wake(sub, subscription_id, token, generation, wake_id)
            _of_type(sub, WAKE_EVENT)
            sub = sub.finished()
            return (self.wake_change(sub, heads) if sub.has_pending(heads) else Change(sub)), None

        await self.decide_seeing(tenant, subscription_id, decide)

    async def of_stream(
        self, caller: Caller, run_id: str, stream_id: str
    ) -> list[tuple[Subscription, Heads]]:
        """The subscriptions linking a stream the caller may read (404 otherwise), each with
        that stream's link alone: the listing of one stream reveals no other. A run-restricted
        caller sees only those `get` would show it (everything they name in its runs: a wake
        stream or a pattern names a run too), and a webhook's address as `get` shows it."""
        caller.require("streams:read")
        key = caller.key(run_id, stream_id)
        if self._definitions is not None:
            definition = await self._definitions.get(key, touch=False, runs=caller.runs)
            require_reader(caller, definition)
        path = StreamPath(run_id, stream_id)
        return [
            (
                _configured(caller, sub).with_links(
                    {k.path: k for k in sub.links if k.path == path}
                ),
                heads,
            )
            for sub, heads in await self._store.of_stream(key, named_runs=caller.runs is not None)
            if visible_to(caller, sub)
        ]


# The wake scheduler's retries while the database is out of reach.
RETRY_FIRST_SECONDS = 0.05
RETRY_MAX_SECONDS = 5.0


class WakeScheduler:
    """Runs `Subscriptions.wake_due` whenever a stream is notified (in this process, or by the
    wake bus from any), for the subscriptions pending on the streams notified, and at least
    every `poll_seconds` for those whose lease ran out: a tick runs at a time, and the
    notifications heard meanwhile make one more. Every `sweep_seconds` a tick looks at every
    subscription, for what no notification said (one lost while the wake bus reconnected).

    A tick that looked at every subscription at every notification (each append anywhere)
    and every 0.05 s cost PostgreSQL 27 ms a tick with 100,000 subscriptions of one link each,
    back to back under appends (docs/architecture.md, "Subscriptions")."""

    name = "wake-scheduler"

    def __init__(
        self,
        subscriptions: Subscriptions,
        wake: WakeRegistry,
        poll_seconds: float,
        sweep_seconds: float = SWEEP_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._subscriptions = subscriptions
        self._poll = poll_seconds
        self._sweep = sweep_seconds
        self._clock = clock
        self._heard = asyncio.Event()
        self._notified: set[StreamKey] = set()
        wake.on_notified(self._on_notified)
        self.ticks = 0
        self.sweeps = 0

    def _on_notified(self, key: StreamKey) -> None:
        self._notified.add(key)
        self._heard.set()

    async def run(self, stopping: asyncio.Event) -> None:
        outage = Outage(self.name, OUTAGE_LOG_SECONDS, doing="decide wakes")
        failures = 0
        swept_at: float | None = None
        sweep_failed = False
        while not stopping.is_set():
            self._heard.clear()
            streams, self._notified = self._notified, set()
            sweep = swept_at is None or self._clock() - swept_at >= self._sweep
            if sweep and sweep_failed and streams:
                # A sweep that failed (past its bound, say) is tried again after the streams
                # announced meanwhile are decided: failing at every tick, it held up every
                # announced wake, of every tenant, for as long as it failed.
                sweep = False
            try:
                limit = 100
                found = await self._subscriptions.wake_due(
                    limit, streams=None if sweep else streams
                )
                self.sweeps += sweep
                if found >= limit:  # more may be due than one tick takes: all, next tick
                    swept_at = None
                elif sweep:
                    swept_at = self._clock()
            except Exception as error:  # the database is out of reach: retried, backing off
                self._notified |= streams  # nothing was decided for them
                swept_at = None  # and what was said meanwhile may not have been heard
                sweep_failed = sweep
                outage.failed(error)
                failures += 1
                self.ticks += 1
                # Not at the next notification: while PostgreSQL is away the wake bus polls
                # every 0.25 s, and each tick would try (and log) again.
                pause = backoff(failures, base=RETRY_FIRST_SECONDS / 2, cap=RETRY_MAX_SECONDS)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), pause)
                continue
            sweep_failed = False
            if failures:
                outage.recovered()
                failures = 0
            self.ticks += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heard.wait(), self._poll)


def _of_type(sub: Subscription, kind: str) -> None:
    want = "webhook" if kind == WEBHOOK else "pull-wake"
    if sub.config.type != want:
        raise WrongSubscriptionType(f"subscription {sub.id!r} is not {want}")


def wire_status(status: StreamStatus, minting: Minting | None = None) -> dict[str, Any]:
    """A stream's part of a wake or a claim, its offsets stated (domain/offsets.py).

    `minting`: the stream's, with its chain, where the caller read it (a claim), used when it
    is of the stream the decision saw; otherwise the stream's own incarnation as the decision
    read it with the link (a webhook's payload is written within the decision): a fork's
    inherited positions then carry the fork's own incarnation, which a read of the fork takes
    as readily as its source's."""
    return {
        "path": status.path.path,
        "link_type": status.link_type,
        "acked_offset": offset_of(status, status.acked, minting),
        "tail_offset": offset_of(status, status.tail, minting),
        "has_pending": status.pending,
    }


def offset_of(status: StreamStatus, sequence: int, minting: Minting | None) -> str:
    if minting is not None and (not status.incarnation or minting.own == status.incarnation):
        return minting.text(sequence)
    return spelled(status.incarnation, sequence)


# -- the delivering worker -------------------------------------------------------------------


class WebhookAnswer(msgspec.Struct, frozen=True):
    status: int
    body: bytes


class WebhookFailed(Exception):
    def __init__(self, detail: str, retry_in: float) -> None:
        super().__init__(detail)
        self.retry_in = retry_in


class WebhookSender(Protocol):
    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> WebhookAnswer:
        """POST with the URL's rules checked against the address connected to (raises
        WebhookUrlRejected, or OSError/TimeoutError for what did not get through)."""


class WebhookSigner(Protocol):
    async def signature(self, body: bytes, now: float) -> str:
        """The `Webhook-Signature` header for `body` at `now`."""


class AppendWake(Protocol):
    async def __call__(
        self,
        caller: Caller,
        run_id: str,
        stream_id: str,
        inputs: list[RecordInput],
        idempotency_key: str | None = None,
    ) -> object: ...


class _Done(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    done: bool = False


class DeliverWakes:
    """The worker's job: hand one outbox row over. A webhook that answers 2xx is delivered;
    `{"done": true}` in its answer acknowledges the wake's snapshot and ends it. Anything else
    is retried (1 s to 60 s, 20% jitter) under the same generation, the subscription showing
    `failed` meanwhile. A pull-wake event is appended to the wake stream with the wake as its
    idempotency key, so a retry after a lost answer appends nothing twice."""

    def __init__(
        self,
        store: SubscriptionStore,
        subscriptions: Subscriptions,
        sender: WebhookSender,
        signer: WebhookSigner,
        append: AppendWake,
        retry_unit_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._subscriptions = subscriptions
        self._sender = sender
        self._signer = signer
        self._append = append
        self._unit = retry_unit_seconds
        self._clock = clock
        self.attempts = 0
        self.failures = 0

    async def run_job(self, job: Job) -> float | None:
        delivery = await self._store.delivery(job)
        if delivery is None:
            return None
        # (Not `get`: a pattern's every link, read for each delivery, was half the process's
        # CPU beside a subscription of 20,000 links.)
        current = await self._store.wake_id(delivery.tenant, delivery.subscription_id)
        if current != delivery.wake_id:
            return None  # deleted, or this wake ended (a later one carries the work)
        if delivery.kind == WAKE_EVENT:
            await self._wake_event(delivery, job)
            return None
        payload = await self._subscriptions.as_its_creator_sees(delivery)
        ensure_claimed()
        self.attempts += 1
        assert delivery.url is not None
        try:
            headers = {
                "content-type": "application/json",
                "webhook-signature": await self._signer.signature(payload, self._clock()),
            }
            answer = await self._sender.post(delivery.url, payload, headers)
        except (OSError, TimeoutError, errors.DomainError) as error:
            self.failures += 1
            # A timeout says nothing of itself ("TimeoutError: ").
            said = str(error) or "no answer within the webhook timeout"
            raise WebhookFailed(
                f"{type(error).__name__}: {said}", retry_seconds(job.attempts + 1, self._unit)
            ) from None
        if not 200 <= answer.status < 300:
            self.failures += 1
            raise WebhookFailed(
                f"the webhook answered {answer.status}", retry_seconds(job.attempts + 1, self._unit)
            )
        try:
            done = msgspec.json.decode(answer.body, type=_Done).done if answer.body else False
        except (msgspec.DecodeError, msgspec.ValidationError):
            done = False
        await self._delivered(delivery, done)
        return None

    async def _delivered(self, delivery: Delivery, done: bool) -> None:
        now = self._clock()

        def decide(sub: Subscription | None, heads: Heads) -> tuple[Change | None, None]:
            if sub is None or sub.wake is None or sub.wake.wake_id != delivery.wake_id:
                return None, None
            wake = sub.wake
            sub = msgspec.structs.replace(sub, failing=False)
            if not done:  # the receiver calls back: its lease starts now
                return Change(sub.leased(now + sub.config.lease_ttl_ms / 1000)), None
            # What the wake named, for each stream still linked and not behind its tail then;
            # a stream now behind it was erased and created again meanwhile: the receiver saw
            # none of the new one's records, whose cursor stays.
            # (The links by path, once: a look-up of each in turn cost a wake of 10,000 streams
            # seconds of the process's CPU, every other request waiting.)
            # A stream the wake named that was deleted and created again since is another, even
            # when the new one has grown past the tail: its records were never shown.
            acked = {link.path: link.acked for link in sub.links}
            same = wake.tails_of_the_same_streams(sub.links)
            sub = sub.acknowledged(
                [(p, t) for p, t in same if p in acked and acked[p] <= t <= heads.get(p, 0)],
                heads,
            ).finished()
            return (
                self._subscriptions.wake_change(sub, heads)
                if sub.has_pending(heads)
                else Change(sub)
            ), None

        await self._subscriptions.decide_seeing(delivery.tenant, delivery.subscription_id, decide)

    async def _wake_event(self, delivery: Delivery, job: Job) -> None:
        assert delivery.wake_stream is not None
        # Written as its creator would write it: a wake stream the creator's runs leave out (a
        # fork of another run's stream) is not there, and the attempt fails as for none.
        caller = creator_caller(
            delivery.tenant, delivery.created_by, delivery.creator_runs, "streams:write"
        )
        record = RecordInput(data=msgspec.Raw(delivery.payload))
        ensure_claimed()
        try:
            await self._append(
                caller,
                delivery.wake_stream.run_id,
                delivery.wake_stream.stream_id,
                [record],
                f"ds-wake:{delivery.subscription_id}:{delivery.wake_id}",
            )
        except (NotFound, errors.DomainError) as error:
            raise WebhookFailed(
                f"the wake stream {delivery.wake_stream.path!r}: {error}",
                retry_seconds(job.attempts + 1, self._unit),
            ) from None


def job_key(tenant: str, subscription_id: str) -> StreamKey:
    return StreamKey(tenant, JOB_RUN, subscription_id)
