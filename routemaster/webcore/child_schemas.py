"""The JSON shapes of child labels (SPEC G3): a spawn state's settings, a parent's counts,
its children listed, a child's parent."""

from __future__ import annotations

from routemaster.webcore.schemas import BOOLEAN, INTEGER, TEXT, Schema, array, obj

_SETTINGS: dict[str, Schema] = {
    "machine": {**TEXT, "description": "The machine the children are labels of."},
    "for_each": {**TEXT, "description": "The metadata list: one child per element."},
    "wait": {
        "anyOf": [{"enum": ["all"]}, obj({"at_least": INTEGER})],
        "description": "What the parent waits for (wait: any is at_least 1).",
    },
    "on_exit": {"enum": ["keep", "delete"]},
}

CHILD_SCHEMAS: dict[str, Schema] = {
    "SpawnSettings": obj(_SETTINGS),
    "SpawnProgress": obj(
        {
            **_SETTINGS,
            "spawned": {**INTEGER, "description": "Children created so far."},
            "to_spawn": {
                "type": ["integer", "null"],
                "description": "Children to create in all (null: not started).",
            },
        }
    ),
    "ChildrenCounts": obj(
        {"total": INTEGER, "succeeded": INTEGER, "failed": INTEGER, "running": INTEGER}
    ),
    "Parent": {
        **obj({"state_machine": TEXT, "label": TEXT}),
        "description": "The label whose spawn state created this one (a child only).",
    },
    "Children": obj(
        {
            "children": array(
                obj(
                    {
                        "state_machine": TEXT,
                        "label": TEXT,
                        "state": TEXT,
                        "outcome": {
                            "enum": ["succeeded", "failed", None],
                            "description": "null: the child is still running.",
                        },
                        "metadata": {"type": "object"},
                    }
                )
            ),
            "next": {
                "type": ["string", "null"],
                "description": "The next page (in the order the children were spawned), or null.",
            },
        }
    ),
    "WaitMet": {**BOOLEAN, "description": "The parent's wait is over: it leaves now."},
}
