"""JSON responses, written with :mod:`json` directly: no content negotiation, no key sorting."""

from __future__ import annotations

import datetime
import json
from typing import Any

from flask import Response


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(body, separators=(",", ":"), ensure_ascii=False),
        status=status,
        headers=headers,
        mimetype="application/json",
    )


def isoformat(moment: datetime.datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
