"""CPU cost of one next check (SPEC E1), per call, for the conditions gates use most.

    .venv/bin/python bench/next_check_cost.py [--calls 20000] [--repeat 5]

The next check runs for every label entering a gate and every metadata update, inside
the API's transaction; the target (issue 28) for ``12h has passed since
history.entered_state`` is a few tens of microseconds. Measured in process CPU time (the
best of ``--repeat`` runs), so a busy machine inflates it less than wall time would.
Contexts are built with ``routemaster.machine.planning.context_for``, as the service does.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routemaster.exit_conditions import compile_condition, compile_timing
from routemaster.machine.planning import PlanInput, context_for

ENTERED = datetime.datetime(2024, 3, 1, 10, 0, tzinfo=datetime.UTC)
CASES: list[tuple[str, dict[str, Any], datetime.timedelta]] = [
    ("12h has passed since history.entered_state", {}, datetime.timedelta(minutes=5)),
    (
        "metadata.has_recommendations and 12h has passed since history.entered_state"
        " and system.time >= 18:30",
        {"has_recommendations": True},
        datetime.timedelta(minutes=5),
    ),
    (
        "metadata.has_recommendations and 12h has passed since history.entered_state"
        " and system.time >= 18:30",
        {"has_recommendations": False},
        datetime.timedelta(minutes=5),
    ),
    (
        "metadata.reply is defined or 2h has passed since history.entered_state",
        {},
        datetime.timedelta(minutes=5),
    ),
    (
        "system.now >= metadata.send_at",
        {"send_at": "2024-03-04T09:00:00+01:00"},
        datetime.timedelta(),
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for source, metadata, elapsed in CASES:
        program = compile_condition(source)
        plan_input = PlanInput("label-1", "waiting", metadata, ENTERED, "start")

        def context_at(moment: datetime.datetime, plan_input: PlanInput = plan_input) -> Any:
            return context_for(plan_input, moment)

        after = ENTERED + elapsed

        def call(program: Any = program, context_at: Any = context_at, after: Any = after) -> Any:
            return compile_timing(program).next_check(context_at, after)

        runs = timeit.repeat(call, timer=time.process_time, number=args.calls, repeat=args.repeat)
        per_call = min(runs) / args.calls * 1e6
        check = call()
        print(f"{per_call:7.1f} us  {source!r} {metadata} -> {check.at} ({check.reason})")


if __name__ == "__main__":
    main()
