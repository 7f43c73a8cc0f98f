"""``python -m routemaster``: the same as the ``routemaster`` command."""

from routemaster.cli import main

main()
