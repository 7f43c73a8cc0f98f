"""``search:``: the metadata paths a machine's searches compare, each to be indexed."""

from __future__ import annotations

from routemaster.config import load_config
from tests.config.conftest import Problems, Write

MACHINE = """\
state_machines:
  orders:
    search:
{paths}
    states:
      - gate: start
        exit_condition: false
"""


def test_search_paths_are_compiled_without_their_metadata_root(write: Write) -> None:
    path = write(MACHINE.format(paths="      - metadata.customer.id\n      - metadata.total"))
    machine = load_config([path]).state_machines[0]
    assert machine.search == (("customer", "id"), ("total",))


def test_a_path_outside_metadata_is_an_error_with_file_path_and_line(
    write: Write, problems: Problems
) -> None:
    path = write(MACHINE.format(paths="      - metadata.total\n      - history.entered_state"))
    (problem,) = problems(path)
    assert problem.file == str(path)
    assert problem.line == 5
    assert problem.path == "state_machines.orders.search.1"
    assert "metadata path" in problem.message


def test_a_repeated_path_is_an_error(write: Write, problems: Problems) -> None:
    path = write(MACHINE.format(paths="      - metadata.total\n      - metadata.total"))
    (problem,) = problems(path)
    assert "once" in problem.message
