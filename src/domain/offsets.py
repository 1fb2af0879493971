"""Durable Streams offsets: which incarnation of a stream minted a position, and the position.

An offset is two fixed-width decimal fields, `IIIIIIIIIIIIIIII_NNNNNNNNNNNNNNNN`: the creation
time (microseconds since the Unix epoch) of the stream that minted it, then the native sequence
N it stands after (16 digits each, so byte-wise order is numeric order within a stream).

A stream deleted and created again under the same ID is another stream. Its offsets carry its
own creation time, so an offset a client kept from the deleted one is told apart: a read from it
starts at the new stream's start (the foreign offset sorts before every offset the new stream
mints, and the protocol promises nothing more for an offset a stream did not issue) instead of
in the middle of the new stream, which would have skipped its first records without a word.

A fork's positions up to its fork point are its source's (the protocol's offsets section: "offsets
identical to the source up to the divergence point"): they carry the creation time of the
stream in its chain that minted them, its own positions after the fork point its own.

Offsets minted before the incarnation was written in carry sixteen zeros there; they are still
taken, as the position they name in whatever stream now has the ID (what they always meant)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import NamedTuple

from domain.digits import bounded_integer

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_OFFSET = re.compile(r"([0-9]{16})_([0-9]{16})")
UNSTATED = 0  # the incarnation of an offset minted before it was written in


@functools.lru_cache(maxsize=4096)  # each append states its stream's: a hot few at a time
def incarnation(created_at: datetime | None) -> int:
    """A stream's incarnation: its creation time in microseconds since the epoch (0 unknown)."""
    if created_at is None:
        return UNSTATED
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    delta = created_at - _EPOCH
    return max(0, (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)


class Offset(NamedTuple):
    """An offset as a client gave it: the incarnation that minted it, and its sequence."""

    minted_by: int
    sequence: int


START = Offset(UNSTATED, 0)


def parse(text: str) -> Offset | None:
    """The offset `text` spells, or None when it is no offset this server mints."""
    match = _OFFSET.fullmatch(text)
    if match is None:
        return None
    minted_by = bounded_integer(match.group(1), 10**16)
    sequence = bounded_integer(match.group(2), 10**16)
    assert minted_by is not None and sequence is not None  # 16 digits each
    return Offset(minted_by, sequence)


class Minting:
    """The offsets of one stream: its own incarnation, and for a fork the incarnations that
    minted its inherited positions, nearest source first (each with its fork point)."""

    __slots__ = ("_inherited", "_own")

    def __init__(
        self, created_at: datetime | None = None, chain: Iterable[tuple[datetime, int]] = ()
    ) -> None:
        self._own = incarnation(created_at)
        # chain: (source's creation time, the fork point), from the stream's own link up to
        # the root's first fork; positions up to a link's fork point are its source's (or a
        # deeper source's, when they are within the next link's fork point too).
        self._inherited = (
            tuple((through, incarnation(at)) for at, through in chain) if chain else ()
        )

    @property
    def own(self) -> int:
        """The stream's own incarnation (UNSTATED: not known)."""
        return self._own

    def minter(self, sequence: int) -> int:
        """The incarnation that minted the position after `sequence`."""
        minted_by = self._own
        for through, source in self._inherited:
            if sequence > through:
                break
            minted_by = source
        return minted_by

    def text(self, sequence: int) -> str:
        return spelled(self.minter(sequence), sequence)

    def resolve(self, offset: Offset) -> int | None:
        """The sequence `offset` names in this stream; None when another stream minted it (one
        deleted since, whose ID this stream now has, or another stream altogether).

        The stream's own incarnation is taken for any of its positions, inherited ones too
        (no other stream has it: a wake states a fork's positions so, where its chain is not
        at hand); an offset that states none is taken as it always was; and a stream whose
        own is not known takes every offset, as before incarnations were stated."""
        minted_by, sequence = offset
        own = self._own
        if own == UNSTATED or minted_by in (UNSTATED, own) or minted_by == self.minter(sequence):
            return sequence
        return None


def text(created_at: datetime | None, sequence: int) -> str:
    """The offset after `sequence` that a stream created at `created_at` mints itself (one
    that is no fork, or any stream past its fork point): `Minting(created_at).text(sequence)`."""
    return spelled(incarnation(created_at), sequence)


def spelled(minted_by: int, sequence: int) -> str:
    """The offset after `sequence` that the incarnation `minted_by` mints: the one place the
    format is written (`parse` reads it)."""
    return f"{minted_by:016d}_{sequence:016d}"
