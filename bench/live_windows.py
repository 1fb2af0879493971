"""The live windows of `python -m bench`, against the running server: (5) SSE fan-out, (6) idle
SSE connections, (7) catch-up reads (with py-spy on the server under --profile-catchup),
(8) objects and (9) input dispatch. Each sets its stream up and hands over to the module that
measures it: bench/live.py for (5)-(7), bench/objects.py for (8), bench/dispatch.py for (9)."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

from bench import database, live, profile
from bench import dispatch as dispatching
from bench import objects as uploads
from bench.payloads import BATCH, PREFIX, RUN_ID, compact, record
from bench.server import tree_cpu, tree_memory

if TYPE_CHECKING:
    from bench.orchestrator import Bench

# -- live delivery (5-7) -------------------------------------------------------------------------


def fanout(bench: Bench) -> list[live.Fanout]:
    a = bench.args

    def counts():  # an awaitable for live.fanout
        return database.statement_counts(bench.url)

    runs = []
    for n in sorted({min(10, a.subscribers), a.subscribers}):
        stream = f"fanout-{n}"
        bench.server.create_stream(RUN_ID, stream)
        print(f"  {n} subscribers ...", flush=True)
        runs.append(
            live.fanout(
                bench.server.port,
                bench.token,
                PREFIX,
                stream,
                subscribers=n,
                processes=1 if n <= 10 else a.subscriber_processes,
                rate=a.fanout_rate,
                duration=a.duration,
                warmup=a.warmup,
                counts=counts,
                meter=bench.meter(),
            )
        )
    return runs


def idle(bench: Bench) -> live.Idle:
    bench.server.create_stream(RUN_ID, "idle")
    return live.idle(
        bench.server.port,
        bench.token,
        PREFIX,
        "idle",
        connections=bench.args.subscribers,
        processes=bench.args.subscriber_processes,
        hold=min(bench.args.duration, 5.0),
        memory=lambda: tree_memory(bench.server.pid),
    )


def catchup(bench: Bench) -> live.Catchup:
    bench.server.create_stream(RUN_ID, "catchup")
    body = compact({"records": [{"data": record(i)} for i in range(BATCH)]})
    print(f"  filling {bench.args.catchup_records:,} records ...", flush=True)
    return live.catchup(
        bench.server.port,
        bench.token,
        PREFIX,
        "catchup",
        records=bench.args.catchup_records // BATCH * BATCH,
        batch_body=body,
        batch=BATCH,
        fill_clients=bench.args.batch_clients,
        timeout=300,
        meter=bench.meter(),
        floor=lambda result, meter: live.read_floor(
            bench.url, database.TENANT, RUN_ID, "catchup", result.records, 300, result, meter
        ),
        spy=(lambda name: _catchup_spy(bench, name)) if bench.args.profile_catchup else None,
    )


def _catchup_spy(bench: Bench, name: str):
    """py-spy on the server while catch-up reader `name` runs; the stop function ends it
    (SIGINT: py-spy writes what it sampled) and keeps its summary."""
    raw = bench.tmp / f"profile-{name}.txt"
    spy = profile.start(bench.server.pid, 600, raw, native=bench.args.profile_native)
    time.sleep(1)  # py-spy attaches before the reader starts

    def stop() -> None:
        spy.send_signal(signal.SIGINT)
        summary = profile.finish(spy, raw, f"ductor-bench-profile-{name}.txt")
        if summary is not None:
            bench.catchup_profiles[name] = summary

    return stop


# -- objects (8) and input dispatch (9) ----------------------------------------------------------


def objects(bench: Bench) -> uploads.Objects:
    bench.server.create_stream(RUN_ID, "objects")
    roots = {"server": bench.server.pid, "postgres": bench.pg_pid}
    return uploads.run(
        bench.server.port,
        bench.token,
        PREFIX,
        "objects",
        server_pid=bench.server.pid,
        size=bench.args.object_size,
        uploads=bench.args.object_uploads,
        cpu=lambda: {**tree_cpu(roots), "client": time.process_time()},
    )


def dispatch(bench: Bench) -> list[dispatching.Dispatch]:
    a = bench.args
    runs = []
    for service in a.wait_services:
        print(f"  wait service {service} ...", flush=True)
        runs.append(
            dispatching.measure(
                service,
                url=bench.url,
                port=bench.server.port,
                token=bench.token,
                prefix=PREFIX,
                run_id=RUN_ID,
                create_stream=lambda s: bench.server.create_stream(RUN_ID, s, "input"),
                data_dir=bench.tmp / "data",
                log=bench.tmp / "worker.log",
                pids={"server": bench.server.pid, "postgres": bench.pg_pid},
                records=a.dispatch_records,
                batch=BATCH,
                rate=a.dispatch_rate,
                duration=a.duration,
                warmup=a.warmup,
                poll_seconds=0.05,
                timeout=a.dispatch_timeout,
            )
        )
    return runs
