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


def glob_paths(glob: str) -> list[str]:
    """The snapshot-diff paths ``glob`` can match, a placeholder segment (NAME, N) filled as
    ``glob_matches_some_path`` fills it (with the glob's own segments: ``packages.flashinfer*.build``)."""
    pat, paths = _glob_pattern(glob)
    fills = {*pat.split("."), "x", "0"}
    out = {".".join(f if part in PLACEHOLDERS else part for part in t.split(".")) for t in paths for f in fills}
    return sorted(c for c in out if fnmatch.fnmatchcase(c, pat))


def shadowed(hypotheses: list[tuple[str, list[str]]]) -> list[str]:
    """Evidence globs that can never claim a change: each path they match is matched first by a glob of a
    hypothesis listed before (a change belongs to the first hypothesis whose evidence matches it). One warning a
    glob, naming what shadows it; ``hypotheses`` is (id, evidence globs), in the playbook's order."""
    out = []
    for j, (hid, globs) in enumerate(hypotheses):
        for g in globs:
            by: dict[str, str] = {}
            paths = glob_paths(g)
            for c in paths:
                for hid0, globs0 in hypotheses[:j]:
                    first = next((g0 for g0 in globs0 if fnmatch.fnmatchcase(c, _glob_pattern(g0)[0])
                                  and (not g0.startswith(EDITABLE) or g.startswith(EDITABLE))), None)
                    if first:
                        by.setdefault(c, f"`{first}` of {hid0}")
                        break
            if paths and len(by) == len(paths):
                names = sorted(set(by.values()))
                out.append(f"{hid}: evidence `{g}` is shadowed by {', '.join(names)}, listed first: a change goes to the "
                           f"first hypothesis whose evidence matches it, so {hid} never sees these; narrow that glob or "
                           f"list {hid} first")
    return out
