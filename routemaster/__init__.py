"""routemaster: state machines as a service."""

# The one place the version is declared (pyproject.toml reads it). Pre-releases are
# "a"/"b"/"rc", never ".dev": routemaster-sentry 1.x sends nothing for a "dev" version.
__version__ = "2.0.0a1"
