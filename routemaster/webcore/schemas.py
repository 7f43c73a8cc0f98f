"""The JSON Schemas (OpenAPI 3.1, i.e. JSON Schema 2020-12) of request and response bodies.

Objects list every field the API sends and forbid others, so a field added
to a handler but not here fails the conformance tests instead of drifting
silently. Endpoints name these schemas in their :func:`~routemaster.webcore.endpoints.endpoint`
declaration; add a schema here when adding an endpoint with a new body.
Three tables, one per family of endpoints: :data:`SCHEMAS` (labels,
machines, operators, bulk), :data:`OUTBOUND_SCHEMAS` (the delivery log,
receivers, push subscriptions) and :data:`TASK_SCHEMAS` (pull workers'
tasks); the OpenAPI document has all three.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

TEXT: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
BOOLEAN: Schema = {"type": "boolean"}
ANY: Schema = {}

UNTIL_REFUSED = '"until" must be an ISO-8601 time with its UTC offset, e.g. "2030-01-01T09:00:00Z".'
TIME: Schema = {"type": ["string", "null"], "format": "date-time"}

MAX_LABEL_NAME = 1024
LABEL_NAME: Schema = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_LABEL_NAME,
    "pattern": "^[^\\u0000]*$",
    "description": f"1 to {MAX_LABEL_NAME} characters, without NUL; percent-encoded in a path.",
    "x-error": f"Label names are 1 to {MAX_LABEL_NAME} characters, without NUL characters.",
}
"""The label-name rule, declared once: every ``label`` path parameter, and the console's checks."""


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def obj(
    properties: dict[str, Schema], *, optional: tuple[str, ...] = (), strict: bool = True
) -> Schema:
    """An object whose properties are all required except ``optional`` ones."""
    schema: Schema = {
        "type": "object",
        "properties": properties,
        "required": [name for name in properties if name not in optional],
    }
    if strict:
        schema["additionalProperties"] = False
    return schema


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


_TRIGGER = obj(
    {
        "kind": {"enum": ["metadata", "interval", "time", "event"]},
        "path": TEXT,
        "seconds": {"type": "number"},
        "time": TEXT,
        "timezone": TEXT,
        "event": TEXT,
    },
    optional=("path", "seconds", "time", "timezone", "event"),
)

_NEXT = obj(
    {
        "type": {"enum": ["constant", "context", "none"]},
        "state": TEXT,
        "path": TEXT,
        "default": TEXT,
        "destinations": array(obj({"value": ANY, "state": TEXT})),
    },
    optional=("state", "path", "default", "destinations"),
)

_MACHINE_STATE = obj(
    {
        "name": TEXT,
        "kind": {"enum": ["gate", "action", "spawn"]},
        "exit_condition": {"type": ["string", "null"]},
        "triggers": array(ref("Trigger")),
        "webhook": {"type": ["string", "null"]},
        "worker": {
            "anyOf": [ref("WorkerSettings"), {"type": "null"}],
            "description": "A pull action: claimed through /tasks/claim.",
        },
        "next": ref("Next"),
        "end": BOOLEAN,
        "labels": {**INTEGER, "description": "Live labels in this state now."},
        "errored": {**INTEGER, "description": "How many of them are errored."},
        "outcome": {
            "enum": ["succeeded", "failed"],
            "description": "A child entering this state has finished so.",
        },
        "spawn": ref("SpawnSettings"),
    },
    optional=("outcome", "spawn"),
)

_VERSION_NUMBER: Schema = {
    "type": ["integer", "null"],
    "description": "The machine version the change was made under (null: not recorded).",
}

_CLAUSE = obj(
    {
        "text": TEXT,
        "kind": TEXT,
        "evaluated": BOOLEAN,
        "held": {"type": ["boolean", "null"]},
        "values": array(obj({"text": TEXT, "value": ANY})),
        "children": array(ref("Clause")),
        "error": TEXT,
    },
    optional=("error",),
)

TEXT_OR_NULL: Schema = {"type": ["string", "null"]}
_DRY_RUN: Schema = {"required": ["dry_run"], "properties": {"dry_run": {"const": True}}}


def _given(name: str) -> Schema:
    """The property is there and not empty."""
    return {"required": [name], "properties": {name: {"type": "string", "minLength": 1}}}


def _only_with(command: str, name: str, required: str | None) -> Schema:
    """``name`` is for ``command`` only (and required with it when ``required`` says why)."""
    if_command: Schema = {"required": ["command"], "properties": {"command": {"const": command}}}
    refused = {"type": "null", "x-error": f'"{name}" is for {command} only.'}
    rule: Schema = {"if": if_command, "else": {"properties": {name: refused}}}
    if required is not None:
        rule["then"] = {
            "required": [name],
            "properties": {name: {"type": "string"}},
            "x-error": required,
        }
    return rule


SCHEMAS: dict[str, Schema] = {
    "LabelName": LABEL_NAME,
    "Error": obj(
        {"message": {**TEXT, "description": "What went wrong, for people."}}, strict=False
    ),
    "Health": obj(
        {"status": {"const": "ok"}, "state-machines": TEXT, "version": TEXT},
    ),
    "HealthError": obj(
        {"status": {"const": "error"}, "message": TEXT, "version": TEXT},
    ),
    "MachineList": obj(
        {"state-machines": array(obj({"name": TEXT, "labels": TEXT}))},
    ),
    "Trigger": _TRIGGER,
    "Next": _NEXT,
    "Machine": obj(
        {
            "name": TEXT,
            "states": array(_MACHINE_STATE),
            "edges": array(
                obj(
                    {"from": TEXT, "to": TEXT, "kind": TEXT, "value": ANY},
                    optional=("value",),
                )
            ),
            "feeds": array(obj({"name": TEXT, "url": TEXT})),
            "label_counts": {
                "type": "object",
                "additionalProperties": INTEGER,
                "description": "Live labels per state, including states the config no longer has.",
            },
            "errored_counts": {
                "type": "object",
                "additionalProperties": INTEGER,
                "description": "Errored labels per state, for the states that have any.",
            },
            "labels": TEXT,
            "errored_labels": {**TEXT, "description": "The listing of its errored labels."},
            "changes": {**TEXT, "description": "Its changes stream."},
        }
    ),
    "Versions": obj(
        {
            "versions": array(
                obj(
                    {
                        "version": INTEGER,
                        "applied_at": TIME,
                        "digest": {**TEXT, "description": "SHA-256 of the definition's JSON."},
                        "definition": {
                            "type": "object",
                            "description": "The machine as GET /state-machines/{sm} shows it"
                            " (without label counts); no header values or secrets.",
                        },
                    }
                )
            ),
            "next": {"type": ["string", "null"], "description": "The next page, or null."},
        }
    ),
    "LabelList": obj(
        {
            "labels": array(obj({"name": TEXT, "state": TEXT})),
            "create": TEXT,
            "next": {**TEXT, "description": "The next page, when there is one (with ?limit=)."},
        },
        optional=("next",),
    ),
    "MetadataBody": obj(
        {"metadata": {"type": "object", "description": "Any JSON object."}}, strict=False
    ),
    "Label": obj(
        {
            "metadata": {"type": "object"},
            "state": TEXT,
            "state_entered_at": TIME,
            "paused": BOOLEAN,
            "errored": BOOLEAN,
            "last_error": {"type": ["string", "null"]},
            # the machine version the label follows: its own on a continue machine
            "version": {"type": ["integer", "null"]},
            "parent": ref("Parent"),
        },
        optional=("parent",),
    ),
    "History": obj(
        {
            "history": array(
                obj(
                    {
                        "kind": {"enum": ["created", "moved", "deleted", "forced", "errored"]},
                        "old_state": {"type": ["string", "null"]},
                        "new_state": {
                            "type": ["string", "null"],
                            "description": "null: the label was deleted.",
                        },
                        "created": TIME,
                        "forced": BOOLEAN,
                        "reason": {"type": ["string", "null"]},
                        "version": _VERSION_NUMBER,
                    }
                )
            )
        }
    ),
    "Clause": _CLAUSE,
    "Explanation": obj(
        {
            "state": TEXT,
            "state_entered_at": TIME,
            "previous_state": {"type": ["string", "null"]},
            "paused": BOOLEAN,
            "paused_until": {**TIME, "description": "When a paused label resumes by itself."},
            "errored": BOOLEAN,
            "last_error": {"type": ["string", "null"]},
            "attempts": INTEGER,
            "due_at": TIME,
            "next_check_at": {
                **TIME,
                "description": "In a gate: the earliest moment its exit condition could hold "
                "with the label's metadata (null: not until the metadata changes).",
            },
            "next_check_reason": {
                "type": ["string", "null"],
                "description": "The clause that sets next_check_at.",
            },
            "kind": {"enum": ["gate", "action", "spawn", None]},
            "spawn": ref("SpawnProgress"),
            "children": {**ref("ChildrenCounts"), "description": "A waiting parent's children."},
            "wait_met": ref("WaitMet"),
            "message": TEXT,
            "next": ref("Next"),
            "webhook": TEXT,
            "worker": ref("WorkerSettings"),
            "async_timeout": {**INTEGER, "description": "Seconds a 202 keeps the label leased."},
            "task": {
                "anyOf": [
                    obj(
                        {
                            "worker": TEXT,
                            "attempt": INTEGER,
                            "claimed_at": TIME,
                            "lease_expires_at": TIME,
                            "lease": ref("Lease"),
                        }
                    ),
                    {"type": "null"},
                ],
                "description": "The task holding the label now (pull workers, 202 callbacks).",
            },
            "waiting_for": {
                "anyOf": [ref("WaitingFor"), {"type": "null"}],
                "description": "In an action with a flow: the key the label waits its turn "
                "for, without using attempts (null: not waiting in the flow).",
            },
            "triggers": array(ref("Trigger")),
            "exit_condition": obj(
                {
                    "source": TEXT,
                    "result": {"type": ["boolean", "null"]},
                    "error": {"type": ["string", "null"]},
                    "warnings": array(TEXT),
                    "clause": ref("Clause"),
                }
            ),
            "next_state_if_held": {
                "type": ["string", "null"],
                "description": "Where the label would go if the condition held (null: nowhere, "
                "the gate is an end state).",
            },
            "next_state_error": TEXT,
            "recent_deliveries": array(ref("Delivery")),
        },
        optional=(
            "paused_until",
            "message",
            "next",
            "webhook",
            "worker",
            "async_timeout",
            "task",
            "waiting_for",
            "triggers",
            "exit_condition",
            "next_state_if_held",
            "next_state_error",
            "spawn",
            "children",
            "wait_met",
        ),
    ),
    "LabelCount": obj({"count": {**INTEGER, "description": "Live labels matching the filters."}}),
    "LabelListOrCount": {"anyOf": [ref("LabelList"), ref("LabelCount")]},
    "Bulk": {
        **obj(
            {
                "command": {"enum": ["retry", "pause", "resume", "move", "delete", "upgrade"]},
                "where": TEXT_OR_NULL,
                "state": TEXT_OR_NULL,
                "errored": {"type": ["boolean", "null"]},
                "prefix": TEXT_OR_NULL,
                "to": {
                    **TEXT_OR_NULL,
                    "description": "move only (and required there): the state to move to.",
                },
                "until": {
                    "type": ["string", "null"],
                    "format": "date-time",
                    "description": "pause only: ISO-8601 with offset, in the future; "
                    "each label resumes by itself then.",
                    "x-error": UNTIL_REFUSED,
                },
                "reason": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Recorded in each label's history.",
                    "x-error": 'A bulk command needs a "reason": it is recorded in each '
                    "label's history.",
                },
                "dry_run": {"type": ["boolean", "null"]},
                "expect": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "A real run (not dry_run): the count a dry run answered.",
                },
            },
            optional=("where", "state", "errored", "prefix", "to", "until", "dry_run", "expect"),
        ),
        "description": "A real run (without dry_run: true) needs at least one filter (where, "
        "state, errored: true or prefix) and expect; to only with move, until only with pause.",
        "allOf": [
            {
                "if": _DRY_RUN,
                "else": {
                    "anyOf": [
                        _given("where"),
                        _given("state"),
                        _given("prefix"),
                        {"required": ["errored"], "properties": {"errored": {"const": True}}},
                    ],
                    "x-error": "A bulk command needs at least one filter: where, state, "
                    "errored or prefix.",
                },
            },
            {
                "if": _DRY_RUN,
                "else": {
                    "required": ["expect"],
                    "x-error": 'A bulk command needs "expect": the number of labels a dry '
                    "run counted.",
                },
            },
            _only_with("move", "to", 'A bulk move needs "to": the state to move the labels to.'),
            _only_with("pause", "until", None),
        ],
    },
    "BulkDryRun": obj({"count": INTEGER, "sample": array(TEXT)}),
    "BulkAccepted": obj({"id": INTEGER, "count": INTEGER}),
    "BulkMismatch": obj({"message": TEXT, "reason": {"const": "count_mismatch"}, "count": INTEGER}),
    "BulkJob": obj(
        {
            "id": INTEGER,
            "command": TEXT,
            "state_machine": TEXT,
            "total": INTEGER,
            "done": INTEGER,
            "skipped": INTEGER,
            "failed": INTEGER,
            "state": {"enum": ["running", "finished"]},
            "until": {
                **TEXT,
                "format": "date-time",
                "description": "A pause with until: when each label resumes.",
            },
        },
        optional=("until",),
    ),
    "Command": obj({"reason": {"type": ["string", "null"]}}, optional=("reason",), strict=False),
    "Move": {
        **obj(
            {"state": TEXT, "reason": {"type": ["string", "null"]}},
            optional=("reason",),
            strict=False,
        ),
        "x-error": 'The request body must name the destination: {"state": "..."}.',
    },
    "Pause": obj(
        {
            "reason": {"type": ["string", "null"]},
            "until": {
                "type": ["string", "null"],
                "format": "date-time",
                "description": "ISO-8601 with offset: the label resumes by itself then.",
                "x-error": UNTIL_REFUSED,
            },
        },
        optional=("reason", "until"),
        strict=False,
    ),
}


# --- the outbound calls: the delivery log, receivers, push subscriptions ---------------

MAX_URL = 2048
POSITION_PATTERN = "^[0-9]{1,19}-[0-9]{1,19}$"

SUBSCRIPTION = obj(
    {
        "name": TEXT,
        "url": TEXT,
        "state_machines": nullable(array(TEXT)),
        "max_events": INTEGER,
        "batch_delay_ms": INTEGER,
        "signing_secret_env": {"type": ["string", "null"]},
        "cursor": {**TEXT, "description": "The last acknowledged changes-stream position"},
        "pending": {**INTEGER, "description": "Changes after the cursor that it takes"},
        "oldest_pending_at": TIME,
        "in_flight": nullable(obj({"webhook_id": TEXT, "events": INTEGER, "last_id": TEXT})),
        "next_attempt_at": TIME,
        "last_attempt_at": TIME,
        "last_success_at": TIME,
        "last_error": {"type": ["string", "null"]},
        "failures_in_a_row": INTEGER,
        "lost_events": {
            **INTEGER,
            "description": "Changes retention removed (or skipped) before they were sent: "
            "the subscription had fallen behind the oldest kept position",
        },
        "created_at": TIME,
        "updated_at": TIME,
    }
)

OUTBOUND_SCHEMAS: dict[str, Schema] = {
    "Delivery": obj(
        {
            "id": INTEGER,
            "kind": {"enum": ["webhook", "feed", "subscription"]},
            "state_machine": TEXT_OR_NULL,
            "label": TEXT_OR_NULL,
            "state": TEXT_OR_NULL,
            "url": {"type": "string", "description": "Userinfo and query values redacted."},
            "receiver": TEXT,
            "attempt": {"type": ["integer", "null"]},
            "trigger": {"enum": ["scheduled", "retry", "manual", "probe"]},
            "started_at": TIME,
            "duration_ms": INTEGER,
            "status": {"type": ["integer", "null"], "description": "null: no answer."},
            "outcome": {
                "enum": [
                    "delivered",
                    "accepted",
                    "failed",
                    "gone",
                    "timeout",
                    "network",
                    "throttled",
                ]
            },
            "error": TEXT_OR_NULL,
            "response_excerpt": {
                "type": ["string", "null"],
                "description": "The first KiB of the answer's body, as text.",
            },
        }
    ),
    "DeliveryList": obj(
        {
            "deliveries": array(ref("Delivery")),
            "next": {"type": ["string", "null"], "description": "The next page, if any."},
        }
    ),
    "Receiver": obj(
        {
            "id": {"type": "string", "description": "URL-safe, from the origin."},
            "origin": TEXT,
            "state": {"enum": ["closed", "open", "half_open", "paused"]},
            "in_flight": INTEGER,
            "waiting": {"type": "integer", "description": "Labels due for it, not yet sent."},
            "failures_in_a_row": INTEGER,
            "last_success_at": TIME,
            "last_failure_at": TIME,
            "last_error": TEXT_OR_NULL,
            "open_until": TIME,
            "max_in_flight": {"type": ["integer", "null"]},
            "rate": TEXT_OR_NULL,
        }
    ),
    "ReceiverList": obj({"receivers": array(ref("Receiver"))}),
    "RetryErrored": obj(
        {
            "since": {
                "type": "string",
                "format": "date-time",
                "description": "Retry the labels that became errored at or after this time.",
            },
            "until": {
                "type": ["string", "null"],
                "format": "date-time",
                "description": "...and before this one (null or left out: now).",
            },
            "reason": TEXT_OR_NULL,
        },
        optional=("until", "reason"),
    ),
    "RetryCount": obj({"count": INTEGER}),
    "Subscription": SUBSCRIPTION,
    "SubscriptionList": obj({"subscriptions": array(ref("Subscription"))}),
    "SubscriptionBody": obj(
        {
            "url": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_URL,
                "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://[^/?#@]+([/?#]|$)",
                "description": "http or https, without user or password; refused (400, "
                '"reason": "forbidden_address") when it resolves inside the network, unless '
                "the configuration allows it",
                "x-error": f'"url" must be an http or https URL of at most {MAX_URL} characters.',
            },
            "state_machines": {
                "anyOf": [{**array(TEXT), "minItems": 1}, {"type": "null"}],
                "description": "Only these machines' changes (null or left out: every machine); "
                "a name the configuration lacks is refused (400).",
                "x-error": '"state_machines" must be a non-empty list of state machine names.',
            },
            "max_events": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
            "batch_delay_ms": {
                "type": "integer",
                "minimum": 0,
                "maximum": 3_600_000,
                "default": 500,
            },
            "signing_secret_env": {
                "type": ["string", "null"],
                "pattern": "^ROUTEMASTER_SUBSCRIPTION_SECRET_[A-Za-z0-9_]{1,200}$",
                "description": "The environment variable holding the signing secret.",
                "x-error": '"signing_secret_env" must name an environment variable starting '
                "ROUTEMASTER_SUBSCRIPTION_SECRET_ (letters, digits, _).",
            },
            "after": {
                **TEXT_OR_NULL,
                "pattern": POSITION_PATTERN,
                "description": "A changes-stream position (XACT-ID); only when creating",
                "x-error": '"after" must be a changes-stream position (XACT-ID).',
            },
        },
        optional=("state_machines", "max_events", "batch_delay_ms", "signing_secret_env", "after"),
    ),
    "Cursor": {
        **obj(
            {
                "after": {
                    **TEXT,
                    "pattern": POSITION_PATTERN,
                    "description": "A changes-stream position (XACT-ID)",
                }
            }
        ),
        "x-error": 'The body must be {"after": POSITION}.',
    },
}


# --- pull workers' tasks, and what explanations show of a pull action -----------------

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
