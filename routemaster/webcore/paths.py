"""Routing on the path exactly as the client sent it.

A label may contain ``/``, sent as ``%2F``. WSGI servers percent-decode the
path into ``PATH_INFO`` before the application sees it, which would turn that
``%2F`` into a separator. So we take the raw request target (``RAW_URI`` from
gunicorn and Werkzeug, ``REQUEST_URI`` from others), split it on ``/`` first,
and re-encode every segment so the router only ever sees real separators;
the :class:`NameConverter` decodes a segment back into the name.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote, unquote_to_bytes, urlsplit

from werkzeug.exceptions import BadRequest
from werkzeug.routing import BaseConverter

# Characters that percent-encoding leaves as they are (``quote``'s always-safe set), and ``/``.
_PLAIN = re.compile(r"[A-Za-z0-9_.~/-]*")


def rewrite_path_info(environ: dict[str, Any]) -> None:
    """Replace ``PATH_INFO`` by the raw path with each segment percent-encoded on its own."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if not raw:
        return
    path = raw.split("?", 1)[0]
    if not path.startswith("/"):  # absolute-form target: http://host/path
        path = urlsplit(path).path or "/"
    script_name = environ.get("SCRIPT_NAME", "")
    if script_name:
        prefix = quote(script_name.encode("latin-1"), safe="/")
        if path.startswith(prefix):
            path = path[len(prefix) :]
    if _PLAIN.fullmatch(path):  # nothing to decode or encode: the common case, kept cheap
        environ["PATH_INFO"] = path
        return
    # WSGI strings carry the request's bytes as latin-1 characters.
    raw_bytes = path.encode("latin-1", errors="replace")
    environ["PATH_INFO"] = "/".join(
        quote(unquote_to_bytes(segment), safe="") for segment in raw_bytes.split(b"/")
    )


class NameConverter(BaseConverter):
    """One path segment, percent-decoded into the name of a state machine or label."""

    regex = "[^/]+"
    # Exactly one segment. Werkzeug guesses from the "/" in the regex that it may span
    # several and would then match every rule below it by one whole-path regex each
    # (8 per label request); declared, the router matches segment by segment.
    part_isolating = True

    def to_python(self, value: str) -> str:
        try:
            return unquote(value, errors="strict")
        except UnicodeDecodeError:
            raise BadRequest("Names in the path must be percent-encoded UTF-8 text.") from None

    def to_url(self, value: Any) -> str:
        return quote(str(value), safe="")


def link(*names: str) -> str:
    """``/a/b/c`` from path segments, each percent-encoded (a ``/`` in a name becomes ``%2F``)."""
    return "".join("/" + quote(name, safe="") for name in names)
