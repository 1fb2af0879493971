"""DUCTOR_STREAMS_SNAPSHOT_EVERY_EVENTS and DUCTOR_STREAMS_COMPACTION_BATCH_EVENTS: 1,000 each by
default, whole numbers of 1 or more, and what the wired streams port snapshots by."""

from __future__ import annotations

import pytest

from domain.events import StreamSnapshotted
from entrypoints.config import InvalidSetting, Settings
from entrypoints.container import memory_container
from tests.support.builders import NOW, append, definition, new_key


def test_both_are_a_thousand_by_default_and_may_be_set() -> None:
    default = Settings.from_env({})
    assert (default.snapshot_every_events, default.compaction_batch_events) == (1000, 1000)
    given = Settings.from_env(
        {
            "DUCTOR_STREAMS_SNAPSHOT_EVERY_EVENTS": "7",
            "DUCTOR_STREAMS_COMPACTION_BATCH_EVENTS": "50",
        }
    )
    assert (given.snapshot_every_events, given.compaction_batch_events) == (7, 50)


@pytest.mark.parametrize("name", ["SNAPSHOT_EVERY_EVENTS", "COMPACTION_BATCH_EVENTS"])
@pytest.mark.parametrize("value", ["0", "-5", "1.5", "often"])
def test_a_value_that_is_not_a_positive_whole_number_stops_the_process_naming_it(
    name: str, value: str
) -> None:
    with pytest.raises(InvalidSetting, match=f"DUCTOR_STREAMS_{name}"):
        Settings.from_env({f"DUCTOR_STREAMS_{name}": value})


async def test_the_wired_streams_port_snapshots_at_the_setting() -> None:
    container = memory_container(Settings(snapshot_every_events=3))
    streams, key = container.streams(), new_key()
    await streams.create(key, definition(), NOW)
    for _ in range(2):
        await streams.update(key, [append()])
    [snapshot] = await streams.journal(key)  # created, two appends: version 3, then the snapshot
    assert isinstance(snapshot, StreamSnapshotted) and snapshot.version == 4
