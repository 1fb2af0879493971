"""The checks that keep bad text out of storage: JSON nesting and UTF-8, media types, control
characters (docs/http-api.md "Errors")."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain import errors
from domain.definition import DefinitionRequest, Redaction, resolve_definition
from domain.objects import ObjectRequest
from domain.records import RecordInput, prepare_records
from domain.text import check_json_text, check_media_type, check_text, has_escaped_nul
from entrypoints.http.body import MAX_JSON_DEPTH, decode_json, nests_deeper_than
from entrypoints.http.schemas import AppendBody


def depth_of(document: object) -> int:
    if isinstance(document, list):
        return 1 + max((depth_of(x) for x in document), default=0)
    if isinstance(document, dict):
        return 1 + max((depth_of(x) for x in document.values()), default=0)
    return 0


json_documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n\x00é'),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=3), children, max_size=3)
    ),
    max_leaves=40,
)


@given(json_documents, st.integers(min_value=0, max_value=12))
def test_nesting_is_measured_exactly_whatever_the_strings_hold(document, levels) -> None:
    text = json.dumps(document).encode()
    assert nests_deeper_than(text, levels) == (depth_of(document) > levels)


def body_nested(levels: int) -> bytes:
    """An append body that nests exactly `levels` deep: 3 levels are the body's own."""
    inner = levels - 3
    return b'{"records":[{"data":' + b"[" * inner + b"1" + b"]" * inner + b"}]}"


def test_a_body_nested_64_deep_is_decoded_and_65_is_refused() -> None:
    body = decode_json(body_nested(MAX_JSON_DEPTH), AppendBody)
    assert bytes(body.records[0].data).count(b"[") == MAX_JSON_DEPTH - 3  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidInput, match="deeper than 64"):
        decode_json(body_nested(MAX_JSON_DEPTH + 1), AppendBody)
    with pytest.raises(errors.InvalidInput, match="deeper than 64"):
        decode_json(body_nested(100_000), AppendBody)


def test_brackets_inside_strings_do_not_count() -> None:
    deep_looking = json.dumps({"records": [{"data": "[{" * 1000 + '\\"[' * 100}]}).encode()
    assert len(decode_json(deep_looking, AppendBody).records) == 1


@pytest.mark.parametrize(
    "raw",
    [b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x80"],
    ids=["ff-fe", "overlong-slash", "encoded-surrogate", "truncated", "lone-continuation"],
)
def test_a_body_that_is_not_utf8_is_refused(raw: bytes) -> None:
    with pytest.raises(errors.InvalidInput, match="UTF-8"):
        decode_json(b'{"records":[{"data":"a' + raw + b'b"}]}', AppendBody)


def test_utf8_beyond_ascii_is_accepted() -> None:
    body = decode_json('{"records":[{"data":"é€😀"}]}'.encode(), AppendBody)
    assert bytes(body.records[0].data) == '"é€😀"'.encode()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value",
    [
        "text/plain",
        "application/vnd.api+json",
        "text/plain; charset=utf-8",
        "text/plain;charset=utf-8;format=flowed",
        'multipart/form-data; boundary="a b;c\\"d"',
        "text/plain;",
        "*/*",
    ],
)
def test_media_types_are_accepted(value: str) -> None:
    assert check_media_type("content_type", value) == value


@pytest.mark.parametrize(
    "value",
    [
        "text/plain\x00",
        "text/plain\r\nX-Injected: 1",
        "text/plain\n",
        "text/plain; charset=\tutf-8",
        "text/plain\x7f",
        "textplain",
        "text/",
        "/plain",
        "text /plain",
        "text/plain; charset",
        "text/plain; charset=",
        'text/plain; charset="utf-8',
        "text/pläin",
        'text/plain; title="é"',
        " text/plain",
        "text/" + "p" * 251,
    ],
)
def test_values_that_are_not_media_types_are_refused(value: str) -> None:
    with pytest.raises(errors.InvalidInput, match="media type"):
        check_media_type("content_type", value)


@pytest.mark.parametrize(
    "char",
    [
        *("\x00", "\x01", "\t", "\n", "\r", "\x1b", "\x7f", "\x85", "\x9f"),
        *("\u202a", "\u202e", "\u2066", "\u2069"),  # bidirectional embedding, override, isolate
    ],
)
def test_control_characters_are_refused_in_stored_text(char: str) -> None:
    with pytest.raises(errors.InvalidInput, match="control characters"):
        check_text("reason", f"a{char}b")
    with pytest.raises(errors.InvalidInput, match="control characters"):
        check_json_text("schema", {"type": "object", "properties": {f"k{char}": {}}})
    with pytest.raises(errors.InvalidInput, match="control characters"):
        check_json_text("schema", [1, {"enum": [f"a{char}"]}])


def test_text_with_printable_unicode_is_accepted() -> None:
    assert check_text("reason", "audit — Ünïcode 😀 “quoted”") == "audit — Ünïcode 😀 “quoted”"
    # Right-to-left text and its marks, and a joined emoji, are text, not controls.
    assert check_text("reason", "שלום\u200f 👩\u200d💻") == "שלום\u200f 👩\u200d💻"
    assert check_json_text("schema", {"a": [1, None, True, "ok"]}) == {"a": [1, None, True, "ok"]}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (rb'"\u0000"', True),
        (rb'{"a\u0000":1}', True),
        (rb'"\\\u0000"', True),  # an escaped backslash, then U+0000
        (rb'"\\u0000"', False),  # a backslash, then the text u0000
        (rb'"\\\\u0000"', False),
        (rb'"\u00000"', True),
        (rb'"\u0001"', False),
        (b'"u0000"', False),
    ],
)
def test_an_escaped_nul_is_found_exactly(text: bytes, expected: bool) -> None:
    assert has_escaped_nul(text) is expected


def records(body: bytes) -> list[RecordInput]:
    return msgspec.json.decode(body, type=list[RecordInput])


def test_an_input_streams_record_may_not_hold_nul_but_an_output_streams_may() -> None:
    nul = records(rb'[{"data": 1}, {"data": {"k": "a\u0000b"}}]')
    assert len(prepare_records(nul, Redaction())) == 2
    with pytest.raises(errors.InvalidInput, match=r"records\[1\].data holds U\+0000"):
        prepare_records(nul, Redaction(), input_stream=True)
    redacted = records(rb'[{"data": {"secret": "a\u0000b", "k": 1}}]')
    [record] = prepare_records(redacted, Redaction(json_pointers=("/secret",)), input_stream=True)
    assert record.payload == b'{"secret":"[REDACTED]","k":1}'
    literal = records(rb'[{"data": "\\u0000"}]')
    assert len(prepare_records(literal, Redaction(), input_stream=True)) == 1


def test_an_input_streams_record_may_not_hold_an_integer_python_cannot_decode() -> None:
    """Over 4,300 digits an integer is kept on an output stream (clients read its JSON text),
    and refused on an input stream, whose wait service must decode it; one digit fewer is
    kept on both."""
    body = b'[{"data": 1}, {"data": {"n": ' + b"1" * 4301 + b"}}]"
    assert len(prepare_records(records(body), Redaction())) == 2
    with pytest.raises(errors.InvalidInput, match=r"records\[1\].data holds an integer of over"):
        prepare_records(records(body), Redaction(), input_stream=True)
    fits = b'[{"data": ' + b"1" * 4300 + b"}]"
    assert len(prepare_records(records(fits), Redaction(), input_stream=True)) == 1
    overflow = b'[{"data": 1e400}]'
    with pytest.raises(errors.InvalidInput, match="no IEEE double"):
        prepare_records(records(overflow), Redaction(), input_stream=True)


def test_a_records_content_type_must_be_a_media_type() -> None:
    bad = records(b'[{"data": 1}, {"data": 2, "content_type": "text/plain\\r\\nX: y"}]')
    with pytest.raises(errors.InvalidInput, match=r"records\[1\].content_type must be a media"):
        prepare_records(bad, Redaction())
    good = records(b'[{"data": 1, "content_type": "application/json; charset=utf-8"}]')
    assert prepare_records(good, Redaction())[0].content_type == "application/json; charset=utf-8"


SHA = "0" * 64


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"idempotency_key": "k\x00"}, "idempotency_key must not contain control"),
        ({"idempotency_key": "k\n"}, "idempotency_key must not contain control"),
        ({"content_type": "a/b\x00"}, "content_type must be a media type"),
        ({"content_type": "a/b\r\nx: y"}, "content_type must be a media type"),
        ({"content_type": "nonsense"}, "content_type must be a media type"),
        ({"schema": {"title": "a\x00"}}, "schema must not contain control"),
        ({"sha256": SHA + "\n"}, "Expected `str` matching regex"),
    ],
)
def test_a_prepare_body_with_bad_text_is_refused(fields: dict, message: str) -> None:
    body = {"idempotency_key": "k", "size": 1, "sha256": SHA, **fields}
    with pytest.raises(msgspec.ValidationError, match=message):
        msgspec.json.decode(msgspec.json.encode(body), type=ObjectRequest)


def definition(**fields: object) -> DefinitionRequest:
    return msgspec.json.decode(
        msgspec.json.encode({"direction": "output", **fields}), type=DefinitionRequest
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"schema": {"a": "\x00"}}, "schema must not contain control"),
        ({"authorization": {"readers": ["al\x00ice"]}}, "authorization.readers must not"),
        ({"authorization": {"writers": ["bob\n"]}}, "authorization.writers must not"),
        ({"redaction": {"json_pointers": ["/a\x00"]}}, "redaction.json_pointers must not"),
    ],
)
def test_a_definition_with_control_characters_is_refused(fields: dict, message: str) -> None:
    with pytest.raises(errors.InvalidInput, match=message):
        resolve_definition(definition(**fields), region="local", egress_region="local")


def test_a_region_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError, match="regex"):
        definition(placement={"object_regions": ["local\n"]})


@pytest.mark.parametrize("repeats", [16, 84])
def test_runs_of_spaces_and_semicolons_are_decided_at_once(repeats: int) -> None:
    """Spaces between semicolons once split in exponentially many ways: 16 repeats took two
    seconds, 84 (a whole 255-character value) would never have ended."""
    value = ("a/b" + "  ;" * repeats)[:254] + "!"
    with pytest.raises(errors.InvalidInput, match="media type"):
        check_media_type("content_type", value)
    assert check_media_type("content_type", "a/b" + "  ;" * 20) == "a/b" + "  ;" * 20


@pytest.mark.parametrize("escape", [b"\\ud800", b"\\udc00x", b"\\ud800\\u0041"])
def test_a_lone_surrogate_escape_is_refused_saying_so(escape: bytes) -> None:
    """msgspec refuses it as "Input data was truncated", which says nothing of why; a pair,
    and an escaped backslash before `ud800` (text), are taken."""
    with pytest.raises(errors.InvalidInput, match="surrogate pair"):
        decode_json(b'{"records":[{"data":"' + escape + b'"}]}', AppendBody)
    pair = decode_json(b'{"records":[{"data":"\\ud83d\\ude00"}]}', AppendBody)
    assert len(pair.records) == 1
    text = decode_json(b'{"records":[{"data":"\\\\ud800"}]}', AppendBody)
    assert len(text.records) == 1
