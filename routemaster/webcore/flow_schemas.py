"""The JSON Schemas of flows (SPEC G2): ``GET /flows``, ``GET /flows/{name}/keys`` and
explain's ``waiting_for``; a table of its own beside :mod:`routemaster.webcore.schemas`."""

from __future__ import annotations

from routemaster.webcore.schemas import ANY, INTEGER, TEXT, TIME, Schema, array, obj

_KEY: Schema = {**ANY, "description": "The key's value, as in the metadata (null: missing)."}
_CAP: Schema = {"type": ["integer", "null"], "description": "Each key's cap (null: none)."}

FLOW_SCHEMAS: dict[str, Schema] = {
    "WaitingFor": obj(
        {
            "flow": TEXT,
            "key": _KEY,
            "holding": {**INTEGER, "description": "Labels of the key holding a slot now."},
            "concurrency": _CAP,
            "since": {**TIME, "description": "When the label was queued for its key's turn."},
        }
    ),
    "FlowList": obj(
        {
            "flows": array(
                obj(
                    {
                        "name": TEXT,
                        "concurrency": _CAP,
                        "keys_waiting": {**INTEGER, "description": "Keys with labels queued."},
                        "labels_waiting": {
                            **INTEGER,
                            "description": "Labels queued for their key's turn.",
                        },
                        "holding": {**INTEGER, "description": "Labels holding a slot now."},
                    }
                )
            )
        }
    ),
    "FlowKeyList": obj(
        {
            "flow": TEXT,
            "keys": array(obj({"key": _KEY, "waiting": INTEGER, "holding": INTEGER})),
        }
    ),
}
