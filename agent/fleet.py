"""Many hosts: snapshot a fleet concurrently, and find the odd one out.

``snapshot_fleet`` takes a snapshot of every host (``tools/inventory.py`` says which) with a bounded pool
of threads, one SSH connection per host (host keys checked as for one host), each snapshot written to
``DIR/NAME.json`` as soon as it is taken, and ``DIR/fleet.json`` naming every host, its file or why it
could not be read (a line per host, never a traceback; the others still finish).

``fleet_diff`` compares the snapshots of a folder field by field: each host is diffed against one
reference host with the same probes' ``diff`` as ``debugagent diff`` (so a field differs for the fleet
exactly where it would for two snapshots), every host then has a value for every path that differs
anywhere, and the value most hosts hold is the majority; the others are the odd hosts. The benchmark's
numbers (each host's median over its runs) are a distribution: its median and MAD, and a host is an
outlier where its modified z-score is beyond 3.5 (Iglewicz and Hoaglin, 1993; the MAD scaled to the
normal's SD by ``scipy.stats.median_abs_deviation(scale="normal")``), which one slow host cannot hide by
moving the fleet's centre.
"""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from debugagent.tools.errors import DebugAgentError, UsageError
from debugagent.tools.inventory import InventoryHost
from debugagent.tools.redact import redact_text
from pydantic import BaseModel, Field

from .config import SSHOptions

FLEET_FILE = "fleet.json"
OUTLIER_Z = 3.5


class HostResult(BaseModel):
    """One host of a fleet snapshot: where its snapshot went, or why there is none."""

    name: str
    target: str
    file: str | None = None
    error: str | None = None
    fix: str | None = None
    exit_code: int = 0          # the exit code `debugagent snapshot` would have given for this host
    seconds: float = 0.0
    notes: list[str] = Field(default_factory=list)   # what the snapshot could not read (its ``errors``)
    bench_failed: bool = False  # benchmark runs were asked and none gave a number


class FleetRecord(BaseModel):
    """``DIR/fleet.json``."""

    fleet_version: int = 1
    inventory: str
    limit: str | None = None
    taken_at: str
    seconds: float
    forks: int
    hosts: list[HostResult] = Field(default_factory=list)


def file_names(hosts: list[InventoryHost]) -> dict[str, str]:
    """A snapshot file name for each host: its name with nothing but letters, digits, ``.``, ``_``, ``-``;
    two hosts that would share one get ``-2``, ``-3``."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for h in hosts:
        base = re.sub(r"[^A-Za-z0-9._-]", "_", h.name).strip(".") or "host"
        name, n = base, 1
        while name.lower() in used or name.lower() == Path(FLEET_FILE).stem:
            n += 1
            name = f"{base}-{n}"
        used.add(name.lower())
        out[h.name] = f"{name}.json"
    return out


def snapshot_fleet(hosts: list[InventoryHost], out_dir: Path, ssh: SSHOptions, *, forks: int, inventory: str,
                   limit: str | None = None, collect_args: dict[str, Any] | None = None,
                   on_done: Callable[[HostResult], None] | None = None) -> FleetRecord:
    """Snapshot every host, at most ``forks`` at once; each host's file is written when it is taken."""
    from debugagent.tools.redact import write_private
    from debugagent.tools.registry import Runner
    from debugagent.tools.snapshot import collect, dump

    from .hosts import open_transport

    names = file_names(hosts)
    lock = threading.Lock()
    t0 = time.monotonic()

    def one(h: InventoryHost) -> HostResult:
        start = time.monotonic()
        res = HostResult(name=h.name, target=h.target)
        opts = ssh.model_copy(update={"identity_file": h.identity_file}) if h.identity_file else ssh
        try:
            with open_transport(h.target, opts) as tr:
                snap = collect(Runner(tr), **(collect_args or {}))
            path = out_dir / names[h.name]
            write_private(path, dump(snap) + "\n")
            res.file = path.name
            res.notes = [redact_text(e) for e in snap.errors]
            res.bench_failed = bool(snap.bench) and snap.bench.get("runs", 0) > 0 and not snap.bench.get("samples")
        except DebugAgentError as exc:
            res.error, res.fix, res.exit_code = redact_text(exc.message), exc.fix, exc.exit_code
        except Exception as exc:  # noqa: BLE001 - one host's failure is that host's line, never the fleet's traceback
            res.error, res.exit_code = redact_text(f"internal error: {type(exc).__name__}: {exc}"), 1
        res.seconds = round(time.monotonic() - start, 2)
        if on_done is not None:
            with lock:
                on_done(res)
        return res

    with ThreadPoolExecutor(max_workers=max(1, forks), thread_name_prefix="fleet") as pool:
        results = list(pool.map(one, hosts))
    rec = FleetRecord(inventory=inventory, limit=limit, taken_at=datetime.now(UTC).isoformat(timespec="seconds"),
                      seconds=round(time.monotonic() - t0, 2), forks=forks, hosts=results)
    write_private(out_dir / FLEET_FILE, rec.model_dump_json(indent=1) + "\n")
    return rec


# ---------------------------------------------------------------- diff
class Split(BaseModel):
    """One field on which the fleet does not agree."""

    path: str
    hypothesis: str
    majority: Any = None
    majority_hosts: int = 0
    hosts: int = 0
    odd: dict[str, Any] = Field(default_factory=dict)   # host -> its value
    note: str = ""
    follows_load: bool = False


class BenchSpread(BaseModel):
    metric: str | None = None
    unit: str | None = None
    values: dict[str, float] = Field(default_factory=dict)     # host -> the median of its runs
    median: float | None = None
    mad: float | None = None                                   # scaled to the normal's SD
    z: dict[str, float | None] = Field(default_factory=dict)   # host -> modified z-score (None: off a MAD of 0)
    outliers: list[str] = Field(default_factory=list)
    test: str = f"modified z-score beyond {OUTLIER_Z} (Iglewicz and Hoaglin), from the median and the MAD"
    note: str = ""


class FleetDiff(BaseModel):
    hosts: list[str]
    reference: str | None = None
    splits: list[Split] = Field(default_factory=list)
    bench: BenchSpread | None = None
    unread: dict[str, str] = Field(default_factory=dict)       # host -> why it has no snapshot

    @property
    def odd_hosts(self) -> list[str]:
        seen: list[str] = []
        for s in self.splits:
            for h in s.odd:
                if h not in seen:
                    seen.append(h)
        for h in self.bench.outliers if self.bench else []:
            if h not in seen:
                seen.append(h)
        return seen


@dataclass
class Loaded:
    snaps: dict[str, Any]          # host -> Snapshot
    unread: dict[str, str]


def load_fleet(folder: str) -> Loaded:
    """The snapshots of a ``fleet snapshot`` folder (its ``fleet.json`` names them), or every snapshot
    ``*.json`` in a folder of them."""
    from debugagent.tools.snapshot import Snapshot

    d = Path(folder)
    if not d.is_dir():
        raise UsageError(f"fleet diff {folder}: " + ("is a file, not a folder" if d.exists() else "no such folder"),
                         fix="give the folder `debugagent fleet snapshot -o DIR` wrote")
    snaps: dict[str, Any] = {}
    unread: dict[str, str] = {}
    rec_path = d / FLEET_FILE
    if rec_path.is_file():
        try:
            rec = FleetRecord.model_validate_json(rec_path.read_text())
        except ValueError as exc:
            raise UsageError(f"{rec_path}: not a fleet record ({str(exc).splitlines()[0]})",
                             fix="take the fleet's snapshots again with `debugagent fleet snapshot`") from None
        for h in rec.hosts:
            if h.file:
                snaps[h.name] = Snapshot.load(str(d / h.file))
            else:
                unread[h.name] = h.error or "not read"
    else:
        for p in sorted(d.glob("*.json")):
            snaps[p.stem] = Snapshot.load(str(p))
    if len(snaps) < 2:
        raise UsageError(f"fleet diff {folder}: {len(snaps)} snapshot(s) read; a fleet needs at least 2 to compare",
                         fix="take snapshots of two or more hosts (`debugagent fleet snapshot -i INVENTORY -o DIR`)")
    return Loaded(snaps, unread)


def _key(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def fleet_diff(snaps: dict[str, Any], group_of: Callable[[Any], str], unread: dict[str, str] | None = None) -> FleetDiff:
    """Where the fleet's snapshots disagree: per field the majority and the odd hosts; the benchmark's
    outliers. ``group_of`` files a ``Change`` under its hypothesis (the playbook's ``evidence_of``)."""
    from debugagent.tools.snapshot import Change, diff

    names = sorted(snaps)
    ref = names[0]
    refval: dict[str, Any] = {}
    meta: dict[str, Change] = {}
    values: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for h in names[1:]:
        for c in diff(snaps[ref], snaps[h]):
            if c.path not in meta:
                order.append(c.path)
                meta[c.path], refval[c.path] = c, c.a
            values.setdefault(c.path, {})[h] = c.b
    splits: list[Split] = []
    for path in order:
        every = {h: (refval[path] if h == ref else values[path].get(h, refval[path])) for h in names}
        counts = Counter(_key(v) for v in every.values())
        (top, n_top), *rest = counts.most_common()
        tie = bool(rest) and rest[0][1] == n_top
        majority = next(v for v in every.values() if _key(v) == top)
        c = meta[path]
        odd = {h: v for h, v in every.items() if _key(v) != top}
        note = c.note
        if tie:
            note = (note + "; " if note else "") + "no majority: as many hosts hold another value"
        splits.append(Split(path=path, hypothesis=group_of(Change(path=path, a=majority, b=next(iter(odd.values())))),
                            majority=majority, majority_hosts=n_top, hosts=len(names), odd=odd, note=note,
                            follows_load=c.follows_load))
    return FleetDiff(hosts=names, reference=ref, splits=splits, bench=bench_spread(snaps), unread=unread or {})


def bench_spread(snaps: dict[str, Any]) -> BenchSpread | None:
    """Each host's benchmark median and the fleet's outliers (modified z-score from the median and MAD)."""
    from scipy.stats import median_abs_deviation

    vals: dict[str, float] = {}
    metric = unit = None
    for h, s in snaps.items():
        b = s.bench or {}
        samples = [float(x) for x in b.get("samples") or []]
        if samples:
            vals[h] = statistics.median(samples)
            metric, unit = metric or b.get("metric"), unit or b.get("unit")
    if len(vals) < 2:
        return None
    xs = list(vals.values())
    med = statistics.median(xs)
    mad = float(median_abs_deviation(xs, scale="normal"))  # pyright: ignore[reportArgumentType] - scipy takes "normal"
    out = BenchSpread(metric=metric, unit=unit, values=vals, median=med, mad=mad)
    if len(vals) < 3:
        out.note = "two hosts: no majority to call one of them an outlier"
        return out
    if mad == 0:
        # most hosts read the same: any host off that value is an outlier, and its z is unbounded
        out.z = {h: 0.0 if v == med else None for h, v in vals.items()}
    else:
        out.z = {h: round((v - med) / mad, 2) for h, v in vals.items()}
    out.outliers = [h for h, z in out.z.items() if z is None or abs(z) > OUTLIER_Z]
    return out
