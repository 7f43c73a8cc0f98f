"""Ratios, the issue's targets as pass/fail checks, and the printed table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ORDER = [
    "create_c1",
    "create_c16",
    "read_c1",
    "read_c16",
    "update_c16",
    "create_c16_10k",
    "read_c16_10k",
    "update_c16_10k",
    "create_c16_100k",
    "read_c16_100k",
    "update_c16_100k",
    "list_full_100k",
    "list_page_100k",
    "list_full_10k",
    "list_page_10k",
    "interval_2k",
    "interval_100k",
    "action_fast",
    "action_flaky",
    "patch_flat_1k",
    "patch_flat_10k",
    "patch_flat_100k",
    "patch_nested_1k",
    "patch_nested_10k",
    "patch_nested_60k",
]
PGBENCH = {"create": "pg_insert", "read": "pg_read"}
TIME_UNITS = {"s", "ms", "ms/req", "us/req"}


def median(results: dict[str, Any], key: str, target: str) -> float | None:
    value = results.get(key, {}).get(target, {}).get("median")
    return None if value is None else float(value)


def cpu_ms(results: dict[str, Any], key: str, target: str, role: str) -> float | None:
    """Median CPU milliseconds per request spent by one role (serve, cron, postgres)."""
    per_role = results.get(key, {}).get(target, {}).get("cpu_ms_per_request", {})
    value = per_role.get(role, {}).get("median")
    return None if value is None else float(value)


def p50_ms(results: dict[str, Any], key: str, target: str) -> float | None:
    value = results.get(key, {}).get(target, {}).get("latency_p50_ms", {})
    value = value.get("median") if isinstance(value, dict) else None
    return None if value is None else float(value)


def pg_key(key: str) -> str | None:
    """The pgbench figure a scenario is held against: same operation, same clients."""
    parts = key.split("_")
    if parts[0] not in PGBENCH or len(parts) < 2:
        return None
    return f"{PGBENCH[parts[0]]}_{parts[1]}"


def speedup(results: dict[str, Any], key: str, other_key: str, other: str) -> float | None:
    """How many times better the project is (rates: project/other; times: other/project)."""
    mine, theirs = median(results, key, "project"), median(results, other_key, other)
    if not mine or not theirs:
        return None
    unit = results[key]["project"]["unit"]
    return theirs / mine if unit in TIME_UNITS else mine / theirs


def ratios(results: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    out = {}
    for key in results:
        if key.startswith("pg_"):
            continue
        pg = pg_key(key)
        out[key] = {
            "project_vs_reference": speedup(results, key, key, "reference"),
            "project_vs_pgbench": speedup(results, key, pg, "pgbench") if pg else None,
        }
    return out


def operations_cost(results: dict[str, Any], key: str, variant: str) -> float | None:
    """A variant's speed relative to ``plain``'s (no metrics, no tokens): 1.0 is no cost.

    Rates compare as mine / plain, costs (CPU per request) as plain / mine.
    """
    mine, plain = median(results, key, variant), median(results, key, "plain")
    if not mine or not plain:
        return None
    return plain / mine if results[key][variant]["unit"] in TIME_UNITS else mine / plain


def _serve_peak(entry: dict[str, Any] | None) -> float | None:
    if not entry or "peak_rss_mib" not in entry:
        return None
    return max(v for k, v in entry["peak_rss_mib"].items() if k.startswith("serve"))


def evaluate(
    results: dict[str, Any],
    memory: dict[str, dict[str, int]],
    round_ratios: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured value and pass/fail (None: not measured).

    ``round_ratios`` (the turn-about comparison's, ``versus``): a ratio measured
    within each round; where one exists, the check takes the median of those
    (a paired comparison: both sides of each ratio ran under the same load)
    instead of the ratio of the two medians, and says so in its name.
    """
    r = ratios(results)
    paired = round_ratios or {}
    checks: list[dict[str, Any]] = []

    def check(name: str, value: float | None, ok: Callable[[float], bool], goal: str) -> None:
        checks.append(
            {
                "name": name,
                "value": value,
                "target": goal,
                "pass": None if value is None else bool(ok(value)),
            }
        )

    on = "secured" if any("secured" in per for per in results.values()) else "project"

    def rel(key: str, base: str, target: str = on) -> float | None:
        within = paired.get(f"{key} vs empty") if base + "_100k" == key else None
        if within is not None:
            return float(within["median"])
        a, b = median(results, key, target), median(results, base, target)
        return a / b if a and b else None

    def versus(key: str, other: str, mine: float | None, theirs: float | None) -> float | None:
        within = paired.get(f"{key} vs {other}")
        if within is not None:
            return float(within["median"])
        return mine / theirs if mine and theirs else None

    how = " (median of per-round ratios)" if paired else ""

    check(
        "create, 16 clients, vs reference",
        r.get("create_c16", {}).get("project_vs_reference"),
        lambda v: v >= 6,
        ">= 6x",
    )
    check(
        "create, 16 clients, vs pgbench insert",
        r.get("create_c16", {}).get("project_vs_pgbench"),
        lambda v: v >= 1 / 3,
        ">= 0.33",
    )
    check(
        "read, 16 clients, vs reference",
        r.get("read_c16", {}).get("project_vs_reference"),
        lambda v: v >= 4,
        ">= 4x",
    )
    check(
        "update with transition, 16 clients, vs reference",
        r.get("update_c16", {}).get("project_vs_reference"),
        lambda v: v >= 5,
        ">= 5x",
    )
    # Issue 15's targets hold with tokens and metrics on: the secured variant when measured.
    for op, goal in (("create", 1.0), ("read", 0.5), ("update", 1.2)):
        check(
            f"{op}, 16 clients, serve CPU per request (ms, {on})",
            cpu_ms(results, f"{op}_c16", on, "serve"),
            lambda v, goal=goal: v <= goal,
            f"<= {goal} ms",
        )
    for op, times in (("create", 5), ("read", 4), ("update", 6)):
        mine, theirs = median(results, f"{op}_c16", on), median(results, f"{op}_c16", "reference")
        check(
            f"{op}, 16 clients, vs reference ({on}){how}",
            versus(f"{op}_c16", "reference", mine, theirs),
            lambda v, times=times: v >= times,
            f">= {times}x",
        )
    mine, pg = median(results, "create_c16", on), median(results, "pg_insert_c16", "pgbench")
    check(
        f"create, 16 clients, vs pgbench insert ({on}){how}",
        versus("create_c16", "pgbench", mine, pg),
        lambda v: v >= 1 / 3,
        ">= 0.33",
    )
    for op, goal in (("create", 1.5), ("read", 1.0)):
        check(
            f"{op}, 1 client, p50 latency (ms, {on})",
            p50_ms(results, f"{op}_c1", on),
            lambda v, goal=goal: v <= goal,
            f"<= {goal} ms",
        )
    for op in ("create", "read", "update"):
        check(
            f"{op} at 100,000 labels vs empty{how}",
            rel(f"{op}_c16_100k", f"{op}_c16"),
            lambda v: v >= 0.9,
            ">= 0.9",
        )
    for op in ("create", "read"):
        check(
            f"{op} with 50 open changes streams vs none",
            rel(f"{op}_c16_streams50", f"{op}_c16_streams0", "project"),
            lambda v: v >= 0.9,
            ">= 0.9",
        )
    check(
        "interval gate, 2,000 labels",
        median(results, "interval_2k", "project"),
        lambda v: v >= 5000,
        ">= 5,000 labels/s",
    )
    drain = results.get("interval_100k", {}).get("project", {}).get("drain_s", {}).get("median")
    check("interval gate, 100,000 labels drained", drain, lambda v: v < 60, "< 60 s")
    check(
        "action, fast receiver (worker drain)",
        median(results, "action_drain", "project"),
        lambda v: v >= 1000,
        ">= 1,000 labels/s",
    )
    check(
        "full listing of 100,000",
        median(results, "list_full_100k", "project"),
        lambda v: v < 1,
        "< 1 s",
    )
    listing = _serve_peak(results.get("list_full_100k", {}).get("project"))
    reading = _serve_peak(results.get("read_c16_100k", {}).get("project"))
    check(
        "full listing memory growth over reads (MiB)",
        None if listing is None or reading is None else listing - reading,
        lambda v: v < 20,
        "< 20 MiB (flat)",
    )
    check(
        "page of 100 at 100,000",
        median(results, "list_page_100k", "project"),
        lambda v: v < 20,
        "< 20 ms",
    )
    for op in ("create", "read"):
        for variant, what in (("secured", "tokens + metrics"), ("project", "metrics")):
            for key, measure in (
                (f"cost_{op}_c16", "throughput, 16 clients"),
                (f"cost_{op}_c16_cpu", "API CPU per request over HTTP"),
                (f"cost_{op}_wsgi", "API CPU per request in-process"),
            ):
                check(
                    f"{op}, {what} vs neither, {measure}",
                    operations_cost(results, key, variant),
                    lambda v: v >= 0.95,
                    ">= 0.95 (within 5%)",
                )
    check(
        "PATCH of 100,000 keys (deep merge)",
        median(results, "patch_flat_100k", "project"),
        lambda v: v < 1,
        "< 1 s",
    )
    peak = max(memory.get("project", {}).values(), default=None)
    check(
        "largest process RSS (MiB)",
        None if peak is None else peak / 2**20,
        lambda v: v <= 150,
        "<= 150 MiB",
    )
    return checks


def _fmt(entry: dict[str, Any] | None) -> str:
    if not entry or entry.get("median") is None:
        return "-"
    m, lo, hi = entry["median"], entry["min"], entry["max"]
    digits = 3 if entry["unit"] in ("s", "ms/req") else 1
    if lo == hi:
        return f"{m:,.{digits}f}"
    return f"{m:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_table(report: dict[str, Any]) -> None:
    results = report["scenarios"]
    r = ratios(results)
    variants = [v for v in ("plain", "secured") if any(v in per for per in results.values())]
    rows = [("scenario", "unit", "project", "reference", "pgbench", "proj/ref", "proj/pg")]
    rows = [rows[0][:3] + tuple(variants) + rows[0][3:]]
    keys = [k for k in ORDER if k in results] + sorted(
        k for k in results if k not in ORDER and not k.startswith("pg_")
    )
    for key in keys:
        entry = results[key]
        unit = next(iter(entry.values()))["unit"]
        pg = pg_key(key)
        rows.append(
            (
                key,
                unit,
                _fmt(entry.get("project")),
                *(_fmt(entry.get(v)) for v in variants),
                _fmt(entry.get("reference")),
                _fmt(results.get(pg, {}).get("pgbench")) if pg else "",
                _x(r[key]["project_vs_reference"]),
                _x(r[key]["project_vs_pgbench"]),
            )
        )
    for key in sorted(k for k in results if k.startswith("pg_")):
        blanks = ("",) * len(variants)
        rows.append((key, "tx/s", "", *blanks, "", _fmt(results[key].get("pgbench")), "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    _print_cpu_table(results, keys)
    notes = [
        (k, t, e["note"]) for k, per in results.items() for t, e in per.items() if e.get("note")
    ]
    if notes:
        print("\nnotes:")
        for key, target, note in notes:
            print(f"  {key} {target}: {note}")
    print("\npeak RSS (MiB) per process role over the whole run:")
    for target, roles in report["peak_rss_mib"].items():
        print(f"  {target}: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(roles.items())))
    print("\ntargets:")
    for c in report["checks"]:
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[c["pass"]]
        value = "-" if c["value"] is None else f"{c['value']:,.2f}"
        print(f"  {mark}  {c['name']}: {value} (target {c['target']})")
    if report.get("skipped"):
        for target, why in report["skipped"].items():
            print(f"  {target} not measured: {why}")


def _print_cpu_table(results: dict[str, Any], keys: list[str]) -> None:
    """CPU milliseconds per request by process role, and the median latency, per HTTP scenario."""
    targets = [
        t
        for t in ("project", "plain", "secured", "reference")
        if any(t in per and "cpu_ms_per_request" in per[t] for per in results.values())
    ]
    columns = [(t, role) for t in targets for role in ("serve", "postgres")]
    header = (
        "scenario",
        *(f"{t[:4]} {role}" for t, role in columns),
        *(f"{t[:4]} p50" for t in targets),
    )
    rows = [header]
    for key in keys:
        if not any("cpu_ms_per_request" in e for e in results[key].values()):
            continue

        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"

        rows.append(
            (
                key,
                *(ms(cpu_ms(results, key, t, role)) for t, role in columns),
                *(ms(p50_ms(results, key, t)) for t in targets),
            )
        )
    if len(rows) == 1:
        return
    print("\nCPU ms per request by process (median of runs), and p50 latency (ms):")
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
