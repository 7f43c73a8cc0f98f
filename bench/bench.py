"""The benchmark suite: this project vs thread/routemaster 1.5.0 vs pgbench, same machine, same run.

Run it with ``bench/run`` (which installs the reference and wrk first); see
docs/performance.md for what each scenario measures and what limits it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from measure import (
    BENCH_DIR,
    MemorySampler,
    Server,
    cpu_ms_per_request,
    cpu_sample,
    run_pgbench,
    run_wrk,
    run_wrk_until,
    summarise,
)
from report import evaluate, print_table
from streams import OpenStreams
from targets import REFERENCE_VENV, REPO, RUN_SUFFIX, VARIANTS, Project, Reference, Target

RECEIVER_PORT = 18089
# Several engineers may bench on one machine: ROUTEMASTER_BENCH_INSTANCE=N (N > 0)
# gives this run's services their own databases (bench_project_iN, ...) and ports (+100 N).
INSTANCE = int(os.environ.get("ROUTEMASTER_BENCH_INSTANCE") or 0)
SUFFIX = f"_i{INSTANCE}" if INSTANCE else ""
STREAMS = 50  # open changes streams in the *_streams50 scenarios
PATCH_SIZES = [("flat", "1k"), ("flat", "10k"), ("flat", "100k"), ("nested", "1k")]
PATCH_SIZES += [("nested", "10k"), ("nested", "60k")]


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, remainder = divmod(number, 36)
        text = digits[remainder] + text
        if not number:
            return text


@dataclass(frozen=True)
class Profile:
    """How long and how big: the default run and ``--quick``."""

    duration: float  # seconds per measured wrk/pgbench run
    warmup: float
    reps: int  # measured runs per HTTP/pgbench scenario
    slow_reps: int  # runs of the interval and action scenarios (each waits for a trigger)
    scales: tuple[int, ...]  # existing labels for the create/read/update scenarios
    list_scale: int
    interval_sizes: tuple[int, ...]
    action_labels: dict[str, int]  # per target
    reference_cap: float  # seconds a reference drain may run before its rate is extrapolated
    project_cap: float
    reference_minute_jobs: bool  # measure the reference's once-a-minute drains (each waits ~1 min)
    cost_rounds: int  # interleaved rounds of the cost comparison (plain/project/secured)


FULL = Profile(
    duration=5,
    warmup=2,
    reps=3,
    slow_reps=1,
    scales=(0, 10_000, 100_000),
    list_scale=100_000,
    interval_sizes=(2_000, 100_000),
    action_labels={"project": 5_000, "reference": 1_000},
    reference_cap=60,
    project_cap=180,
    reference_minute_jobs=True,
    cost_rounds=9,
)
QUICK = Profile(
    duration=2,
    warmup=1,
    reps=1,
    slow_reps=1,
    scales=(0, 10_000),
    list_scale=10_000,
    interval_sizes=(2_000,),
    action_labels={"project": 2_000, "reference": 300},
    reference_cap=20,
    project_cap=60,
    reference_minute_jobs=False,
    cost_rounds=7,
)


class Suite:
    def __init__(
        self,
        profile: Profile,
        server: Server,
        log_dir: Path,
        scenarios: set[str] | None,
        tree: Path = REPO,
    ):
        self.p = profile
        self.tree = tree
        self.server = server
        self.log_dir = log_dir
        self.only = scenarios
        self.sampler = MemorySampler()
        self.results: dict[str, dict[str, Any]] = {}
        self.memory: dict[str, dict[str, int]] = {}
        self.counter = 0
        self.round_ratios: dict[str, dict[str, Any]] = {}  # the turn-about comparison's

    # -- bookkeeping ---------------------------------------------------------

    def wanted(self, key: str) -> bool:
        return self.only is None or any(key.startswith(s) for s in self.only)

    def tag(self, base: str) -> str:
        self.counter += 1
        return f"{base}{self.counter}"

    def record(self, key: str, target: str, unit: str, values: list[float], **extra: Any) -> None:
        peaks = self.sampler.take()
        # other work on the machine skews every figure: keep the load next to it
        entry = {
            "unit": unit,
            **summarise(values),
            **extra,
            "loadavg_1m_after": round(os.getloadavg()[0], 2),
        }
        if target in peaks:
            entry["peak_rss_mib"] = {k: round(v / 2**20, 1) for k, v in peaks[target].items()}
            overall = self.memory.setdefault(target, {})
            for role, rss in peaks[target].items():
                overall[role] = max(overall.get(role, 0), rss)
        self.results.setdefault(key, {})[target] = entry
        median = entry["median"]
        shown = "n/a" if median is None else f"{median:,.1f}"
        print(
            f"  {key:<22} {target:<10} {shown:>12} {unit}"
            + (f"  ({extra['note']})" if extra.get("note") else ""),
            flush=True,
        )

    # -- pgbench ---------------------------------------------------------------

    def prepare_pgbench(self) -> tuple[str, dict[str, Path]]:
        """A database with this project's schema, and pgbench's insert and read scripts."""
        pg = Project(self.server, self.log_dir, tree=self.tree)
        pg.database = "bench_pgbench" + RUN_SUFFIX + SUFFIX
        pg.fresh_database()
        pg.bulk_labels("flow", "start", "r", 1000, {"go": False})
        pg.query("CREATE SEQUENCE pgbench_names")
        pg.analyze()
        history_seq = pg.query("SELECT pg_get_serial_sequence('history', 'id')")
        insert = self.log_dir / "insert.sql"
        insert.write_text(
            "BEGIN;\n"
            "INSERT INTO history (state_machine, label, old_state, new_state, shard_key) "
            "VALUES ('flow', 'p' || nextval('pgbench_names'), NULL, 'start', "
            "routemaster_shard_key('p' || currval('pgbench_names')));\n"
            "INSERT INTO labels (state_machine, name, metadata, state, state_entered_at, entry_id, "
            "name_key, shard_key) "
            "VALUES ('flow', 'p' || currval('pgbench_names'), '{\"n\": 1, \"go\": false}', "
            f"'start', now(), currval('{history_seq}'), "
            "routemaster_label_key('p' || currval('pgbench_names')), "
            "routemaster_shard_key('p' || currval('pgbench_names')));\n"
            "END;\n"
        )
        read = self.log_dir / "read.sql"
        read.write_text(
            "\\set i random(0, 999)\n"
            # the API's primary-key lookup: the key (migration 0006) and the full name
            "SELECT * FROM labels WHERE state_machine = 'flow' "
            "AND name_key = convert_to('r-' || :i, 'UTF8') AND name = 'r-' || :i;\n"
        )
        pg.close()
        return pg.database, {"insert": insert, "read": read}

    def pgbench(self) -> None:
        print("pgbench (this project's schema, same server)", flush=True)
        database, scripts = self.prepare_pgbench()
        for name, script in scripts.items():
            for clients in (1, 16):
                key = f"pg_{name}_c{clients}"
                scenario = f"{'create' if name == 'insert' else 'read'}_c{clients}"
                if not (self.wanted(key) or self.wanted(scenario)):
                    continue
                run_pgbench(self.server, database, script, clients=clients, duration=self.p.warmup)
                runs = [
                    run_pgbench(
                        self.server, database, script, clients=clients, duration=self.p.duration
                    )
                    for _ in range(self.p.reps)
                ]
                self.record(key, "pgbench", "tx/s", runs)
        self.server.drop(database)

    def ready(self, target: Target, existing: int) -> None:
        """A fresh database holding ``existing`` labels and the 1,000 reads use; then start."""
        target.fresh_database()
        if existing:
            target.bulk_labels("flow", "start", "b", existing, {"n": 0, "go": False})
        target.bulk_labels("flow", "start", "r", 1000, {"n": 0, "go": False})
        target.analyze()
        target.start()

    # -- turn about ------------------------------------------------------------

    def versus(self, reference_workers: int) -> None:
        """The reference, the project (secured) and pgbench, measured turn about.

        On a shared machine the load moves by a factor of two within minutes,
        so figures taken one target after another compare different
        machines. Here every target runs at once, each on its own database
        and port: the reference; the project as issue 15 measures it (tokens
        and metrics on) on an empty table; the same on a table of
        ``list_scale`` labels; and pgbench. Each round measures every
        scenario on each target in an order that rotates every round, and
        every ratio is taken within a round, then the median of the rounds
        is reported (``ratios_by_round`` in the JSON).
        """
        names = ("create_c1", "create_c16", "read_c1", "read_c16", "update_c16")
        keys = [k for k in names if self.wanted(k)]
        if not keys:
            return
        scale = self.p.list_scale
        suffix = f"_{scale // 1000}k"
        print(f"turn about: reference, secured (empty and {scale:,} labels), pgbench", flush=True)
        services: list[tuple[Target, str]] = [
            (_instance(Reference(self.server, self.log_dir, reference_workers)), ""),
            (_instance(Project(self.server, self.log_dir, "secured", tree=self.tree)), ""),
            (
                _instance(Project(self.server, self.log_dir, "secured", slot=2, tree=self.tree)),
                suffix,
            ),
        ]
        pg_database, scripts = self.prepare_pgbench()
        try:
            for target, size in services:
                self.sampler.roots[target.name + size] = target.pids
                self.ready(target, scale if size else 0)
            runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
            pg_runs: dict[str, list[float]] = {}
            for key in keys:
                mode, conc = key.split("_")[0], int(key.split("_")[1][1:])
                pg_key = f"pg_{'insert' if mode == 'create' else 'read'}_c{conc}"
                # the full table's figures the issue compares are at 16 clients
                contenders: list[tuple[Target | None, str]] = [
                    (target, size) for target, size in services if conc > 1 or not size
                ]
                if mode != "update":
                    contenders.append((None, ""))  # pgbench
                rate: dict[str, float] = {}
                for round_ in range(-1, self.p.cost_rounds):  # round -1: the warm-up
                    duration = self.p.warmup if round_ < 0 else self.p.duration
                    shift = max(round_, 0) % len(contenders)
                    for target, size in contenders[shift:] + contenders[:shift]:
                        if target is None:
                            tx = run_pgbench(
                                self.server,
                                pg_database,
                                scripts[pg_key.split("_")[1]],
                                clients=conc,
                                duration=duration,
                            )
                            if round_ >= 0:
                                pg_runs.setdefault(pg_key, []).append(tx)
                            continue
                        name = target.name + size
                        result = self.measure(target, mode, conc, duration, rate.get(name, 0.0))
                        rate[name] = result["rate"]
                        if round_ >= 0:
                            runs.setdefault((key + size, target.name), []).append(result)
            self.sampler.take()
            for (key, name), measured in runs.items():
                self.record_http(key, name, key.split("_")[0], measured)
            for key, values in pg_runs.items():
                self.record(key, "pgbench", "tx/s", values)
            self.record_round_ratios(runs, pg_runs, suffix)
        finally:
            for target, _ in services:
                target.stop()
                target.close()
            self.server.drop(pg_database)

    def record_round_ratios(
        self,
        runs: dict[tuple[str, str], list[dict[str, Any]]],
        pg_runs: dict[str, list[float]],
        suffix: str,
    ) -> None:
        """Each ratio of the issue's targets taken within one round, for every round."""
        ratios: dict[str, list[float]] = {}
        for (key, name), measured in runs.items():
            if name != "secured" or key.endswith(suffix):
                continue
            mine = [r["rate"] for r in measured]
            theirs = [r["rate"] for r in runs.get((key, "reference"), [])]
            if theirs:
                ratios[f"{key} vs reference"] = [
                    a / b for a, b in zip(mine, theirs, strict=True) if b
                ]
            pg = pg_runs.get(
                f"pg_{'insert' if key.startswith('create') else 'read'}_c" + key.split("_c")[1]
            )
            if pg and key.startswith("create"):
                ratios[f"{key} vs pgbench"] = [a / b for a, b in zip(mine, pg, strict=True) if b]
            big = [r["rate"] for r in runs.get((key + suffix, name), [])]
            if big:
                ratios[f"{key}{suffix} vs empty"] = [
                    a / b for a, b in zip(big, mine, strict=True) if b
                ]
        for what, values in ratios.items():
            self.round_ratios[what] = summarise(values)
            print(
                f"  {what:<32} median {statistics.median(values):.2f} "
                f"(rounds: {', '.join(f'{v:.2f}' for v in values)})",
                flush=True,
            )

    # -- a service -------------------------------------------------------------

    def service(self, target: Target) -> None:
        self.sampler.roots[target.name] = target.pids
        try:
            for scale in self.p.scales:
                suffix = "" if scale == 0 else f"_{scale // 1000}k"
                names = ("create_c1", "create_c16", "read_c1", "read_c16", "update_c16")
                keys = [f"{k}{suffix}" for k in names]
                if scale:
                    keys = [k for k in keys if "_c1_" not in k + "_"]
                extra = []
                if scale == 0:
                    extra = ["action_drain", "action_fast", "action_flaky", "interval_2k"]
                    if target.name == "project":  # the reference has no changes stream
                        extra.append(f"streams{STREAMS}")
                    extra += [f"patch_{shape}_{size}" for shape, size in PATCH_SIZES]
                if scale == self.p.list_scale:
                    extra += [f"list_full{suffix}", f"list_page{suffix}"]
                    extra += [f"interval_{n // 1000}k" for n in self.p.interval_sizes if n > 2000]
                if target.name == "reference" and not self.p.reference_minute_jobs:
                    minute_jobs = ("action_drain", "action_flaky", "interval")
                    extra = [k for k in extra if not k.startswith(minute_jobs)]
                if not any(self.wanted(k) for k in keys + extra):
                    continue
                print(f"{target.name}: {scale:,} existing labels", flush=True)
                self.ready(target, scale)
                self.sampler.take()
                for key in keys:
                    if self.wanted(key):
                        mode, conc = key.split("_")[0], int(key.split("_")[1][1:])
                        self.http(target, key, mode, conc)
                for key in extra:
                    if not self.wanted(key):
                        continue
                    if key.startswith("list"):
                        self.listing(target, key, scale)
                    elif key.startswith("streams"):
                        self.streams(target)
                    elif key.startswith("patch_"):
                        self.patch_keys(target, key)
                    elif key == "action_drain":
                        self.action_drain(target, key)
                    elif key.startswith("action"):
                        self.action(target, key)
                    elif key.startswith("interval"):
                        self.interval(target, key, int(key.split("_")[1][:-1]) * 1000)
                target.stop()
        finally:
            target.stop()
            target.close()
            self.sampler.roots.pop(target.name, None)

    def streams(self, target: Target) -> None:
        """Creates and reads at 16 clients, in alternate runs without and with open streams.

        Alternating (rather than one scenario after the other) keeps the
        comparison fair on a machine whose load drifts; the ratio of each
        pair of runs is kept, and the check uses the ratio of the medians.
        """
        rounds = max(self.p.reps, 3)

        def serve_cpu() -> float:
            """CPU seconds used so far by the serve processes (the master and its workers)."""
            total = 0.0
            for role, pid in target.pids():
                if role != "serve":
                    continue
                with contextlib.suppress(psutil.Error):
                    root = psutil.Process(pid)
                    for proc in [root, *root.children(recursive=True)]:
                        times = proc.cpu_times()
                        total += times.user + times.system
            return total

        def run(mode: str, duration: float) -> dict[str, Any]:
            before = serve_cpu()
            result = run_wrk(
                target.base_url,
                mode=mode,
                machine="flow",
                prefix=self.tag("s") if mode == "create" else "r",
                n=0 if mode == "create" else 1000,
                connections=16,
                duration=duration,
            )
            result["cpu_ms_per_request"] = (
                1000 * (serve_cpu() - before) / max(result["requests"], 1)
            )
            return result

        for mode in ("create", "read"):
            run(mode, self.p.warmup)
            self.sampler.take()
            plain: list[dict[str, Any]] = []
            streamed: list[dict[str, Any]] = []
            received, opened = 0, 0
            for _ in range(rounds):
                plain.append(run(mode, self.p.duration))
                with OpenStreams(target.base_url, STREAMS) as open_streams:
                    streamed.append(run(mode, self.p.duration))
                    received += open_streams.events
                    opened = min(opened or STREAMS, open_streams.open)
            self.record(
                f"{mode}_c16_streams0",
                target.name,
                "req/s",
                [r["rate"] for r in plain],
                serve_cpu_ms_per_request=[round(r["cpu_ms_per_request"], 3) for r in plain],
            )
            self.record(
                f"{mode}_c16_streams{STREAMS}",
                target.name,
                "req/s",
                [r["rate"] for r in streamed],
                note="" if opened == STREAMS else f"only {opened} of {STREAMS} streams open",
                pair_ratios=[
                    round(b["rate"] / a["rate"], 3) for a, b in zip(plain, streamed, strict=True)
                ],
                stream_events=received,
                errors=sum(r["errors"] for r in plain + streamed),
                serve_cpu_ms_per_request=[round(r["cpu_ms_per_request"], 3) for r in streamed],
            )

    def cost(self) -> None:
        """``plain``, ``project`` and ``secured`` running side by side, measured in turns.

        Each round runs create then read (16 clients) against each variant, in
        an order that rotates every round, so load from elsewhere on a shared
        machine falls on all three alike; the medians over the rounds are compared.
        """
        keys = [k for k in ("cost_create_c16", "cost_read_c16") if self.wanted(k)]
        if not keys:
            return
        print("cost of metrics and tokens: plain, project and secured side by side", flush=True)
        variants = [
            Project(self.server, self.log_dir, v, slot=1, tree=self.tree)
            for v in ("plain", "project", "secured")
        ]
        try:
            for target in variants:
                self.sampler.roots[target.name] = target.pids
                self.ready(target, 0)

            def api_cpu(target: Project) -> float:
                """CPU seconds used so far by the API's processes (gunicorn and its workers)."""
                total = 0.0
                for role, pid in target.pids():
                    if role == "serve":
                        parent = psutil.Process(pid)
                        for process in [parent, *parent.children(recursive=True)]:
                            times = process.cpu_times()
                            total += times.user + times.system
                return total

            def run(target: Project, mode: str, duration: float) -> tuple[float, float]:
                """Requests per second, and API CPU milliseconds per request."""
                prefix = self.tag("k") if mode == "create" else "r"
                before = api_cpu(target)
                result = run_wrk(
                    target.base_url,
                    mode=mode,
                    machine="flow",
                    prefix=prefix,
                    n=0 if mode == "create" else 1000,
                    connections=16,
                    duration=duration,
                    env=target.wrk_env,
                )
                if result["errors"]:
                    raise RuntimeError(f"{target.name} {mode}: {result['errors']} errors")
                cpu_ms = (api_cpu(target) - before) * 1000 / max(result["requests"], 1)
                return float(result["rate"]), cpu_ms

            for target in variants:
                for key in keys:
                    run(target, key.split("_")[1], self.p.warmup)
            self.sampler.take()
            rates: dict[tuple[str, str], list[float]] = {}
            cpu: dict[tuple[str, str], list[float]] = {}
            for round_ in range(self.p.cost_rounds):
                shift = round_ % len(variants)
                for key in keys:
                    for target in variants[shift:] + variants[:shift]:
                        rate, cpu_ms = run(target, key.split("_")[1], self.p.duration)
                        rates.setdefault((key, target.name), []).append(rate)
                        cpu.setdefault((key + "_cpu", target.name), []).append(cpu_ms)
            for (key, name), values in rates.items():
                self.record(key, name, "req/s", values, rounds=self.p.cost_rounds)
            for (key, name), values in cpu.items():
                self.record(key, name, "ms/req", values, rounds=self.p.cost_rounds)
            self.wsgi_cost(variants[0].database, [t.name for t in variants])
        finally:
            for target in variants:
                target.stop()
                target.close()
                self.sampler.roots.pop(target.name, None)

    def wsgi_cost(self, database: str, variants: list[str]) -> None:
        """Each variant's in-process CPU per request (bench/wsgi_cost.py), in rotating turns."""
        measured: dict[str, dict[str, list[float]]] = {}
        rounds = 3
        for round_ in range(rounds):
            shift = round_ % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                script = str(BENCH_DIR / "wsgi_cost.py")
                out = subprocess.run(
                    [sys.executable, script, self.server.url(database), variant],
                    cwd=REPO,
                    env={**os.environ, "PYTHONPATH": str(REPO)},
                    capture_output=True,
                    text=True,
                    check=False,
                )
                line = next((x for x in out.stdout.splitlines() if x.startswith("WSGICOST ")), "")
                if not line:
                    raise RuntimeError(f"wsgi_cost.py {variant} failed: {out.stderr[-2000:]}")
                for op, value in json.loads(line.removeprefix("WSGICOST ")).items():
                    key = f"cost_{op.removesuffix('_us')}_wsgi"
                    measured.setdefault(key, {}).setdefault(variant, []).append(value)
        for key, per_variant in measured.items():
            for variant, values in per_variant.items():
                # the least disturbed run is the closest to the true cost
                self.record(key, variant, "us/req", [min(values)], runs=values)

    def measure(
        self, target: Target, mode: str, conc: int, duration: float, rate_hint: float = 0.0
    ) -> dict[str, Any]:
        """One wrk run of create / read / update (PATCH moving each label start -> review).

        ``rate_hint``: the last rate seen, to size the fresh labels an update run needs.
        """
        base = target.base_url
        if mode == "update":
            # enough fresh labels in `start` for the run, sized from the last rate
            count = int(max(rate_hint, 100) * duration * 2) + 500
            prefix = self.tag("u")
            target.bulk_labels("flow", "start", prefix, count, {"n": 0, "go": False})
            since = target.max_history_id()
        before = cpu_sample(target.pids(), target.backend_pids())
        if mode == "create":
            result = run_wrk(
                base,
                mode="create",
                machine="flow",
                prefix=self.tag("c"),
                n=0,
                connections=conc,
                duration=duration,
                env=target.wrk_env,
            )
        elif mode == "read":
            result = run_wrk(
                base,
                mode="read",
                machine="flow",
                prefix="r",
                n=1000,
                connections=conc,
                duration=duration,
                env=target.wrk_env,
            )
        else:
            result = run_wrk(
                base,
                mode="patch",
                machine="flow",
                prefix=prefix,
                n=count,
                connections=conc,
                duration=duration,
                key="go",
                env=target.wrk_env,
            )
        after = cpu_sample(target.pids(), target.backend_pids())
        result["cpu_ms_per_request"] = cpu_ms_per_request(before, after, result["requests"])
        if mode == "update":
            result["moved"] = target.transitions("flow", "start", "review", since)
            result["exhausted"] = result["moved"] >= count
        return result

    def http(self, target: Target, key: str, mode: str, conc: int) -> None:
        """create / read / update for a fixed time: a warm-up, then the profile's runs."""
        rate = self.measure(target, mode, conc, self.p.warmup)["rate"]
        self.sampler.take()
        runs = []
        for _ in range(self.p.reps):
            runs.append(self.measure(target, mode, conc, self.p.duration, rate))
            rate = runs[-1]["rate"]
        self.record_http(key, target.name, mode, runs)

    def record_http(self, key: str, name: str, mode: str, runs: list[dict[str, Any]]) -> None:
        errors = sum(r["errors"] for r in runs)
        requests = sum(r["requests"] for r in runs)
        note = f"{errors} errors of {requests}" if errors else ""
        if any(r.get("exhausted") for r in runs):
            note += " labels ran out"
        if mode == "update":
            moved = sum(r["moved"] for r in runs)
            if moved < requests * 0.99:
                note += f" only {moved} of {requests} moved"
        roles = sorted({role for r in runs for role in r["cpu_ms_per_request"]})
        self.record(
            key,
            name,
            "req/s",
            [r["rate"] for r in runs],
            note=note.strip(),
            latency_p50_ms=summarise(r["p50_us"] / 1000 for r in runs),
            latency_p99_ms=summarise(r["p99_us"] / 1000 for r in runs),
            cpu_ms_per_request={
                role: summarise(r["cpu_ms_per_request"].get(role, 0.0) for r in runs)
                for role in roles
            },
            raw=runs,
        )

    def patch_keys(self, target: Target, key: str) -> None:
        """One PATCH of N keys into a label that stores N keys: seconds per request.

        ``flat``: N scalar keys, each replacing a stored one. ``nested``: N
        objects, each merged one level down into a stored object (the deep
        merge's costly case). Keys are short (base 36) so 100,000 flat keys fit
        the default 1 MiB body limit; nested sizes stop where the body would not.
        """
        _, shape, size = key.split("_")
        n = int(size[:-1]) * 1000
        keys = [_base36(i) for i in range(n)]
        nested = shape == "nested"
        stored = {k: ({"m": 1} if nested else 1) for k in keys}
        patch = {k: ({"n": 2} if nested else 2) for k in keys}
        body = json.dumps({"metadata": patch}, separators=(",", ":")).encode()
        expected = {k: ({"m": 1, "n": 2} if nested else 2) for k in keys}
        conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=120)
        times = []
        for rep in range(max(self.p.reps, 2) + 1):  # the first is a warm-up
            name = self.tag("p")
            target.bulk_labels("flow", "start", name, 1, stored)
            start = time.perf_counter()
            conn.request(
                "PATCH",
                f"/state-machines/flow/labels/{name}-0",
                body=body,
                # 1.5.0 reads a body only when it is declared JSON
                headers={"Content-Type": "application/json", **target.auth_headers},
            )
            response = conn.getresponse()
            answer = response.read()
            elapsed = time.perf_counter() - start
            if response.status != 200:
                raise RuntimeError(f"PATCH {key}: {response.status} {answer[:200]!r}")
            if json.loads(answer)["metadata"] != expected:
                raise RuntimeError(f"PATCH {key}: merged metadata is wrong")
            if rep:
                times.append(elapsed)
        conn.close()
        self.record(key, target.name, "s", times, keys=n, body_bytes=len(body))

    def listing(self, target: Target, key: str, scale: int) -> None:
        """Full listing (time to the last byte) or one page of 100 (latency), sequentially."""
        conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=120)
        path = "/state-machines/flow/labels"

        def get(url: str) -> tuple[float, bytes]:
            start = time.perf_counter()
            conn.request("GET", url, headers=target.auth_headers)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"GET {url}: {response.status} {body[:200]!r}")
            return time.perf_counter() - start, body

        if key.startswith("list_full"):
            get(path)
            self.sampler.take()
            runs, count = [], 0
            for _ in range(max(self.p.reps, 2)):
                seconds, body = get(path)
                runs.append(seconds)
                count = len(json.loads(body)["labels"])
            self.record(
                key,
                target.name,
                "s",
                runs,
                labels=count,
                note="" if count >= scale else f"only {count} labels listed",
            )
        else:
            _, body = get(path + "?limit=100")
            first = json.loads(body)
            if len(first["labels"]) > 100 or "next" not in first:
                self.record(key, target.name, "ms", [], note="no paged listing")
                return
            times, url = [], first["next"]
            for _ in range(50):
                seconds, body = get(url)
                times.append(seconds * 1000)
                page = json.loads(body)
                url = page.get("next") or path + "?limit=100"
            middle = path + "?limit=100&after=b-5"  # a page from the middle of the table
            for _ in range(10):
                times.append(get(middle)[0] * 1000)
            self.record(key, target.name, "ms", times)
        conn.close()

    def wait_for(
        self,
        target: Target,
        machine: str,
        old: str,
        new: str,
        since: int,
        n: int,
        *,
        cap: float,
        origin: float,
        started: float | None,
        first_timeout: float,
    ) -> dict[str, Any]:
        """Poll history until ``n`` labels made the move ``old`` -> ``new``.

        The drain is timed from ``started`` (or, when that cannot be known, from
        the first label seen moving) and given up ``cap`` seconds after that;
        ``first_timeout`` bounds the wait, from ``origin``, for the first move.
        """
        first, count, progressed = None, 0, origin
        while True:
            now = time.time()
            seen = target.transitions(machine, old, new, since)
            if seen > count:
                count, progressed = seen, now
            if count and first is None:
                first = now
            if count >= n:
                break
            begun = started if started is not None else first
            if begun is None:
                if now - origin > first_timeout:
                    break
            elif now - begun > cap:
                break
            time.sleep(0.05)
        begun = started if started is not None else first
        # timed to the last label seen moving, so a stuck straggler does not count as time
        elapsed = (progressed - begun) if begun is not None and count else None
        return {
            "count": count,
            "elapsed": elapsed,
            "done": count >= n,
            "first_after_s": None if first is None else first - origin,
        }

    def interval(self, target: Target, key: str, n: int) -> None:
        """Labels whose condition is already true sit in an interval gate: time the drain."""
        cap = self.p.reference_cap if target.name == "reference" else self.p.project_cap
        runs, notes, raw = [], [], []
        for _ in range(self.p.slow_reps if n <= 2000 else 1):
            prefix = self.tag("i")
            tick = target.next_interval_tick(time.time())
            if tick is None:
                # the reference's interval clock starts with the process
                target.restart()
                since = target.max_history_id()
                target.bulk_labels("timed", "wait", prefix, n, {"go": True})
            else:
                lead = 3 + n / 30_000  # seconds the insert may take, plus margin
                tick = target.next_interval_tick(time.time() + lead)
                assert tick is not None
                time.sleep(max(0.0, tick - lead - time.time()))
                since = target.max_history_id()
                target.bulk_labels("timed", "wait", prefix, n, {"go": True})
                if time.time() > tick:
                    notes.append("insert overran the tick")
            target.analyze()
            self.sampler.take()
            outcome = self.wait_for(
                target,
                "timed",
                "wait",
                "done",
                since,
                n,
                cap=cap,
                origin=time.time(),
                started=tick,
                first_timeout=90,
            )
            raw.append(outcome)
            if outcome["elapsed"] is None or not outcome["count"]:
                notes.append("nothing left the gate")
                continue
            rate = outcome["count"] / max(outcome["elapsed"], 0.05)
            runs.append(rate)
            if not outcome["done"]:
                notes.append(
                    f"{outcome['count']} of {n} in {outcome['elapsed']:.0f}s, "
                    f"full drain ~{n / rate:.0f}s"
                )
        drain = [n / r for r in runs]
        self.record(
            key,
            target.name,
            "labels/s",
            runs,
            drain_s=summarise(drain),
            note="; ".join(notes),
            raw=raw,
            measured_from="the trigger's occurrence"
            if target.name != "reference"
            else "the first label leaving the gate",
        )

    def action_drain(self, target: Target, key: str) -> None:
        """Labels that have just entered an action: how fast the worker delivers them all."""
        n = self.p.action_labels["reference" if target.name == "reference" else "project"]
        cap = self.p.reference_cap if target.name == "reference" else self.p.project_cap
        runs, notes, raw = [], [], []
        for _ in range(self.p.slow_reps):
            prefix = self.tag("d")
            aligned = target.next_interval_tick(time.time()) is not None
            if not aligned:
                target.restart()  # its every-minute action job counts from process start
            since = target.max_history_id()
            target.bulk_labels("flow", "notify", prefix, n, {"go": True, "done": True}, due=True)
            origin = time.time()
            self.sampler.take()
            outcome = self.wait_for(
                target,
                "flow",
                "notify",
                "end",
                since,
                n,
                cap=cap,
                origin=origin,
                started=origin if aligned else None,
                first_timeout=90,
            )
            raw.append(outcome)
            if outcome["count"]:
                runs.append(outcome["count"] / max(outcome["elapsed"], 0.05))
            if not outcome["done"]:
                notes.append(f"{outcome['count']} of {n} in {outcome['elapsed'] or 0:.0f}s")
        self.record(
            key,
            target.name,
            "labels/s",
            runs,
            labels=n,
            note="; ".join(notes),
            raw=raw,
            measured_from="the labels entering the action"
            if target.name != "reference"
            else "the first delivery (its action job runs once a minute)",
        )

    def action(self, target: Target, key: str) -> None:
        """PATCH opens the gate into an action (16 clients); time until all reached `end`."""
        machine = "flow" if key == "action_fast" else "flaky"
        n = self.p.action_labels["reference" if target.name == "reference" else "project"]
        cap = (self.p.reference_cap + 60) if target.name == "reference" else self.p.project_cap
        runs, notes, raw = [], [], []
        for _ in range(self.p.slow_reps):
            prefix = self.tag("a")
            target.bulk_labels(machine, "review", prefix, n, {"go": True, "done": False})
            target.analyze()
            since = target.max_history_id()
            self.sampler.take()
            started = time.time()
            patch = run_wrk_until(
                target.base_url,
                mode="patch",
                machine=machine,
                prefix=prefix,
                n=n,
                connections=16,
                key="done",
                cap=cap,
                env=target.wrk_env,
                done=lambda since=since: (
                    target.transitions(machine, "review", "notify", since) >= n
                ),
            )
            patched = time.time() - started
            outcome = self.wait_for(
                target,
                machine,
                "notify",
                "end",
                since,
                n,
                cap=cap,
                origin=started,
                started=started,
                first_timeout=cap,
            )
            outcome["patch_seconds"] = patched
            outcome["patch_errors"] = patch["errors"]
            raw.append(outcome)
            if outcome["count"]:
                runs.append(outcome["count"] / outcome["elapsed"])
            if not outcome["done"]:
                notes.append(f"{outcome['count']} of {n} done in {outcome['elapsed']:.0f}s")
        self.record(key, target.name, "labels/s", runs, labels=n, note="; ".join(notes), raw=raw)


def project_runnable(tree: Path) -> str | None:
    """None when ``python -m routemaster`` has serve, cron and migrate; else why not."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-m", "routemaster", "--help"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    missing = [c for c in ("serve", "cron", "migrate") if c not in out.stdout]
    if out.returncode or missing:
        return f"routemaster CLI not usable (missing {missing}): {out.stderr.strip()[-300:]}"
    return None


def machine_info(server: Server) -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ref_python = REFERENCE_VENV / "bin" / "python"
    reference_python = (
        subprocess.run(
            [str(ref_python), "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if ref_python.exists()
        else None
    )
    wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "postgresql": server.version(),
        "python": platform.python_version(),
        "reference_python": reference_python,
        "wrk": (wrk.stdout or wrk.stderr).splitlines()[0] if (wrk.stdout or wrk.stderr) else None,
        "kernel": platform.release(),
    }


def _instance(target: Target) -> Target:
    """The target's database and port for this run's ROUTEMASTER_BENCH_INSTANCE."""
    target.database += SUFFIX
    target.port += 100 * INSTANCE
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="~3 minute development run")
    parser.add_argument(
        "--targets",
        default="pgbench,reference,project,cost",
        help="comma-separated subset of pgbench,reference,project; also plain (the project "
        "with metrics off), secured (tokens required, metrics on), and cost (the three "
        "side by side, their create/read runs interleaved: the cost of metrics and tokens), "
        "and versus (the reference, secured on an empty and a full table, and pgbench, all "
        "running at once and measured turn about: issue 15's ratios)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated scenario name prefixes, e.g. create_c16,interval",
    )
    parser.add_argument("--reference-workers", type=int, default=4)
    parser.add_argument(
        "--scales",
        default="",
        help="comma-separated existing-label counts to run the HTTP scenarios at "
        "(default: 0,10000,100000; with --quick 0,10000), e.g. 0,100000",
    )
    parser.add_argument(
        "--project-tree",
        type=Path,
        default=REPO,
        help="the checkout whose code the project target runs (default: this one), "
        "to measure two versions with one harness",
    )
    parser.add_argument("--output", type=Path, default=BENCH_DIR / "results")
    args = parser.parse_args()
    profile = QUICK if args.quick else FULL
    if args.scales:
        scales = tuple(int(n) for n in args.scales.split(","))
        profile = dataclasses.replace(profile, scales=scales, list_scale=max(scales))
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    server = Server.from_environment()
    log_dir = Path(tempfile.mkdtemp(prefix="routemaster-bench-"))
    print(f"logs in {log_dir}", flush=True)

    only = {s.strip() for s in args.only.split(",") if s.strip()} or None
    suite = Suite(profile, server, log_dir, only, args.project_tree.resolve())
    started = time.time()
    receiver = subprocess.Popen(
        [sys.executable, str(BENCH_DIR / "receiver.py"), "--port", str(RECEIVER_PORT + INSTANCE)],
        stdout=subprocess.DEVNULL,
        stderr=open(log_dir / "receiver.log", "wb"),  # noqa: SIM115
    )
    suite.sampler.roots["receiver"] = lambda: [("receiver", receiver.pid)]
    suite.sampler.start()
    skipped: dict[str, str] = {}
    try:
        if "pgbench" in targets:
            suite.pgbench()
        if "reference" in targets:
            if not (REFERENCE_VENV / "bin" / "routemaster").exists():
                skipped["reference"] = f"not installed in {REFERENCE_VENV} (bench/run does that)"
            else:
                suite.service(_instance(Reference(server, log_dir, args.reference_workers)))
        if "versus" in targets:
            suite.versus(args.reference_workers)
        if "cost" in targets:
            suite.cost()
        for variant in VARIANTS:
            if variant not in targets:
                continue
            why = project_runnable(args.project_tree)
            if why:
                skipped[variant] = why
                print(f"{variant} skipped: {why}", flush=True)
            else:
                suite.service(_instance(Project(server, log_dir, variant, tree=args.project_tree)))
    finally:
        suite.sampler.stop()
        receiver.terminate()
        receiver.wait()
        variant_databases = [f"bench_{v}{s}" for v in VARIANTS for s in ("", "_1", "_2")]
        for name in ("bench_reference", "bench_pgbench", *variant_databases):
            server.drop(name + RUN_SUFFIX + SUFFIX)

    checks = evaluate(suite.results, suite.memory, suite.round_ratios)
    report = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "bench/run" + (" --quick" if args.quick else ""),
        "profile": profile.__dict__,
        "reference_workers": args.reference_workers,
        "project_tree": str(args.project_tree.resolve()),
        "machine": machine_info(server),
        "elapsed_s": round(time.time() - started),
        "skipped": skipped,
        "scenarios": suite.results,
        "peak_rss_mib": {
            t: {r: round(v / 2**20, 1) for r, v in roles.items()}
            for t, roles in suite.memory.items()
        },
        "checks": checks,
        "ratios_by_round": suite.round_ratios,
    }
    print()
    print_table(report)
    args.output.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    text = json.dumps(report, indent=2, default=str)
    latest = "latest-quick.json" if args.quick else "latest.json"
    (args.output / f"{stamp}{'-quick' if args.quick else ''}.json").write_text(text)
    (args.output / latest).write_text(text)
    print(f"\nsaved {args.output / latest} (and a timestamped copy); logs in {log_dir}")


if __name__ == "__main__":
    main()
