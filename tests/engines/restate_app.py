"""A Restate service whose workflow waits for a stream's input records and writes output.

`python -m tests.engines.restate_app PORT` serves, over HTTP/2 on 127.0.0.1:PORT (hypercorn),
the workflow `Waiter`:

- `run({"stream_id", "n", "output"})` awaits the durable promises `<stream>:1` ... `<stream>:n`
  in turn and returns `[[sequence, wall time it was resolved], ...]`; with `output`, each
  record is echoed there by `restate_append` (a journaled step with its own Idempotency-Key);
- `on_record(event)`, the target of the Restate wait service (`Waiter/on_record`), resolves the
  promise its event names (`<stream_id>:<sequence>`).

With `CRASH_AFTER_APPEND=<sequence>` and the file `CRASH_FLAG` present, the process removes the
file and kills itself as soon as the service has answered the output append of that sequence,
inside the step, before Restate journals it: once the service is back, Restate retries the
invocation, the step runs again, and the append must not count twice."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import restate

from ductor_streams_client import StreamsClient
from ductor_streams_client.workflows import restate_append

waiter = restate.Workflow("Waiter")
_streams: StreamsClient | None = None


async def _crash_after_append(response: httpx.Response) -> None:
    flag, sequence = os.environ.get("CRASH_FLAG"), os.environ.get("CRASH_AFTER_APPEND")
    key = response.request.headers.get("idempotency-key", "")
    wanted = flag and sequence and key.endswith(f":output-{sequence}") and response.is_success
    if wanted and Path(flag).exists():  # noqa: ASYNC240  (a test hook, once)
        Path(flag).unlink()  # noqa: ASYNC240
        os._exit(9)  # appended, step not journaled


def streams() -> StreamsClient:
    global _streams
    if _streams is None:
        http = httpx.AsyncClient(event_hooks={"response": [_crash_after_append]})
        _streams = StreamsClient(
            os.environ["STREAMS_URL"], os.environ["STREAMS_TOKEN"], http_client=http
        )
    return _streams


def _now() -> float:
    return time.time()


@waiter.main()
async def run(ctx: restate.WorkflowContext, request: dict[str, Any]) -> list[list[float]]:
    stream_id, n, output = request["stream_id"], request["n"], request.get("output")
    got: list[list[float]] = []
    for sequence in range(1, n + 1):
        event = await ctx.promise(f"{stream_id}:{sequence}").value()
        resolved_at = await ctx.run("clock", _now)  # journaled: the same on a replay
        got.append([event["sequence"], resolved_at])
        if output:
            await restate_append(
                ctx, streams(), ctx.key(), output, [{"echo": sequence}], f"output-{sequence}"
            )
    return got


@waiter.handler()
async def on_record(ctx: restate.WorkflowSharedContext, event: dict[str, Any]) -> None:
    await ctx.promise(f"{event['stream_id']}:{event['sequence']}").resolve(event)


app = restate.app([waiter])


def main(port: int) -> None:
    import hypercorn.asyncio
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    print("restate app ready", flush=True)
    asyncio.run(hypercorn.asyncio.serve(app, config))


if __name__ == "__main__":
    main(int(sys.argv[1]))
