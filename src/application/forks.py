"""Resolve what a new fork inherits: the source, the fork point, and a partial record to copy.

A fork reads its source's records 1..`through` without copying them (the ports stitch them
into its pages, `application.fork_reads`) and appends its own from `through + 1`. A request
names the fork point as an offset (a source sequence; None: the source's head) refined by a
sub-offset: for a JSON source, that many more records; for any other content type, that many
more bytes, of which the whole records are inherited and a partial one is copied (its first
bytes) as the fork's first record of its own. The port re-checks the source under its row lock
when the fork is created (`StreamRepository.create`), so nothing decided here can be undone by
a delete in between.
"""

from __future__ import annotations

from application.access import Caller, require_reader
from application.definitions import Definitions
from application.errors import NotFound
from application.ports import RecordReader, StreamRepository
from application.read_records import check_cursor
from domain import errors
from domain.definition import MAX_FORK_DEPTH, Expiry, Fork
from domain.offsets import UNSTATED, Minting, Offset
from domain.records import NewRecord, RecordKind
from domain.stream import StreamKey

JSON = "application/json"
_SCAN_PAGE = 1_000


def media_type(content_type: str) -> str:
    """The type/subtype of a content type, without parameters, lowercased."""
    return content_type.split(";", 1)[0].strip().lower()


class Forks:
    def __init__(
        self, definitions: Definitions, streams: StreamRepository, reader: RecordReader
    ) -> None:
        self._definitions = definitions
        self._streams = streams
        self._reader = reader

    async def resolve(
        self,
        caller: Caller,
        source_run_id: str,
        source_stream_id: str,
        given_offset: Offset | int | None,
        sub_offset: int,
        content_type: str | None,
    ) -> tuple[Fork, list[NewRecord], str]:
        """(the definition's fork, the records the fork starts with, the source's content
        type). A native source (no content type) forks as `application/json`.

        Source missing (or expired, or not readable here) → NotFound; soft-deleted, or
        another content type asked for → DefinitionConflict (409); a source already
        MAX_FORK_DEPTH forks deep, an offset past the head, a
        negative sub-offset, a sub-offset without an offset, or one past what follows the
        offset → InvalidInput (400); a binary sub-offset from below the source's retention →
        CursorExpired (410)."""
        caller.require("streams:read")
        key = caller.key(source_run_id, source_stream_id)
        definition = await self._definitions.get(key, delivers_data=True, runs=caller.runs)
        require_reader(caller, definition)
        source = await self._streams.load(key)
        if source is None:
            raise NotFound(f"no stream {source_stream_id!r} in run {source_run_id!r}")
        if source.state.soft_deleted:
            raise errors.DefinitionConflict(
                f"stream {source_stream_id!r} was deleted (only its forks keep it): it cannot "
                "be forked"
            )
        chain = await self._reader.chain(key)
        depth = len(chain) + 1
        if depth > MAX_FORK_DEPTH:
            raise errors.InvalidInput(
                f"stream {source_stream_id!r} is a fork {depth - 1} deep: a fork chain holds at "
                f"most {MAX_FORK_DEPTH} forks, so it cannot be forked (fork its root, or a "
                "shallower fork, instead)",
                field="Stream-Forked-From",
            )
        source_type = definition.content_type or JSON
        if content_type is not None and media_type(content_type) != media_type(source_type):
            raise errors.DefinitionConflict(
                f"the fork's content type {content_type!r} is not its source's ({source_type!r})"
            )
        head = source.state.head
        offset = None
        if isinstance(given_offset, int):  # a sequence, as the native surface names one
            given_offset = Offset(UNSTATED, given_offset)
        if given_offset is not None:
            minting = Minting(
                source.state.created_at, ((k.source_created_at, k.through) for k in chain)
            )
            offset = minting.resolve(given_offset)
            if offset is None:
                raise errors.InvalidInput(
                    f"the fork offset was not issued by stream {source_stream_id!r}: it names a "
                    "position of another stream (one deleted since, whose ID this one now has)",
                    field="offset",
                )
        if sub_offset < 0:
            raise errors.InvalidInput("a fork's sub-offset is 0 or more", field="sub_offset")
        if offset is None:
            if sub_offset > 0:
                raise errors.InvalidInput(
                    "a fork's sub-offset refines a fork offset: give the offset too",
                    field="sub_offset",
                )
            anchor = head
        elif not 0 <= offset <= head:
            raise errors.InvalidInput(
                f"the fork offset {offset} is past the source's head {head}", field="offset"
            )
        else:
            anchor = offset
        records: list[NewRecord] = []
        if sub_offset == 0:
            through = anchor
        elif media_type(source_type) == JSON:
            through = anchor + sub_offset
            if through > head:
                raise errors.InvalidInput(
                    f"a sub-offset of {sub_offset} records passes the source's head {head}",
                    field="sub_offset",
                )
        else:
            through, records = await self._split(key, anchor, sub_offset)
        assert source.state.created_at is not None
        fork = Fork(
            run_id=source_run_id,
            stream_id=source_stream_id,
            source_created_at=source.state.created_at,
            through=through,
            offset=offset,
            sub_offset=sub_offset,
        )
        return fork, records, source_type

    async def inherited_expiry(
        self, caller: Caller, source_run_id: str, source_stream_id: str, requested: Expiry
    ) -> Expiry:
        """The fork's expiry (PROTOCOL.md §4.2's table): its own when the request sets one,
        otherwise its source's (the same `idle_seconds`, refreshed independently, or the same
        `expires_at`); never capped by the source's."""
        if requested.enabled:
            return requested
        key = caller.key(source_run_id, source_stream_id)
        return (await self._definitions.get(key, touch=False, runs=caller.runs)).expiry

    async def _split(
        self, key: StreamKey, anchor: int, sub_offset: int
    ) -> tuple[int, list[NewRecord]]:
        """`sub_offset` bytes after record `anchor`, counted as a read of the stream answers
        them: the last whole record inherited, and the copied first bytes of the next one when
        the point falls inside it."""
        through, left, cursor = anchor, sub_offset, anchor
        while True:
            found = await self._reader.page(key, cursor, _SCAN_PAGE)
            if found is None:
                raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
            position, page = found
            check_cursor(cursor, position.head, position.earliest)
            for record in page:
                # The bytes a read of the stream answers for it: an object record's descriptor,
                # not its body's size (which `size` counts).
                answered = len(record.payload)
                if answered <= left:
                    through, left = record.sequence, left - answered
                    if left == 0:
                        return through, []
                    continue
                if record.kind != RecordKind.BINARY:
                    raise errors.InvalidInput(
                        f"the sub-offset falls inside record {record.sequence}, which is not "
                        "bytes and cannot be split",
                        field="sub_offset",
                    )
                partial = record.payload[:left]
                return through, [
                    NewRecord(
                        kind=RecordKind.BINARY,
                        content_type=record.content_type,
                        payload=partial,
                        size=len(partial),
                    )
                ]
            if len(page) < _SCAN_PAGE:
                raise errors.InvalidInput(
                    f"a sub-offset of {sub_offset} bytes passes the end of the source",
                    field="sub_offset",
                )
            cursor = page[-1].sequence
