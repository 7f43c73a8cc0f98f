"""What every long-running command checks and sets up before it starts: which database, the
tuning variables, JSON logs, and the ``-c`` option wherever it is written.

Each problem is one line naming what to change, never a traceback.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from routemaster.app import Settings
from routemaster.db.plumbing.database import (
    DatabaseURLError,
    direct_url_from_environment,
    url_from_environment,
)
from routemaster.db.plumbing.embedded import EmbeddedUnavailable, embedded_database_url
from routemaster.logging import JsonFormatter

ENV_PREFIX = "ROUTEMASTER_"
EMBEDDED = "embedded"

NO_DATABASE = (
    "No database: set DATABASE_URL=postgresql://USER:PASSWORD@HOST:PORT/NAME "
    "(or DB_HOST, DB_PORT, DB_NAME, DB_USER, DB_PASS), "
    "or ROUTEMASTER_DATABASE=embedded for a private development database"
)

# Inclusive bounds of the tuning variables; any other number or duration must be > 0.
LIMITS: dict[str, tuple[float, float]] = {
    "max_request_body": (1, 2**31),
    "max_response_body": (1, 2**31),
    "max_json_depth": (1, 10_000),
    "statement_timeout": (0, 86_400),  # 0: none
    "max_transitions": (1, 10_000),
    "delivery_concurrency": (1, 1024),
    "batch_size": (1, 100_000),
    "evaluation_retry_delay": (0, 86_400),
    "lease": (1, 86_400),
    "poll_interval": (0.01, 3_600),
    "feed_timeout": (0.01, 3_600),
    "feed_timeout_in_request": (0.01, 3_600),
    "changes_poll_interval": (0.01, 60),
    "stream_heartbeat": (0.05, 3_600),
    "max_streams": (1, 100_000),
    "max_waiting_claims": (1, 100_000),
    "task_retention": (86_400, 10 * 365 * 86_400),  # at least a day: longer than any lease
    "label_gauges_interval": (0, 3_600),  # 0: counted at every scrape
    "token_use_interval": (0.01, 86_400),
    "subscription_concurrency": (1, 1024),
    "subscription_timeout": (0.01, 3_600),
    "subscription_lease": (1, 86_400),
    "subscription_poll": (0.005, 60),
    "subscription_backoff": (0.01, 3_600),
    "subscription_max_backoff": (0.01, 86_400),
    "delivery_retention": (60, 10 * 365 * 86_400),
    "bulk_retention": (60, 10 * 365 * 86_400),
    "retention_interval": (0.1, 86_400),
    "migrations_interval": (0.1, 86_400),
}


def settings_from_environment(environ: Mapping[str, str] | None = None) -> Settings:
    """:class:`Settings` with each field overridable as ``ROUTEMASTER_<FIELD>``, range-checked.

    Durations are given in seconds (``ROUTEMASTER_LEASE=30``). A value that is
    not a number, or out of range, is a usage error naming the variable.
    """
    env = os.environ if environ is None else environ
    defaults = Settings()
    overrides: dict[str, Any] = {}
    for field in dataclasses.fields(Settings):
        name = ENV_PREFIX + field.name.upper()
        raw = env.get(name)
        if raw is None:
            continue
        default = getattr(defaults, field.name)
        try:
            overrides[field.name] = _parse(field.name, default, raw)
        except ValueError as error:
            raise click.UsageError(f"{name}={raw!r}: {error}") from error
    return dataclasses.replace(defaults, **overrides)


def _parse(field: str, default: Any, raw: str) -> Any:
    if isinstance(default, bool):
        words = {"1": True, "true": True, "yes": True, "on": True}
        words |= {"0": False, "false": False, "no": False, "off": False}
        if raw.strip().lower() not in words:
            raise ValueError("expected true or false")
        return words[raw.strip().lower()]
    if isinstance(default, str):
        if not raw.strip():
            raise ValueError("must not be empty")
        return raw
    if isinstance(default, int):
        try:
            number: float = int(raw)
        except ValueError:
            raise ValueError("expected a whole number") from None
    else:
        try:
            number = float(raw)
        except ValueError:
            raise ValueError("expected a number (seconds for durations)") from None
        if not math.isfinite(number):
            raise ValueError("expected a finite number")
    low, high = LIMITS.get(field, (math.ulp(0), math.inf))
    if not low <= number <= high:
        low_text = "more than 0" if low == math.ulp(0) else f"at least {low:g}"
        high_text = "" if high == math.inf else f" and at most {high:g}"
        raise ValueError(f"must be {low_text}{high_text}")
    if isinstance(default, datetime.timedelta):
        return datetime.timedelta(seconds=number)
    return type(default)(number)


def direct_database_url() -> str | None:
    """``ROUTEMASTER_DIRECT_DATABASE_URL``; the embedded server's URL when that is the database
    (it is PostgreSQL itself); else ``None``: ``LISTEN`` is tried on ``DATABASE_URL``."""
    try:
        direct = direct_url_from_environment()
        named = url_from_environment()
    except DatabaseURLError as error:
        raise click.ClickException(str(error)) from None
    if direct is not None or named is not None:
        return direct
    return database_url()


def database_url() -> str:
    """The named server, or the embedded one when asked for; else one line saying what to set."""
    try:
        url = url_from_environment()
    except DatabaseURLError as error:
        raise click.ClickException(str(error)) from None
    if url:
        return url
    wanted = os.environ.get("ROUTEMASTER_DATABASE", "")
    if wanted == EMBEDDED:
        try:
            return embedded_database_url()
        except EmbeddedUnavailable as error:
            raise click.ClickException(str(error)) from error
    if wanted:
        raise click.ClickException(
            f"ROUTEMASTER_DATABASE={wanted!r}: the only value is 'embedded'; "
            "a server is named with DATABASE_URL"
        )
    raise click.ClickException(NO_DATABASE)


F = TypeVar("F", bound=Callable[..., Any])


def late_config_option(command: F) -> F:
    """``-c``/``--config``/``--config-file`` after the command too (1.x spelled it --config-file).

    Files given there are layered after those given before the command.
    """

    @click.option(
        "-c",
        "--config",
        "--config-file",
        "late_config_paths",
        multiple=True,
        metavar="CONFIG",
        help="A YAML config file; repeat to layer later files over earlier ones.",
    )
    @functools.wraps(command)
    def wrapper(*args: Any, late_config_paths: tuple[str, ...], **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        if late_config_paths:
            ctx.obj = dataclasses.replace(
                ctx.obj, config_paths=(*ctx.obj.config_paths, *late_config_paths)
            )
        return command(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def use_json_logs() -> None:
    """Every log line of this process as one JSON object (``json: true`` on the PythonLogger)."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())
