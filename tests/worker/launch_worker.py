"""Run one real worker process for the multi-process tests.

``python tests/worker/launch_worker.py CONFIG.yaml [CLOCK_OFFSET_SECONDS]``

Like ``routemaster -c CONFIG.yaml cron`` (settings from ``ROUTEMASTER_*``,
database from ``DATABASE_URL``), plus an optional clock offset so that
several processes agree on a fake time near a daily trigger.
"""

from __future__ import annotations

import datetime
import logging
import sys

from routemaster.app import App, utc_now
from routemaster.cli.environment import settings_from_environment
from routemaster.config import load_config
from routemaster.db.plumbing.database import (
    create_engine,
    direct_url_from_environment,
    url_from_environment,
)
from routemaster.worker import run_worker


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
    )
    # Each delivery at DEBUG: the tests read which worker delivered what.
    logging.getLogger("routemaster.worker.delivery").setLevel(logging.DEBUG)
    # Each occurrence another worker recorded first, likewise: the tests wait for it.
    logging.getLogger("routemaster.worker.clock_triggers").setLevel(logging.DEBUG)
    config = load_config([sys.argv[1]])
    offset = datetime.timedelta(seconds=float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
    url = url_from_environment()
    assert url is not None, "set DATABASE_URL"
    engine = create_engine(url)
    direct_url = direct_url_from_environment()
    direct = None if direct_url is None else create_engine(direct_url, pool_size=1)
    try:
        app = App(config=config, db=engine, settings=settings_from_environment(), direct=direct)
        app.clock = lambda: utc_now() + offset
        run_worker(app)
    finally:
        engine.dispose()
        if direct is not None:
            direct.dispose()


if __name__ == "__main__":
    main()
