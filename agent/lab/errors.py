"""The lab's own errors: an experiment that could not be applied, or whose connection dropped."""

from __future__ import annotations


class ExperimentError(Exception):
    """An experiment could not be applied (its undo has run)."""


class ConnectionLost(ExperimentError):
    """The connection dropped during an experiment (its undo has run; it may run again)."""
