"""Reading a fork: its inherited prefix from the source chain, then its own records.

A fork never copies what it inherits. Its state starts at `head = fork.through` with no record
of its own; sequences up to `through` are read from the source (which may be a fork itself, so
the source's own `page` stitches in turn), those after it from the fork. Both adapters stitch
here, in their `RecordReader.page`, so every reader (native reads, long-poll waits, the live
tails, the protocol) gets it without knowing forks exist.

Retention: a fork pins the prefix it inherits. The source's retention never prunes a record
that a fork referencing it (live, or soft-deleted and kept for forks of its own) inherits: the
port reads the highest `through` of the source's links under the source's row lock, the lock a
fork's creation takes too, and `Stream.prune` keeps everything from the source's `earliest`
while that reaches it. A fork's `earliest` is still the source's where that lies within the
prefix (records retention took before the fork was created are not brought back); a read below
it is `cursor-expired` like any other. A fork's own retention going past `through` hides the
whole prefix.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import NamedTuple

import msgspec

from application.errors import NotFound
from application.ports import Position, StoredRecord
from domain import errors
from domain.definition import Fork
from domain.state import StreamState
from domain.stream import StreamKey

Page = tuple[Position, list[StoredRecord]]


class ForkLink(NamedTuple):
    """Where a fork's prefix comes from: the source (same tenant), which incarnation of it, and
    the last inherited sequence."""

    source: StreamKey
    source_created_at: datetime
    through: int


async def stitch(
    own: Page,
    link: ForkLink,
    cursor: int,
    limit: int,
    read_source: Callable[[StreamKey, int, int], Awaitable[Page | None]],
) -> Page:
    """The fork's page after `cursor`: `own` is its page as stored (records > through only)."""
    position, own_records = own
    through = link.through
    wanted = max(0, min(limit, through - cursor))
    found = await read_source(link.source, min(cursor, through), wanted)
    if found is None or found[0].created_at != link.source_created_at:
        # Cannot happen while the link holds the source; read as if retention took it all.
        inherited_earliest, inherited = through + 1, []
    else:
        source_position, source_records = found
        inherited_earliest = min(source_position.earliest, through + 1)
        inherited = [r for r in source_records if r.sequence <= through]
    earliest = position.earliest if position.earliest > through + 1 else inherited_earliest
    if cursor < through and inherited and inherited[-1].sequence < through:
        records = inherited  # the page ends inside the inherited prefix
    else:
        records = (inherited + own_records)[:limit]
    return msgspec.structs.replace(position, earliest=earliest), records


def check_fork_source(source: StreamKey, state: StreamState | None, fork: Fork) -> None:
    """What a fork's creation re-checks under its source's row lock (both adapters)."""
    if state is None or state.created_at != fork.source_created_at:
        raise NotFound(f"no stream {source.stream_id!r} in run {source.run_id!r} to fork")
    if state.soft_deleted:
        raise errors.DefinitionConflict(
            f"stream {source.stream_id!r} was deleted (only its forks keep it): it cannot be forked"
        )
    if fork.through > state.head:
        raise errors.InvalidInput(
            f"the fork point {fork.through} is past the source's head {state.head}"
        )


def kept_by_forks(keys: list[StreamKey], forks: dict[StreamKey, set[StreamKey]]) -> set[StreamKey]:
    """Of streams deleted together (a run), those a fork outside the group, or a kept one,
    still reads: they are soft-deleted, the others erased."""
    group, kept = set(keys), set()
    changed = True
    while changed:
        changed = False
        for key in group - kept:
            if any(f not in group or f in kept for f in forks.get(key, ())):
                kept.add(key)
                changed = True
    return kept
