"""The fast records' JSON (application.views.RecordsEncoder, StoredPage.json, the SSE frames)
writes exactly the bytes msgspec writes for the views it stands in for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import msgspec
import pytest

from application.fork_reads import ForkLink, segments, stitched
from application.ports import Position, StoredRecord
from application.views import RecordsEncoder, StoredPage, record_view, records_json
from domain.definition import Redaction
from domain.records import RecordInput, RecordKind, prepare_records
from domain.stream import StreamKey
from entrypoints.sse.events import records_frame

encode = msgspec.json.encode
AT = datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)


NO_REDACTION = Redaction()


def stored(*inputs: RecordInput, redaction: Redaction = NO_REDACTION, first: int = 1):
    """Records as an append stores them (compact, redacted), numbered from `first`."""
    prepared = prepare_records(list(inputs), redaction)
    return [
        StoredRecord(first + i, AT, r.kind, r.content_type, r.size, r.payload)
        for i, r in enumerate(prepared)
    ]


def raw(text: str) -> msgspec.Raw:
    return msgspec.Raw(text.encode())


EVERY_KIND = [
    *stored(
        RecordInput(data=raw('{"i": 1, "text": "caf\\u00e9 \\"quoted\\" \\\\ /"}')),
        RecordInput(data=raw('"\\u0000 nul, \\u2028 and emoji \\ud83d\\ude00"')),
        RecordInput(data=raw("[1, 2.5, -3e10, true, false, null]")),
        RecordInput(data=raw("{}"), content_type="application/vnd.x+json; charset=utf-8"),
        RecordInput(data_base64="AAECA/7/+w=="),  # bytes whose base64 has + / and =
        RecordInput(data_base64="", content_type='text/plain; name="a b"'),
        RecordInput(data_base64="//79/A=="),
    ),
    # Not a type an append takes today, but the encoder escapes whatever it is given.
    StoredRecord(8, AT, RecordKind.BINARY, 'image/x-"odd"\\type ü\n', 1, b"\xff"),
    StoredRecord(
        9,
        AT,
        RecordKind.OBJECT,
        "application/octet-stream",
        33_554_432,
        b'{"object_id":"o1","sha256":"ab","content_type":"text/plain"}',
    ),
]

TIMES = [
    AT,
    AT.replace(microsecond=0),  # no fraction
    datetime(2000, 1, 1, tzinfo=UTC),
    datetime(1, 1, 1, tzinfo=UTC),
    AT.astimezone(timezone(timedelta(hours=2))),  # equal to AT, encoded with its offset
    AT.astimezone(timezone(timedelta(hours=-9, minutes=-30))),
    datetime.max,  # what asyncpg reads 'infinity' as: naive
    datetime.min,
]


def views_json(records: list[StoredRecord]) -> list[bytes]:
    return [encode(record_view(r)) for r in records]


def test_every_kind_as_its_view() -> None:
    assert records_json(EVERY_KIND) == views_json(EVERY_KIND)


def test_redacted_records_as_their_views() -> None:
    records = stored(
        RecordInput(data=raw('{"user": {"token": "secret", "name": "a"}, "keep": [1]}')),
        RecordInput(data=raw('{"user": {"name": "b"}}')),
        redaction=Redaction(json_pointers=("/user/token", "/keep/0")),
    )
    assert b"secret" not in b"".join(r.payload for r in records)
    assert records_json(records) == views_json(records)


@pytest.mark.parametrize("at", TIMES, ids=repr)
def test_every_time_as_its_view(at: datetime) -> None:
    records = [msgspec.structs.replace(r, appended_at=at) for r in EVERY_KIND]
    assert records_json(records) == views_json(records)


def test_equal_times_in_other_zones_are_not_confused() -> None:
    """A UTC time memoized first does not stand in for the same instant elsewhere."""
    for at in (AT, AT.astimezone(timezone(timedelta(hours=2))), AT):
        records = [msgspec.structs.replace(r, appended_at=at) for r in EVERY_KIND[:2]]
        assert records_json(records) == views_json(records)


def test_many_distinct_times_and_types() -> None:
    """Past the memo's bound it starts again, and still answers the same bytes."""
    records = [
        StoredRecord(i, AT + timedelta(microseconds=i), RecordKind.JSON, f"a/b{i % 5000}", 2, b"{}")
        for i in range(1, 10_001)
    ]
    assert records_json(records) == views_json(records)


def test_a_plain_int_kind_is_its_kind() -> None:
    records = [msgspec.structs.replace(r, kind=int(r.kind)) for r in EVERY_KIND]
    assert records_json(records) == views_json(EVERY_KIND)


@pytest.mark.parametrize("closed", [False, True])
def test_page_json_is_the_records_page(closed: bool) -> None:
    for records in (EVERY_KIND, EVERY_KIND[:1], []):
        page = StoredPage(
            records=records,
            next_cursor=records[-1].sequence if records else 5,
            head=2**63 - 1,
            earliest=0,
            closed=closed,
        )
        assert page.json() == encode(page.view())


def test_sse_frames_are_one_event_per_view() -> None:
    expected = b"".join(
        b"id: %d\nevent: record\ndata: %s\n\n" % (r.sequence, encode(record_view(r)))
        for r in EVERY_KIND
    )
    assert records_frame(EVERY_KIND) == expected
    assert records_frame([]) == b""


def test_before_and_after_are_taken_as_they_are() -> None:
    encoder = RecordsEncoder(b"<", b"%s %d>")
    assert encoder(EVERY_KIND[:1]) == [b"<" + encode(record_view(EVERY_KIND[0])) + b"%s %d>"]


def test_a_stitched_fork_page_as_its_views() -> None:
    """A fork's page (its source's records, then its own) encodes as its views do."""
    source = EVERY_KIND[:4]
    own = [msgspec.structs.replace(r, sequence=5 + i) for i, r in enumerate(EVERY_KIND[4:])]

    chain = [ForkLink(StreamKey("default", "run", "source"), AT, 4)]
    [segment] = segments(chain, 2, 100)
    found = [
        (
            Position(head=4, earliest=1, closed=False, created_at=AT),
            [r for r in source if segment.after < r.sequence <= segment.through],
        )
    ]
    position, records = stitched(
        (Position(head=9, earliest=5, closed=False), own), chain, found, 100
    )
    assert [r.sequence for r in records] == [3, 4, 5, 6, 7, 8, 9]
    page = StoredPage(records, records[-1].sequence, position.head, position.earliest, False)
    assert page.json() == encode(page.view())
