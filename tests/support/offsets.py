"""Offsets as a test expects them: a position, minted with its stream's incarnation stated
(domain/offsets.py), whatever the stream's creation time was."""

from __future__ import annotations

import re

_MINTED = re.compile(r"([0-9]{16})_([0-9]{16})")


class At:
    """Equal to an offset the server minted after sequence `n`, its incarnation stated (and, when
    `of` is given, the same incarnation as that offset's)."""

    def __init__(self, n: int, of: str | None = None) -> None:
        self.n = n
        self.of = of

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, str) or (match := _MINTED.fullmatch(other)) is None:
            return False
        incarnation, position = match.groups()
        if self.of is not None and incarnation != self.of[:16]:
            return False
        return int(incarnation) != 0 and int(position) == self.n

    def __hash__(self) -> int:
        return hash(self.n)

    def __repr__(self) -> str:
        return f"<an offset after {self.n}>"


def position(offset: str) -> int:
    """The sequence an offset stands after."""
    match = _MINTED.fullmatch(offset)
    assert match is not None, offset
    return int(match.group(2))
