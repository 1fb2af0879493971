"""The ports the use cases need. Adapters implement them; tests swap in the memory ones."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol, TypeVar

import msgspec

from application.access import Caller
from domain.definition import StreamDefinition
from domain.events import Event
from domain.objects import ObjectIntent
from domain.producers import ProducerClaim
from domain.records import NewRecord, RecordKind
from domain.stream import Stream, StreamKey


class Idempotency(msgspec.Struct, frozen=True):
    key: str
    fingerprint: bytes


class Command(Protocol):
    """One request to change a stream, decided under the stream-row lock.

    `decide` is pure: it returns the events the request causes or raises a DomainError, and the
    port applies the events before the next command of the same transaction is decided.
    """

    # Read-only members (properties here), so a command may declare each as narrowly as it is:
    # `offset_of = None`, `records = ()`.
    @property
    def idempotency(self) -> Idempotency | None: ...

    @property
    def records(self) -> Sequence[NewRecord]: ...

    @property
    def offset_of(self) -> int | None:  # a sequence whose cumulative end offset `decide` needs
        ...

    @property
    def producer(self) -> ProducerClaim | None:  # a producer's claim: the port loads its state
        ...

    # A command may also say `needs_consumers = True` (its decide or answer reads the stream's
    # consumers): an adapter that keeps them apart then reads them with the row lock, instead
    # of after a first ConsumersNotLoaded. One that may erase the stream says `erases = True`:
    # an adapter may then erase a batch's deletions together. One whose bytes are not only its
    # records' says how many more it may add (`pledge`: an object's intent). A command that may
    # add bytes carries its tenant's `tenant_room` (application/tenant_limits.py) when the
    # tenants' bytes are limited.

    def decide(self, stream: Stream, offset: int | None) -> list[Event]: ...

    def answer(self, stream: Stream, events: list[Event]) -> Any: ...


AnswerT_co = TypeVar("AnswerT_co", covariant=True)


class AnsweringCommand(Command, Protocol[AnswerT_co]):
    """A command whose answer's type is known, so `run_one` returns it typed."""

    def answer(self, stream: Stream, events: list[Event]) -> AnswerT_co: ...


class Done(msgspec.Struct, frozen=True):
    events: list[Event]
    answer: Any
    # The bytes the command added to its tenant's (records, and objects' pledges; less what it
    # released), when its tenant's bytes are limited (`tenant_room`): counted by the process.
    stored: int = 0


class Replayed(msgspec.Struct, frozen=True):
    """An idempotency key seen before with the same request: the stored answer, as JSON."""

    answer_json: bytes


class Failed(msgspec.Struct, frozen=True):
    error: Exception


Outcome = Done | Replayed | Failed


class PeerUnavailable(Exception):
    """The process that commits a stream could not be asked (not there, not listening, its
    connection lost before the command was sent): nothing was sent, so this process commits."""


class CommitPeers(Protocol):
    """The other server processes of this host (`serve --workers N`), so that each stream's
    appends are committed by one of them, its owner, whichever process received them: one
    group commit per stream instead of one per process taking turns on its row lock. Every
    decision is still made under the row lock; which process makes it is only a matter of
    speed, so a process that cannot reach the owner commits itself."""

    def owner(self, key: StreamKey) -> Hashable | None:
        """The process that commits `key`'s appends, or None: this one."""
        ...

    async def submit(
        self, owner: Hashable, key: StreamKey, command: Command, seconds: float
    ) -> Outcome:
        """`command`, committed by `owner`'s group commit, within `seconds`. Raises
        `PeerUnavailable` when nothing was sent, and `Unanswered` (of unknown outcome) when it
        was sent and not answered in time or the connection was lost meanwhile."""
        ...


class RunSummary(msgspec.Struct, frozen=True):
    run_id: str
    stream_count: int
    created_at: datetime  # when its oldest stream was created


class RunPage(msgspec.Struct, frozen=True):
    """A page of a run's streams (`StreamRepository.list_run_within`): the streams, the bytes of
    their stored definitions, states and consumers, and whether it stopped at its bytes (more
    may follow)."""

    streams: list[Stream]
    size: int
    cut: bool


class ConsumerPosition(msgspec.Struct, frozen=True):
    consumer_id: str
    acked_sequence: int
    holds_credit: bool


class StreamRepository(Protocol):
    async def create(
        self,
        key: StreamKey,
        definition: StreamDefinition,
        now: datetime,
        then: Sequence[Command] = (),
    ) -> tuple[Stream, bool]:
        """Create the stream, or return the existing one; the flag says whether it is new.

        The `then` commands (initial records, a close) are decided in order right after
        `StreamCreated`, in the creation's one transaction, and what they cause is written and
        announced to live readers as `update` does: nobody ever sees the new stream without it.
        If one fails, nothing is created and its error is raised. An existing stream is returned
        as it is: they are not decided on it."""

    async def load(self, key: StreamKey) -> Stream | None: ...

    async def list_run(
        self, tenant: str, run_id: str, after: str | None = None, limit: int | None = None
    ) -> list[Stream]:
        """The run's streams with stream_id > `after`, ascending, at most `limit` (a keyset page
        over the key; every one without a limit)."""

    async def list_run_within(
        self, tenant: str, run_id: str, after: str | None, limit: int, max_bytes: int
    ) -> RunPage:
        """`list_run`, stopping also before the stream whose stored definition, state and
        consumers would take the page's past `max_bytes` (never before the first one): a
        definition may hold a 64 KiB schema, and 1,000 of them were 61 MB to decode and encode
        for one listing."""

    async def consumers(
        self, key: StreamKey, after: str | None, limit: int
    ) -> list[ConsumerPosition]:
        """The stream's consumers whose consumer_id follows `after`, ascending, at most `limit`
        (a keyset page: its cost does not grow with the number of consumers)."""

    async def definition(self, key: StreamKey) -> StreamDefinition | None:
        """The immutable definition (adapters may keep it once seen), or None."""

    async def update(self, key: StreamKey, commands: Sequence[Command]) -> list[Outcome]:
        """Lock the stream row, decide each command in order, then write every resulting event,
        record, receipt and the snapshot in one transaction, commit, and only then wake
        listeners. One command's failure leaves the others untouched. Raises NotFound."""

    async def update_many(
        self, groups: Sequence[tuple[StreamKey, Sequence[Command]]]
    ) -> list[list[Outcome] | Exception]:
        """`update` of many streams (each key once) committed together: each stream decided as
        `update` decides it, under its row lock (taken in one fixed order, so that overlapping
        batches never deadlock), one transaction for all. The answer, per group in order: its
        outcomes, or the error that stream alone raised (NotFound), which fails no other group.
        Raises only what fails the batch as a whole (nothing of it was committed, or it is
        unknown whether it was)."""

    async def journal(self, key: StreamKey) -> list[Event]:
        """The stream's journal from its latest snapshot (or its creation) on, read at once:
        `Stream.replay` of it rebuilds the stored state."""

    async def delete_run(
        self, tenant: str, run_id: str, now: datetime, check: Callable[[Stream], None] | None = None
    ) -> list[StreamKey]:
        """Lock every stream of the run (in stream_id order), decide `Stream.delete` on each
        (and `check`, which may raise to refuse), then erase them all in that transaction, or
        none: a legal hold on any is `LegalHoldActive`. Raises NotFound when the run has no
        stream. Answers the erased keys."""

    async def list_runs(
        self, tenant: str, after: str | None, limit: int, prefix: str = ""
    ) -> list[RunSummary]:
        """The tenant's runs with run_id > `after` (and starting with `prefix`), ascending, at most
        `limit`."""


class AppendReceipts(Protocol):
    async def forget_receipts(self, older_than: timedelta, batch: int = 1000) -> int:
        """Remove every append receipt created more than `older_than` ago, `batch` at a time,
        but those of a stream under legal hold (a hold removes nothing); answer how many."""


class StorageCleanup(Protocol):
    """Bookkeeping rows the service no longer needs, removed once older than an age: `batch`
    rows per statement, never a row of a stream under legal hold, never taking a stream-row
    lock. Each answers how many rows it removed."""

    async def forget_delivered_inputs(self, older_than: timedelta, batch: int = 1000) -> int:
        """Input-delivery rows delivered more than `older_than` ago, but each stream's highest
        delivered one: it is what `delivered_through` reads, so the document stays the same."""

    async def forget_done_deletions(self, older_than: timedelta, batch: int = 1000) -> int:
        """Deletion-outbox rows done (their body removed) more than `older_than` ago."""

    async def forget_gap_evidence(self, older_than: timedelta, batch: int = 1000) -> int:
        """Gap evidence recorded more than `older_than` ago."""

    async def fold_tenant_counts(self) -> int:
        """Keep the tenants' counts of streams and bytes (`TenantCounts`) quick to read: the parts
        kept apart while they were written are summed where nothing writes them any more.
        Answers how many parts it folded."""


class TenantCounts(Protocol):
    async def tenant_streams(self, tenant: str) -> int:
        """How many streams the tenant holds, a soft-deleted one too (its rows are kept until
        its last fork goes), as of the last commit: whatever created or erased them."""

    async def tenant_bytes(self, tenant: str) -> int:
        """How many bytes the tenant holds, as of the last commit, whatever appended, pruned,
        erased or opened them: what its streams count (`domain.stream.definition_bytes`), what
        its records count (`domain.records.held_bytes`: size, row and an object's reference), a
        soft-deleted stream's too, and what its open object intents pledge
        (`domain.objects.pledged_bytes`)."""


class AccessRecord(msgspec.Struct, frozen=True):
    last_access: datetime
    legal_hold: bool


class StreamAccess(Protocol):
    """When each stream with an expiry was last read or written, apart from the stream row (so
    a read never writes it). Creating such a stream records its creation as its last access."""

    async def record_access(self, accesses: Mapping[StreamKey, datetime]) -> None:
        """Move each stream's last access forward to the instant given (never back). A stream
        without an expiry, or one that is gone, is left alone."""

    async def last_access(self, key: StreamKey) -> AccessRecord | None:
        """The recorded last access and the legal hold; None without an expiry or a stream."""

    async def run_access(self, tenant: str, run_id: str) -> dict[str, datetime]:
        """The recorded last access of each of the run's streams that has an expiry."""

    async def expiry_candidates(
        self, now: datetime, grace: timedelta, limit: int
    ) -> list[StreamKey]:
        """At most `limit` streams not under a legal hold whose `expires_at` has passed, or whose
        recorded last access plus `idle_seconds` plus `grace` has, the longest due first."""

    async def live_runs(
        self,
        tenant: str,
        after: str | None,
        limit: int,
        now: datetime,
        slack: timedelta,
        prefix: str = "",
    ) -> list[RunSummary]:
        """`StreamRepository.list_runs` without the streams that answer 404 as expired at `now`
        (past `expires_at`, or past the recorded last access plus `idle_seconds` plus `slack`,
        and not under a legal hold): a run whose streams have all expired is not listed."""


class StoredRecord(msgspec.Struct, frozen=True):
    sequence: int
    appended_at: datetime
    kind: RecordKind
    content_type: str
    size: int
    payload: bytes


class Position(msgspec.Struct, frozen=True):
    head: int
    earliest: int
    closed: bool
    # Which incarnation of the stream this is: a stream deleted and created again with the same
    # ID is another stream, told apart by its creation time.
    created_at: datetime | None = None
    # Deleted while forks still read it: every direct read answers StreamGone (410).
    soft_deleted: bool = False


class ForkLink(NamedTuple):
    """Where a fork's prefix comes from: the source (same tenant), which incarnation of it, and
    the last inherited sequence."""

    source: StreamKey
    source_created_at: datetime
    through: int


def within_bytes(records: list[StoredRecord], budget: int | None) -> list[StoredRecord]:
    """The longest prefix of `records` whose payloads fit `budget` bytes (None: all of them),
    and at least the first record that is not empty (with the empty ones before it)."""
    if budget is None:
        return records
    total = 0
    for index, record in enumerate(records):
        size = len(record.payload)
        total += size
        if total > budget and total != size:
            return records[:index]
    return records


class RecordReader(Protocol):
    async def page(
        self, key: StreamKey, cursor: int, limit: int, max_bytes: int | None = None
    ) -> tuple[Position, list[StoredRecord]] | None:
        """The stream's position and its records with sequence > cursor, ascending, at most
        `limit` (a keyset page), read from one snapshot; None if there is no such stream.
        Given `max_bytes`, the page ends before the first record that would take its payloads
        past that many bytes (`within_bytes`), and the rest are not read at all: one record is
        always answered.

        A fork's page is stitched (`application.fork_reads`): records up to its `through` are
        its ancestors' (each serving its own range of the chain, read without recursion and in
        a number of queries that does not grow with the chain's depth), later ones its own;
        its `earliest` is where the ancestors' retention left the inherited prefix, unless its
        own went further."""

    async def created_at(self, key: StreamKey) -> datetime | None:
        """The creation time of the stream now under `key` (its incarnation); None: none is."""

    async def chain(self, key: StreamKey, created_at: datetime | None = None) -> list[ForkLink]:
        """The stream's fork links up its chain: its own link first (to its source), then its
        source's, up to the root (a stream that is no fork). Empty for a stream that is no
        fork, or that does not exist. The chain of a fork never changes while it exists.
        `created_at`: of the stream created then (the incarnation a caller read)."""

    async def expired_through(
        self, key: StreamKey, after: int, cutoff: datetime, limit: int
    ) -> int:
        """The last sequence of the run of records after `after` appended before `cutoff`
        (at most `limit` of them), or `after` when the next one is younger."""


class FoundToken(msgspec.Struct, frozen=True):
    """A token that may be used now, and for how long at most (its expiry, by the store's
    clock: a cache counts it down on its own clock, so the two clocks never need to agree)."""

    caller: Caller
    expires_in_seconds: float | None  # None: it does not expire


class TokenRecord(msgspec.Struct, frozen=True):
    """What is known about a token, without the token or its hash."""

    token_id: str
    caller: Caller
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenStore(Protocol):
    async def find(self, token_hash: bytes) -> FoundToken | None:
        """The token with this hash, unless it is unknown, revoked or expired."""

    async def put(
        self,
        token_hash: bytes,
        caller: Caller,
        expires_in_seconds: int | None = None,
        minted_by: str | None = None,
    ) -> datetime | None:
        """Store (or replace) the token with this hash, for `caller` (its tenant, principal,
        scopes and runs); answer when it expires. A revoked token stays revoked. `minted_by`:
        the id of the stored token minting it, which must work until this is stored (else
        MinterEnded, and nothing is stored); revoking that token revokes this one."""

    async def revoke(self, token_id: str) -> list[str]:
        """Revoke the token with this id (again, if it already is) and every token minted from
        it, and theirs in turn, and tell every process that caches tokens to forget them; the
        ids revoked (none if there is no such token)."""

    async def page(
        self, tenant: str, after: str | None, limit: int, within: frozenset[str] | None = None
    ) -> list[TokenRecord]:
        """At most `limit` of the tenant's tokens (revoked and expired ones too) by creation
        (`created_at`, then token id), those after the token with id `after` when it is given
        (exclusive). `within`: only the tokens restricted to some of these runs (what a
        run-restricted caller may see), chosen in the read, so a page never passes over a token
        its caller may not see. Raises `CursorUnknown` if `after` names no token of the tenant
        that the page's caller may see."""

    async def list(self, tenant: str | None = None) -> list[TokenRecord]:
        """Every token (revoked and expired ones too), by tenant then creation."""

    async def get(self, token_id: str) -> TokenRecord | None:
        """The token with this id (revoked or expired too), or None."""

    async def forget_ended(self, older_than: timedelta) -> int:
        """Remove the tokens that expired more than `older_than` ago (they refuse every request
        already; the listing shows them until then); answer how many. A revoked token that
        never expires is kept: its record keeps it revoked if its value is stored again."""

    async def tenant_tokens(self, tenant: str) -> int:
        """How many tokens of `tenant` are kept (revoked and expired ones too, until they are
        forgotten): what DUCTOR_STREAMS_MAX_TOKENS_PER_TENANT counts."""


class JwtVerifier(Protocol):
    async def verify(self, token: str) -> Mapping[str, Any]:
        """The claims of a JWT whose signature verifies with one of the identity provider's
        keys, by an allowed algorithm, and whose `exp` (required), `nbf`, `iat`, `iss` and
        `aud` hold. Raises `Unauthenticated` for anything else, the provider's key set being
        out of reach included."""


class ObjectIntents(Protocol):
    """The intents' projection (every state), written with the stream's events."""

    async def intent(self, key: StreamKey, object_id: str) -> ObjectIntent | None: ...

    async def created_at(self, key: StreamKey) -> datetime | None:
        """When the stream now under `key` was created (a stream deleted and created again
        under the same ID is another stream), or None if there is none."""

    async def expired_intents(self, now: datetime, limit: int) -> list[tuple[StreamKey, str]]:
        """Open (prepared or uploaded) intents whose expiry has passed."""

    async def uploading(
        self, key: StreamKey, storage_region: str, storage_key: str, due: datetime
    ) -> None:
        """Arm the deletion of a body an upload is about to put, due at `due` (when no put of it
        can still land) or later if it was armed for later, and count the put as under way. A
        deletion queued for the body already, done or not, runs again then too. The intent's
        `ObjectUploaded`, or `upload_ended`, ends the put; once none is under way, a row only
        armed is done. An abort, expiry, pruning or erasure takes it over: due at once, and
        again at `due` while a put is under way."""

    async def upload_ended(self, key: StreamKey, storage_region: str, storage_key: str) -> None:
        """A put that armed the body's deletion has ended, and what it left is handled."""


class StoredObject(msgspec.Struct, frozen=True):
    """What an object store holds under a key: the evidence a commit checks."""

    size: int
    sha256: bytes


class ObjectStore(Protocol):
    """Bodies of large objects, under keys the server chooses (never a caller's)."""

    async def put(
        self,
        key: str,
        chunks: AsyncIterator[bytes],
        *,
        max_size: int,
        expect: StoredObject | None = None,
    ) -> StoredObject:
        """Stream `chunks` to `key` while counting and hashing them, never holding the whole
        body in memory. More than `max_size` bytes raises `ObjectTooLarge` at once and leaves
        nothing at `key`. Atomic: a reader sees the whole previous body or the whole new one.
        With `expect`, a body of another size or SHA-256 is not written at `key` (what was
        there stays): its evidence is returned, for the caller to refuse it."""

    async def stat(self, key: str) -> StoredObject | None:
        """Size and SHA-256 of what is stored at `key`, computed or attested by the store."""

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> AsyncIterator[bytes]:
        """The body in chunks, or only the `length` bytes from `offset` (fewer where the body
        ends first, none from an offset at or past its end), reading no other bytes from
        storage; raises `ObjectMissing` if nothing is stored at `key`."""

    async def delete(self, key: str) -> None:
        """Remove `key`; removing what is not there is not an error."""

    def keys(self, prefix: str) -> AsyncIterator[str]:
        """Every stored key that starts with `prefix` (for orphan sweeps)."""

    async def sweep_incomplete(self, older_than: timedelta) -> int:
        """Remove what uploads started more than `older_than` ago and never finished left
        behind (a process killed mid-put): temporary files, incomplete multipart uploads and
        their temporary objects. An upload still running when swept fails (its key stays as it
        was), so `older_than` must be well above any upload's duration. Answers how many."""


class Clock(Protocol):
    def __call__(self) -> datetime: ...


class Backlog(msgspec.Struct, frozen=True):
    """An outbox's undone rows and the age of its oldest (0 when empty)."""

    outbox: str  # input_delivery, deletion
    pending: int
    lag_seconds: float


class StoredFigures(msgspec.Struct, frozen=True):
    """What /metrics reports from the source of truth rather than from this process."""

    backlogs: list[Backlog]
    objects: dict[str, int]  # object intents by state


class FiguresSource(Protocol):
    async def figures(self) -> StoredFigures: ...
