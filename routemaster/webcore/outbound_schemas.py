"""The JSON Schemas of the outbound calls' endpoints: the delivery log, receivers, push
subscriptions (the rest are in :mod:`routemaster.webcore.schemas`; the OpenAPI document
has both)."""

from __future__ import annotations

from routemaster.webcore.schemas import (
    INTEGER,
    TEXT,
    TEXT_OR_NULL,
    TIME,
    Schema,
    array,
    nullable,
    obj,
    ref,
)

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
