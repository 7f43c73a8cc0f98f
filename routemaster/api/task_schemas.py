"""The JSON Schemas of pull workers' endpoints (``/tasks/...``) and of what explanations show
of a pull action (the rest are in :mod:`routemaster.api.schemas`; the OpenAPI document
has both)."""

from __future__ import annotations

from routemaster.api.schemas import BOOLEAN, INTEGER, TEXT, TIME, Schema, array, obj, ref

WORKER_SETTINGS = obj(
    {
        "lease": {**INTEGER, "description": "A fixed lease, in seconds."},
        "percentile": {
            "type": "number",
            "description": "A lease set at each claim: this percentile of recent durations.",
        },
        "min": {**INTEGER, "description": "Seconds: the percentile lease's lower bound."},
        "max": {**INTEGER, "description": "Seconds: the percentile lease's upper bound."},
        "at_most_once": {
            **BOOLEAN,
            "description": "A lease that runs out errors the label instead of offering it again.",
        },
    },
    optional=("lease", "percentile", "min", "max"),
)

LEASE = obj(
    {
        "seconds": {"type": "number"},
        "source": {
            "enum": ["fixed", "percentile", "min", "max"],
            "description": "fixed: the configured lease; percentile: the percentile of recent "
            "durations; min: fewer than 20 completions, or the percentile was below min; "
            "max: the percentile was above max.",
        },
        "samples": {
            **INTEGER,
            "description": "Completions the percentile was taken over (at most 100).",
        },
    }
)

TASK_SCHEMAS: dict[str, Schema] = {
    "Claim": obj(
        {
            "worker": {**TEXT, "description": "Who claims: shown in explanations and the console."},
            "state_machine": TEXT,
            "state": {**TEXT, "description": "A pull action (worker:) to claim from."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 1},
            "wait": {
                "type": "number",
                "minimum": 0,
                "maximum": 60,
                "default": 0,
                "description": "Seconds to wait for a task when none is due now.",
            },
        },
        optional=("state_machine", "state", "limit", "wait"),
    ),
    "Task": obj(
        {
            "id": {**TEXT, "description": "The task's capability: keep it secret."},
            "state_machine": TEXT,
            "label": TEXT,
            "state": TEXT,
            "metadata": {"type": "object"},
            "attempt": INTEGER,
            "idempotency_token": TEXT,
            "lease_expires_at": {**TEXT, "format": "date-time"},
        }
    ),
    "TaskHistory": obj(
        {
            "tasks": array(
                obj(
                    {
                        "state": TEXT,
                        "attempt": INTEGER,
                        "worker": TEXT,
                        "idempotency_token": TEXT,
                        "claimed_at": TIME,
                        "ended_at": TIME,
                        "outcome": {
                            "enum": ["completed", "failed", "released", "expired", None],
                            "description": "null: in flight, or ended by a move or a pause.",
                        },
                    }
                )
            )
        }
    ),
    "TaskList": obj({"tasks": array(ref("Task"))}),
    "Heartbeat": obj({"lease_expires_at": {**TEXT, "format": "date-time"}}),
    "Empty": obj({}, strict=False),
    "Completion": obj(
        {"metadata": {"type": "object", "description": "Deep-merged as PATCH does."}},
        optional=("metadata",),
        strict=False,
    ),
    "Failure": obj(
        {
            "error": TEXT,
            "retry": {**BOOLEAN, "default": True},
            "retry_after": {"type": ["number", "null"], "minimum": 0},
        },
        optional=("retry", "retry_after"),
        strict=False,
    ),
    "WorkerSettings": WORKER_SETTINGS,
    "Lease": LEASE,
    "Completions": obj(
        {
            "tasks": {
                **array(
                    obj(
                        {
                            "id": TEXT,
                            "metadata": {
                                "type": "object",
                                "description": "Deep-merged as PATCH does.",
                            },
                        },
                        optional=("metadata",),
                    )
                ),
                "maxItems": 100,
                "description": "Tasks to complete, in order (none only with claim).",
            },
            "claim": {**ref("Claim"), "description": "Claim next (needs the work scope)."},
        },
        optional=("claim",),
    ),
    "Completed": obj(
        {
            "completed": array(
                obj(
                    {
                        "id": TEXT,
                        "status": {
                            "enum": [200, 404, 409],
                            "description": "What /tasks/{id}/complete would have answered.",
                        },
                        "label": ref("Label"),
                        "message": TEXT,
                        "reason": {"enum": ["lease_lost"]},
                    },
                    optional=("label", "message", "reason"),
                )
            ),
            "tasks": {**array(ref("Task")), "description": "Claimed after the completions."},
        }
    ),
}
