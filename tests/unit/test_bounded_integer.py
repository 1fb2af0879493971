"""`bounded_integer`: a client's decimal digits as a number, the length checked before int()
sees them (which raises ValueError past 4,300 digits), and nothing but ASCII digits taken."""

from __future__ import annotations

import pytest

from domain.digits import bounded_integer
from domain.records import redact
from entrypoints.durable_streams import wire

HUGE = "1" + "0" * 4999


@pytest.mark.parametrize(
    ("text", "maximum", "expected"),
    [
        ("0", 10, 0),
        ("10", 10, 10),
        ("11", 10, None),
        ("0000000000000000000000000000000007", 10, 7),  # leading zeros do not count as length
        (HUGE, 2**63 - 1, None),
        ("9" * 100_000, 2**63 - 1, None),
        (str(2**63 - 1), 2**63 - 1, 2**63 - 1),
        (str(2**63), 2**63 - 1, None),
        ("", 10, None),
        ("²", 10, None),  # str.isdigit takes it, int() does not
        ("٣", 10, None),  # an Arabic-Indic digit: int() would take it
        ("-1", 10, None),
        ("+1", 10, None),
        (" 1", 10, None),
        ("1_0", 100, None),  # int() takes underscores
        ("1e3", 10_000, None),
        (b"42", 100, 42),
        (b"\xb2", 100, None),
        (HUGE.encode(), 2**64 - 1, None),
    ],
)
def test_only_ascii_digits_up_to_the_maximum(text, maximum, expected) -> None:
    assert bounded_integer(text, maximum) == expected


def test_protocol_numbers_of_any_length_are_invalid_input() -> None:
    for name in ("Producer-Epoch", "Producer-Seq", "Stream-Fork-Sub-Offset"):
        with pytest.raises(wire.InvalidInput):
            wire.decimal(name, HUGE, maximum=wire.MAX_PRODUCER_INTEGER)
    with pytest.raises(wire.InvalidInput):
        wire.ttl_seconds(HUGE)
    assert wire.next_cursor(HUGE) == "1" + "0" * len(HUGE)


def test_a_pointer_index_of_any_digits_points_at_nothing() -> None:
    document = {"list": [1, 2, 3]}
    assert redact(document, [("list", HUGE), ("list", "²"), ("list", "01")]) == document
    assert redact({"list": [1, 2, 3]}, [("list", "2")]) == {"list": [1, 2, "[REDACTED]"]}
