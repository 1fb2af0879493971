"""What the windows of `python -m bench` send: the run and its streams' path, the batch size,
and the ~100-byte JSON record every append measurement repeats."""

from __future__ import annotations

import json

RUN_ID = "bench"
BATCH = 1_000
PREFIX = f"/api/workflow-streams/runs/{RUN_ID}/streams"


def record(i: int, size: int = 100) -> dict[str, object]:
    """A JSON record whose compact encoding is exactly `size` bytes."""
    head = {"i": i, "kind": "token", "text": ""}
    pad = size - len(json.dumps(head, separators=(",", ":")))
    head["text"] = "x" * pad
    return head


def compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
