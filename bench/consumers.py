"""What a stream's consumers cost its appends and its document.

`python3 dev.py run python -m bench.consumers [--consumers N] [--appends M]` starts
`ductor-streams serve` on embedded PostgreSQL in a temporary directory, creates one stream,
measures M one-record appends (median and p90 latency) with no consumer, acknowledges N
consumers, and measures again, with the size of the stream document each time. The two
figures should stay close however large N is (docs/benchmarks.md, "Consumers").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

TOKEN = "bench-" + secrets.token_hex(8)
PREFIX = "/api/workflow-streams"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _appends(client: httpx.AsyncClient, path: str, count: int) -> list[float]:
    took = []
    for n in range(count):
        start = time.perf_counter()
        answer = await client.post(f"{path}/records", json={"records": [{"data": {"n": n}}]})
        took.append((time.perf_counter() - start) * 1000)
        answer.raise_for_status()
        ack = await client.post(
            f"{path}/consumers/bench/ack", json={"sequence": answer.json()["head"]}
        )
        ack.raise_for_status()
    return took


def _summary(label: str, took: list[float], document: int) -> str:
    took = sorted(took)
    p90 = took[int(len(took) * 0.9)]
    return (
        f"{label:>22}: append median {statistics.median(took):6.2f} ms, p90 {p90:6.2f} ms; "
        f"stream document {document / 1024:7.1f} KB"
    )


async def _measure(base: str, consumers: int, appends: int) -> None:
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
        before = await _appends(client, path, appends)
        document_before = len((await client.get(path)).content)
        head = (await client.get(path)).json()["state"]["head"]
        started = time.perf_counter()
        for n in range(consumers):
            # At the head, so that they hold nothing back whatever rule credit follows.
            ack = await client.post(f"{path}/consumers/c{n:06d}/ack", json={"sequence": head})
            if ack.status_code != 200:
                sys.exit(f"consumer {n}: {ack.status_code} {ack.text}")
        acked = time.perf_counter() - started
        after = await _appends(client, path, appends)
        document_after = len((await client.get(path)).content)
        print(_summary("1 consumer", before, document_before))
        print(_summary(f"{consumers + 1} consumers", after, document_after))
        print(f"{'':>22}  {consumers} first acks took {acked:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--consumers", type=int, default=5000)
    parser.add_argument("--appends", type=int, default=200)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        port = _free_port()
        env = {
            **os.environ,
            "DUCTOR_STREAMS_DATA_DIR": data,
            "DUCTOR_STREAMS_BOOTSTRAP_TOKEN": TOKEN,
            "DUCTOR_STREAMS_MAX_CONSUMERS_PER_STREAM": str(arguments.consumers + 10),
        }
        log = Path(data) / "serve.log"
        with log.open("wb") as out:
            server = subprocess.Popen(
                [sys.executable, "-m", "entrypoints.cli", "serve", "--port", str(port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(base + "/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit("the server did not start:\n" + log.read_text(errors="replace"))
                time.sleep(0.2)
            asyncio.run(_measure(base, arguments.consumers, arguments.appends))
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
