"""The Durable Streams wire format: offsets, cursors, header values and JSON-mode bodies."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain import offsets
from domain.definition import Redaction
from domain.errors import InvalidInput, RecordTooLarge
from domain.offsets import Offset
from domain.records import RecordInput, RecordKind, prepare_records
from entrypoints.durable_streams import wire


def test_an_offset_is_parsed_not_yet_resolved() -> None:
    assert wire.parse_offset("0000000000000000_0000000000000007") == Offset(0, 7)
    assert wire.parse_offset("1765000000000000_0000000000000007") == Offset(1765000000000000, 7)
    assert wire.parse_offset("-1") == offsets.START
    assert wire.parse_offset("now") is None


@pytest.mark.parametrize(
    "bad",
    ["", " ", "0,1", "../x", "a/..", "1", "000000000000001_0000000000000000", "x\n", "-2", "NOW"],
)
def test_anything_else_is_not_an_offset(bad: str) -> None:
    with pytest.raises(InvalidInput):
        wire.parse_offset(bad)


def test_a_cursor_is_the_interval_and_moves_past_an_echoed_one() -> None:
    now = wire.CURSOR_EPOCH + 20 * 1000 + 5
    assert wire.next_cursor(None, now) == "1000"
    assert wire.next_cursor("999", now) == "1000"
    for _ in range(50):
        assert int(wire.next_cursor("1000", now)) > 1000
        assert int(wire.next_cursor("5000", now)) > 5000
    assert wire.next_cursor("junk", now) == "1000"


@pytest.mark.parametrize("good", ["0", "1", "3600"])
def test_decimal_takes_plain_integers(good: str) -> None:
    assert wire.decimal("X", good, maximum=10**6) == int(good)


@pytest.mark.parametrize("bad", ["", "+1", "01", "1.0", "1e3", "-1", "abc", "0x10", "9" * 30])
def test_decimal_refuses_the_rest(bad: str) -> None:
    with pytest.raises(InvalidInput):
        wire.decimal("X", bad, maximum=10**6)


def test_ttl_and_expires_at() -> None:
    assert wire.ttl_seconds("60") == 60
    with pytest.raises(InvalidInput):
        wire.ttl_seconds("0")
    at = wire.expires_at("2030-01-02T03:04:05+02:00")
    assert at == datetime(2030, 1, 2, 1, 4, 5, tzinfo=UTC)
    assert wire.rfc3339(at) == "2030-01-02T01:04:05Z"
    for bad in ("not-a-timestamp", "2030-01-02", "2030-01-02T03:04:05"):
        with pytest.raises(InvalidInput):
            wire.expires_at(bad)


def test_stream_closed_is_exactly_true_in_any_case() -> None:
    assert wire.is_true("true") and wire.is_true("TRUE") and wire.is_true(" True ")
    assert not any(wire.is_true(v) for v in (None, "", "false", "yes", "1"))


def test_content_types_normalize_and_classify() -> None:
    assert wire.normalize_content_type("TEXT/Plain") == "text/plain"
    assert wire.normalize_content_type("application/JSON ;Charset=utf-8") == (
        "application/json; charset=utf-8"
    )
    assert wire.is_json("application/json; charset=utf-8")
    assert wire.is_text("text/csv") and wire.is_text("application/json")
    assert not wire.is_text("application/octet-stream")
    with pytest.raises(InvalidInput):
        wire.normalize_content_type("not a type")


@pytest.mark.parametrize(
    ("sent", "stored"),
    [
        ("application/json;", "application/json"),  # an empty parameter is none
        ("text/plain ; ; charset=utf-8 ;", "text/plain; charset=utf-8"),
        ('text/plain; x="a;b"', 'text/plain; x="a;b"'),  # a quoted value keeps its `;`
        ('text/plain;Q="a b";charset="utf-8"', 'text/plain; q="a b"; charset=utf-8'),
    ],
)
def test_a_content_type_is_stored_as_a_media_type_it_would_itself_accept(
    sent: str, stored: str
) -> None:
    """By the grammar that checks it: it was split at every `;`, so that `application/json;`
    was stored as `application/json; =`, which it would refuse, and served so ever after."""
    assert wire.normalize_content_type(sent) == stored
    assert wire.normalize_content_type(stored) == stored


def test_json_mode_flattens_exactly_one_level() -> None:
    def messages(body: bytes) -> list[bytes]:
        return [r.payload for r in wire.json_records(body, allow_empty_array=False)]

    assert messages(b'{"a": 1}') == [b'{"a":1}']
    assert messages(b"[1, [2, 3], [[4]]]") == [b"1", b"[2,3]", b"[[4]]"]
    assert wire.json_records(b" [ ] ", allow_empty_array=True) == []
    for bad in (b"[]", b"{x}", b"[1,", b"\xff", b"[" * 65 + b"]" * 65):
        with pytest.raises(InvalidInput):
            wire.json_records(bad, allow_empty_array=False)
    with pytest.raises(RecordTooLarge):
        wire.json_records(b'"' + b"x" * 70_000 + b'"', allow_empty_array=False)


def test_bytes_split_at_the_inline_limit() -> None:
    records = wire.byte_records(bytes(150_000), "x/y")
    assert [r.size for r in records] == [65_536, 65_536, 18_928]
    assert {(r.kind, r.content_type) for r in records} == {(RecordKind.BINARY, "x/y")}
    assert wire.records_for(b"", "x/y", creating=True) == []


@pytest.mark.parametrize(
    "client", ["99999999999999999999999", "1" * 5000, "000123456789012345678901", str(10**18)]
)
def test_a_cursor_at_or_past_the_interval_gets_a_greater_one_however_long(client: str) -> None:
    now = wire.CURSOR_EPOCH + 1000 * wire.CURSOR_INTERVAL_SECONDS
    answered = wire.next_cursor(client, now)
    assert answered.isdigit() and len(answered) <= len(client.lstrip("0")) + 1
    assert int(answered) > int(client) if len(client) < 4000 else len(answered) >= len(client)
    if len(client) >= 4000:  # beyond what int() parses: compared as digit strings
        assert (len(answered), answered) > (len(client), client)


@pytest.mark.parametrize("junk", ["-5", "1e9", "12a", " ", "٣"])
def test_a_cursor_that_is_no_decimal_number_gets_the_current_interval(junk: str) -> None:
    now = wire.CURSOR_EPOCH + 1000 * wire.CURSOR_INTERVAL_SECONDS
    assert wire.next_cursor(junk, now) == "1000"


@pytest.mark.parametrize(
    "value", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-00:01", "9999-12-31T23:59:59-14:00"]
)
def test_an_expiry_beyond_the_calendar_in_utc_is_invalid_input(value: str) -> None:
    with pytest.raises(InvalidInput):
        wire.expires_at(value)


def test_json_records_follow_the_stream_definitions_preparation_rules() -> None:
    from domain.definition import Redaction

    redacted = wire.records_for(
        b'[{"secret":"pw2","k":1}]',
        "application/json",
        creating=False,
        redaction=Redaction(json_pointers=("/secret",)),
    )
    assert [r.payload for r in redacted] == [b'{"secret":"[REDACTED]","k":1}']
    body = b'{"a":"x\\u0000y"}'
    assert wire.records_for(body, "application/json", creating=False)[0].payload == body
    with pytest.raises(InvalidInput):
        wire.records_for(body, "application/json", creating=False, input_stream=True)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ('application/json; charset="utf-8"', "application/json; charset=utf-8"),
        ("text/plain;CHARSET=utf-8", 'text/plain; charset="utf-8"'),
    ],
)
def test_quoted_and_unquoted_parameters_are_one_content_type(a: str, b: str) -> None:
    assert wire.normalize_content_type(a) == wire.normalize_content_type(b)


def test_a_fork_offset_is_one_the_server_issued_or_the_start() -> None:
    assert wire.parse_fork_offset("0000000000000009_0000000000000007") == Offset(9, 7)
    assert wire.parse_fork_offset("-1") == offsets.START  # the start: the fork inherits nothing
    for bad in ("now", "NOW", "", "7", "0000000000000001_000000000000000"):
        with pytest.raises(InvalidInput) as refused:
            wire.parse_fork_offset(bad)
        assert refused.value.extra["field"] == "Stream-Fork-Offset"


def test_a_fork_source_is_a_stream_path_relative_to_the_mount() -> None:
    assert wire.fork_source("/v1/stream/b1") == ("default", "b1")
    assert wire.fork_source("/v1/stream/run-1/b1") == ("run-1", "b1")


@pytest.mark.parametrize(
    "bad",
    [
        "http://evil.example/api/durable-streams/v1/stream/b1",
        "https://localhost/v1/stream/b1",
        "//evil.example/v1/stream/b1",
        "/api/durable-streams/v1/stream/b1",
        "v1/stream/b1",
        "/v1/stream/",
        "/v1/stream",
        "/v1/stream/a/b/c",
        "/v1/stream/../b1",
        "/v1/stream/run/..",
        "/v1/stream/./b1",
        "/v1/stream//b1",
        "/v1/stream/run%2Fb1",
        "/v1/stream/run%2fb1",
        "/v1/stream/b%31",
        "/v1/stream/b1?x=1",
        "/v1/stream/b1#f",
        "/v1/stream/b1/",
        "/v1/stream\\b1",
        " /v1/stream/b1",
        "/V1/stream/b1",
    ],
)
def test_anything_else_is_not_a_fork_source(bad: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        wire.fork_source(bad)
    assert refused.value.extra["field"] == "Stream-Forked-From"


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_json_values, min_size=1, max_size=20), st.sampled_from(["", " ", "\n  "]))
def test_a_json_body_becomes_the_records_the_native_append_would_store(
    values: list[object], space: str
) -> None:
    """The one-pass preparation of a JSON array (no redaction, not an input stream) stores
    exactly what `prepare_records` stores for each message, whatever the spacing."""
    body = json.dumps(values, indent=space and 1).encode()
    items = msgspec.json.decode(body, type=list[msgspec.Raw])
    general = prepare_records([RecordInput(data=item) for item in items], Redaction())
    assert wire.json_records(body, allow_empty_array=False) == general


def test_a_number_no_double_holds_is_refused_by_index_on_the_one_pass_path_too() -> None:
    for body, index in ((b"[1, 2, 1e400]", 2), (b'[{"a": 1}, -1e999]', 1)):
        with pytest.raises(InvalidInput, match=rf"records\[{index}\]"):
            wire.json_records(body, allow_empty_array=False)
    long_integer = b"[" + b"9" * 5000 + b", 1]"  # kept as is, as natively
    assert len(wire.json_records(long_integer, allow_empty_array=False)) == 2


def test_an_escaped_backslash_before_u_is_no_surrogate_escape() -> None:
    """`\\\\ud800` is a backslash and the text `ud800`: a body cut short after it is refused
    as not valid JSON, not blamed on a surrogate."""
    with pytest.raises(InvalidInput) as refused:
        wire.json_messages(b'{"a":"\\\\ud800"', allow_empty_array=False)
    assert "surrogate" not in str(refused.value)
    with pytest.raises(InvalidInput, match="surrogate"):
        wire.json_messages(b'{"a":"\\\\\\ud800"}', allow_empty_array=False)
