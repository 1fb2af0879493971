"""Text a caller chooses and the service stores: media types, keys, names, reasons, schemas.

PostgreSQL text cannot hold U+0000, an HTTP header cannot carry a control character, and a
stored value is presented again to every later reader: so such text is checked before anything
is stored, and refused as `invalid-input`."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from domain.errors import InvalidInput

# Unicode category Cc: C0 (including tab, CR and LF), DEL and C1; and the bidirectional
# embedding, override and isolate controls (U+202A-U+202E, U+2066-U+2069), which reorder the
# text shown after them (a reason that reverses the date beside it in a page).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

# RFC 9110 §8.3.1: type "/" subtype *( OWS ";" OWS [ parameter ] ), a parameter's value a token
# or a quoted-string. Narrowed to printable ASCII: no tab (in OWS or a quoted-string) and no
# obs-text, since the value becomes a Content-Type header again when a body is downloaded.
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[ !#-\[\]-~]|\\[ -~])*"'
# The spaces around a `;` are taken possessively (`*+`): with plain `*`, a run of spaces between
# semicolons could be split between one parameter's trailing spaces and the next one's leading
# spaces in exponentially many ways, and a 60-character value held the process for seconds.
# Possessive, the spaces go to the `;` before them, which accepts the same values. (The document
# states the plain form: a JSON Schema pattern has no possessive quantifiers.)
_PARAMETERS = rf"(?: *; *(?:{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))?)*"
_MEDIA_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}(?: *+; *+(?:{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))?)*+")
_ESSENCE = re.compile(rf"{_TOKEN}/{_TOKEN}")
_PARAMETER = re.compile(rf" *; *(?:({_TOKEN})=({_TOKEN}|{_QUOTED}))?")
MAX_MEDIA_TYPE_CHARS = 255

# The same rules for the OpenAPI document, as field annotations that only document: the checks
# here still decide, and answer with their own details.
TEXT_CHARACTER = f"[^{_CONTROL.pattern[1:-1]}]"
TEXT_PATTERN = f"^{TEXT_CHARACTER}*$"
DOCUMENTED_TEXT = msgspec.Meta(extra_json_schema={"pattern": TEXT_PATTERN})
DOCUMENTED_MEDIA_TYPE = msgspec.Meta(
    extra_json_schema={
        "pattern": f"^(?:{_TOKEN}/{_TOKEN}{_PARAMETERS})$",
        "maxLength": MAX_MEDIA_TYPE_CHARS,
    }
)
JSON_TEXT = "JsonText"  # the document's schema of a JSON value without control characters
DOCUMENTED_JSON_TEXT = msgspec.Meta(extra_json_schema={"$ref": f"#/components/schemas/{JSON_TEXT}"})

# JSON text with an escaped U+0000 (an odd run of backslashes before "u0000").
_ESCAPED_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def has_control_character(value: str) -> bool:
    return _CONTROL.search(value) is not None


def check_text(field: str, value: str) -> str:
    """A stored name, key or reason: no control character."""
    if _CONTROL.search(value) is not None:
        raise InvalidInput(
            f"{field} must not contain control characters (nor the bidirectional controls "
            "U+202A-U+202E and U+2066-U+2069)",
            field=field,
        )
    return value


def check_media_type(field: str, value: str) -> str:
    """A content type: an RFC 9110 media type (`type/subtype[; name=value]...`)."""
    if len(value) > MAX_MEDIA_TYPE_CHARS or _MEDIA_TYPE.fullmatch(value) is None:
        raise InvalidInput(
            f"{field} must be a media type such as 'text/plain; charset=utf-8' "
            f"(RFC 9110: type/subtype with optional ; name=value parameters, printable ASCII, "
            f"at most {MAX_MEDIA_TYPE_CHARS} characters)",
            field=field,
        )
    return value


def media_type_parts(value: str) -> tuple[str, list[tuple[str, str]]]:
    """A media type that `check_media_type` accepts, as its `type/subtype` and its parameters'
    names and values, in order, by the same grammar: an empty parameter (`text/plain;`) is
    none, and a quoted value keeps its `;` (`x="a;b"`) and its quotes."""
    head = _ESSENCE.match(value)
    assert head is not None, value  # (checked)
    parameters = [
        (m.group(1), m.group(2))
        for m in _PARAMETER.finditer(value, head.end())
        if m.group(1) is not None
    ]
    return head.group(), parameters


def check_json_text(field: str, document: Any) -> Any:
    """A decoded JSON document the service stores (a schema): no control character in any
    string or object key."""
    pending = [document]
    while pending:
        node = pending.pop()
        if isinstance(node, str):
            check_text(field, node)
        elif isinstance(node, dict):
            for key, value in node.items():
                check_text(field, key)
                pending.append(value)
        elif isinstance(node, list):
            pending.extend(node)
    return document


def check_json_size(field: str, document: Any, limit: int) -> Any:
    """A decoded JSON document the service stores and serves again (a schema): at most `limit`
    bytes as compact JSON, so that what every read, cache and commit carries stays bounded."""
    if document is not None and len(msgspec.json.encode(document)) > limit:
        raise InvalidInput(f"{field}: at most {limit} bytes as compact JSON", field=field)
    return document


def has_escaped_nul(json_text: bytes) -> bool:
    """Whether compact JSON text carries U+0000 in a string (JSON text cannot hold it raw)."""
    return b"\\u0000" in json_text and _ESCAPED_NUL.search(json_text) is not None
