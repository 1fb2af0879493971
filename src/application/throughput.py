"""Records and appends counted where they commit, whichever surface and way brought them.

Every record enters a stream through a command decided under the stream-row lock: an append of
either surface, an object commit (through the group commit), or the initial records of a
Durable Streams create (in the creation's own transaction). Those two places report here what
committed, so the figures on /metrics cannot miss a surface that an entrypoint forgot to count.
Counts are plain numbers kept by one event loop: no lock on the append path."""

from __future__ import annotations

from collections.abc import Sequence

from application.ports import Command, Done, Outcome
from domain.events import RecordsAppended

# Which surface a command serves and how its records enter, as class attributes of the
# commands that bring records (`surface`, `entry`); a command without them is native.
WORKFLOW_STREAMS = "workflow-streams"
DURABLE_STREAMS = "durable-streams"


class Throughput:
    """Appends (commands that appended) and records, by (surface, entry): entry is `append`,
    `create` (records given with the creation) or `object` (an object commit)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], list[int]] = {}

    def committed(self, commands: Sequence[Command], outcomes: Sequence[Outcome]) -> None:
        """A group's outcomes, as the stream port answered them (after its commit)."""
        for command, outcome in zip(commands, outcomes, strict=True):
            if type(outcome) is not Done:
                continue
            for event in outcome.events:
                if type(event) is RecordsAppended:
                    self._count(
                        getattr(command, "surface", WORKFLOW_STREAMS),
                        getattr(command, "entry", "append"),
                        event.last_sequence - event.first_sequence + 1,
                    )

    def created(self, commands: Sequence[Command]) -> None:
        """A stream was created with these commands decided in its transaction: all of them
        committed (one failing would have created nothing)."""
        for command in commands:
            if command.records:
                self._count(
                    getattr(command, "surface", WORKFLOW_STREAMS), "create", len(command.records)
                )

    def _count(self, surface: str, entry: str, records: int) -> None:
        cell = self.counts.get((surface, entry))
        if cell is None:
            cell = self.counts[surface, entry] = [0, 0]
        cell[0] += 1
        cell[1] += records

    def appends(self, surface: str | None = None) -> int:
        return sum(c[0] for (s, _), c in self.counts.items() if surface in (None, s))

    def records(self, surface: str | None = None) -> int:
        return sum(c[1] for (s, _), c in self.counts.items() if surface in (None, s))
