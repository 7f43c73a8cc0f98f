"""routemaster: state machines as a service."""

__version__ = "2.0.0.dev0"
