"""What answers nobody reads cost the server: memory, and its shutdown.

`python3 dev.py run python -m bench.unread_answers [--connections N] [--batch B] [--pause S]
[--stall S]` starts `ductor-streams serve` on embedded PostgreSQL in a temporary directory
(DUCTOR_STREAMS_ANSWER_STALL_SECONDS set to `--stall`, default 30) and appends about 4.2 MB of
records (70 of 60 KB) to one stream. It then opens N connections (default 1,000), B at a time
(default 50) with S seconds between batches (default 0.5), each with a 4 KB receive buffer,
each sending `GET …/records?cursor=0&limit=1000` (a 4 MiB page) and never reading the answer. It
prints the server's RSS at the start, its peak while the connections open and 10 s later, how
many of the requests were refused 429, and how long the server took to stop on SIGTERM with
the connections still open and unread
(docs/benchmarks.md, "2026-12-06, twelfth sitting").
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import signal
import socket
import subprocess
import time

import httpx

from bench.large_beside import TOKEN, _stream
from bench.server import embedded_server, raise_fd_limit


def _rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


def _refused(base: str) -> int:
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith("ductor_streams_tenant_answers_refused_total "):
            return int(float(line.split()[1]))
    return 0  # (a server without the cap)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=1_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--pause", type=float, default=0.5)
    parser.add_argument("--stall", type=float, default=30.0)
    a = parser.parse_args()
    raise_fd_limit()
    env = {
        "DUCTOR_STREAMS_BOOTSTRAP_TOKEN": TOKEN,
        "DUCTOR_STREAMS_ANSWER_STALL_SECONDS": str(a.stall),
    }
    with embedded_server(env) as (base, server, _):
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            path = _stream(client, "unread-" + secrets.token_hex(3), "a")
            chunk = base64.b64encode(os.urandom(45_000)).decode()
            for _ in range(7):
                made = client.post(path, json={"records": [{"data": chunk}] * 10}, timeout=60)
                assert made.status_code == 201, made.text
        host, port = base.removeprefix("http://").split(":")
        request = (
            f"GET {path}?cursor=0&limit=1000 HTTP/1.1\r\nHost: bench\r\n"
            f"Authorization: Bearer {TOKEN}\r\n\r\n"
        ).encode()
        start = _rss_mb(server.pid)
        peak, held = start, []
        for n in range(a.connections):
            conn = socket.socket()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.connect((host, int(port)))
            conn.sendall(request)
            held.append(conn)
            if n % a.batch == a.batch - 1:
                time.sleep(a.pause)
                peak = max(peak, _rss_mb(server.pid))
        time.sleep(10.0)
        later = _rss_mb(server.pid)
        refused = _refused(base)
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(120)
            stopped = f"{time.monotonic() - started:.1f} s"
        except subprocess.TimeoutExpired:
            stopped = "not within 120 s"
        for conn in held:
            conn.close()
    print(f"{a.connections} connections asking for a 4 MiB page each, never reading it")
    print(
        f"server RSS: {start} MB at the start, peak {peak} MB while opening, {later} MB 10 s later"
    )
    print(f"refused 429 (answers not taken): {refused}")
    print(f"SIGTERM with the connections open: stopped in {stopped}")


if __name__ == "__main__":
    main()
