"""A DBOS application whose workflows wait for a stream's input records and write output.

`python -m tests.engines.dbos_app [RUN_ID STREAM_ID N [OUTPUT_STREAM]]...` launches DBOS on
`DBOS_SYSTEM_DATABASE_URL` (creating its system database), starts one workflow per argument
group (workflow id = the run ID, the default mapping of the DBOS wait service) unless it exists,
prints "dbos app ready" and runs until stopped. DBOS recovers the workflows a killed process
left pending when it launches again.

The workflow `wait_for_records` calls `DBOS.recv(stream_id)` until it has N records and returns
`[[sequence, wall time of its recv], ...]`; with an output stream, each record is echoed there
by a step that appends with the step's own Idempotency-Key (`dbos_append`). With
`CRASH_AFTER_APPEND=<sequence>` and the file `CRASH_FLAG` present, that step removes the file
and kills the process right after its append of that sequence, before DBOS records the step:
the relaunched process runs the step again, and the append must not count twice."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from dbos import DBOS, DBOSConfig, SetWorkflowID

from ductor_streams_client import SyncStreamsClient
from ductor_streams_client.workflows import dbos_append

streams = SyncStreamsClient(os.environ["STREAMS_URL"], os.environ["STREAMS_TOKEN"])


@DBOS.step()
def write_output(run_id: str, stream_id: str, sequence: int) -> int:
    answer = dbos_append(streams, run_id, stream_id, [{"echo": sequence}])
    flag = os.environ.get("CRASH_FLAG")
    if flag and os.path.exists(flag) and str(sequence) == os.environ.get("CRASH_AFTER_APPEND"):
        os.remove(flag)
        os._exit(9)  # appended, step not recorded: DBOS runs it again after the relaunch
    return answer.last_sequence


@DBOS.workflow()
def wait_for_records(stream_id: str, n: int, output_stream: str | None) -> list[list[float]]:
    got: list[list[float]] = []
    while len(got) < n:
        event = DBOS.recv(stream_id, timeout_seconds=30)
        if event is None:
            continue
        got.append([event["sequence"], time.time()])  # the wall time: for bench/engines.py only
        if output_stream:
            write_output(event["run_id"], output_stream, event["sequence"])
    return got


def main(argv: list[str]) -> None:
    config: DBOSConfig = {
        "name": "ductor-streams-test",
        "system_database_url": os.environ["DBOS_SYSTEM_DATABASE_URL"],
    }
    DBOS(config=config)
    DBOS.launch()
    groups = [argv[i : i + 4] for i in range(0, len(argv), 4)]
    for group in groups:
        run_id, stream_id, n = group[0], group[1], int(group[2])
        output = group[3] if len(group) > 3 and group[3] != "-" else None
        with SetWorkflowID(run_id):
            DBOS.start_workflow(wait_for_records, stream_id, n, output)
    print("dbos app ready", flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    stopped.wait()
    DBOS.destroy()


if __name__ == "__main__":
    main(sys.argv[1:])
