"""Subscriptions (PROTOCOL.md sections 6 and 7): durable cursors over a set of streams that wake
a consumer (a webhook, or a pull-wake stream) when any of them has records past its cursor.

Pure rules only: the configuration and its hash (re-confirming a subscription compares it),
the glob over stream paths, the wake's fencing (`generation` and `wake_id`), the lease bounds,
and the URL rules that need no network (the address rules are in `domain.webhook_urls`)."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Collection, Iterable
from typing import Literal, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

import msgspec

from domain.errors import DomainError, InvalidInput
from domain.ids import ID_PATTERN
from domain.text import check_text

SubscriptionType = Literal["webhook", "pull-wake"]
LinkType = Literal["glob", "explicit"]

DEFAULT_LEASE_TTL_MS = 30_000
MIN_LEASE_TTL_MS = 1_000
MAX_LEASE_TTL_MS = 600_000
MAX_EXPLICIT_STREAMS = 1_000
# The most streams one wake names: a decision reads the links with pending work up to this
# many (and those it acknowledges), never all of them; the rest are woken by the next wakes.
WAKE_STREAMS = 1_000
MAX_DESCRIPTION = 1_000
MAX_URL = 2_048
MAX_WORKER = 256  # a pull-wake worker's name
# Webhook retries: exponential from 1 s to 60 s, 20% jitter either way (section 7.1).
RETRY_BASE_SECONDS = 1.0
RETRY_CAP_SECONDS = 60.0
RETRY_JITTER = 0.2

_SUBSCRIPTION_ID = re.compile(ID_PATTERN)
_SEGMENT = ID_PATTERN.removeprefix("^").removesuffix("$")
_PATH = re.compile(rf"(?:({_SEGMENT})/)?({_SEGMENT})")
_PATTERN_SEGMENT = re.compile(r"\*\*|[A-Za-z0-9._:*-]{1,128}")


class SubscriptionConflict(DomainError):
    code = "subscription-conflict"


class SubscriptionNotFound(DomainError):
    code = "subscription-not-found"


class Fenced(DomainError):
    code = "fenced"


class AlreadyClaimed(DomainError):
    code = "already-claimed"


class NoPendingWork(DomainError):
    code = "no-pending-work"


class InvalidOffset(DomainError):
    code = "invalid-offset"


class WrongSubscriptionType(DomainError):
    code = "wrong-subscription-type"


class WakeTokenInvalid(DomainError):
    code = "wake-token-invalid"


class TooManyLinks(DomainError):
    """Linking would name more streams than a subscription may name (MAX_EXPLICIT_STREAMS):
    `get` shows every link, and the wake scheduler passes over them every 30 s."""

    code = "too-many-links"


class WebhookUrlRejected(DomainError):
    code = "webhook-url-rejected"


class StreamPath(msgspec.Struct, frozen=True, order=True):
    """A stream-root-relative path: `stream` (run `default`) or `run/stream`."""

    run_id: str
    stream_id: str

    @property
    def path(self) -> str:
        return self.stream_id if self.run_id == DEFAULT_RUN else f"{self.run_id}/{self.stream_id}"


DEFAULT_RUN = "default"


def parse_path(value: str, field: str = "streams") -> StreamPath:
    match = _PATH.fullmatch(value.strip("/")) if isinstance(value, str) else None
    if match is None:
        raise InvalidInput(
            f"{field}: {str(value)[:140]!r} is not a stream path (`stream` or `run/stream`, "
            f"each part matching {ID_PATTERN})",
            field=field,
        )
    run_id, stream_id = match.groups()
    return StreamPath(run_id or DEFAULT_RUN, stream_id)


def check_subscription_id(value: str) -> str:
    if not _SUBSCRIPTION_ID.fullmatch(value):
        raise InvalidInput(
            f"subscription id {value[:140]!r} must match {ID_PATTERN}", field="subscription_id"
        )
    return value


def check_pattern(pattern: str) -> str:
    """`*` matches one path segment, `**` zero or more; at most two segments are ever matched
    (a stream path is `stream` or `run/stream`), so a pattern has at most a few segments."""
    segments = pattern.strip("/").split("/")
    if not pattern or len(pattern) > 512 or len(segments) > 8:
        raise InvalidInput(
            "pattern must be 1-512 characters in at most 8 segments", field="pattern"
        )
    for segment in segments:
        if not _PATTERN_SEGMENT.fullmatch(segment) or ("**" in segment and segment != "**"):
            raise InvalidInput(
                f"pattern segment {segment[:140]!r}: letters, digits, `._:-`, `*` within a "
                "segment, or `**` alone",
                field="pattern",
            )
    return "/".join(segments)


def pattern_regex(pattern: str) -> str:
    """The POSIX regular expression (PostgreSQL `~`, Python `re`) a canonical path must fully
    match. `**` is zero or more whole segments."""
    out = ""
    segments = pattern.split("/")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            out += ".*" if last else "([^/]+/)*"
            continue
        out += "".join("[^/]*" if ch == "*" else re.escape(ch) for ch in segment)
        if not last:
            out += "/"
    return "^" + out + "$"


def matches(pattern: str, path: StreamPath) -> bool:
    """Whether the glob matches the stream, under either of its names (`s` and `default/s`
    are the same stream): what `pattern_regex` says in PostgreSQL, decided here without a
    backtracking regular expression. Python's `re` took seconds of the event loop for a glob
    such as `*d*e*f*a*u*l*t*` against a long ID it fails to match."""
    segments = pattern.split("/")
    full = [path.run_id, path.stream_id]
    return _segments_match(segments, path.path.split("/")) or _segments_match(segments, full)


def _segments_match(pattern: list[str], path: list[str]) -> bool:
    """`**` is zero or more whole segments (a trailing one also matches what follows as one
    text, `.*`); any other pattern segment matches exactly one segment. Paths have one or two
    segments and patterns at most eight, so the table below is tiny."""
    # reachable[j]: the first i pattern segments can match the first j path segments.
    reachable = [True] + [False] * len(path)
    for index, glob in enumerate(pattern):
        if glob == "**":
            last = index == len(pattern) - 1
            if last:  # `/.*` after what matched so far (`.*` alone): one or more segments
                return any(reachable[: len(path)])
            for j in range(1, len(path) + 1):
                reachable[j] = reachable[j] or reachable[j - 1]
            continue
        reachable = [False] + [
            reachable[j] and _glob_match(glob, path[j]) for j in range(len(path))
        ]
    return reachable[len(path)]


def _glob_match(glob: str, text: str) -> bool:
    """`*` (any run of characters within a segment) against one segment, in time bounded by
    the product of their lengths: the greedy match, going back only to the last `*`."""
    g = t = 0
    star = mark = -1
    while t < len(text):
        if g < len(glob) and glob[g] != "*" and glob[g] == text[t]:
            g += 1
            t += 1
        elif g < len(glob) and glob[g] == "*":
            star, mark = g, t
            g += 1
        elif star >= 0:
            mark += 1
            g, t = star + 1, mark
        else:
            return False
    while g < len(glob) and glob[g] == "*":
        g += 1
    return g == len(glob)


class WebhookConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    url: str


class SubscriptionConfig(msgspec.Struct, frozen=True):
    """What a PUT configures, normalized: its hash decides 200 (same) or 409 (different)."""

    type: SubscriptionType
    pattern: str | None
    streams: tuple[StreamPath, ...]
    webhook_url: str | None
    wake_stream: StreamPath | None
    lease_ttl_ms: int
    description: str | None

    def digest(self) -> bytes:
        return hashlib.sha256(msgspec.json.encode(self)).digest()


class SubscriptionRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    type: str
    pattern: str | None = None
    streams: list[str] | None = None
    webhook: WebhookConfig | None = None
    wake_stream: str | None = None
    lease_ttl_ms: int | None = None
    description: str | None = None


WAKE_STREAM_WATCHED = (
    "the wake stream is one the subscription watches (its pattern or streams name it): each "
    "wake event written to it would wake the subscription again; give it a path they leave out"
)


class Watcher(msgspec.Struct, frozen=True):
    """A pull-wake subscription as the others see it: the wake stream its wake events are
    written to, and what it watches (its pattern, and the streams it names)."""

    id: str
    wake_stream: StreamPath
    pattern: str | None
    streams: frozenset[StreamPath]

    @classmethod
    def of(
        cls, sub_id: str, config: SubscriptionConfig, named: Iterable[StreamPath] | None = None
    ) -> Watcher | None:
        """`sub_id` with `config` as a watcher; None: not a pull-wake subscription. `named`: the
        streams it links by name now (a stored subscription's: an unlink, or its stream's
        erasure, takes one out of them, not out of its configuration); None: those `config`
        names (one being made)."""
        if config.wake_stream is None:
            return None
        streams = frozenset(config.streams if named is None else named)
        return cls(sub_id, config.wake_stream, config.pattern, streams)

    def watches(self, path: StreamPath) -> bool:
        return path in self.streams or (self.pattern is not None and matches(self.pattern, path))


# The most pattern matches a ring search makes (about 10 µs each): a tenant's administrator
# could make thousands of pull-wake subscriptions whose search would hold the event loop.
RING_CHECKS = 20_000


def wake_cycle(watchers: Collection[Watcher], start: str) -> list[str] | None:
    """The pull-wake subscriptions, `start` first, each of which watches the wake stream of the
    one before it and `start` that of the last: a wake event of `start` wakes the next, whose
    wake event wakes the one after, and round to `start` again, without end. None: no such
    ring through `start`. InvalidInput past RING_CHECKS pattern matches."""
    by_id = {w.id: w for w in watchers}
    if start not in by_id:
        return None
    ordered = sorted(watchers, key=lambda w: w.id)
    naming: dict[StreamPath, dict[str, Watcher]] = {}
    for watcher in ordered:
        for named in watcher.streams:
            naming.setdefault(named, {})[watcher.id] = watcher
    globbing = [w for w in ordered if w.pattern is not None]
    woken: dict[StreamPath, list[Watcher]] = {}  # by wake stream: who its events wake
    budget = RING_CHECKS

    def wakes(watcher: Watcher) -> list[Watcher]:
        nonlocal budget
        stream = watcher.wake_stream
        found = woken.get(stream)
        if found is None:
            by = dict(naming.get(stream, {}))
            unnamed = [other for other in globbing if other.id not in by]
            budget -= len(unnamed)  # the matches it makes
            if budget < 0:
                raise InvalidInput(
                    "the tenant's pull-wake subscriptions watch each other's wake streams in "
                    "too many ways for this change to be checked against waking each other "
                    "without end (they may not): watch fewer wake streams, or use fewer "
                    "pull-wake subscriptions with patterns",
                    field="wake_stream",
                )
            for other in unnamed:
                if other.pattern and matches(other.pattern, stream):
                    by[other.id] = other
            found = woken[stream] = [by[i] for i in sorted(by)]
        return found

    # Depth first; a subscription seen once is not gone through again (a ring through it
    # would have been found the first time).
    seen = {start}
    ring = [start]
    nexts = [iter(wakes(by_id[start]))]
    while nexts:
        for watcher in nexts[-1]:
            if watcher.id == start:
                return ring
            if watcher.id not in seen:
                seen.add(watcher.id)
                ring.append(watcher.id)
                nexts.append(iter(wakes(watcher)))
                break
        else:
            nexts.pop()
            ring.pop()
    return None


def refuse_wake_cycles(
    watchers: Collection[Watcher], changed: Watcher, named: bool, field: str = "wake_stream"
) -> None:
    """InvalidInput (400) if `changed`, as it would be among the others, were in a ring of
    pull-wake subscriptions waking each other (`wake_cycle`); `named`: the answer names the
    others (not to a caller who may not see them all)."""
    others = [w for w in watchers if w.id != changed.id]
    ring = wake_cycle([*others, changed], changed.id)
    if ring is None:
        return
    if named:
        names = " → ".join(repr(i) for i in [*ring, changed.id])
        which = f"each of {names} watches the wake stream of the one before it"
    else:
        which = (
            f"it and {len(ring) - 1} other pull-wake subscription(s) of the tenant each watch "
            "the wake stream of another"
        )
    raise InvalidInput(
        f"pull-wake subscriptions would wake each other without end: {which}, so each wake "
        "event written wakes the next; watch paths that leave their wake streams out",
        field=field,
    )


def configure(request: SubscriptionRequest, allow_no_streams: bool = False) -> SubscriptionConfig:
    """The normalized configuration, or InvalidInput. The protocol needs a pattern or streams;
    the native API lets a subscription start with neither (`allow_no_streams`)."""
    if request.type not in ("webhook", "pull-wake"):
        raise InvalidInput("type must be `webhook` or `pull-wake`", field="type")
    pattern = check_pattern(request.pattern) if request.pattern is not None else None
    if request.streams is not None and len(request.streams) > MAX_EXPLICIT_STREAMS:
        raise InvalidInput(f"at most {MAX_EXPLICIT_STREAMS} streams", field="streams")
    streams = tuple(sorted({parse_path(s) for s in request.streams or ()}))
    if pattern is None and not streams and not allow_no_streams:
        raise InvalidInput("give a pattern, streams, or both", field="pattern")
    ttl = DEFAULT_LEASE_TTL_MS if request.lease_ttl_ms is None else request.lease_ttl_ms
    if not MIN_LEASE_TTL_MS <= ttl <= MAX_LEASE_TTL_MS:
        raise InvalidInput(
            f"lease_ttl_ms must be {MIN_LEASE_TTL_MS}-{MAX_LEASE_TTL_MS}", field="lease_ttl_ms"
        )
    if request.description is not None:
        if len(request.description) > MAX_DESCRIPTION:
            raise InvalidInput(
                f"description: at most {MAX_DESCRIPTION} characters", field="description"
            )
        check_text("description", request.description)
    url: str | None = None
    wake: StreamPath | None = None
    if request.webhook is not None and len(request.webhook.url) > MAX_URL:
        raise InvalidInput(f"webhook.url: at most {MAX_URL} characters", field="webhook")
    if request.type == "webhook":
        if request.webhook is None:
            raise InvalidInput("a webhook subscription needs webhook.url", field="webhook")
        url = request.webhook.url
    else:
        if request.wake_stream is None:
            raise InvalidInput("a pull-wake subscription needs wake_stream", field="wake_stream")
        wake = parse_path(request.wake_stream, "wake_stream")
        if wake in streams or (pattern is not None and matches(pattern, wake)):
            raise InvalidInput(WAKE_STREAM_WATCHED, field="wake_stream")
    return SubscriptionConfig(
        type=request.type,  # type: ignore[arg-type]  # checked above
        pattern=pattern,
        streams=streams,
        webhook_url=url,
        wake_stream=wake,
        lease_ttl_ms=ttl,
        description=request.description,
    )


def new_wake_id() -> str:
    return "w_" + secrets.token_hex(12)


def retry_seconds(attempts: int, unit: float) -> float:
    """The wait before retry number `attempts` (1 for the first): 1, 2, 4 ... 60 seconds (times
    `unit`, 1 in production), each within 20% either way."""
    base = min(RETRY_CAP_SECONDS, RETRY_BASE_SECONDS * 2 ** max(0, min(attempts - 1, 10)))
    return float(base * unit * (1 + RETRY_JITTER * (2 * secrets.randbelow(1001) / 1000 - 1)))


class Link(msgspec.Struct, frozen=True):
    """One stream of a subscription: how it is linked and its cursor (the last sequence
    processed, inclusive; 0 before the first record)."""

    path: StreamPath
    explicit: bool
    glob: bool
    acked: int
    # The linked stream's incarnation (domain/offsets.py), as the store read it with the link;
    # 0: not known. Not stored: a link lives only as long as its stream.
    incarnation: int = 0
    # Where the stream is a fork, its fork point: its positions up to it are its sources' (their
    # offsets state their incarnations, domain/offsets.py); -1: no fork (or not known).
    inherited: int = -1

    @property
    def link_type(self) -> LinkType:
        return "explicit" if self.explicit else "glob"


class StreamStatus(msgspec.Struct, frozen=True):
    path: StreamPath
    link_type: LinkType
    acked: int
    tail: int
    incarnation: int = 0  # the stream's (Link.incarnation)
    inherited: int = -1  # Link.inherited

    @property
    def needs_chain(self) -> bool:
        """Whether its offsets need the stream's chain to be stated as a read states them: its
        incarnation is not known, or a position it shows is inherited from a source."""
        return not self.incarnation or min(self.acked, self.tail) <= self.inherited

    @property
    def pending(self) -> bool:
        return self.tail > self.acked


class Wake(msgspec.Struct, frozen=True):
    """The wake in flight: fenced by (generation, wake_id); `tails` is its snapshot, what a
    synchronous `done` acknowledges."""

    generation: int
    wake_id: str
    tails: tuple[tuple[StreamPath, int], ...]
    holder: str | None = None
    lease_until: float | None = None  # Unix seconds; None: not leased yet (being delivered)
    # The incarnations of the streams `tails` names, where known when it was issued: a stream
    # deleted and created again since is another, which the wake's `done` does not acknowledge.
    incarnations: tuple[tuple[StreamPath, int], ...] = ()

    def tails_of_the_same_streams(self, links: Iterable[Link]) -> list[tuple[StreamPath, int]]:
        """`tails` without the streams deleted and created again since it was issued (whose
        link's incarnation is not the one the wake named)."""
        then = dict(self.incarnations)
        now = {link.path: link.incarnation for link in links}
        return [
            (path, tail)
            for path, tail in self.tails
            if not (then.get(path) and now.get(path) and then[path] != now[path])
        ]


class Subscription(msgspec.Struct, frozen=True):
    tenant: str
    id: str
    config: SubscriptionConfig
    created_at: float  # Unix seconds
    created_by: str
    base_url: str
    generation: int = 0
    wake: Wake | None = None
    failing: bool = False  # the last webhook attempt failed and a retry is scheduled
    links: tuple[Link, ...] = ()
    # While failing: why the last attempt failed (a webhook's answer or error, a wake stream's
    # refusal), for whoever configures subscriptions. Kept beside the state, like `failing`.
    last_error: str | None = None
    # The runs its creator's token was restricted to (sorted; None: not restricted). Its wakes
    # show and write streams as its creator sees them: a fork whose source chain leaves these
    # runs is not there for it.
    creator_runs: tuple[str, ...] | None = None
    # The last stream the last wake named: the next wake names pending streams after it first,
    # so that with more than WAKE_STREAMS pending, each is named in its turn.
    woken_up_to: StreamPath | None = None
    # A decision sees some of the links (`links`: those with pending work, up to WAKE_STREAMS,
    # the current wake's and those the decision names); this many streams it names explicitly
    # are among the others. What a decision leaves out of `links` it leaves as it is.
    named_elsewhere: int = 0
    # The runs of the streams it names explicitly (sorted), where the store read them for a
    # caller restricted to runs (`SubscriptionStore.update(named_runs=True)`, `get`,
    # `of_stream(named_runs=True)`); None: not read. Links made since its configuration
    # (`POST .../streams`) are among them, and a decision does not see all its links.
    named_runs: tuple[str, ...] | None = None

    @property
    def status(self) -> str:
        return "failed" if self.failing else "active"

    def link(self, path: StreamPath) -> Link | None:
        for link in self.links:
            if link.path == path:
                return link
        return None

    def streams(self, heads: dict[StreamPath, int]) -> list[StreamStatus]:
        return [
            StreamStatus(
                link.path,
                link.link_type,
                link.acked,
                max(heads.get(link.path, 0), 0),
                link.incarnation,
                link.inherited,
            )
            for link in self.links
        ]

    def has_pending(self, heads: dict[StreamPath, int]) -> bool:
        return any(max(heads.get(link.path, 0), 0) > link.acked for link in self.links)

    def of_wake(self) -> Subscription:
        """This subscription with the links of its current wake's snapshot alone."""
        named = {path for path, _ in self.wake.tails} if self.wake else set()
        return self.with_links({k.path: k for k in self.links if k.path in named})

    def wake_streams(self, heads: dict[StreamPath, int]) -> list[StreamStatus]:
        """The streams the current wake names (its snapshot), as they are now."""
        return self.of_wake().streams(heads)

    def with_links(self, links: dict[StreamPath, Link]) -> Subscription:
        return msgspec.structs.replace(self, links=tuple(sorted(links.values(), key=_by_path)))

    def with_webhook_address(self) -> Subscription:
        """This subscription with its webhook URL cut to the receiver's origin (scheme, host,
        port): a URL's user information, path (`/services/T…/B…/secret`), query and fragment
        often hold the receiver's credential, and are shown only to those who may configure
        subscriptions."""
        url = self.config.webhook_url
        if url is None:
            return self
        address = webhook_address(url)
        if address == url:
            return self
        config = msgspec.structs.replace(self.config, webhook_url=address)
        return msgspec.structs.replace(self, config=config)

    def linked(self, paths: dict[StreamPath, int], *, explicit: bool) -> Subscription:
        """Links `paths` (explicitly or by the glob), new ones at the given cursor."""
        links = {link.path: link for link in self.links}
        for path, acked in paths.items():
            old = links.get(path)
            if old is None:
                links[path] = Link(path, explicit=explicit, glob=not explicit, acked=acked)
            elif explicit:
                links[path] = msgspec.structs.replace(old, explicit=True)
            else:
                links[path] = msgspec.structs.replace(old, glob=True)
        return self.with_links(links)

    def named(self) -> int:
        """How many streams it names (links them explicitly)."""
        return self.named_elsewhere + sum(1 for link in self.links if link.explicit)

    def unlinked(self, path: StreamPath) -> Subscription:
        """Removes the explicit link only: a glob link stays while the pattern matches."""
        links = {link.path: link for link in self.links}
        old = links.get(path)
        if old is None or not old.explicit:
            return self
        if old.glob:
            links[path] = msgspec.structs.replace(old, explicit=False)
        else:
            del links[path]
        return self.with_links(links)

    def issue_wake(self, heads: dict[StreamPath, int], limit: int = WAKE_STREAMS) -> Subscription:
        """A new wake naming the streams with pending work, up to `limit` of them, after the
        last one the last wake named first."""
        after = self.woken_up_to
        named = in_turn([s for s in self.streams(heads) if s.pending], after)[:limit]
        tails = tuple(sorted((s.path, s.tail) for s in named))
        born = tuple(sorted((s.path, s.incarnation) for s in named if s.incarnation))
        generation = self.generation + 1
        return msgspec.structs.replace(
            self,
            generation=generation,
            wake=Wake(generation, new_wake_id(), tails, incarnations=born),
            woken_up_to=named[-1].path if named else after,
        )

    def check_wake(self, generation: int, wake_id: str) -> Wake:
        """The wake a callback, ack or release names, or Fenced."""
        wake = self.wake
        if wake is None or wake.generation != generation or wake.wake_id != wake_id:
            raise Fenced(
                "the wake named is not the current one (it ended, or a later one replaced it)",
                generation=self.generation,
            )
        return wake

    def acknowledged(
        self,
        acks: list[tuple[StreamPath, int]],
        heads: dict[StreamPath, int],
        incarnations: list[int] | None = None,
    ) -> Subscription:
        """Cursors moved to `acks` (last processed, inclusive): never back, never past the
        tail, only on linked streams, only of the stream linked (`incarnations`, one per ack:
        the one its offset was issued by, 0 where not stated: a stream deleted and created
        again since is another); all or nothing."""
        links = {link.path: link for link in self.links}
        for index, (path, offset) in enumerate(acks):
            link = links.get(path)
            if link is None:
                raise InvalidOffset(f"{path.path!r} is not a stream of this subscription")
            issued_by = incarnations[index] if incarnations else 0
            if issued_by and link.incarnation and issued_by != link.incarnation:
                raise InvalidOffset(
                    f"the offset acked for {path.path!r} was not issued by that stream: it "
                    "names a position of another stream (one deleted since, whose path this "
                    "one now has)"
                )
            if offset < link.acked:
                raise InvalidOffset(f"ack of {path.path!r} regresses its cursor")
            if offset > heads.get(path, 0):
                raise InvalidOffset(f"ack of {path.path!r} is beyond the stream's tail")
            links[path] = msgspec.structs.replace(link, acked=offset)
        return self.with_links(links)

    def finished(self) -> Subscription:
        return msgspec.structs.replace(self, wake=None)

    def leased(self, until: float, holder: str | None = None) -> Subscription:
        assert self.wake is not None
        wake = msgspec.structs.replace(
            self.wake, lease_until=until, holder=holder if holder is not None else self.wake.holder
        )
        return msgspec.structs.replace(self, wake=wake)


class _Pathed(Protocol):
    @property
    def path(self) -> StreamPath: ...


_P = TypeVar("_P", bound=_Pathed)


def in_turn(items: list[_P], after: StreamPath | None) -> list[_P]:
    """`items` (in path order) in the order a wake names them: those after `after` (the last
    stream the last wake named) first, then from the first."""
    if after is None:
        return items
    return [i for i in items if i.path > after] + [i for i in items if i.path <= after]


def _by_path(link: Link) -> StreamPath:
    return link.path


def webhook_address(url: str) -> str:
    """`url`'s origin: without user information, path, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host if port is None else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, "", "", ""))
