"""Gunicorn's own log lines (start-up, workers, errors) as JSON when the plugins ask for JSON."""

from __future__ import annotations

from typing import Any

from gunicorn.glogging import Logger as GunicornLogger

from routemaster.logging import JsonFormatter


class JsonGunicornLogger(GunicornLogger):  # type: ignore[misc]
    """Gunicorn's own lines (start-up, workers, errors) as JSON too."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                handler.setFormatter(JsonFormatter())
