"""How request handlers reach the :class:`~routemaster.app.App` without a global."""

from __future__ import annotations

from typing import cast

from flask import current_app
from werkzeug.exceptions import NotFound

from routemaster.app import App
from routemaster.config.model import StateMachine

EXTENSION_KEY = "routemaster"
STARTED = "routemaster.started"
"""The WSGI environ key holding ``time.perf_counter()`` when the request reached the app."""


def routemaster_app() -> App:
    """The App that ``create_app`` attached to the Flask app serving this request."""
    return cast(App, current_app.extensions[EXTENSION_KEY])


def machine_or_404(app: App, name: str) -> StateMachine:
    try:
        return app.config.get_machine(name)
    except KeyError:
        raise NotFound(f"No state machine called {name!r}.") from None
