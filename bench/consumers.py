"""What a stream's consumers cost its appends and its document.

`python3 dev.py run python -m bench.consumers [--consumers N] [--appends M]` starts
`ductor-streams serve` on embedded PostgreSQL in a temporary directory, creates one stream,
measures M one-record appends and M acks of one consumer (median and p90 latency), acknowledges
N more consumers, and measures again, with the size of the stream document each time. The
append's figures should stay close however large N is (docs/benchmarks.md, "Consumers").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

import httpx

from bench.server import embedded_server

TOKEN = "bench-" + secrets.token_hex(8)
TICK = os.sysconf("SC_CLK_TCK")
PREFIX = "/api/workflow-streams"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CPU:
    """CPU seconds of the server process and of its PostgreSQL (the postmaster, its live
    backends and what its exited children used): on a shared machine, wall time swings with
    the neighbours' load, CPU per request much less."""

    def __init__(self, server: int, data: str) -> None:
        self.server = server
        self.postmaster = int((Path(data) / "pg" / "postmaster.pid").read_text().split()[0])

    @staticmethod
    def _stat(pid: int) -> list[str]:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

    def seconds(self) -> float:
        total = 0
        for pid, with_children in ((self.server, False), (self.postmaster, True)):
            fields = self._stat(pid)
            total += int(fields[11]) + int(fields[12])
            if with_children:
                total += int(fields[13]) + int(fields[14])
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = self._stat(int(entry.name))
                except OSError:
                    continue
                if int(fields[1]) == self.postmaster:
                    total += int(fields[11]) + int(fields[12])
        return total / TICK


async def _appends(client: httpx.AsyncClient, path: str, count: int) -> list[float]:
    took = []
    for n in range(count):
        start = time.perf_counter()
        answer = await client.post(f"{path}/records", json={"records": [{"data": {"n": n}}]})
        took.append((time.perf_counter() - start) * 1000)
        answer.raise_for_status()
    return took


async def _acks(client: httpx.AsyncClient, path: str, count: int) -> list[float]:
    """One consumer's acks, each one record further (`count` records past its position)."""
    head = (await client.get(path)).json()["state"]["head"]
    took = []
    for sequence in range(head - count + 1, head + 1):
        start = time.perf_counter()
        ack = await client.post(f"{path}/consumers/bench/ack", json={"sequence": sequence})
        took.append((time.perf_counter() - start) * 1000)
        ack.raise_for_status()
    return took


def _figures(took: list[float], cpu: float) -> str:
    took = sorted(took)
    return (
        f"median {statistics.median(took):6.2f} ms, p90 {took[int(len(took) * 0.9)]:6.2f} ms, "
        f"CPU {cpu * 1000 / len(took):6.2f} ms each"
    )


async def _round(client: httpx.AsyncClient, path: str, count: int, cpu: CPU, label: str) -> None:
    start = cpu.seconds()
    appends = await _appends(client, path, count)
    middle = cpu.seconds()
    acks = await _acks(client, path, count)
    end = cpu.seconds()
    document = len((await client.get(path)).content)
    print(
        f"{label:>16}: append {_figures(appends, middle - start)}\n"
        f"{'':>16}     ack {_figures(acks, end - middle)}\n"
        f"{'':>16}  stream document {document / 1024:.1f} KB",
        flush=True,
    )


async def _measure(base: str, consumers: int, appends: int, cpu: CPU) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base + PREFIX, headers=headers, timeout=60) as client:
        run = "bench-" + secrets.token_hex(4)
        created = await client.post(
            f"/runs/{run}/streams",
            json={"stream_id": "s", "direction": "output"},
        )
        created.raise_for_status()
        path = f"/runs/{run}/streams/s"
        await _appends(client, path, 20)  # warm up
        await _round(client, path, appends, cpu, "1 consumer")
        head = (await client.get(path)).json()["state"]["head"]
        started = time.perf_counter()
        for n in range(consumers):
            # At the head, so that they hold nothing back whatever rule credit follows.
            ack = await client.post(f"{path}/consumers/c{n:06d}/ack", json={"sequence": head})
            if ack.status_code != 200:
                sys.exit(f"consumer {n}: {ack.status_code} {ack.text}")
        acked = time.perf_counter() - started
        print(f"{'':>16}  ({consumers} first acks took {acked:.1f} s)", flush=True)
        await _round(client, path, appends, cpu, f"{consumers + 1} consumers")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--consumers", type=int, default=5000)
    parser.add_argument("--appends", type=int, default=200)
    arguments = parser.parse_args()
    env = {
        "DUCTOR_STREAMS_BOOTSTRAP_TOKEN": TOKEN,
        "DUCTOR_STREAMS_MAX_CONSUMERS_PER_STREAM": str(arguments.consumers + 10),
    }
    with embedded_server(env) as (base, server, data):
        cpu = CPU(server.pid, data)
        asyncio.run(_measure(base, arguments.consumers, arguments.appends, cpu))


if __name__ == "__main__":
    main()
