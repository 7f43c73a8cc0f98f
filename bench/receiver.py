"""A fast local webhook receiver for the action scenarios (asyncio, HTTP/1.1 keep-alive).

``POST /ok`` answers 200 at once. ``POST /flaky`` answers 503 the first time it
sees an ``X-Idempotency-Token`` (one entry of one label into the action) and
200 after that, so every label needs exactly one retry. ``GET /stats`` returns
the request counts as JSON. It is a separate process so its CPU shows up as
the load it is, and asyncio so that it is never what limits a figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json

COUNTS = {"ok": 0, "flaky_failed": 0, "flaky_ok": 0, "other": 0}
SEEN_TOKENS: set[bytes] = set()


def respond(status: str, body: bytes = b"{}") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            method, path, _ = lines[0].split(b" ", 2)
            headers = {}
            for line in lines[1:]:
                if b":" in line:
                    key, value = line.split(b":", 1)
                    headers[key.strip().lower()] = value.strip()
            length = int(headers.get(b"content-length", b"0"))
            if length:
                await reader.readexactly(length)
            if path == b"/ok":
                COUNTS["ok"] += 1
                reply = respond("200 OK")
            elif path == b"/flaky":
                token = headers.get(b"x-idempotency-token", b"")
                if token in SEEN_TOKENS:
                    COUNTS["flaky_ok"] += 1
                    reply = respond("200 OK")
                else:
                    SEEN_TOKENS.add(token)
                    COUNTS["flaky_failed"] += 1
                    reply = respond("503 Service Unavailable")
            elif method == b"GET" and path == b"/stats":
                reply = respond("200 OK", json.dumps(COUNTS).encode())
            else:
                COUNTS["other"] += 1
                reply = respond("404 Not Found")
            writer.write(reply)
            await writer.drain()
            if headers.get(b"connection", b"").lower() == b"close":
                break
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def serve(port: int) -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=18089)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
