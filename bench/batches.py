"""The batch windows of `python -m bench`: (4) HTTP appends of 1,000 x ~100-byte records per
request, and (4b) the raw asyncpg COPY of the same 1,000-row batches (4) is compared to."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from bench import database
from bench.appends import group_note, http_window
from bench.database import Measurement
from bench.payloads import BATCH, PREFIX, RUN_ID, compact, record
from bench.server import CpuMeter

if TYPE_CHECKING:
    from bench.orchestrator import Bench


def batch(bench: Bench) -> Measurement:
    body = compact({"records": [{"data": record(i)} for i in range(BATCH)]})
    result = http_window(
        bench,
        "batch",
        f"(4) HTTP append, {BATCH} x 100 B/request",
        "POST",
        f"{PREFIX}/batch/records",
        body,
        bench.args.batch_clients,
        BATCH,
        profile_it=bench.args.profile_batch,
    )
    group_note(bench, result, "batch", BATCH)
    return result


def copy(bench: Bench) -> Measurement:
    meter = CpuMeter({"postgres": bench.pg_pid})
    result = asyncio.run(
        database.copy(
            bench.url,
            run_id=RUN_ID,
            payloads=[compact(record(i)) for i in range(BATCH)],
            connections=bench.args.batch_clients,
            duration=bench.args.duration,
            warmup=bench.args.warmup,
            meter=meter,
        )
    )
    return result
