"""Experiments: change one thing on the host, measure, and put it back.

Every experiment journals its undo step (``agent/journal.py``: in the run folder and on
the host, durably) and records it in the transcript *before* it acts, and undoes it in a
``finally`` (so an error, Ctrl-C, SIGTERM or SIGHUP restores the host too); a step is
marked done only once it succeeded. The user's working tree is never touched: code experiments use a
``git worktree`` of debugagent's own.

The package::

    lab.py        Lab: runs one experiment of any kind, undoes it, controls a restart's recovery
    measure.py    Bench: benchmark runs, warm-ups after a restart, the re-measured reference, sampling
    server.py     Server: find the server, restart it changed (or by the restart hook), wait until ready
    undo.py       Undo: journal each step before its change, run the journal newest first, refuse what it did not write
    asfound.py    what each change touches, read before the first change and after the undo, compared
    control.py    the restart control (a plain restart of the server as found, measured the same way)
    bisect.py     the first bad commit of a range a code revert recovered
    spec.py       ExperimentSpec and Kind: what a kind declares
    registry.py   KINDS and the playbook's Experiment union, built from the kinds' classes
    kinds/        one module per kind: code, restart (flags, environment), package, knobs (power, governor)
"""

from __future__ import annotations

from .errors import ConnectionLost, ExperimentError
from .kinds.code import CodePlan, map_path, plan_code_run
from .kinds.package import PackageTarget, build_matches, package_targets
from .lab import Lab
from .measure import Measure
from .registry import KINDS, Experiment, kind_of
from .server import LabSetup, ServerRun, edit_argv
from .spec import ExperimentSpec, FixTemplate, Kind

__all__ = ["KINDS", "CodePlan", "ConnectionLost", "Experiment", "ExperimentError", "ExperimentSpec", "FixTemplate",
           "Kind", "Lab", "LabSetup", "Measure", "PackageTarget", "ServerRun", "build_matches", "edit_argv", "kind_of",
           "map_path", "package_targets", "plan_code_run"]
