"""The API's own CPU per request, in-process: what metrics and tokens add to create and read.

``python bench/wsgi_cost.py DATABASE_URL VARIANT`` prints one line
``WSGICOST {"read_us": ..., "create_us": ...}``. It calls the Flask app's
WSGI entry directly (no HTTP server, no client) for a fixed number of
requests and reads this process's CPU clock, so load elsewhere on a shared
machine disturbs it far less than a throughput run. ``VARIANT`` is ``plain``
(no metrics, no tokens), ``project`` (metrics, as ``serve`` runs them, in
multiprocess mode) or ``secured`` (metrics and tokens). The database's own
work is not counted: it is the same for all three.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REQUESTS = 3000


def main() -> None:
    url, variant = sys.argv[1], sys.argv[2]
    directory = tempfile.mkdtemp(prefix="routemaster-wsgi-cost-")
    if variant != "plain":  # as serve does it: before prometheus_client is imported
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    from werkzeug.test import EnvironBuilder

    from routemaster.api import create_app
    from routemaster.app import App
    from routemaster.auth.admin import create_token
    from routemaster.config import load_config
    from routemaster.db.database import create_engine
    from routemaster.db.migrate import upgrade

    configs = [BENCH_DIR / "bench.yaml"]
    if variant == "secured":
        configs.append(BENCH_DIR / "bench-secured.yaml")
    engine = create_engine(url)
    upgrade(engine)
    app = App(config=load_config(configs), db=engine)
    headers: dict[str, str] = {}
    if variant != "plain":
        from routemaster.metrics import Metrics

        app.metrics = Metrics(multiprocess_dir=directory)
        app.loggers = (app.metrics.observer(),)
    if variant == "secured":
        secret, _ = create_token(engine, f"wsgi-{os.getpid()}", {"read", "write"}, wait=0)
        headers["Authorization"] = f"Bearer {secret.secret}"
    flask_app = create_app(app)
    if variant == "secured":
        flask_app.extensions["routemaster.tokens"].wait_until_current(10)

    def call(method: str, path: str, body: bytes | None, expect: str) -> None:
        environ = EnvironBuilder(
            path=path, method=method, headers=headers, data=body, content_type="application/json"
        ).get_environ()
        environ["RAW_URI"] = path

        def start(status: str, response_headers: Any, exc_info: Any = None) -> None:
            assert status.startswith(expect), status

        b"".join(flask_app.wsgi_app(environ, start))

    prefix = f"/state-machines/flow/labels/w{os.getpid()}-"
    call("POST", prefix + "read", b'{"metadata": {}}', "201")

    def measure(run: Any) -> float:
        for i in range(200):
            run(-i - 1)  # warm up
        started = time.process_time()
        for i in range(REQUESTS):
            run(i)
        return (time.process_time() - started) / REQUESTS * 1e6

    read_us = measure(lambda i: call("GET", prefix + "read", None, "200"))
    create_us = measure(lambda i: call("POST", f"{prefix}{i}", b'{"metadata": {"n": 1}}', "201"))
    print("WSGICOST " + json.dumps({"read_us": read_us, "create_us": create_us}), flush=True)
    os._exit(0)  # the token cache's thread and the pool need no orderly goodbye here


if __name__ == "__main__":
    main()
