"""`python -m bench.commit_cycle [G] [N] [S]`: the CPU a commit costs this process, through the
PostgreSQL adapter alone: N commits of G single-record appends to each of S streams
(`PostgresStreams.update_many`, as the group commit's leader calls it; S is 1 by default, a hot
stream's commit, and more than 1 is a batch of the commit across streams, as spread load makes),
against an embedded PostgreSQL started for the run, on a pool set up as the service's is.
Prints the process's CPU time (`time.process_time`, system calls included) per commit and per
append, the wall time per commit, and the statements sent per commit (each a round trip).

No HTTP, no event-loop contention: what it measures is the leader's share of a hot stream's
append, which the wrk benchmarks cannot separate from the rest. Compare two checkouts by running
it in each, alternately (the shared machine moves it by 10-20% from one minute to the next)."""

from __future__ import annotations

import asyncio
import atexit
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
from tests.support.builders import WRITER, definition, new_key, record

from adapters.postgres.stream_writes import prepare_pooled
from adapters.postgres.streams import PostgresStreams
from application.append_records import AppendCommand
from application.ports import Done
from bench.database import start_database
from entrypoints.serving import fast_loop

WARM_UP = 200
RECORD = record(b'{"msg":"hello world, 31 bytes!"}')


async def measure(url: str, group: int, commits: int, spread: int) -> tuple[float, float, float]:
    statements = [0]

    def count(_: object) -> None:
        statements[0] += 1

    async def setup(conn: asyncpg.Connection) -> None:
        await prepare_pooled(conn)
        conn.add_query_logger(count)

    async def keep(_: asyncpg.Connection) -> None:
        pass  # as the service's pool: nothing to reset

    pool = await asyncpg.create_pool(url, min_size=2, max_size=2, init=setup, reset=keep)
    try:
        streams = PostgresStreams(pool)
        run = new_key()
        keys = [run._replace(stream_id=f"s{i:04d}") for i in range(spread)]
        # Room for every append of the run: a stream out of credit refuses them, and a commit
        # that writes nothing costs less than one that writes.
        roomy = definition(max_unread_items=10**9, max_unread_bytes=10**12)
        for key in keys:
            await streams.create(key, roomy, datetime.now(UTC))

        async def commit() -> None:
            now = datetime.now(UTC)
            results = await streams.update_many(
                [
                    (key, [AppendCommand(WRITER, [RECORD], None, now) for _ in range(group)])
                    for key in keys
                ]
            )
            for result in results:
                assert not isinstance(result, Exception), result
                assert all(isinstance(outcome, Done) for outcome in result), result

        for _ in range(WARM_UP):
            await commit()
        statements[0] = 0
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(commits):
            await commit()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return cpu / commits, wall / commits, statements[0] / commits
    finally:
        await pool.close()


def main(argv: list[str]) -> int:
    group = int(argv[0]) if argv else 15
    commits = int(argv[1]) if len(argv) > 1 else 2_000
    spread = int(argv[2]) if len(argv) > 2 else 1
    tmp = tempfile.mkdtemp(prefix="ductor-commit-cycle-")
    atexit.register(shutil.rmtree, tmp, True)  # after the embedded server stops (registered later)
    url, _ = start_database(Path(tmp))
    with asyncio.Runner(loop_factory=fast_loop()) as runner:  # the server's loop (uvloop)
        cpu, wall, statements = runner.run(measure(url, group, commits, spread))
    appends = group * spread
    over = f" to each of {spread} streams" if spread > 1 else ""
    print(
        f"{group} appends{over} per commit: {cpu * 1e6:.1f} µs of CPU per commit, "
        f"{cpu / appends * 1e6:.1f} µs per append; {wall * 1e6:.0f} µs of wall time per commit; "
        f"{statements:.2f} statements per commit (over {commits})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
