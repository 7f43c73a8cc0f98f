"""Small typed helpers for the API tests."""

from __future__ import annotations

from typing import Any

from werkzeug.test import TestResponse


def body(response: TestResponse) -> Any:
    """The decoded JSON body; fails the test when the response is not JSON."""
    assert response.mimetype == "application/json", response.data[:200]
    return response.get_json()
