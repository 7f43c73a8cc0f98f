"""Small typed helpers for the API tests."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import requests
from werkzeug.test import TestResponse


def body(response: TestResponse) -> Any:
    """The decoded JSON body; fails the test when the response is not JSON."""
    assert response.mimetype == "application/json", response.data[:200]
    return response.get_json()


@contextmanager
def answering(process: subprocess.Popen[bytes], base: str, *, timeout: float) -> Iterator[str]:
    """``base`` once the server process answers ``GET /``; the process is stopped afterwards."""
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                requests.get(base + "/", timeout=2)
                break
            except requests.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=timeout)
