"""The API's own CPU per request, in-process: what metrics and tokens add to create and read.

``python bench/wsgi_cost.py DATABASE_URL VARIANT`` prints one line
``WSGICOST {"read_us": ..., "create_us": ...}``. It calls the Flask app's
WSGI entry directly (no HTTP server, no client) for a fixed number of
requests (their environs built beforehand) and reads this process's CPU
clock, keeping the least disturbed of several chunks, so load elsewhere on a
shared machine disturbs it far less than a throughput run. ``VARIANT`` is ``plain``
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
REQUESTS = 3000  # timed, in CHUNKS chunks
CHUNKS = 6
WARM_UP = 200


def main() -> None:
    url, variant = sys.argv[1], sys.argv[2]
    directory = tempfile.mkdtemp(prefix="routemaster-wsgi-cost-")
    if variant != "plain":  # as serve does it: before prometheus_client is imported
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    from werkzeug.test import EnvironBuilder

    from routemaster.app import App
    from routemaster.auth.admin import create_token
    from routemaster.config import load_config
    from routemaster.db.plumbing.database import create_engine
    from routemaster.db.upgrade import upgrade
    from routemaster.web import create_app

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

    def environ(method: str, path: str, body: bytes | None) -> dict[str, Any]:
        built = EnvironBuilder(
            path=path, method=method, headers=headers, data=body, content_type="application/json"
        ).get_environ()
        built["RAW_URI"] = path
        return built

    def call(request: dict[str, Any], expect: str) -> None:
        def start(status: str, response_headers: Any, exc_info: Any = None) -> None:
            assert status.startswith(expect), status

        b"".join(flask_app.wsgi_app(request, start))

    prefix = f"/state-machines/flow/labels/w{os.getpid()}-"
    call(environ("POST", prefix + "read", b'{"metadata": {}}'), "201")

    def measure(requests: list[dict[str, Any]], expect: str) -> float:
        """The least disturbed of several chunks: microseconds of CPU per request."""
        for request in requests[:WARM_UP]:
            call(request, expect)
        timed = requests[WARM_UP:]
        chunk = len(timed) // CHUNKS
        best = float("inf")
        for start in range(0, chunk * CHUNKS, chunk):
            started = time.process_time()
            for request in timed[start : start + chunk]:
                call(request, expect)
            best = min(best, (time.process_time() - started) / chunk * 1e6)
        return best

    total = WARM_UP + REQUESTS
    read = environ("GET", prefix + "read", None)
    read_us = measure([dict(read) for _ in range(total)], "200")
    creates = [environ("POST", f"{prefix}{i}", b'{"metadata": {"n": 1}}') for i in range(total)]
    create_us = measure(creates, "201")
    print("WSGICOST " + json.dumps({"read_us": read_us, "create_us": create_us}), flush=True)
    os._exit(0)  # the token cache's thread and the pool need no orderly goodbye here


if __name__ == "__main__":
    main()
