"""``routemaster work``: a pull worker running a handler given as ``module:function``.

It needs no configuration file and no database: only the service's URL.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from routemaster.client import Refused, Worker


def handler_named(spec: str) -> Any:
    """The callable ``module:function`` names (the current directory importable, as for
    gunicorn's ``module:app``); a usage error saying what is wrong otherwise."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise click.BadParameter("expected module:function", param_hint="HANDLER")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise click.BadParameter(f"cannot import {module_name}: {error}") from error
    handler = module
    for part in name.split("."):
        handler = getattr(handler, part, None)  # type: ignore[assignment]
        if handler is None:
            raise click.BadParameter(f"{module_name} has no {name}", param_hint="HANDLER")
    if not callable(handler):
        raise click.BadParameter(f"{spec} is not callable", param_hint="HANDLER")
    return handler


@click.command()
@click.option("--url", required=True, envvar="ROUTEMASTER_URL", help="The service's base URL.")
@click.option("--state-machine", default=None, help="Claim only from this state machine.")
@click.option("--state", default=None, help="Claim only from this pull action.")
@click.option(
    "--concurrency",
    default=8,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Tasks handled at once (each on a thread of its own).",
)
@click.option(
    "--grace",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds running handlers get to finish after SIGTERM/SIGINT; then released.",
)
@click.option(
    "--wait",
    default=20.0,
    show_default=True,
    type=click.FloatRange(0, 60),
    help="Seconds a claim waits on the service for work.",
)
@click.option("--name", default=None, help="The worker's name, as explanations show it.")
@click.option(
    "--token", default=None, help="A token with the `work` scope (default: $ROUTEMASTER_TOKEN)."
)
@click.argument("handler")
def work(
    url: str,
    state_machine: str | None,
    state: str | None,
    concurrency: int,
    grace: float,
    wait: float,
    name: str | None,
    token: str | None,
    handler: str,
) -> None:
    """Run HANDLER (module:function) on the tasks of pull actions until SIGTERM or SIGINT.

    The function takes a task (id, label, state_machine, state, metadata, attempt,
    idempotency_token) and returns a dict merged into the label's metadata, or raises
    routemaster.client.Fail("why", retry=False) to error the label. Exits 0 after a
    clean drain; 1 when stopped at once by a second signal, or when the service refuses
    the claims (no such pull action, a token without the `work` scope).
    """
    worker = Worker(
        url,
        token,
        state_machine=state_machine,
        state=state,
        concurrency=concurrency,
        grace=grace,
        wait=wait,
        name=name,
    )
    worker.task(handler_named(handler))
    try:
        clean = worker.run()
    except Refused as error:
        raise click.ClickException(f"the service refused the claims: {error}") from None
    if not clean:
        sys.exit(1)
