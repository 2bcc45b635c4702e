"""Evidence globs: which snapshot-diff paths a playbook names (a hypothesis' ``evidence``, a restoring
experiment's ``paths``). Pure; read by the playbook's schema and by the experiments that put changes back."""

from __future__ import annotations

import difflib
import fnmatch
from typing import Annotated

from debugagent.tools.snapshot import DIFF_PATHS, PLACEHOLDERS, Change
from pydantic import AfterValidator

EDITABLE = "editable:"   # an evidence glob with this prefix matches only changes of packages installed editable


def _glob_pattern(glob: str) -> tuple[str, tuple[str, ...]]:
    """The glob without its qualifier, and the snapshot paths it may match."""
    if glob.startswith(EDITABLE):
        return glob[len(EDITABLE):], tuple(t for t in DIFF_PATHS if t.startswith("packages."))
    return glob, DIFF_PATHS


def glob_matches_some_path(glob: str, under: str = "") -> bool:
    """Can ``glob`` match a path the snapshot diff reports (one under ``under``)? A placeholder segment of a
    path (NAME, N) is tried as any of the glob's own segments, so ``packages.flashinfer*`` matches
    ``packages.NAME.build``."""
    pat, paths = _glob_pattern(glob)
    fills = {*pat.split("."), "x", "0"}
    return any(fnmatch.fnmatchcase(".".join(f if part in PLACEHOLDERS else part for part in t.split(".")), pat)
               for t in paths if t.startswith(under) for f in fills)


def _known_glob(glob: str) -> str:
    if not glob_matches_some_path(glob):
        shown = list(dict.fromkeys(".".join("*" if part in PLACEHOLDERS else part for part in t.split("."))
                                   for t in DIFF_PATHS))
        close = difflib.get_close_matches(_glob_pattern(glob)[0], shown, n=1, cutoff=0.5)
        hint = f"; did you mean `{close[0]}`?" if close else f"; the paths: {', '.join(shown)}"
        raise ValueError(f"evidence glob `{glob}` matches no snapshot path{hint}")
    return glob


EvidenceGlob = Annotated[str, AfterValidator(_known_glob)]


def evidence_matches(glob: str, change: Change) -> bool:
    """Does a change's path match an evidence glob (``*`` spans dots; ``editable:`` asks for an editable package)?"""
    if glob.startswith(EDITABLE) and not change.editable:
        return False
    return fnmatch.fnmatchcase(change.path, _glob_pattern(glob)[0])
