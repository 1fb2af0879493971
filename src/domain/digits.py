"""Decimal digits a client sent, as an integer: the one conversion every header, parameter,
cursor and path segment goes through.

Python's `int()` refuses a string of more than 4,300 digits with a `ValueError` (CVE-2020-10735's
guard), and `str.isdigit` accepts digits `int()` does not take ("²", "٣"). A pattern check
before `int()` therefore still let a long enough value through to a 500. Here the length is
compared with the maximum's before anything is converted, so the work and the answer are the
same for five digits and five million: the value, or None for anything else."""

from __future__ import annotations


def bounded_integer(text: str | bytes, maximum: int) -> int | None:
    """The integer `text` spells in ASCII digits (`0`-`9` only, leading zeros allowed, nothing
    else: no sign, space, point or exponent), if it is at most `maximum`; None otherwise.
    Callers with stricter spelling rules (no leading zero) check them first."""
    if isinstance(text, bytes):
        if not text.isdigit():  # bytes.isdigit is ASCII 0-9 only
            return None
        text = text.decode("ascii")
    elif not (text.isascii() and text.isdigit()):
        return None
    significant = text.lstrip("0")
    if len(significant) > len(str(maximum)):
        return None
    value = int(significant or "0")
    return value if value <= maximum else None
