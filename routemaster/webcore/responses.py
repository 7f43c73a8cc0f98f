"""JSON responses, written with :mod:`json` directly: no content negotiation, no key sorting."""

from __future__ import annotations

import datetime
import json
from typing import Any

from flask import Response

# What json.dumps(separators=(",", ":"), ensure_ascii=False) builds on every call; it holds
# only those two settings, so one serves every response.
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
# As mimetype="application/json" would make it, minus Werkzeug working that out per response.
_CONTENT_TYPE = "application/json"


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_ENCODE(body), status=status, headers=headers, content_type=_CONTENT_TYPE)


def isoformat(moment: datetime.datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
