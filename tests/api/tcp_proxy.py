"""A TCP forwarder on 127.0.0.1 that can be cut and restored, to simulate a database outage.

Stopping it closes the listening socket and every forwarded connection, so
clients see exactly what a dead database looks like (refused connections,
broken pooled sockets) without touching the real PostgreSQL server.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading


class TcpProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Listen (again, on the same port once one has been chosen) and forward."""
        self._stopping.clear()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._spawn(self._accept, self._listener)

    def stop(self) -> None:
        """Refuse new connections and cut every open one."""
        self._stopping.set()
        while True:
            with self._lock:
                running = [thread for thread in self._threads if thread.is_alive()]
                self._threads = running
            if not running:
                break
            for thread in running:
                thread.join()
        with self._lock:
            for sock in self._sockets:
                _close(sock)
            self._sockets = []

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        with listener:
            while not self._stopping.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                except OSError:
                    _close(client)
                    continue
                client.settimeout(None)
                upstream.settimeout(None)
                with self._lock:
                    self._sockets.extend((client, upstream))
                self._spawn(self._pump, client, upstream)
                self._spawn(self._pump, upstream, client)

    def _pump(self, source: socket.socket, destination: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                readable, _, _ = select.select([source], [], [], 0.05)
                if not readable:
                    continue
                data = source.recv(65536)
            except (OSError, ValueError):  # ValueError: the other pump closed it
                break
            if not data:
                break
            try:
                destination.sendall(data)
            except OSError:
                break
        _close(source)
        _close(destination)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
