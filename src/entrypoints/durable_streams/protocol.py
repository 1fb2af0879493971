"""The Durable Streams operations (PROTOCOL.md section 5) translated onto the use cases.

A protocol stream is a native stream (docs/durable-streams.md): `PUT` creates it with the
protocol's content type and expiry, `POST` appends (and closes), `GET` reads (catch-up,
long-poll, SSE), `HEAD` answers its metadata, `DELETE` erases it. This module only parses
what a request says and shapes what the use cases answer: its functions take plain values (the
services, the caller, the path's parameters, the headers) from whichever adapter serves the
request (`routes.py` under Litestar, `entrypoints/front.py` for the appends)."""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import functools
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

import msgspec

from application.access import Caller
from application.create_durable_stream import ForkOf
from application.durable_reads import Page
from application.errors import NotFound
from application.live import Idle, RecordsDelivered, StreamEnded
from application.live_slots import Slot
from application.ports import StoredRecord
from application.views import record_view
from domain import errors, offsets
from domain.definition import Expiry, Redaction, StreamDefinition
from domain.offsets import START as FROM_START
from domain.offsets import Offset, incarnation
from domain.producers import ProducerClaim
from domain.records import NewRecord, RecordKind
from domain.stream import StreamKey
from domain.text import check_media_type, media_type_parts
from entrypoints.container import Services
from entrypoints.durable_streams import wire
from entrypoints.durable_streams.answers import Answer, problem_answer
from entrypoints.edge.head import RequestHeaders
from entrypoints.edge.paths import DURABLE_STREAMS_PREFIX
from entrypoints.edge.wake_links import stream_root_url
from entrypoints.sse.asgi import EventStreamResponse

PREFIX = DURABLE_STREAMS_PREFIX
DEFAULT_RUN = "default"

# A catch-up read answers at most this many records, and stops adding records past this many
# bytes (one record is always answered): the client reads on from Stream-Next-Offset.
PAGE_RECORDS = 500
PAGE_BYTES = 4 * 1024 * 1024
# An append body past this many bytes is prepared off the event loop (`append_body`).
OFF_LOOP_BYTES = 1024 * 1024
# SSE connections end after about this long (10.2), so that clients collapse onto new ones.
SSE_SECONDS = 60.0

NO_STORE = "no-store"
AT_THE_TAIL = "no-cache"  # may change with the next append: revalidate (ETag)
HISTORY = "private, max-age=60, stale-while-revalidate=300"
VARY = "Origin, Authorization"
TRUE = "true"

_encode = msgspec.json.Encoder().encode


# -- helpers -------------------------------------------------------------------------------------


def header(headers: RequestHeaders, name: str) -> str | None:
    """A protocol header's value (`single`)."""
    return single(name, headers.raw_values(name))


class Where(NamedTuple):
    """The stream a URL names, and whether it named its run (`…/{runID}/{streamID}`)."""

    run_id: str
    stream_id: str
    in_run: bool


def where(params: dict[str, str]) -> Where:
    run_id = params.get("run_id")
    return Where(run_id or DEFAULT_RUN, params["stream_id"], run_id is not None)


def stream_content_type(definition: StreamDefinition) -> str:
    """A native stream reads as `application/json`."""
    return definition.content_type or wire.JSON


class Origin(NamedTuple):
    """The server's own address, as the ASGI server says it answered (`scope["server"]`)."""

    scheme: str
    server: tuple[str | None, int | None] | None


def location_of(origin: Origin, at: Where) -> str:
    """The stream's URL. Its authority is the server's own address (the socket it answered
    on), never the client's Host header: a Location must not carry what a client made up."""
    stream = f"{at.run_id}/{at.stream_id}" if at.in_run else at.stream_id
    return f"{stream_root_url(None, origin.server, origin.scheme)}/{stream}"


async def offset_after(
    services: Services,
    key: StreamKey,
    definition: StreamDefinition,
    created_at: datetime | None,
    sequence: int,
) -> str:
    """The offset after `sequence` in the stream created at `created_at`: its own, or, within a
    fork's inherited prefix, the source's that minted it (its chain, read once per fork)."""
    fork = definition.fork
    if fork is None or sequence > fork.through:
        return offsets.text(created_at, sequence)
    minting = await services.durable_reads.minting(key, created_at, fork=True)
    return minting.text(sequence)


# -- PUT: create ---------------------------------------------------------------------------------

# The native fields a creation's refusal may name, as the headers that set them.
_HEADER_OF = {
    "offset": "Stream-Fork-Offset",
    "sub_offset": "Stream-Fork-Sub-Offset",
    "expiry.expires_at": "Stream-Expires-At",
    "expiry.idle_seconds": "Stream-TTL",
}


async def create(
    services: Services,
    caller: Caller,
    at: Where,
    headers: RequestHeaders,
    read_body: Callable[[], Awaitable[bytes]],
    origin: Origin,
) -> Answer:
    """PUT. The body is read (`read_body`) once the head is found good."""
    run_id, stream_id, _ = at
    create_stream = services.create_durable_stream
    create_stream.check(caller, run_id, stream_id)
    closed = wire.is_true(header(headers, "stream-closed"))
    ttl, expires = header(headers, "stream-ttl"), header(headers, "stream-expires-at")
    if ttl is not None and expires is not None:
        raise errors.InvalidInput(
            "Stream-TTL and Stream-Expires-At exclude each other: send one", field="Stream-TTL"
        )
    expiry: Expiry | None = None
    if ttl is not None:
        expiry = Expiry(idle_seconds=wire.ttl_seconds(ttl))
    elif expires is not None:
        expiry = Expiry(expires_at=wire.expires_at(expires))
    forked_from = headers.get("stream-forked-from")
    fork_offset = headers.get("stream-fork-offset")
    sub_header = headers.get("stream-fork-sub-offset")
    if forked_from is None and (fork_offset is not None or sub_header is not None):
        raise errors.InvalidInput(
            "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From",
            field="Stream-Forked-From",
        )
    sub_offset = 0
    if sub_header is not None:
        sub_offset = wire.decimal(
            "Stream-Fork-Sub-Offset", sub_header, maximum=wire.MAX_PRODUCER_INTEGER
        )
        if sub_offset > 0 and fork_offset is None:
            raise errors.InvalidInput(
                "Stream-Fork-Sub-Offset needs Stream-Fork-Offset", field="Stream-Fork-Offset"
            )
    given_type = header(headers, "content-type")
    content_type = wire.normalize_content_type(given_type) if given_type else None
    body = await read_body()
    fork = None
    if forked_from is not None:
        source_run, source_stream = wire.fork_source(forked_from, DEFAULT_RUN)
        offset = wire.parse_fork_offset(fork_offset) if fork_offset is not None else None
        fork = ForkOf(source_run, source_stream, offset, sub_offset)

    def records_of(content_type: str, redaction: Redaction) -> list[NewRecord]:
        return wire.records_for(body, content_type, creating=True, redaction=redaction)

    try:
        stream, created = await create_stream(
            caller,
            run_id,
            stream_id,
            content_type=content_type,
            default_content_type=wire.DEFAULT_CONTENT_TYPE,
            expiry=expiry,
            closed=closed,
            fork=fork,
            records_of=records_of,
        )
    except errors.DomainError as error:
        # A refusal names the header the client sent, not the native field it became.
        named = _HEADER_OF.get(error.extra.get("field", ""))
        if named is not None:
            error.extra["field"] = named
        raise
    next_offset = await offset_after(
        services,
        caller.key(run_id, stream_id),
        stream.definition,
        stream.state.created_at,
        stream.head,
    )
    answer = {
        "Content-Type": stream.definition.content_type or wire.JSON,
        "Stream-Next-Offset": next_offset,
    }
    if created:
        answer["Location"] = location_of(origin, at)
    if stream.state.closed:
        answer["Stream-Closed"] = TRUE
    return Answer(201 if created else 200, answer)


# -- POST: append, close -------------------------------------------------------------------------


# An append's protocol headers, found in one pass over the raw headers (every append reads
# them), in the order the head decides them.
_WRITE_HEADERS = ("stream-closed", "producer-id", "producer-epoch", "producer-seq", "stream-seq")
_CONTENT_TYPE = len(_WRITE_HEADERS)
_WRITE_SLOTS = {name.encode(): slot for slot, name in enumerate((*_WRITE_HEADERS, "content-type"))}
_WRITE_COUNT = len(_WRITE_SLOTS)


def single(name: str, values: list[bytes] | None) -> str | None:
    """A protocol header's value from its raw values: at most once (each says one thing: given
    twice, which one counts is ambiguous: 400, not first-wins), and ASCII (obs-text bytes would
    be stored or answered as mojibake): otherwise 400."""
    if values is None:
        return None
    if len(values) > 1:
        raise errors.InvalidInput(f"{name} may be given once", field=name)
    value = values[0]
    if not value.isascii():
        raise errors.InvalidInput(f"{name} must be ASCII text", field=name)
    return value.decode("ascii")


def producer_claim(given: list[list[bytes] | None]) -> ProducerClaim | None:
    """The claim as the headers give it (its validity is the use case's: `check_claims`).
    `given`: the append's headers as picked by `_WRITE_SLOTS`."""
    if given[1] is None and given[2] is None and given[3] is None:
        return None  # most writes
    producer_id, epoch, seq = (single(_WRITE_HEADERS[i], given[i]) for i in (1, 2, 3))
    if producer_id is None or epoch is None or seq is None:
        raise errors.InvalidInput(
            "Producer-Id, Producer-Epoch and Producer-Seq go together: all three or none",
            field="Producer-Id",
        )
    return ProducerClaim(
        producer_id=producer_id.strip(),
        epoch=wire.decimal("Producer-Epoch", epoch, maximum=wire.MAX_PRODUCER_INTEGER),
        seq=wire.decimal("Producer-Seq", seq, maximum=wire.MAX_PRODUCER_INTEGER),
    )


def writer_seq(given: list[list[bytes] | None]) -> str | None:
    """`Stream-Seq` as given, without surrounding blanks (its validity: `check_claims`)."""
    value = single("stream-seq", given[4])
    return None if value is None else value.strip()


class AppendHead(NamedTuple):
    """What an append's head decided before its body is read."""

    services: Services
    caller: Caller
    content_type: list[bytes] | None  # as given (checked once the body is read)
    key: StreamKey
    close: bool
    producer: ProducerClaim | None
    seq: str | None


async def append(
    services: Services,
    caller: Caller,
    at: Where,
    headers: RequestHeaders,
    read_body: Callable[[], Awaitable[bytes]],
) -> Answer:
    """POST: append and/or close."""
    head = append_head(services, caller, at, headers)
    return await append_body(head, await read_body())


def append_head(
    services: Services, caller: Caller, at: Where, headers: RequestHeaders
) -> AppendHead:
    """The decisions of an append that need only its head (scope, ID, protocol headers), made
    before its body is read: a refused append's body never is."""
    use_case = services.append_records
    key = use_case.writing(caller, at.run_id, at.stream_id)
    given = headers.pick(_WRITE_SLOTS, _WRITE_COUNT)
    close = given[0] is not None and wire.is_true(single("stream-closed", given[0]))
    producer = seq = None
    claimed, epoch, number, stream_seq = given[1:_CONTENT_TYPE]
    if claimed is not None or epoch is not None or number is not None or stream_seq is not None:
        producer, seq = producer_claim(given), writer_seq(given)
        use_case.check_claims(producer, seq)
    return AppendHead(services, caller, given[_CONTENT_TYPE], key, close, producer, seq)


async def append_body(head: AppendHead, body: bytes) -> Answer:
    services, caller, content_type, key, close, producer, seq = head
    use_case = services.append_records
    use_case.check_content(has_content=bool(body), close=close)
    definition = await use_case.writable(caller, key)
    records: list[NewRecord] = []
    conflict: str | None = None
    if body:
        given = single("content-type", content_type)
        if not given:
            raise errors.InvalidInput("an append with a body needs its Content-Type")
        kind = stream_content_type(definition)
        # The stream's own type as stored is the common case, and is the same type.
        if given != kind and wire.essence(wire.normalize_content_type(given)) != wire.essence(kind):
            conflict = f"the stream's content type is {kind!r}, not {given[:80]!r}"
    if body and conflict is None:
        prepare = functools.partial(
            wire.records_for,
            body,
            kind,
            creating=False,
            redaction=definition.redaction,
            input_stream=definition.direction == "input",
        )
        # A large body's messages are decoded, redacted and checked in a thread: 8 MiB of
        # small messages is 0.15-0.3 s of Python, and the event loop (every other request of
        # this process) then gets the interpreter between its slices rather than after it all.
        records = await asyncio.to_thread(prepare) if len(body) > OFF_LOOP_BYTES else prepare()
    try:
        produced = await use_case.produce_checked(
            caller,
            key,
            definition,
            records,
            producer=producer,
            writer_seq=seq,
            close=close,
            content_conflict=conflict,
        )
    except errors.StreamClosed as error:
        reads, fork = services.durable_reads, definition.fork is not None
        stream_head = error.extra.get("head")
        if stream_head is None:
            page = await reads.page(key, None, 1, fork=fork)
            return closed_answer(error, page.minting.text(page.position.head))
        # The stream's incarnation as the process knows it (no round trip).
        minting = await reads.minting(key, None, fork=fork)
        return closed_answer(error, minting.text(stream_head))
    except errors.ProducerEpochStale as error:
        return problem_answer(error, {"Producer-Epoch": str(error.extra.get("current_epoch", ""))})
    except errors.ProducerSequenceGap as error:
        return problem_answer(
            error,
            {
                "Producer-Expected-Seq": str(error.extra.get("expected_seq", "")),
                "Producer-Received-Seq": str(error.extra.get("received_seq", "")),
            },
        )
    next_offset = await offset_after(services, key, definition, produced.created_at, produced.head)
    answer = {"Stream-Next-Offset": next_offset}
    if produced.closed:
        answer["Stream-Closed"] = TRUE
    status = 204
    if producer is not None:
        if produced.producer_epoch is not None:
            answer["Producer-Epoch"] = str(produced.producer_epoch)
        if produced.producer_seq is not None:
            answer["Producer-Seq"] = str(produced.producer_seq)
        status = 200 if records and not produced.duplicate else 204
    return Answer(status, answer)


def closed_answer(error: errors.DomainError, head_offset: str) -> Answer:
    return problem_answer(error, {"Stream-Closed": TRUE, "Stream-Next-Offset": head_offset})


# -- DELETE --------------------------------------------------------------------------------------


async def erase(services: Services, caller: Caller, at: Where) -> None:
    await services.delete_stream(caller, at.run_id, at.stream_id)


# -- GET / HEAD: read ----------------------------------------------------------------------------


class ReadQuery(msgspec.Struct, frozen=True):
    cursor: Offset | None  # None: `now`
    live: str | None
    client_cursor: str | None
    # `-1` or no offset: the start of the stream, whatever retention removed (the earliest
    # record retained), where an offset this server issued, past what retention removed, is 410.
    from_start: bool = False


def read_query(query_string: bytes) -> ReadQuery:
    pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    found: dict[str, list[str]] = {}
    for name, value in pairs:
        found.setdefault(name, []).append(value)
    for name in ("offset", "live", "cursor"):
        if len(found.get(name, ())) > 1:
            raise errors.InvalidInput(f"{name} may be given once", field=name)
    offset = found.get("offset", [None])[0]
    live = found.get("live", [None])[0]
    if live not in (None, "long-poll", "sse"):
        raise errors.InvalidInput("live is long-poll or sse", field="live")
    if live is not None and offset is None:
        raise errors.InvalidInput(f"live={live} needs an offset", field="offset")
    cursor = FROM_START if offset is None else wire.parse_offset(offset)
    from_start = offset is None or offset == wire.START
    return ReadQuery(cursor, live, found.get("cursor", [None])[0], from_start)


def trimmed(records: list[StoredRecord]) -> list[StoredRecord]:
    total = 0
    for index, record in enumerate(records):
        total += record.size
        if total > PAGE_BYTES and index > 0:
            return records[:index]
    return records


def json_payload(record: StoredRecord) -> bytes:
    if record.kind == RecordKind.JSON:
        return record.payload
    return _encode(record_view(record))  # a native stream's binary or object record


def body_of(records: list[StoredRecord], content_type: str) -> bytes:
    if wire.is_json(content_type):
        return b"[" + b",".join(json_payload(r) for r in records) + b"]"
    return b"".join(r.payload for r in records)


def etag(page: Page, start: int, end: int, closed: bool) -> str:
    minted_by = f"{incarnation(page.position.created_at):x}"
    return f'"{minted_by}:{start}:{end}{":c" if closed else ""}"'


def matches(if_none_match: str | None, tag: str) -> bool:
    if if_none_match is None:
        return False
    given = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return tag in given or "*" in given


def metadata(definition: StreamDefinition, head_offset: str, closed: bool) -> dict[str, str]:
    headers = {
        "Content-Type": stream_content_type(definition),
        "Stream-Next-Offset": head_offset,
        "Cache-Control": NO_STORE,
    }
    if definition.expiry.idle_seconds is not None:
        headers["Stream-TTL"] = str(definition.expiry.idle_seconds)
    if definition.expiry.expires_at is not None:
        headers["Stream-Expires-At"] = wire.rfc3339(definition.expiry.expires_at)
    if closed:
        headers["Stream-Closed"] = TRUE
    return headers


async def read(
    services: Services,
    caller: Caller,
    at: Where,
    headers: RequestHeaders,
    query_string: bytes,
    *,
    head_only: bool,
    long_poll_seconds: float,
) -> Any:
    """GET, or HEAD (`head_only`: the metadata alone)."""
    run_id, stream_id, _ = at
    reads = services.durable_reads
    if head_only:
        key, definition = await reads.open(caller, run_id, stream_id)
        page = await reads.page(key, None, 1, fork=definition.fork is not None)
        position = page.position
        return Answer(200, metadata(definition, page.minting.text(position.head), position.closed))
    query = read_query(query_string)
    key, definition = await reads.open(caller, run_id, stream_id)
    content_type = stream_content_type(definition)
    page = await reads.page(
        key,
        query.cursor,
        PAGE_RECORDS,
        from_start=query.from_start,
        max_bytes=PAGE_BYTES,
        fork=definition.fork is not None,
    )
    # The start is the earliest record retention kept for a read from the start (or from an
    # offset another stream of this ID minted).
    cursor, minting = page.start, page.minting
    if query.live == "sse":
        start = page.position.head if cursor is None else cursor
        # Refused (429) here, before the event stream starts, past the principal's cap.
        slot = reads.hold_live(caller)
        return sse(
            slot, services, caller, key, definition, content_type, page, start, query.client_cursor
        )
    position = page.position
    start = position.head if cursor is None else cursor
    records = trimmed(page.records)
    head, closed = position.head, position.closed
    if query.live == "long-poll" and not records:
        if not (closed and start >= head):
            waited = await reads.wait(
                key,
                start,
                long_poll_seconds,
                caller=caller,
                definition=definition,
                created_at=position.created_at,
                minting=minting,
            )
            records, head, closed = trimmed(waited.records), max(waited.head, start), waited.closed
        if not records:
            answer = {"Stream-Next-Offset": minting.text(start), "Stream-Up-To-Date": TRUE}
            answer["Cache-Control"] = NO_STORE
            if closed and start >= head:
                answer["Stream-Closed"] = TRUE
            else:
                answer["Stream-Cursor"] = wire.next_cursor(query.client_cursor)
            return Answer(204, answer)
    end = records[-1].sequence if records else start
    up_to_date = end >= head
    at_the_end = closed and end >= head
    answer = {"Content-Type": content_type, "Stream-Next-Offset": minting.text(end)}
    if up_to_date:
        answer["Stream-Up-To-Date"] = TRUE
    if at_the_end:
        answer["Stream-Closed"] = TRUE
    if query.live == "long-poll" and not at_the_end:
        answer["Stream-Cursor"] = wire.next_cursor(query.client_cursor)
    if query.cursor is None:
        answer["Cache-Control"] = NO_STORE
    else:
        tag = etag(page, start, end, at_the_end)
        answer["ETag"] = tag
        answer["Cache-Control"] = AT_THE_TAIL if up_to_date else HISTORY
        # Who may read it is the token's to say: a cache keeps one copy per token (a browser
        # that reads with another token, another tenant's, asks again).
        answer["Vary"] = VARY
        if query.live is None and matches(headers.get("if-none-match"), tag):
            return Answer(304, answer)
    return Answer(200, answer, body_of(records, content_type))


# -- SSE -----------------------------------------------------------------------------------------

_LINES = re.compile(r"\r\n|\r|\n")
_SURROGATE = re.compile("[\ud800-\udfff]")


def text_charset(content_type: str) -> str:
    """The charset a `text/*` stream's bytes are read in for an SSE data event (which carries
    UTF-8 text): the content type's `charset` parameter when it names a text encoding Python
    knows, else UTF-8 (`hex` or `zlib` are codecs, not charsets: `bytes.decode` refuses them)."""
    try:
        check_media_type("content type", content_type)  # (checked when its stream was made)
    except errors.InvalidInput:
        return "utf-8"
    for name, value in media_type_parts(content_type)[1]:
        if name.lower() == "charset":
            try:
                b"a".decode(value.strip('"'), "replace")
                return codecs.lookup(value.strip('"')).name
            except (LookupError, ValueError, UnicodeError):
                return "utf-8"
    return "utf-8"


@functools.lru_cache(maxsize=256)  # content types are callers' strings: bounded
def data_encoder(content_type: str) -> Callable[[list[StoredRecord]], bytes]:
    """The data-event encoder of one content type, always the same function object, so that
    `RecordsDelivered.encoded_as` memoizes the event across the followers of a delivery."""

    charset = text_charset(content_type)

    def encode(records: list[StoredRecord]) -> bytes:
        return data_event(list(records), content_type, charset)

    return encode


def data_event(records: list[StoredRecord], content_type: str, charset: str = "utf-8") -> bytes:
    if wire.is_json(content_type):
        return b"event: data\ndata:" + body_of(records, content_type) + b"\n\n"
    payload = b"".join(r.payload for r in records)
    if not wire.is_text(content_type):
        return b"event: data\ndata:" + base64.b64encode(payload) + b"\n\n"
    # Text in the stream's charset, sent as UTF-8 (the protocol's SSE carries UTF-8 text); bytes
    # that are not text in it (a UTF-8 character split across two appends, read in two events)
    # become U+FFFD. Each line after `data:`, and after `data: ` when it begins with a space: a
    # reader strips one space after the colon, and `data:` + " x" lost it. (The conformance
    # suite reads a line that does not as `data:line`, byte for byte.)
    try:
        text = payload.decode(charset, errors="replace")
    except (LookupError, ValueError, UnicodeError):  # a codec that refuses even so (`idna`)
        text = payload.decode("utf-8", errors="replace")
    try:
        lines = _data_lines(text)
    except UnicodeEncodeError:  # a lone surrogate (utf-7 can make one): no UTF-8 text has it
        lines = _data_lines(_SURROGATE.sub("\ufffd", text))
    return b"event: data\n" + lines + b"\n"


def _data_lines(text: str) -> bytes:
    return b"".join(
        (b"data: " if line.startswith(" ") else b"data:") + line.encode() + b"\n"
        for line in _LINES.split(text)
    )


def control_event(
    end_offset: str, *, up_to_date: bool, closed: bool, client_cursor: str | None
) -> bytes:
    control: dict[str, Any] = {"streamNextOffset": end_offset}
    if closed:
        control["streamClosed"] = True
        control["upToDate"] = True
    else:
        control["streamCursor"] = wire.next_cursor(client_cursor)
        if up_to_date:
            control["upToDate"] = True
    return b"event: control\ndata:" + _encode(control) + b"\n\n"


SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
KEEP_ALIVE = b": keep-alive\n\n"


def sse(
    slot: Slot,
    services: Services,
    caller: Caller,
    key: Any,
    definition: StreamDefinition,
    content_type: str,
    first: Page,
    start: int,
    client_cursor: str | None,
) -> EventStreamResponse:
    reads = services.durable_reads

    async def events() -> AsyncGenerator[bytes, None]:
        try:
            deadline = time.monotonic() + SSE_SECONDS
            page, last, minting = first, start, first.minting
            while True:  # catch-up from the source, page by page
                position, records = page.position, trimmed(page.records)
                if not records:
                    closed = position.closed and last >= position.head
                    yield control_event(
                        minting.text(last),
                        up_to_date=True,
                        closed=closed,
                        client_cursor=client_cursor,
                    )
                    if closed:
                        return
                    break
                last = records[-1].sequence
                up_to_date = last >= position.head
                closed = position.closed and up_to_date
                yield data_encoder(content_type)(records) + control_event(
                    minting.text(last),
                    up_to_date=up_to_date,
                    closed=closed,
                    client_cursor=client_cursor,
                )
                if closed:
                    return
                if up_to_date:
                    break
                try:
                    page = await reads.page(
                        key,
                        last,
                        PAGE_RECORDS,
                        created_at=first.position.created_at,
                        max_bytes=PAGE_BYTES,
                    )
                except (
                    NotFound,
                    errors.StreamGone,
                    errors.CursorExpired,
                    errors.CursorAheadOfHead,
                ):
                    # Deleted (and perhaps created again) or overtaken by retention meanwhile:
                    # ended as a live read ends then, and the client's reconnection is told why.
                    return
            async with contextlib.aclosing(
                reads.follow(
                    key, definition, last, caller=caller, created_at=first.position.created_at
                )
            ) as follow:
                async for delivery in follow:
                    match delivery:
                        case RecordsDelivered(records=records):
                            last = records[-1].sequence
                            live = reads.live_position(key)
                            head, closed = live if live is not None else (last, False)
                            closed = closed and last >= head
                            # One delivery is shared by every follower of the stream: its data event
                            # is encoded once for all of them (the encoder is one function object
                            # per content type), and only the small control event is per follower.
                            yield delivery.encoded_as(data_encoder(content_type)) + control_event(
                                minting.text(last),
                                up_to_date=last >= head,
                                closed=closed,
                                client_cursor=client_cursor,
                            )
                            if closed:
                                return
                        case Idle():
                            yield KEEP_ALIVE
                        case StreamEnded(head=head):
                            yield control_event(
                                minting.text(max(head, last)),
                                up_to_date=True,
                                closed=True,
                                client_cursor=None,
                            )
                            return
                        case _:  # overtaken by retention, or gone: the client reconnects
                            return
                    if time.monotonic() >= deadline:
                        return
        finally:  # ended, closed, deleted, cut off by the client or by an error
            reads.release_live(caller, slot)

    headers = list(SSE_HEADERS)
    if not wire.is_text(content_type):
        headers.append((b"stream-sse-data-encoding", b"base64"))
    return EventStreamResponse(events(), headers)
