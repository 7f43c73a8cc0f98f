"""The HTTP server layer's own CPU per request: ``serve``'s gunicorn around an app doing nothing.

``python bench/server_floor.py TREE [TREE ...] [--rounds 3] [--seconds 5] [-c 16]``
runs, for each checkout in turn (alternating, round after round), gunicorn as
``routemaster serve`` configures it (``routemaster.server.application.run_server``:
its worker class, workers, keep-alive, request limits) around a WSGI app that
answers every request with a fixed 200 JSON body of a label's size, drives it
with wrk (the read scenario's requests, ``bench/lua/bench.lua``) and prints the
server processes' CPU per request (user and system, from /proc) and the rate.
What it shows is what the server costs per request apart from the application,
the part ``bench/inprocess.py`` cannot see; paired by rounds, so that load
elsewhere on a shared machine disturbs both sides alike.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
LUA = BENCH_DIR / "lua" / "bench.lua"

SERVER = """
import sys
from routemaster.server.application import run_server

BODY = (
    b'{"metadata": {"n": 1, "go": false}, "state": "start", "state_entered_at": '
    b'"2026-11-28T10:00:00.000000+00:00", "paused": false, "errored": false, '
    b'"last_error": null, "version": "1"}'
)

def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(BODY)))])
    return [BODY]

run_server(lambda: app, bind=sys.argv[1], workers=None, threads=None, keep_alive=None,
           json_logs=False)
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _cpu(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` and its children (gunicorn's workers)."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(child) for child in children.read_text().split()]
    user = system = 0
    for each in pids:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user += int(fields[11])
        system += int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


def _wrk(url: str, seconds: int, connections: int) -> int:
    threads = "1" if connections < 2 else "2"
    command = ["wrk", "-t", threads, "-c", str(connections), "-d", f"{seconds}s"]
    command += ["-s", str(LUA), url, "--", "read", "flow", "r", "1000", threads]
    out = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("BENCHJSON "))
    return int(json.loads(line.removeprefix("BENCHJSON "))["requests"])


def _run(tree: str, seconds: int, connections: int) -> dict[str, float]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEB_")}
    env["PYTHONPATH"] = tree
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, f"127.0.0.1:{port}"],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        time.sleep(1)  # every worker booted
        _wrk(url, 1, connections)  # warm-up
        user, system = _cpu(server.pid)
        requests = _wrk(url, seconds, connections)
        user_after, system_after = _cpu(server.pid)
        return {
            "user_us": (user_after - user) / requests * 1e6,
            "system_us": (system_after - system) / requests * 1e6,
            "rate": requests / seconds,
        }
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("-c", "--connections", type=int, default=16)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {tree: [] for tree in args.trees}
    for round_ in range(args.rounds):
        order = args.trees if round_ % 2 == 0 else list(reversed(args.trees))
        for tree in order:
            result = _run(tree, args.seconds, args.connections)
            runs[tree].append(result)
            load = os.getloadavg()[0]
            print(
                f"{round_} {tree}: {result['user_us']:.0f} + {result['system_us']:.0f} us "
                f"CPU per request (user + system), {result['rate']:.0f}/s, load {load:.2f}",
                flush=True,
            )
    for tree, results in runs.items():
        total = [r["user_us"] + r["system_us"] for r in results]
        print(f"{tree}: median {statistics.median(total):.0f} us CPU per request")


if __name__ == "__main__":
    main()
