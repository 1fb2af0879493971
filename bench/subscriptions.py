"""`python -m bench subscriptions` (or `python3 dev.py bench subscriptions`): from an append's
commit to its webhook arriving, with 100 webhook subscriptions over 1,000 streams, and the
appends per second the server sustains meanwhile; side by side, in one run, with the Durable
Streams reference server (npm @durable-streams/server, in memory, webhooks on).

    python -m bench subscriptions [--duration 10] [--writers 16] [--only ours,reference]

Both servers are driven the same way, through the protocol: 1,000 JSON streams created by PUT,
100 subscriptions (`__ds/subscriptions/...`) each linking 10 of them explicitly, a receiver on
loopback (in this process) answering every webhook `{"done": true}` (so each wake acknowledges
its snapshot and the next append wakes the subscription again), and `--writers` clients
appending one record at a time to random streams for `--duration` seconds. An append's
latency is from its answer (the commit is before it) to the first webhook whose snapshot
reaches its offset (0 when the webhook came first). Our server runs `serve` with its workers in
the process, on embedded PostgreSQL."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from tests.support.node import ReferenceServer, ensure_node_packages

from bench import database
from bench.server import Server, raise_fd_limit

STREAMS = 1_000
SUBSCRIPTIONS = 100
PER_SUBSCRIPTION = STREAMS // SUBSCRIPTIONS
RUN = "bsub"


@dataclass
class Result:
    name: str
    appends: int = 0
    seconds: float = 0.0
    webhooks: int = 0
    latencies: list[float] = field(default_factory=list)
    unmatched: int = 0  # appends no webhook reached before the end

    @property
    def per_s(self) -> float:
        return self.appends / self.seconds if self.seconds else 0.0

    def percentile(self, p: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


class Receiver:
    """A minimal HTTP/1.1 webhook receiver: records each notification's arrival and answers
    `{"done": true}`."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, dict[str, object]]] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                body = await reader.readexactly(length)
                self.arrivals.append((time.monotonic(), json.loads(body)))
                answer = b'{"done":true}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the sender closed, or the bench is over
        finally:
            writer.close()


def _path(i: int) -> str:
    return f"{RUN}/s{i:04d}"


def _offset_number(offset: str) -> tuple[int, ...]:
    """Offsets of either server compare as tuples of their numeric parts."""
    return tuple(int(part) for part in offset.split("_"))


async def drive(name: str, root: str, token: str | None, args: argparse.Namespace) -> Result:
    """`root` is the protocol's stream root (`…/v1/stream`)."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    receiver = Receiver()
    await receiver.start()
    result = Result(name)
    limits = httpx.Limits(max_connections=args.writers + 8)
    async with httpx.AsyncClient(headers=headers, timeout=30, limits=limits) as client:
        json_type = {"content-type": "application/json"}
        sem = asyncio.Semaphore(32)

        async def create(i: int) -> None:
            async with sem:
                answer = await client.put(f"{root}/{_path(i)}", headers=json_type)
                assert answer.status_code in (200, 201), answer.text

        await asyncio.gather(*(create(i) for i in range(STREAMS)))
        tag = secrets.token_hex(3)
        for n in range(SUBSCRIPTIONS):
            body = {
                "type": "webhook",
                "streams": [_path(n * PER_SUBSCRIPTION + k) for k in range(PER_SUBSCRIPTION)],
                "webhook": {"url": f"http://127.0.0.1:{receiver.port}/hook"},
            }
            answer = await client.put(f"{root}/__ds/subscriptions/b{tag}-{n}", json=body)
            assert answer.status_code in (200, 201), answer.text
        acked: dict[str, list[tuple[tuple[int, ...], float]]] = {}
        stop_at = time.monotonic() + args.duration

        async def writer() -> None:
            while time.monotonic() < stop_at:
                path = _path(random.randrange(STREAMS))
                answer = await client.post(f"{root}/{path}", headers=json_type, content=b'{"n":1}')
                done = time.monotonic()
                if answer.status_code not in (200, 204):
                    raise RuntimeError(f"{name}: append {answer.status_code} {answer.text}")
                offset = _offset_number(answer.headers["stream-next-offset"])
                acked.setdefault(path, []).append((offset, done))
                result.appends += 1

        started = time.monotonic()
        await asyncio.gather(*(writer() for _ in range(args.writers)))
        result.seconds = time.monotonic() - started
        await asyncio.sleep(3)  # the last webhooks
    await receiver.stop()
    result.webhooks = len(receiver.arrivals)
    # Each append is reached by the first webhook, after the append, whose snapshot of its
    # stream is at or past the append's offset.
    reached: dict[str, list[tuple[tuple[int, ...], float]]] = {}
    for at, body in receiver.arrivals:
        for stream in body.get("streams", []):  # type: ignore[union-attr]
            reached.setdefault(stream["path"], []).append(
                (_offset_number(stream["tail_offset"]), at)
            )
    for path, appends in acked.items():
        seen = sorted(reached.get(path, []), key=lambda x: x[1])
        for offset, done in appends:
            first = next((at for tail, at in seen if tail >= offset), None)
            if first is None:
                result.unmatched += 1
            else:
                result.latencies.append(max(0.0, first - done))
    return result


def report(results: list[Result]) -> str:
    lines = [
        f"commit -> webhook, {SUBSCRIPTIONS} webhook subscriptions over {STREAMS} streams",
        f"{'server':<34} {'appends/s':>10} {'webhooks':>9} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'unreached':>9}",
    ]
    for r in results:
        p50, p99 = r.percentile(0.5), r.percentile(0.99)
        lines.append(
            f"{r.name:<34} {r.per_s:>10.0f} {r.webhooks:>9} "
            f"{'-' if p50 is None else f'{p50 * 1000:.1f}':>8} "
            f"{'-' if p99 is None else f'{p99 * 1000:.1f}':>8} {r.unmatched:>9}"
        )
    if len(results) == 2 and all(r.percentile(0.5) for r in results):
        ours, ref = results
        lines.append(
            f"ratio ours/reference: appends/s {ours.per_s / ref.per_s:.2f}, "
            f"p50 {ours.percentile(0.5) / ref.percentile(0.5):.2f}, "  # type: ignore[operator]
            f"p99 {ours.percentile(0.99) / ref.percentile(0.99):.2f}"  # type: ignore[operator]
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench subscriptions")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--only", default="ours,reference")
    args = parser.parse_args(argv)
    selected = set(args.only.split(","))
    raise_fd_limit()
    tmp = Path(tempfile.mkdtemp(prefix="ductor-bench-subscriptions-"))
    results: list[Result] = []
    try:
        if "ours" in selected:
            print(f"starting embedded PostgreSQL under {tmp / 'pg'} ...", flush=True)
            url, _ = database.start_database(tmp)
            token = secrets.token_urlsafe(24)
            server = Server(
                url,
                token,
                tmp / "data",
                tmp / "server.log",
                background_workers=True,  # the wake scheduler and deliverer in the process
            )
            try:
                server.wait_ready()
                root = f"http://127.0.0.1:{server.port}/api/durable-streams/v1/stream"
                results.append(asyncio.run(drive("ductor-streams (PostgreSQL)", root, token, args)))
            finally:
                server.stop()
        if "reference" in selected:
            ensure_node_packages()
            ref = ReferenceServer(log_path=tmp / "reference.log", webhooks=True).start()
            try:
                root = ref.base_url + "/v1/stream"
                results.append(asyncio.run(drive("reference (npm, in memory)", root, None, args)))
            finally:
                ref.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(report(results))
    return 0
