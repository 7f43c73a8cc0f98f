"""Small typed helpers for the API tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from werkzeug.test import TestResponse

from tests.waiting import wait_answering


def body(response: TestResponse) -> Any:
    """The decoded JSON body; fails the test when the response is not JSON."""
    assert response.mimetype == "application/json", response.data[:200]
    return response.get_json()


@contextmanager
def answering(process: subprocess.Popen[bytes], base: str, *, timeout: float) -> Iterator[str]:
    """``base`` once the server process answers ``GET /``; the process is stopped afterwards."""
    try:
        wait_answering(base + "/", process, timeout=timeout)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=timeout)
