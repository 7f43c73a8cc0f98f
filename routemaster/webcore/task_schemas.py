"""The JSON Schemas of pull workers' endpoints (``/tasks/...``) and of what explanations show
of a pull action (the rest are in :mod:`routemaster.webcore.schemas`; the OpenAPI document
has both)."""

from __future__ import annotations

from routemaster.webcore.schemas import (
    BOOLEAN,
    INTEGER,
    TEXT,
    TEXT_OR_NULL,
    TIME,
    Schema,
    array,
    obj,
    ref,
)

MAX_WORKER_NAME = 200
MAX_CLAIM = 100  # tasks claimed, or completed, in one request
MAX_CLAIM_WAIT = 60  # seconds
MAX_RETRY_AFTER = 86_400  # seconds

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
            "worker": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_WORKER_NAME,
                "pattern": "\\S",
                "description": "Who claims: shown in explanations and the console.",
                "x-error": '"worker" must name the worker: text of 1 to '
                f"{MAX_WORKER_NAME} characters.",
            },
            "state_machine": TEXT_OR_NULL,
            "state": {**TEXT_OR_NULL, "description": "A pull action (worker:) to claim from."},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_CLAIM, "default": 1},
            "wait": {
                "type": "number",
                "minimum": 0,
                "maximum": MAX_CLAIM_WAIT,
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
        {"metadata": {"type": ["object", "null"], "description": "Deep-merged as PATCH does."}},
        optional=("metadata",),
        strict=False,
    ),
    "Failure": obj(
        {
            "error": {**TEXT, "x-error": '"error" must say what went wrong, as text.'},
            "retry": {**BOOLEAN, "default": True},
            "retry_after": {
                "type": ["number", "null"],
                "minimum": 0,
                "maximum": MAX_RETRY_AFTER,
                "description": "Seconds until the next attempt, instead of the backoff.",
            },
        },
        optional=("retry", "retry_after"),
        strict=False,
    ),
    "WorkerSettings": WORKER_SETTINGS,
    "Lease": LEASE,
    "Completions": {
        **obj(
            {
                "tasks": {
                    **array(
                        obj(
                            {
                                "id": TEXT,
                                "metadata": {
                                    "type": ["object", "null"],
                                    "description": "Deep-merged as PATCH does.",
                                },
                            },
                            optional=("metadata",),
                        )
                    ),
                    "maxItems": MAX_CLAIM,
                    "description": "Tasks to complete, in order (none only with claim).",
                },
                "claim": {
                    "anyOf": [ref("Claim"), {"type": "null"}],
                    "description": "Claim next (needs the work scope).",
                },
            },
            optional=("claim",),
        ),
        "allOf": [
            {
                "anyOf": [
                    {"properties": {"tasks": {"minItems": 1}}},
                    {"required": ["claim"], "properties": {"claim": {"not": {"type": "null"}}}},
                ],
                "x-error": '"tasks" is empty: give tasks to complete, or a "claim".',
            }
        ],
    },
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
