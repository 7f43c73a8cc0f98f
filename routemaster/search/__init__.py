"""Searching labels with the exit-condition language, evaluated by the database.

Pure: :func:`compile_search` turns an expression into a SQL condition over
the ``labels`` table with bound parameters (``compiler``), with operands
(``operands``) and operator rules (``rules``) that give the gate evaluator's
answer for every label, or refuse the expression where the database could
not. The statements that run it are in :mod:`routemaster.db.search`.
"""

from routemaster.exit_conditions import ConditionSyntaxError
from routemaster.search.translator import SearchFilter, compile_search

__all__ = ["ConditionSyntaxError", "SearchFilter", "compile_search"]
