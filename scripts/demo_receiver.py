"""A stand-in for the services example.yaml talks to, so the demo runs with nothing else.

Every POST (an action's webhook) is answered 200 with a small JSON body and
logged with its idempotency token; every GET (a feed) is answered with JSON
describing the request, plus ``"ready": true`` and ``"available": 3`` so
feed-driven gates (example.yaml's stock check) can move.

    python3 scripts/demo_receiver.py --bind 127.0.0.1:2018
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


class Handler(BaseHTTPRequestHandler):
    server_version = "routemaster-demo-receiver"

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            payload = json.loads(body or b"null")
        except ValueError:
            payload = None
        label = payload.get("label") if isinstance(payload, dict) else None
        token = self.headers.get("X-Idempotency-Token")
        self._reply({"received": True, "label": label, "idempotency_token": token})

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        segments = [unquote(part) for part in path.split("/") if part]
        self._reply(
            {
                "path": path,
                "label": segments[-1] if segments else None,
                "ready": True,
                "available": 3,
                "now": datetime.datetime.now(datetime.UTC).isoformat(),
            }
        )

    def _reply(self, document: dict[str, object]) -> None:
        body = json.dumps(document).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"demo-receiver: {format % args}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", default="127.0.0.1:2018", metavar="HOST:PORT")
    args = parser.parse_args()
    host, _, port = args.bind.rpartition(":")
    server = ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
