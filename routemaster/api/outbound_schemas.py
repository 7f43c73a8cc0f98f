"""The JSON Schemas of the outbound calls' endpoints: the delivery log, receivers, push
subscriptions (the rest are in :mod:`routemaster.api.schemas`; the OpenAPI document
has both)."""

from __future__ import annotations

from routemaster.api.schemas import INTEGER, TEXT, TIME, Schema, array, nullable, obj, ref

TEXT_OR_NULL: Schema = {"type": ["string", "null"]}

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
            "since": {"type": "string", "format": "date-time"},
            "until": {"type": "string", "format": "date-time"},
            "reason": TEXT,
        },
        optional=("until", "reason"),
    ),
    "RetryCount": obj({"count": INTEGER}),
    "Subscription": SUBSCRIPTION,
    "SubscriptionList": obj({"subscriptions": array(ref("Subscription"))}),
    "SubscriptionBody": obj(
        {
            "url": {
                **TEXT,
                "description": "http or https; never inside the network unless allowed",
            },
            "state_machines": nullable(array(TEXT)),
            "max_events": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
            "batch_delay_ms": {
                "type": "integer",
                "minimum": 0,
                "maximum": 3_600_000,
                "default": 500,
            },
            "signing_secret_env": {
                "type": ["string", "null"],
                "pattern": "^ROUTEMASTERSUBSCRIPTION_SECRET_[A-Za-z0-9_]+$",
            },
            "after": {**TEXT, "description": "A changes-stream position; only when creating"},
        },
        optional=("state_machines", "max_events", "batch_delay_ms", "signing_secret_env", "after"),
    ),
    "Cursor": obj({"after": {**TEXT, "description": "A changes-stream position (XACT-ID)"}}),
}
