"""What the label service refuses, for the API to turn into status codes."""

from __future__ import annotations


class LabelExists(Exception):
    """The name is taken in this machine (also by a deleted label)."""


class LabelNotFound(Exception):
    """No label of this name was ever created in this machine."""


class LabelDeleted(Exception):
    """The label was deleted: it keeps its name and history, and never moves again."""


class InvalidOperation(Exception):
    """An operator command that does not apply to the label as it is (say why)."""


class Missing(Exception):
    """What a request names does not exist (the faces answer 404 with it)."""


class Malformed(Exception):
    """A request the service cannot carry out as written (the faces answer 400 with it)."""
