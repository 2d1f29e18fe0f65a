"""A local webhook for the alert tests: an HTTP server on 127.0.0.1 that records each POST's JSON body and
answers with the statuses it is given, in order (then 200), or not at all for a while."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator


class Webhook:
    def __init__(self, statuses: list[int] | None = None, stall_seconds: float = 0.0):
        self.statuses, self.stall_seconds = list(statuses or []), stall_seconds
        self.received: list[tuple[int, dict]] = []  # (status answered, body), in arrival order
        self.lock = threading.Lock()
        self.url = ""

    def accepted(self) -> list[dict]:
        with self.lock:
            return [body for status, body in self.received if status == 200]


@contextmanager
def webhook_server(webhook: Webhook) -> Iterator[Webhook]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with webhook.lock:
                status = webhook.statuses.pop(0) if webhook.statuses else 200
                stall, webhook.stall_seconds = webhook.stall_seconds, 0.0
            if stall:
                threading.Event().wait(stall)
            with webhook.lock:
                webhook.received.append((status, body))
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    webhook.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield webhook
    finally:
        server.shutdown()
        server.server_close()
