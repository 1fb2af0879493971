"""Streams from inside a durable workflow (DBOS, Restate): exactly-once output, deterministic reads.

A workflow engine runs a step again when its process died before the step's result was
recorded. An append made by that step must then not append twice, so the append carries an
`Idempotency-Key` that is the same on every run of the step: derived from the engine's
workflow (or invocation) id and the step's identity, never random. The retry is answered from
the first append's receipt, within the service's idempotency window (a day by default).

Reads are side effects too: a workflow's code must replay to the same decisions, so it reads a
stream only inside a step (DBOS) or `ctx.run` (Restate), whose result the engine records and
hands back on replay. Records are returned as plain JSON values (`journal_page`) so every
engine can record them.

DBOS, inside a step (the client is synchronous, like DBOS steps):

```python
from dbos import DBOS
from ductor_streams_client import SyncStreamsClient
from ductor_streams_client.workflows import dbos_append, journal_page

streams = SyncStreamsClient(URL, TOKEN)

@DBOS.step()
def write_answer(run_id: str, text: str) -> int:
    return dbos_append(streams, run_id, "answers", [{"text": text}]).last_sequence

@DBOS.step()
def read_page(run_id: str, cursor: int) -> dict:
    return journal_page(streams.read(run_id, "answers", cursor, wait=10))
```

Restate, in a handler (`restate_append` and `restate_read` wrap the call in `ctx.run`):

```python
answer = await restate_append(ctx, streams, run_id, "answers", [{"text": text}], "answer-1")
page = await restate_read(ctx, streams, run_id, "answers", cursor, "read-1")
```

Neither engine's package is imported until a helper of that engine is called."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import msgspec

from ductor_streams_client.client import StreamsClient
from ductor_streams_client.models import AppendAnswer, RecordsPage
from ductor_streams_client.sync import SyncStreamsClient

MAX_KEY_LENGTH = 255  # the service's limit on an Idempotency-Key


def step_idempotency_key(engine: str, workflow_id: str, step: str | int) -> str:
    """`<engine>:<workflow id>:<step>`, the same on every run of that step; a key that would be
    longer than the service allows is `<engine>:sha256:<hex digest of it>`."""
    key = f"{engine}:{workflow_id}:{step}"
    if len(key) <= MAX_KEY_LENGTH and key.isprintable():
        return key
    return f"{engine}:sha256:{hashlib.sha256(key.encode()).hexdigest()}"


def journal_page(page: RecordsPage) -> dict[str, Any]:
    """A page as plain JSON values (`records`, `next_cursor`, `head`, `earliest`, `closed`), to
    return from a step: what the engine records and replays."""
    values: dict[str, Any] = msgspec.to_builtins(page)
    return values


# -- DBOS ----------------------------------------------------------------------------------------


def dbos_step_key(label: str = "") -> str:
    """The Idempotency-Key of the DBOS step this is called in: its workflow's id and its step
    id (DBOS gives a step the same id on every run of the workflow), and `label` when one step
    appends more than once. Raises RuntimeError outside a step."""
    from dbos import DBOS

    workflow_id, step_id = DBOS.workflow_id, DBOS.step_id
    if workflow_id is None or step_id is None or DBOS.step_status is None:
        raise RuntimeError("dbos_step_key() is called inside a @DBOS.step() function only")
    return step_idempotency_key("dbos", workflow_id, f"{step_id}:{label}" if label else step_id)


def dbos_append(
    client: SyncStreamsClient,
    run_id: str,
    stream_id: str,
    records: Iterable[Any],
    *,
    label: str = "",
    content_type: str | None = None,
) -> AppendAnswer:
    """Append from inside a DBOS step, exactly once however often DBOS runs the step."""
    key = dbos_step_key(label)
    return client.append(run_id, stream_id, records, idempotency_key=key, content_type=content_type)


# -- Restate -------------------------------------------------------------------------------------


def restate_step_key(ctx: Any, name: str) -> str:
    """The Idempotency-Key of the `ctx.run(name, ...)` step of this Restate invocation: the
    invocation id (the same on every retry of it) and the step's name (unique within it)."""
    return step_idempotency_key("restate", ctx.request().id, name)


async def restate_append(
    ctx: Any,
    client: StreamsClient,
    run_id: str,
    stream_id: str,
    records: Iterable[Any],
    name: str,
    *,
    content_type: str | None = None,
) -> dict[str, Any]:
    """Append as the journaled step `name` of this invocation, exactly once however often
    Restate retries it; answers the AppendAnswer as plain JSON values."""
    key = restate_step_key(ctx, name)
    batch = list(records)

    async def append() -> dict[str, Any]:
        answer = await client.append(
            run_id, stream_id, batch, idempotency_key=key, content_type=content_type
        )
        values: dict[str, Any] = msgspec.to_builtins(answer)
        return values

    journaled: dict[str, Any] = await ctx.run(name, append)
    return journaled


async def restate_read(
    ctx: Any,
    client: StreamsClient,
    run_id: str,
    stream_id: str,
    cursor: int,
    name: str,
    *,
    limit: int = 100,
    wait: float = 0,
) -> dict[str, Any]:
    """Read one page as the journaled step `name` (see `journal_page`): a replay answers the
    page the first run read, whatever the stream holds by then."""

    async def read() -> dict[str, Any]:
        return journal_page(await client.read(run_id, stream_id, cursor, limit, wait))

    journaled: dict[str, Any] = await ctx.run(name, read)
    return journaled
