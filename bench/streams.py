"""Open changes streams for the benchmark: N clients on ``GET /changes``, reading everything.

One thread reads every socket with a selector and counts what arrives, so
the streams are live (they receive every change the load makes) at a small
CPU cost to the machine under test.
"""

from __future__ import annotations

import selectors
import socket
import threading
from urllib.parse import urlsplit


class OpenStreams:
    """``with OpenStreams(base_url, 50) as streams:`` ... ``streams.events``."""

    def __init__(self, base_url: str, count: int, path: str = "/changes") -> None:
        self.base_url = base_url
        self.count = count
        self.path = path
        self.events = 0  # "id:" lines received, over all streams
        self.refused = 0  # streams the server did not answer with 200
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> OpenStreams:
        parts = urlsplit(self.base_url)
        request = (
            f"GET {self.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
        for _ in range(self.count):
            sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
            sock.sendall(request)
            head = b""
            while b"\r\n\r\n" not in head:
                data = sock.recv(4096)
                if not data:
                    break
                head += data
            if not head.startswith(b"HTTP/1.1 200"):
                self.refused += 1
                sock.close()
                continue
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ, bytearray())
        self._thread.start()
        return self

    def _read(self) -> None:
        buffer = bytearray(1 << 18)
        while not self._stop.is_set():
            for key, _ in self._selector.select(0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    size = sock.recv_into(buffer)
                except BlockingIOError:
                    continue
                if not size:
                    self._selector.unregister(sock)
                    sock.close()
                    continue
                # every event ends with a blank line; a comment (heartbeat) too, rarely
                self.events += buffer.count(b"\n\n", 0, size)

    @property
    def open(self) -> int:
        return len(self._selector.get_map())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for key in list(self._selector.get_map().values()):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            sock.close()
        self._selector.close()
