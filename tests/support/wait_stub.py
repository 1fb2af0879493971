"""A workflow wait service stub on loopback: slow, flaky, and idempotent by event id."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class WaitServiceStub:
    def __init__(self, fail_every: int = 3, lose_answer_every: int = 5, delay: float = 0.005):
        self.accepted: dict[str, dict] = {}  # first acceptance, in order
        self.requests = 0
        self.duplicates = 0
        self.refuse_with: int | None = None  # answer every request so, accepting nothing
        self.log: list[tuple[float, str, str]] = []  # (monotonic, path, event id) per request
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                key = self.headers["Idempotency-Key"]
                time.sleep(delay)
                with stub._lock:
                    stub.log.append((time.monotonic(), self.path, key))
                    stub.requests += 1
                    n = stub.requests
                    if stub.refuse_with is not None:
                        status = stub.refuse_with
                    elif n % fail_every == 0:
                        status = 503  # refused before accepting
                    else:
                        if key in stub.accepted:
                            stub.duplicates += 1
                        else:
                            event = json.loads(body)
                            assert event["id"] == key
                            stub.accepted[key] = event
                        status = 503 if n % lose_answer_every == 0 else 202  # accepted, answer lost
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/events"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> WaitServiceStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def sequences(self, stream_id: str) -> list[int]:
        with self._lock:
            return [e["sequence"] for e in self.accepted.values() if e["stream_id"] == stream_id]
