"""A tool server in its own process that counts deliveries (crash tests).

POST /charge {"order": str, "amount": int} appends one line per delivery to
the ledger file; GET /item?id=N answers a read. A write delivered twice shows
as two ledger lines with the same order. POST /refund {"order": str} is the
charge's undo: it dedupes by its Idempotency-Key header (the first delivery of
a key takes effect, later ones answer the same), and appends one line per
delivery with "refund", "key" and "applied".
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

LEDGER = sys.argv[1]
PORT_FILE = sys.argv[2]
LOCK = threading.Lock()
REFUNDED: dict[str, str] = {}  # idempotency key -> order


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def _send(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        q = parse_qs(urlparse(self.path).query)
        time.sleep(0.004)
        self._send({"id": int(q["id"][0]), "price": 10 * int(q["id"][0])})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path == "/refund":
            key = self.headers.get("idempotency-key") or ""
            with LOCK:
                applied = key not in REFUNDED
                REFUNDED.setdefault(key, body["order"])
                with open(LEDGER, "a") as f:
                    f.write(json.dumps({"refund": body["order"], "key": key, "applied": applied}) + "\n")
                    f.flush()
            time.sleep(0.004)
            self._send({"refunded": body["order"]})
            return
        with LOCK:
            with open(LEDGER, "a") as f:
                f.write(json.dumps(body) + "\n")
                f.flush()
        time.sleep(0.004)
        self._send({"charged": body["order"]})


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client killed mid-request is what these tests do


server = Server(("127.0.0.1", 0), Handler)
with open(PORT_FILE + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.replace(PORT_FILE + ".tmp", PORT_FILE)
server.serve_forever()
