"""A webhook receiver as a process of its own, on loopback, for the subscription tests:

    python -m tests.support.webhook_receiver PORT LOG

Its behaviour is in each webhook URL's query: `fail=N` answers 500 to the path's first N
requests, `delay=S` waits S seconds before answering, `hang_first=S` holds only the path's
first request S seconds, `done=1` answers `{"done": true}` (else `{}`), `callback=1` then calls
back with `done` and an ack of every stream listed at its tail (as a receiver that processed what
it was shown would), after answering. Every request is logged
to LOG as a JSON line when it arrives (`"event": "start"`) and when it is answered (`"end"`),
with its path, headers and exact body (base64), so a test checks signatures on the bytes sent."""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit


def main(port: int, log: Path) -> None:
    lock = threading.Lock()
    seen: Counter[str] = Counter()
    out = log.open("a", buffering=1)

    def write(entry: dict[str, object]) -> None:
        with lock:
            out.write(json.dumps(entry) + "\n")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            parts = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            with lock:
                seen[parts.path] += 1
                n = seen[parts.path]
            entry = {
                "path": parts.path,
                "n": n,
                "at": time.time(),
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": base64.b64encode(body).decode(),
            }
            write({"event": "start", **entry})
            if n == 1 and "hang_first" in query:
                time.sleep(float(query["hang_first"]))
            time.sleep(float(query.get("delay", 0)))
            status = 500 if n <= int(query.get("fail", 0)) else 200
            answer = json.dumps({"done": True} if query.get("done") == "1" else {}).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
            except OSError:  # the sender went away (a killed worker)
                pass
            write({"event": "end", "path": parts.path, "n": n, "at": time.time(), "status": status})
            if status == 200 and query.get("callback") == "1":
                call_back(json.loads(body))

        def log_message(self, *args: object) -> None:
            pass

    def call_back(note: dict[str, object]) -> None:
        streams = note.get("streams")
        acks = [
            {"path": s["path"], "offset": s["tail_offset"]}
            for s in (streams if isinstance(streams, list) else [])
        ]
        request = urllib.request.Request(
            str(note["callback_url"]),
            data=json.dumps(
                {
                    "wake_id": note["wake_id"],
                    "generation": note["generation"],
                    "acks": acks,
                    "done": True,
                }
            ).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {note['callback_token']}",
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answered:
                answered.read()
        except OSError:  # fenced (409) or the server went away: the test reads the deliveries
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print("receiving", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
