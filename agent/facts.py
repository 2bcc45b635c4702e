"""Facts for playbook rules: a plain, JSON-ready view of what the probes found, one function
per diagnostic area (packages, repo, driver, host, GPUs, tenants, the baseline's diff);
and ``LabFacts``, the typed part of it that experiments read.

Pure functions over snapshots; the rules only ever see the dictionary (the playbook's
contract: its keys are what rules name).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from tools.host import Package
from tools.snapshot import Change, GpuFacts, Snapshot, diff

from .verdicts import not_judged

THERMAL = ("sw_thermal_slowdown", "hw_thermal_slowdown")  # when the playbook's knowledge.thermal_reasons is absent
HW_SLOW = {"hw_slowdown", "hw_power_brake_slowdown"}
MAX_LATER = 3  # late packages tested one by one, newest first
LATER_S = 24 * 3600


def iso(ts: float | int | None) -> str | None:
    if not ts:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def gpu_view(g: dict[str, Any], thermal: Collection[str] = THERMAL) -> dict[str, Any]:
    """One GPU as the rules see it; ``thermal``: the event reasons that mean a thermal slowdown."""
    reasons = list(g.get("event_reasons") or [])
    pl, plm = g.get("power_limit") or 0, g.get("power_limit_max") or 0
    gen, genm = g.get("pcie_gen"), g.get("pcie_gen_max")
    w, wm = g.get("pcie_width"), g.get("pcie_width_max")
    return {
        **g,
        "reasons": reasons,
        "thermal": bool(set(thermal) & set(reasons)),
        "hw_slowdown": bool(HW_SLOW & set(reasons)),
        "power_capped": "sw_power_cap" in reasons,
        "limit_lowered": bool(plm and pl and pl < 0.95 * plm),
        "pcie_degraded": bool(g.get("under_load") and ((gen and genm and gen < genm) or (w and wm and w < wm))),
    }


def _later_packages(packages: dict[str, dict[str, Any]]) -> tuple[float | None, list[dict[str, Any]]]:
    """The base environment's install time, and the packages installed well after it (newest first)."""
    times = [p["installed_at"] for p in packages.values() if p.get("installed_at") and not p.get("editable")]
    if not times:
        return None, []
    # the base environment: the first quarter of install times; the suspects: the newest
    # cluster of installs (within 3 days of the newest), if it came after the base
    env_installed_ts = sorted(times)[len(times) // 4]
    newest = max(times)
    later: list[dict[str, Any]] = []
    for p in packages.values():
        ts = p.get("installed_at")
        if ts and not p.get("editable") and ts > env_installed_ts + LATER_S and ts >= newest - 3 * LATER_S:
            later.append({**p, "installed_at": iso(ts), "_ts": ts})
    later.sort(key=lambda p: -p["_ts"])
    # a suspect stands out: a few late installs with compiled files, not a whole later layer of the image
    compiled = [p for p in later if p.get("build_hash")]
    return env_installed_ts, compiled[:MAX_LATER] if len(later) <= max(MAX_LATER, len(packages) // 4) else []


def repo_facts(snap: Snapshot, baseline: Snapshot | None) -> dict[str, Any] | None:
    """The checkout: head, branch, where the head moved from, and how many commits to bisect."""
    if not snap.repo:
        return None
    g = snap.repo
    prev = g.previous_head()
    moved = next((e.when for e in g.reflog if e.sha == g.head), None) if prev else None
    shas = [c.sha for c in g.commits]
    count = shas.index(prev) if prev in shas else (len(shas) if prev else 0)
    base_head = baseline.repo.head if baseline and baseline.repo else None
    if base_head and base_head in shas:
        count = shas.index(base_head)
    return {"path": g.repo, "head": g.head, "branch": g.branch, "dirty": g.dirty, "previous_head": prev,
            "moved_at": moved, "range_count": count, "head_subject": g.commits[0].subject if g.commits else "",
            "commits": [c.model_dump() for c in g.commits[:30]]}


def _version(v: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v or ""))


def driver_facts(snap: Snapshot, packages: dict[str, dict[str, Any]] | None,
                 env_installed_ts: float | None) -> dict[str, Any] | None:
    """The driver against torch's CUDA, the kernel module against the library, and when it was installed."""
    if not snap.driver:
        return None
    torch = (packages or {}).get("torch")
    tc = None
    if torch:
        m = re.search(r"\+cu(\d+)(\d)$", torch["version"])
        tc = f"{m.group(1)}.{m.group(2)}" if m else None
    df = snap.driver_files or {}
    inst = df.get("installed_at")
    return {**snap.driver, "torch_cuda": tc, "installed_at": iso(inst),
            "module_version": df.get("module_version"), "library_version": df.get("library_version"),
            "mismatch": bool(df.get("module_version") and df.get("library_version")
                             and df["module_version"] != df["library_version"]),
            "later": bool(inst and env_installed_ts and inst > env_installed_ts + LATER_S),
            "cuda_older_than_torch": bool(tc and snap.driver.get("cuda")
                                          and _version(snap.driver["cuda"])[:1] < _version(tc)[:1])}


def host_facts(snap: Snapshot) -> dict[str, Any]:
    hf = snap.host_facts
    if not hf:
        return {"governor": None, "cores": 0, "load1": 0.0, "hostname": ""}
    return {"governor": hf.governor, "cores": hf.cores, "load1": hf.load1, "hostname": hf.hostname}


def tenants(snap: Snapshot, server: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Other processes on the GPUs, by pid, never by name: a second server from the same binary is a tenant."""
    server_pids = {server["pid"], *(server.get("workers") or [])} if server else set()
    return [p for p in snap.gpu_processes if p.get("pid") not in server_pids]


def baseline_facts(snap: Snapshot, baseline: Snapshot | None, group: Callable[[list[Change]], dict[str, list[Change]]]
                   ) -> tuple[dict[str, Any] | None, list[dict[str, Any]], dict[str, Any]]:
    """What differs from the baseline snapshot (grouped by ``group``, and as one flat list), and the baseline's
    head, flags and environment."""
    if baseline is None:
        return None, [], {}
    found = diff(baseline, snap)
    d = {h: [c.model_dump(mode="json") for c in cs] for h, cs in group(found).items()}
    return d, [c.model_dump(mode="json") for c in found], {"repo_head": baseline.repo.head if baseline.repo else None,
               "flags": baseline.server.flags if baseline.server else {},
               "env": baseline.server.env if baseline.server else {}}


def server_facts(server: dict[str, Any] | None, packages: dict[str, dict[str, Any]],
                 knowledge: dict[str, Any]) -> dict[str, Any]:
    """Where the server's code comes from (an editable checkout or a package), and what no list judges."""
    top = ((server or {}).get("entry") or "").split(".")[0]
    pk = packages.values()
    return {
        "server_editable": any(p.get("editable") and top in (p.get("modules") or [p["name"]]) for p in pk),
        "server_package": next((f"{p['name']} {p['version']}" for p in pk if top and top in (p.get("modules") or [])),
                               top),
        "not_judged": not_judged(server, knowledge).model_dump(),
        "install_times_distinct": len({p.get("installed_at") for p in pk
                                       if p.get("installed_at") and not p.get("editable")}),
    }


def build_facts(snap: Snapshot, *, baseline: Snapshot | None, regression: dict[str, Any] | None,
                knowledge: dict[str, Any], symptom: dict[str, Any],
                group: Callable[[list[Change]], dict[str, list[Change]]]) -> dict[str, Any]:
    """Every area's facts in the one dictionary the rules see. ``group`` files the baseline snapshot's changes
    under hypothesis ids (the playbook's ``Playbook.group``)."""
    server = snap.server.model_dump() if snap.server else None
    packages = {p.name: p.model_dump() for p in snap.packages.packages} if snap.packages else None
    env_installed_ts, later = _later_packages(packages) if packages else (None, [])
    gpus = [gpu_view(g.model_dump(), knowledge.get("thermal_reasons", THERMAL)) for g in snap.gpus]
    d, changes, base = baseline_facts(snap, baseline, group)
    return {
        "server": server, "packages": packages, "later_packages": later, "env_installed": iso(env_installed_ts),
        "repo": repo_facts(snap, baseline), "driver": driver_facts(snap, packages, env_installed_ts),
        "host": host_facts(snap), "gpus": gpus, "gpus_loaded": bool(gpus) and all(g.get("under_load") for g in gpus),
        "gpu_processes": tenants(snap, server), "diff": d, "changes": changes, "baseline": base,
        "regression": regression or {}, "knowledge": knowledge, "symptom": symptom,
        **server_facts(server, packages or {}, knowledge),
    }


class LabFacts(BaseModel):
    """What experiments read of the host as probed: typed, from the same (redacted) snapshot as the facts."""

    repo_path: str | None = None
    repo_head: str | None = None
    packages: dict[str, Package] = Field(default_factory=dict)
    changes: list[Change] = Field(default_factory=list)   # differences from the baseline, by path
    gpus: list[GpuFacts] = Field(default_factory=list)
    governor: str | None = None
    server_python: str | None = None

    @classmethod
    def of(cls, snap: Snapshot, baseline: Snapshot | None) -> LabFacts:
        return cls(repo_path=snap.repo.repo if snap.repo else None, repo_head=snap.repo.head if snap.repo else None,
                   packages={p.name: p for p in snap.packages.packages} if snap.packages else {},
                   changes=diff(baseline, snap) if baseline is not None else [], gpus=list(snap.gpus),
                   governor=snap.host_facts.governor if snap.host_facts else None,
                   server_python=snap.server.python if snap.server else None)

    def gpu(self, index: int) -> GpuFacts:
        return next(g for g in self.gpus if g.index == index)
