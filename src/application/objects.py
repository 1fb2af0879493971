"""Large objects: prepare, upload, commit, abort, read — recoverable delivery of bodies.

A body goes to the store of a region the stream pins, under a key the server chooses. Its record
becomes visible only when the commit finds the store's evidence (size and SHA-256 of what is
really stored) equal to the intent, and then it is appended under the stream-row lock with the
same credit rules as any record. Every step is safe to repeat: prepare by idempotency key, commit
by object ID (a repeat returns the original sequence)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Mapping
from datetime import datetime, timedelta

import msgspec

from application import tracing
from application.access import Caller, require_reader, require_writer
from application.append_records import waiting_for_credit
from application.definitions import Definitions
from application.errors import Forbidden, NotFound
from application.group_commit import GroupCommit, run_one
from application.input_delivery import event_bytes
from application.live_slots import LiveSlots
from application.placement import Misdirected
from application.ports import (
    Clock,
    Idempotency,
    ObjectIntents,
    ObjectStore,
    RecordReader,
    StoredObject,
    StreamRepository,
)
from application.read_records import require_live
from application.tokens import TokenCache
from application.views import ObjectList, open_intents, open_object_view
from application.waiting import TooManyAtWork
from application.wake import WakeRegistry
from domain import errors
from domain.definition import MAX_OBJECT_BYTES, StreamDefinition
from domain.events import Event, ObjectCommitted
from domain.ids import check_id
from domain.objects import (
    AuthorizationReceipt,
    ObjectIntent,
    ObjectRequest,
    object_record,
    pledged_bytes,
)
from domain.records import NewRecord
from domain.stream import Stream, StreamKey

log = logging.getLogger("ductor_streams.objects")
_encode = msgspec.json.Encoder().encode


class ObjectStores:
    """The object store of each region this deployment may write bodies to."""

    def __init__(self, stores: Mapping[str, ObjectStore]) -> None:
        self._stores = stores

    def pick(self, object_regions: tuple[str, ...]) -> str:
        for region in object_regions:
            if region in self._stores:
                return region
        raise Misdirected(
            f"no object store here serves the stream's object regions {list(object_regions)}",
            object_regions=list(object_regions),
        )

    def regions(self) -> list[str]:
        return sorted(self._stores)

    def store(self, region: str) -> ObjectStore:
        store = self._stores.get(region)
        if store is None:
            raise Misdirected(f"no object store here serves region {region!r}")
        return store


def object_id_for(key: StreamKey, created_at: datetime, idempotency_key: str) -> str:
    """Deterministic, so concurrent prepares with one key meet on one intent under the lock; the
    stream's creation time is part of it, so a stream deleted and created again under the same
    ID never answers an object ID of the deleted one."""
    parts = (*key, created_at.isoformat(), idempotency_key)
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()
    return "obj-" + digest[:32]


def storage_key_for(key: StreamKey, object_id: str) -> str:
    """Unique to one intent: a stream deleted and created again under the same ID reuses object
    IDs, and its bodies must never meet the deleted stream's queued deletions."""
    return "/".join((*key, f"{object_id}.{secrets.token_hex(8)}"))


def object_id_in(storage_key: str) -> str:
    """The object ID a key of `storage_key_for` was made for."""
    return storage_key.rsplit("/", 1)[-1].rsplit(".", 1)[0]


# Said to another principal that reuses a key: nothing of the first request's intent is answered.
_KEY_IN_USE = "idempotency_key {!r} is in use on this stream by another request"


class ObjectView(msgspec.Struct, frozen=True):
    object_id: str
    state: str
    size: int
    sha256: str
    content_type: str
    schema: object
    # The deadline to upload and commit, while the intent is open; null once it is committed,
    # aborted or expired, so a committed body never reads as if it would vanish.
    expires_at: datetime | None
    created_at: datetime
    sequence: int | None
    upload: dict[str, str] | None = None


OPEN_STATES = ("prepared", "uploaded")
UPLOAD_GRACE_SECONDS = 60.0


def object_view(intent: ObjectIntent) -> ObjectView:
    """The intent as callers see it (the HTTP layer adds the upload URL it routes)."""
    return ObjectView(
        object_id=intent.object_id,
        state=intent.state,
        size=intent.size,
        sha256=intent.sha256,
        content_type=intent.content_type,
        schema=intent.schema,
        expires_at=intent.expires_at if intent.state in OPEN_STATES else None,
        created_at=intent.created_at,
        sequence=intent.sequence,
    )


class ObjectBody:
    """A committed object's body, read from its store only when asked: whole, or one span
    (so a download can resume without the service reading the bytes before the span)."""

    def __init__(self, intent: ObjectIntent, store: ObjectStore) -> None:
        self.intent = intent
        self._store = store

    def read(self, offset: int = 0, length: int | None = None) -> AsyncIterator[bytes]:
        return self._store.get(self.intent.storage_key, offset=offset, length=length)


class CommitAnswer(msgspec.Struct, frozen=True):
    sequence: int
    object_id: str


class _ObjectCommand:
    idempotency: Idempotency | None = None
    records: tuple[NewRecord, ...] = ()
    copies = 0  # its record's wait event's bytes, charged (`AppendCommand.copies`)
    offset_of = None
    producer = None

    def answer(self, stream: Stream, events: list[Event]) -> object:
        return None


class PrepareCommand(_ObjectCommand):
    def __init__(
        self, intent: ObjectIntent, caller: Caller, now: datetime, max_open: int | None = None
    ) -> None:
        self.intent, self.caller, self.now, self.max_open = intent, caller, now, max_open

    @property
    def pledge(self) -> int:
        """Its intent counts in the tenant's bytes (group_commit.claimed_bytes)."""
        return pledged_bytes(self.intent)

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        require_writer(self.caller, stream.definition)
        # Under the row lock: concurrent prepares cannot pledge past the ceilings together.
        return stream.prepare_object(self.intent, self.now, self.max_open)

    def answer(self, stream: Stream, events: list[Event]) -> ObjectIntent | None:
        return stream.state.objects.get(self.intent.object_id)


class LiveCommand(_ObjectCommand):
    """Nothing but the stream's being live, decided under its lock: a stream deleted while
    forks read it answers 410 (StreamGone) to every direct write, a prepare's retry too."""

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        stream.require_live()
        return []


class UploadedCommand(_ObjectCommand):
    def __init__(self, object_id: str, now: datetime) -> None:
        self.object_id, self.now = object_id, now

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        return stream.mark_uploaded(self.object_id, self.now)


class CommitCommand(_ObjectCommand):
    entry = "object"  # counted by application/throughput.py

    def __init__(
        self, intent: ObjectIntent, stored_size: int, stored_sha256: str, now: datetime
    ) -> None:
        self.intent, self.now = intent, now
        self.stored_size, self.stored_sha256 = stored_size, stored_sha256
        self.records = (object_record(intent),)

    @property
    def pledge(self) -> int:
        """Its record takes its intent's pledge up: it adds nothing to the tenant's bytes."""
        return -pledged_bytes(self.intent)

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        return stream.commit_object(
            self.intent.object_id,
            self.stored_size,
            self.stored_sha256,
            self.records[0],
            self.now,
        )

    def answer(self, stream: Stream, events: list[Event]) -> CommitAnswer:
        committed = events[-1]
        assert isinstance(committed, ObjectCommitted)
        return CommitAnswer(sequence=committed.sequence, object_id=committed.object_id)


class AbortCommand(_ObjectCommand):
    frees = True  # its intent's pledge (group_commit.py)

    def __init__(self, object_id: str, now: datetime) -> None:
        self.object_id, self.now = object_id, now

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        return stream.abort_object(self.object_id, self.now)


class ExpireCommand(_ObjectCommand):
    frees = True

    def __init__(self, object_id: str, now: datetime) -> None:
        self.object_id, self.now = object_id, now

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        return stream.expire_object(self.object_id, self.now)


# Uploads of one intent a process takes at once: a client's retry while its first upload still
# dribbles in goes through, and no more. Each is written to its own temporary file or part until
# its end: 200 at once of one 32 MiB intent once held 3.2 GB of the object store (the local disk
# on the embedded defaults), 81 times their tenant's limit, each of them for as long as the
# minimum reading rate let it drip.
MAX_UPLOADS_PER_OBJECT = 2


class Objects:
    """Every object use case; they share the lookups and the checks of who may do what."""

    def __init__(
        self,
        definitions: Definitions,
        intents: ObjectIntents,
        commits: GroupCommit,
        stores: ObjectStores,
        clock: Clock,
        max_open_objects: int | None = None,
        wake: WakeRegistry | None = None,
        upload_grace_seconds: float = UPLOAD_GRACE_SECONDS,
        copies_kept: bool = False,
        reader: RecordReader | None = None,
        slots: LiveSlots | None = None,
        tokens: TokenCache | None = None,
    ) -> None:
        # A commit waiting for credit holds a live-connection slot and its token, as an append
        # that waits does (`waiting_for_credit`).
        self._slots = slots or LiveSlots(1_000)
        self._tokens = tokens
        # Where a read learns that its stream was deleted while forks read it (410), as the
        # record reads do (`require_live`). Without one (some unit tests) it is not checked.
        self._reader = reader
        # The wait service keeps each input record's event in the database: a commit to an
        # input stream is charged its event's bytes, as an append is (`AppendRecords`).
        self._copies_kept = copies_kept
        # How long past an intent's deadline its armed upload deletion waits: a store may still
        # finish a put its client stopped sending at the deadline.
        self._grace = timedelta(seconds=upload_grace_seconds)
        self._definitions = definitions
        # A commit under `unread_policy: block` waits for credit as an append does (without a
        # registry, as in some unit tests, it answers backpressure at once).
        self._wake = wake
        # Open (prepared or uploaded) intents a stream may have at once (None: no bound).
        self._max_open = max_open_objects
        self._intents = intents
        self._commits = commits
        self._stores = stores
        self._clock = clock
        # Uploads of each intent under way in this process (`MAX_UPLOADS_PER_OBJECT`).
        self._uploading: dict[tuple[StreamKey, str], int] = {}

    async def _intent(self, key: StreamKey, object_id: str) -> ObjectIntent:
        check_id("objectID", object_id)
        intent = await self._intents.intent(key, object_id)
        if intent is None:
            raise NotFound(f"no object {object_id!r} on stream {key.stream_id!r}")
        return intent

    async def _own(
        self, caller: Caller, run_id: str, stream_id: str, object_id: str
    ) -> tuple[StreamKey, ObjectIntent, StreamDefinition]:
        """Upload, commit and abort belong to the principal of the authorization receipt."""
        caller.require("streams:write")
        key = caller.key(run_id, stream_id)
        definition = await self._definitions.get(key, runs=caller.runs)
        intent = await self._intent(key, object_id)
        if intent.receipt.principal != caller.principal:
            raise Forbidden("only the principal that prepared this object may change it")
        return key, intent, definition

    @tracing.use_case("object prepare")
    async def prepare(
        self, caller: Caller, run_id: str, stream_id: str, request: ObjectRequest
    ) -> tuple[ObjectView, bool]:
        caller.require("streams:write")
        key = caller.key(run_id, stream_id)
        if request.size > MAX_OBJECT_BYTES:
            raise errors.ObjectTooLarge(
                f"an object body is at most {MAX_OBJECT_BYTES} bytes, not {request.size}",
                size=request.size,
                limit=MAX_OBJECT_BYTES,
            )
        definition = await self._definitions.get(key, runs=caller.runs)
        require_writer(caller, definition)
        created_at = await self._intents.created_at(key)
        if created_at is None:  # deleted since its definition was read
            raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
        object_id = object_id_for(key, created_at, request.idempotency_key)
        existing = await self._intents.intent(key, object_id)
        if existing is not None:
            if existing.receipt.principal != caller.principal:
                raise errors.IdempotencyKeyReused(_KEY_IN_USE.format(request.idempotency_key))
            if not existing.same_request(request):
                raise errors.IdempotencyKeyReused(
                    f"idempotency_key {request.idempotency_key!r} was used with other fields"
                )
            await run_one(self._commits, key, LiveCommand())  # 410 once deleted
            # As it stands now (uploaded or committed since it was read, before the lock).
            return object_view(await self._intents.intent(key, object_id) or existing), False
        now = self._clock()
        region = self._stores.pick(definition.placement.object_regions)
        intent = ObjectIntent(
            object_id=object_id,
            idempotency_key=request.idempotency_key,
            state="prepared",
            size=request.size,
            sha256=request.sha256,
            content_type=request.content_type,
            schema=request.schema,
            storage_region=region,
            storage_key=storage_key_for(key, object_id),
            receipt=AuthorizationReceipt(
                principal=caller.principal, scopes=tuple(sorted(caller.scopes)), decided_at=now
            ),
            expires_at=now + timedelta(seconds=request.expires_in_seconds),
            created_at=now,
        )
        stored = await run_one(
            self._commits, key, PrepareCommand(intent, caller, now, self._max_open)
        )
        created = stored is not None and stored.created_at == now
        return object_view(stored or intent), created

    @tracing.use_case("object upload")
    async def upload(
        self,
        caller: Caller,
        run_id: str,
        stream_id: str,
        object_id: str,
        chunks: AsyncIterator[bytes],
        announced: int | None = None,
    ) -> ObjectView:
        """Stream the body to the store. A body longer than the intent declared is refused
        (`size-mismatch`, as a shorter one is) as soon as it passes the declared size, or before
        any of it is read when its announced length (`Content-Length`) already does; nothing of
        it stays stored."""
        key, intent, _ = await self._own(caller, run_id, stream_id, object_id)
        if intent.state != "prepared":
            raise errors.ObjectStateConflict(f"object {object_id!r} is {intent.state}")
        under_way = (key, object_id)
        if self._uploading.get(under_way, 0) >= MAX_UPLOADS_PER_OBJECT:
            # 429 with Retry-After, not a state conflict: the intent is still prepared, and a
            # retry once one of them ends goes through (the client's retries wait so).
            raise TooManyAtWork(
                f"object {object_id!r} has {MAX_UPLOADS_PER_OBJECT} uploads under way on this "
                "server process: retry once one of them ends",
                retry_after=1,
            )
        self._uploading[under_way] = self._uploading.get(under_way, 0) + 1
        try:
            return await self._upload(key, intent, object_id, chunks, announced)
        finally:
            left = self._uploading.pop(under_way) - 1
            if left:
                self._uploading[under_way] = left

    async def _upload(
        self,
        key: StreamKey,
        intent: ObjectIntent,
        object_id: str,
        chunks: AsyncIterator[bytes],
        announced: int | None,
    ) -> ObjectView:
        if intent.expires_at <= self._clock():
            raise errors.ObjectStateConflict(f"object {object_id!r} expired")
        if announced is not None and announced > intent.size:
            raise errors.SizeMismatch(
                f"the body announces {announced} bytes; the intent declared {intent.size}",
                announced=announced,
                expected=intent.size,
            )
        store = self._stores.store(intent.storage_region)
        # Armed before the first byte: if this process dies after the put and before the intent
        # is uploaded (or before it removes the body of an intent aborted meanwhile), the body
        # is still removed, once no put of it can land. The put's end, seen here, disarms it.
        body = (key, intent.storage_region, intent.storage_key)
        await self._intents.uploading(*body, intent.expires_at + self._grace)
        # A body that is not the prepared one is never written at the intent's key: a twin
        # upload may have put the right body there, and its commit may reference it already.
        expected = StoredObject(size=intent.size, sha256=bytes.fromhex(intent.sha256))
        # No later than the intent's deadline (it could not be uploaded after it anyway), so
        # that the armed deletion is due only once every put of the body has ended.
        left = (intent.expires_at - self._clock()).total_seconds()
        deadline = asyncio.timeout(max(left, 0.0))
        try:
            async with deadline:
                stored = await store.put(
                    intent.storage_key, chunks, max_size=intent.size, expect=expected
                )
        except errors.ObjectTooLarge:
            await self._intents.upload_ended(*body)  # refused: nothing of it was stored
            if intent.size >= MAX_OBJECT_BYTES:  # past the declared size is past the cap
                raise errors.ObjectTooLarge(
                    f"an object body is at most {MAX_OBJECT_BYTES} bytes",
                    limit=MAX_OBJECT_BYTES,
                ) from None
            raise errors.SizeMismatch(
                f"the body passes the {intent.size} bytes the intent declared",
                expected=intent.size,
            ) from None
        except TimeoutError:
            # The put's end is not seen (a store may finish one its client gave up on): the
            # row stays armed, and falls due when none can land.
            if not deadline.expired():
                raise  # the store's own (an outage's), not the intent's deadline
            raise errors.ObjectStateConflict(
                f"object {object_id!r} expired while its body was uploading"
            ) from None
        if stored.size != intent.size or stored.sha256 != expected.sha256:
            await self._intents.upload_ended(*body)  # not the prepared body: never written
            if stored.size != intent.size:
                raise errors.SizeMismatch(
                    f"received {stored.size} bytes; the intent pins {intent.size}",
                    received=stored.size,
                    expected=intent.size,
                )
            raise errors.DigestMismatch(
                "the body's SHA-256 is not the one prepared",
                expected=intent.sha256,
                received=stored.sha256.hex(),
            )
        try:
            # Marking it uploaded ends the put's arming in the same transaction.
            await run_one(self._commits, key, UploadedCommand(object_id, self._clock()))
        except NotFound:
            # The stream was deleted while the body streamed in (its deletion may have run
            # before the body landed): nothing will ever reference it.
            await store.delete(intent.storage_key)
            await self._intents.upload_ended(*body)
            raise
        except errors.ObjectStateConflict:
            # Aborted or expired while the body streamed in: the deletion queued for its key
            # may have run before the body landed, and nothing will ever reference it. (A
            # twin upload, or its commit, keeps the body: it is the same one.) Nor when the
            # stream was deleted and created again meanwhile: the new one has no such intent.
            try:
                again: ObjectIntent | None = await self._intent(key, object_id)
            except NotFound:
                again = None
            if again is None or again.state in ("aborted", "expired"):
                await store.delete(intent.storage_key)
            await self._intents.upload_ended(*body)
            raise
        return object_view(await self._intent(key, object_id))

    @tracing.use_case("object commit")
    async def commit(
        self, caller: Caller, run_id: str, stream_id: str, object_id: str
    ) -> tuple[CommitAnswer, bool]:
        """The answer, and whether this commit appended the record (False: a repeat)."""
        key, intent, definition = await self._own(caller, run_id, stream_id, object_id)
        if intent.state == "committed":
            assert intent.sequence is not None
            return CommitAnswer(sequence=intent.sequence, object_id=object_id), False
        if intent.state in ("aborted", "expired"):
            raise errors.ObjectStateConflict(f"object {object_id!r} is {intent.state}")
        evidence = await self._stores.store(intent.storage_region).stat(intent.storage_key)
        if evidence is None:
            raise errors.ObjectStateConflict(f"no body is stored for object {object_id!r}")

        async def attempt() -> CommitAnswer:
            # Timed when tried: a commit that waited for credit is appended (and its deadline
            # judged) as of then, not as of the wait's start.
            command = CommitCommand(intent, evidence.size, evidence.sha256.hex(), self._clock())
            if self._copies_kept and definition.direction == "input":
                command.copies = event_bytes(key, command.records[0])
            return await run_one(self._commits, key, command)

        try:
            if self._wake is not None and definition.limits.unread_policy == "block":
                waited = await waiting_for_credit(
                    caller, self._slots, self._tokens, self._wake, key, definition, attempt
                )
                return waited, True
            return await attempt(), True
        except errors.ObjectStateConflict:
            again = await self._intent(key, object_id)  # committed meanwhile by a twin request
            if again.state == "committed" and again.sequence is not None:
                return CommitAnswer(sequence=again.sequence, object_id=object_id), False
            raise

    @tracing.use_case("object abort")
    async def abort(
        self, caller: Caller, run_id: str, stream_id: str, object_id: str
    ) -> ObjectView:
        key, intent, _ = await self._own(caller, run_id, stream_id, object_id)
        if intent.state == "committed":
            raise errors.ObjectStateConflict(f"object {object_id!r} is committed")
        if intent.state in OPEN_STATES:
            # If it left the open state meanwhile, report what it is now: aborted or expired
            # by another request (the same end), or committed by one (a 409, as if it had been
            # committed before this abort: its record was appended and stays).
            with contextlib.suppress(errors.ObjectStateConflict):
                await run_one(self._commits, key, AbortCommand(object_id, self._clock()))
        intent = await self._intent(key, object_id)
        if intent.state == "committed":
            raise errors.ObjectStateConflict(f"object {object_id!r} is committed")
        return object_view(intent)

    async def describe(
        self, caller: Caller, run_id: str, stream_id: str, object_id: str
    ) -> ObjectView:
        caller.require("streams:read")
        key = caller.key(run_id, stream_id)
        require_reader(caller, await self._definitions.get(key, runs=caller.runs))
        await self._live(key)
        return object_view(await self._readable(key, object_id))

    async def _readable(self, key: StreamKey, object_id: str) -> ObjectIntent:
        """The object as a reader of `key` may see it: the stream's own, or, for a fork, one
        whose committed record the fork inherits (at or before each link's point up its chain),
        so that a fork's readers can fetch the bodies of the records they read (they were 404
        on the fork's path, and the source's is 410 once it is deleted)."""
        try:
            return await self._intent(key, object_id)
        except NotFound:
            if self._reader is None:
                raise
        through: int | None = None
        for link in await self._reader.chain(key):
            through = link.through if through is None else min(through, link.through)
            inherited = await self._intents.intent(link.source, object_id)
            if inherited is not None:
                sequence = inherited.sequence
                if inherited.state == "committed" and sequence is not None and sequence <= through:
                    return inherited
                break  # the source's, past the point the fork inherits through
        raise NotFound(f"no object {object_id!r} on stream {key.stream_id!r}")

    async def _live(self, key: StreamKey) -> None:
        """410 for a stream deleted while forks read it: its objects' metadata and bodies are
        not served, as its records are not (a body committed after every fork's point was
        still downloadable)."""
        if self._reader is not None:
            found = await self._reader.page(key, 0, 1)
            if found is not None:
                require_live(key, found[0])

    async def download(
        self, caller: Caller, run_id: str, stream_id: str, object_id: str
    ) -> ObjectBody:
        caller.require("streams:read")
        key = caller.key(run_id, stream_id)
        require_reader(
            caller, await self._definitions.get(key, delivers_data=True, runs=caller.runs)
        )
        await self._live(key)
        intent = await self._readable(key, object_id)
        if intent.state != "committed":
            raise errors.ObjectStateConflict(
                f"object {object_id!r} is {intent.state}: only committed bodies are served"
            )
        return ObjectBody(intent, self._stores.store(intent.storage_region))

    async def expire_due(self, limit: int = 100, rounds: int = 10) -> int:
        """The orphan sweeper: expire open intents past their expiry (their bodies are queued
        for deletion with the event), `limit` at a time, until none is due or `rounds` are
        done (one batch a sweep fell behind more than 3 abandoned intents a second, and an
        intent past its deadline still counts against the stream's open intents and pledge
        until it is swept). Idempotent, so sweepers may race."""
        expired = 0
        for _ in range(rounds):
            now = self._clock()
            due = await self._intents.expired_intents(now, limit)
            failed: list[Exception] = []
            for key, object_id in due:
                try:
                    await run_one(self._commits, key, ExpireCommand(object_id, now))
                except NotFound:  # erased meanwhile: nothing to expire
                    pass
                except Exception as error:
                    # One that cannot be expired does not hold up those due after it (each
                    # sweep would otherwise stop at it, for every tenant).
                    log.warning("intent %s of %s not expired: %s", object_id, key, error)
                    failed.append(error)
            if due and len(failed) == len(due):
                raise failed[-1]  # none could be: the sweep failed (an outage, most likely)
            expired += len(due)
            if len(due) < limit:
                break
        return expired


DEFAULT_OBJECTS_LIMIT = 100
MAX_OBJECTS_LIMIT = 1_000


class ListOpenObjects:
    """A stream's open (prepared or uploaded) object intents, page by page, in the order the
    stream document shows its first ones: oldest first, then by object ID."""

    def __init__(
        self, definitions: Definitions, streams: StreamRepository, intents: ObjectIntents
    ) -> None:
        self._definitions = definitions
        self._streams = streams
        self._intents = intents

    async def __call__(
        self,
        caller: Caller,
        run_id: str,
        stream_id: str,
        after: str | None = None,
        limit: int = DEFAULT_OBJECTS_LIMIT,
    ) -> ObjectList:
        caller.require("streams:read")
        key = caller.key(run_id, stream_id)
        if not 1 <= limit <= MAX_OBJECTS_LIMIT:
            raise errors.InvalidInput(f"limit must be 1 to {MAX_OBJECTS_LIMIT}", field="limit")
        if after is not None:
            check_id("after", after)
        require_reader(caller, await self._definitions.get(key, runs=caller.runs))
        stream = await self._streams.load(key)
        if stream is None:
            raise NotFound(f"no stream {stream_id!r} in run {run_id!r}")
        stream.require_live()
        intents = open_intents(stream)
        if after is not None:
            # Keyset on (created_at, object_id): `after` may have been committed, aborted or
            # expired since it was answered; its intent still says where the page resumes.
            last = stream.state.objects.get(after) or await self._intents.intent(key, after)
            if last is None:
                raise errors.CursorUnknown(
                    f"after {after!r} is no object of this stream", field="after"
                )
            mark = (last.created_at, last.object_id)
            intents = [i for i in intents if (i.created_at, i.object_id) > mark]
        page = intents[:limit]
        more = len(intents) > limit
        return ObjectList(
            objects=[open_object_view(i) for i in page],
            next_after=page[-1].object_id if more else None,
        )
