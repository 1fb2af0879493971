"""What a subscriber that stops reading costs the server's memory.

`python3 dev.py run python -m bench.stalled_subscribers [--subscribers N]` starts
`ductor-streams serve` on embedded PostgreSQL in a temporary directory, appends 200 records of
60 KB to a stream, then opens N subscriptions at cursor 0 whose clients never read (a 4 KiB
receive buffer), and prints the server's RSS before and 8 s after: the difference over N is
what one stalled subscriber holds while the stall bound (30 s) runs (docs/benchmarks.md,
"2026-12-06, tenth sitting").
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import socket
import time

import httpx

from bench.server import embedded_server

TOKEN = "bench-" + secrets.token_hex(8)


def _rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0]) // 1024


def _measure(base: str, pid: int, subscribers: int) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    api = f"{base}/api/workflow-streams"
    run = "stalled-" + secrets.token_hex(3)
    made = httpx.post(
        f"{api}/runs/{run}/streams", json={"stream_id": "s", "direction": "output"}, headers=headers
    )
    made.raise_for_status()
    chunk = base64.b64encode(os.urandom(45_000)).decode()  # 60 KB as base64
    for _ in range(4):
        httpx.post(
            f"{api}/runs/{run}/streams/s/records",
            json={"records": [{"data": chunk}] * 50},
            headers=headers,
            timeout=60,
        ).raise_for_status()
    before = _rss_mb(pid)
    host, port = base.removeprefix("http://").split(":")
    connections = []
    try:
        for _ in range(subscribers):
            conn = socket.socket()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.connect((host, int(port)))
            conn.sendall(
                f"GET /api/workflow-streams/runs/{run}/streams/s/subscribe?cursor=0 HTTP/1.1\r\n"
                f"Host: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
            )
            connections.append(conn)
        time.sleep(8)
        after = _rss_mb(pid)
    finally:
        for conn in connections:
            conn.close()
    print(
        f"{subscribers} stalled subscribers on 60 KB records: RSS {before} MB -> {after} MB, "
        f"{(after - before) * 1024 / subscribers:,.0f} KB each"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subscribers", type=int, default=200)
    arguments = parser.parse_args()
    with embedded_server({"DUCTOR_STREAMS_BOOTSTRAP_TOKEN": TOKEN}) as (base, server, _):
        _measure(base, server.pid, arguments.subscribers)


if __name__ == "__main__":
    main()
