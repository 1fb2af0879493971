"""Reading a fork: its inherited prefix from the ancestors in its chain, then its own records.

A fork never copies what it inherits. Its state starts at `head = fork.through` with no record
of its own; sequences up to `through` are read from its ancestors, those after it from the fork.
Both adapters stitch here, in their `RecordReader.page`, so every reader (native reads,
long-poll waits, the live tails, the protocol) gets it without knowing forks exist.

A chain (the fork's link to its source, the source's to its own, up to the root) is immutable
while the fork exists: a linked source is never erased, and its ID not created again. So it is
resolved once and each read splits its range over it (`segments`): walking up, an ancestor
serves the sequences above its own link's `through` and up to the lowest `through` below it.
The adapter reads every segment and every ancestor's position in one go, and `stitched` puts
the page together: no recursion (a chain of 500 forks once overflowed Python's stack, a level
per ancestor), and a number of queries that does not grow with the depth. Chains are bounded
at creation (`MAX_FORK_DEPTH`), so the positions one read takes are too.

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

from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from application.errors import NotFound
from application.ports import ForkLink, Position, StoredRecord
from domain import errors
from domain.definition import Fork
from domain.state import StreamState
from domain.stream import StreamKey

__all__ = [
    "ForkLink",
    "Segment",
    "check_fork_source",
    "kept_by_forks",
    "link_of",
    "segments",
    "stitched",
]

Page = tuple[Position, list[StoredRecord]]


class Segment(NamedTuple):
    """What one read takes from an ancestor: its records with `after < sequence <= through`
    (none when `after >= through`)."""

    key: StreamKey
    after: int
    through: int


def link_of(key: StreamKey, fork: Fork) -> ForkLink:
    """The link a fork's definition names (its source is in the same tenant)."""
    return ForkLink(
        StreamKey(key.tenant, fork.run_id, fork.stream_id), fork.source_created_at, fork.through
    )


def segments(chain: Sequence[ForkLink], cursor: int, limit: int) -> list[Segment]:
    """For each ancestor in `chain` (the fork's link first), the records of the page after
    `cursor` (at most `limit`) it serves: those above its own link's `through` (0 for the root)
    and up to the lowest `through` of the links below it, within (cursor, cursor + limit]."""
    found = []
    end = min(chain[0].through, cursor + limit) if chain else 0
    for index, link in enumerate(chain):
        start = chain[index + 1].through if index + 1 < len(chain) else 0
        after = max(cursor, start)
        found.append(Segment(link.source, min(after, end), end))
        end = max(min(end, start), cursor)
    return found


def stitched(
    own: Page,
    chain: Sequence[ForkLink],
    found: Sequence[tuple[Position | None, list[StoredRecord]]],
    limit: int,
) -> Page:
    """The fork's page: `own` is its page as stored (records above its `through` only),
    `found[i]` the position and segment records of `chain[i].source` (None: no such stream).

    The chain is followed up to the first ancestor missing or of another incarnation than its
    link names (which cannot happen while the link holds it: it is read as if retention had
    taken all it held). The page's `earliest` is the fork's own where its retention went past
    its prefix; otherwise the lowest of where each ancestor's retention left its part, taken
    from the top of the chain down, each clipped to the part the stream below inherits."""
    position, own_records = own
    valid = len(chain)
    for index, link in enumerate(chain):
        found_position = found[index][0]
        if found_position is None or found_position.created_at != link.source_created_at:
            valid = index
            break
    # `inherited`: the earliest the stream below ancestor `index` sees in what it inherits.
    inherited = None
    for index in range(valid - 1, -1, -1):
        found_position = found[index][0]
        assert found_position is not None
        if index + 1 < len(chain):  # the ancestor is a fork itself
            through = chain[index + 1].through
            below = through + 1 if inherited is None else min(inherited, through + 1)
            own_earliest = found_position.earliest
            inherited = own_earliest if own_earliest > through + 1 else below
        else:  # the root
            inherited = found_position.earliest
    through = chain[0].through
    below = through + 1 if inherited is None else min(inherited, through + 1)
    earliest = position.earliest if position.earliest > through + 1 else below
    records: list[StoredRecord] = []
    for index in range(valid - 1, -1, -1):  # the root's part first: ascending sequences
        records.extend(found[index][1])
        if len(records) >= limit:
            break
    if len(records) < limit:
        records.extend(own_records)
    return msgspec.structs.replace(position, earliest=earliest), records[:limit]


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
    group, kept = set(keys), set[StreamKey]()
    changed = True
    while changed:
        changed = False
        for key in group - kept:
            if any(f not in group or f in kept for f in forks.get(key, ())):
                kept.add(key)
                changed = True
    return kept
