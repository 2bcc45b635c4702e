"""``debugagent runs``: the run folders under the state folder, listed, shown and pruned.

A run folder is one that holds ``run.json`` or ``events.jsonl``; anything else in the runs folder is never
listed nor removed. Prune keeps, whatever its age or rank:

* a run whose undo journal is not settled (a step left to undo, or the host not yet checked as found):
  ``debugagent undo RUN`` settles it first;
* a live run: its journal names a process of this machine that is still running, and it has no final event;
  or, without a journal yet, it has no final event and wrote its events within ``LIVE_QUIET_S``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from debugagent.tools.errors import UsageError

FINAL = ("conclusion", "interrupted", "error")
LIVE_QUIET_S = 600.0      # a run with no journal yet and no final event counts as live while it wrote this recently
AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
AGE_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass
class RunInfo:
    """What ``runs list`` shows of one run folder."""

    folder: Path
    id: str
    host: str = ""
    symptom: str = ""
    started: datetime | None = None
    exit_code: int | None = None
    verdict: str = ""          # the root causes, "no confirmed cause", "interrupted", "error: …", "unfinished"
    summary: str = ""
    size: int = 0
    live: bool = False
    unsettled: str = ""        # what the undo journal still has to do ("" when settled or there is none)
    notes: list[str] = field(default_factory=list)

    @property
    def kept_because(self) -> str:
        if self.live:
            return "it is live (still running)"
        if self.unsettled:
            return f"its undo journal is not settled ({self.unsettled}): `debugagent undo {self.folder}` first"
        return ""


def parse_age(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m``, ``2w``, ``90s``; exit 2 naming --older-than otherwise."""
    m = AGE.match(text or "")
    if not m:
        raise UsageError(f"--older-than {text!r}: not an age", fix="give a number and a unit: 7d, 12h, 30m, 2w")
    return timedelta(seconds=float(m.group(1)) * AGE_UNIT[m.group(2)])


def human_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024   # type: ignore[assignment]
    return f"{n} B"


def folder_size(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def is_run(folder: Path) -> bool:
    return folder.is_dir() and not folder.is_symlink() and ((folder / "run.json").is_file()
                                                             or (folder / "events.jsonl").is_file())


def _events_ends(path: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The first event and the last final one (conclusion, interrupted, error) of an ``events.jsonl``; a damaged
    line is skipped."""
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    except OSError:
        return None, None
    first: dict[str, Any] | None = None
    for line in lines:
        if line.strip():
            try:
                first = json.loads(line)
            except ValueError:
                pass
            break
    last: dict[str, Any] | None = None
    for line in reversed(lines):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("event") in FINAL:
            last = ev
            break
        if isinstance(ev, dict) and ev.get("event") == "resumed":
            break   # a resumed run's earlier final event (an interruption) is not its end
    return (first if isinstance(first, dict) else None), last


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _journal_state(folder: Path) -> tuple[dict[str, Any] | None, str]:
    """The journal's raw data and what it still has to do ("" when settled)."""
    path = folder / "journal.json"
    if not path.is_file():
        return None, ""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, "journal.json cannot be read"
    if not isinstance(data, dict):
        return None, "journal.json is not a journal"
    steps = [s for s in data.get("steps") or [] if isinstance(s, dict)]
    pending = [str(s.get("text") or s.get("tool") or "a step") for s in steps if not s.get("done")]
    if pending:
        return data, f"{len(pending)} step(s) left: " + "; ".join(pending)
    if data.get("before") and not data.get("verified"):
        return data, "the host not yet checked as found"
    return data, ""


def read_run(folder: Path, now: datetime | None = None) -> RunInfo:
    """One run folder as ``runs`` sees it (never raises on a damaged file: it says so in ``notes``)."""
    now = now or datetime.now(UTC)
    info = RunInfo(folder=folder, id=folder.name, size=folder_size(folder))
    try:
        saved = json.loads((folder / "run.json").read_text()) if (folder / "run.json").is_file() else {}
    except (OSError, ValueError):
        saved, _ = {}, info.notes.append("run.json cannot be read")
    if isinstance(saved, dict):
        info.host, info.symptom = str(saved.get("host") or ""), str(saved.get("symptom") or "")
        if saved.get("run_id"):
            info.id = str(saved["run_id"])
    events = folder / "events.jsonl"
    first, last = _events_ends(events) if events.is_file() else (None, None)
    if first and first.get("event") == "run_started":
        info.host = info.host or str(first.get("host") or "")
        info.symptom = info.symptom or str(first.get("symptom") or "")
        try:
            info.started = datetime.fromisoformat(str(first.get("started_at")))
        except ValueError:
            pass
    if info.started is None:
        try:
            info.started = datetime.fromtimestamp((events if events.is_file() else folder).stat().st_mtime, UTC)
        except OSError:
            pass
    if last is None:
        info.verdict = "unfinished"
    elif last["event"] == "conclusion":
        info.exit_code = last.get("exit_code")
        causes = [c.get("hypothesis") for c in last.get("root_causes") or [] if isinstance(c, dict)]
        suspects = [c.get("hypothesis") for c in last.get("suspects") or [] if isinstance(c, dict)]
        info.verdict = ("root cause " + ", ".join(map(str, causes)) if causes else
                        "no confirmed cause" + (f"; suspect {suspects[0]}" if suspects else ""))
        info.summary = str(last.get("summary") or "")
    elif last["event"] == "interrupted":
        info.exit_code, info.verdict = 130, "interrupted"
    else:
        info.verdict = f"error ({last.get('kind') or 'error'})"
        info.summary = str(last.get("message") or "")
    journal, info.unsettled = _journal_state(folder)
    if last is None:
        if journal is not None and journal.get("machine") == socket.gethostname() and int(journal.get("pid") or 0) > 0:
            info.live = _pid_alive(int(journal["pid"]))
        elif journal is None:
            try:
                quiet = now.timestamp() - (events if events.is_file() else folder).stat().st_mtime
            except OSError:
                quiet = LIVE_QUIET_S + 1
            info.live = quiet <= LIVE_QUIET_S
    return info


def list_runs(root: Path, now: datetime | None = None) -> list[RunInfo]:
    """Every run folder under ``root``, newest first."""
    if not root.is_dir():
        return []
    runs = [read_run(p, now) for p in root.iterdir() if is_run(p)]
    floor = datetime.min.replace(tzinfo=UTC)
    return sorted(runs, key=lambda r: (r.started or floor, r.folder.name), reverse=True)


def find_run(root: Path, name: str) -> Path:
    """A run named by its folder, its folder's name under ``root``, its run id or a unique prefix of either."""
    p = Path(name).expanduser()
    if is_run(p):
        return p
    runs = [r for r in list_runs(root)]
    exact = [r for r in runs if name in (r.folder.name, r.id)]
    hits = exact or [r for r in runs if r.folder.name.startswith(name) or r.id.startswith(name)]
    if len(hits) == 1:
        return hits[0].folder
    if not hits:
        raise UsageError(f"{name}: no such run (in {root} or as a folder)", fix="`debugagent runs list` names them")
    raise UsageError(f"{name}: names {len(hits)} runs ({', '.join(r.folder.name for r in hits[:4])}…)",
                     fix="give more of the name")


@dataclass
class Pruned:
    removed: list[RunInfo] = field(default_factory=list)
    kept: list[RunInfo] = field(default_factory=list)     # chosen by age or count, but kept (live or unsettled)
    freed: int = 0


def prune(root: Path, older_than: timedelta | None = None, keep: int | None = None, dry_run: bool = False,
          now: datetime | None = None) -> Pruned:
    """Remove the runs older than ``older_than`` and/or beyond the ``keep`` newest; never a live or unsettled one."""
    if older_than is None and keep is None:
        raise UsageError("runs prune: say which runs go", fix="give --older-than 7d, --keep N, or both")
    if keep is not None and keep < 0:
        raise UsageError(f"--keep {keep}: must be at least 0", fix="give --keep a value at least 0")
    now = now or datetime.now(UTC)
    runs = list_runs(root, now)
    chosen: list[RunInfo] = []
    for i, r in enumerate(runs):
        old = older_than is not None and r.started is not None and now - r.started > older_than
        beyond = keep is not None and i >= keep
        if (old or older_than is None) and (beyond or keep is None):
            chosen.append(r)
    res = Pruned()
    for r in chosen:
        if r.kept_because:
            res.kept.append(r)
            continue
        if not dry_run:
            shutil.rmtree(r.folder)
        res.removed.append(r)
        res.freed += r.size
    return res
