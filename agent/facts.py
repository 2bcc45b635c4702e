"""Facts for playbook rules: a plain, JSON-ready view of what the probes found.

Pure functions over snapshots; the rules only ever see this dictionary.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any

from tools.snapshot import Change, Snapshot, diff

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


def build_facts(snap: Snapshot, *, baseline: Snapshot | None, regression: dict[str, Any] | None,
                knowledge: dict[str, Any], symptom: dict[str, Any],
                group: Callable[[list[Change]], dict[str, list[Change]]]) -> dict[str, Any]:
    """``group`` files the baseline snapshot's changes under hypothesis ids (the playbook's ``Playbook.group``)."""
    server = snap.server.model_dump() if snap.server else None
    packages = {p.name: p.model_dump() for p in snap.packages.packages} if snap.packages else None
    env_installed_ts = None
    later: list[dict[str, Any]] = []
    if packages:
        times = [p["installed_at"] for p in packages.values() if p.get("installed_at") and not p.get("editable")]
        if times:
            # the base environment: the first quarter of install times; the suspects: the newest
            # cluster of installs (within 3 days of the newest), if it came after the base
            env_installed_ts = sorted(times)[len(times) // 4]
            newest = max(times)
            for p in packages.values():
                ts = p.get("installed_at")
                if ts and not p.get("editable") and ts > env_installed_ts + LATER_S and ts >= newest - 3 * LATER_S:
                    later.append({**p, "installed_at": iso(ts), "_ts": ts})
            later.sort(key=lambda p: -p["_ts"])
            # a suspect stands out: a few late installs with compiled files, not a whole later layer of the image
            compiled = [p for p in later if p.get("build_hash")]
            later = compiled[:MAX_LATER] if len(later) <= max(MAX_LATER, len(packages) // 4) else []
    repo = None
    if snap.repo:
        g = snap.repo
        prev = g.previous_head()
        moved = next((e.when for e in g.reflog if e.sha == g.head), None) if prev else None
        shas = [c.sha for c in g.commits]
        count = shas.index(prev) if prev in shas else (len(shas) if prev else 0)
        base_head = baseline.repo.head if baseline and baseline.repo else None
        if base_head and base_head in shas:
            count = shas.index(base_head)
        repo = {"path": g.repo, "head": g.head, "branch": g.branch, "dirty": g.dirty, "previous_head": prev,
                "moved_at": moved, "range_count": count, "head_subject": g.commits[0].subject if g.commits else "",
                "commits": [c.model_dump() for c in g.commits[:30]]}
    drv = None
    if snap.driver:
        torch = (packages or {}).get("torch")
        tc = None
        if torch:
            m = re.search(r"\+cu(\d+)(\d)$", torch["version"])
            tc = f"{m.group(1)}.{m.group(2)}" if m else None
        df = snap.driver_files or {}
        inst = df.get("installed_at")

        def ver(v: str | None) -> tuple[int, ...]:
            return tuple(int(x) for x in re.findall(r"\d+", v or ""))
        drv = {**snap.driver, "torch_cuda": tc, "installed_at": iso(inst),
               "module_version": df.get("module_version"), "library_version": df.get("library_version"),
               "mismatch": bool(df.get("module_version") and df.get("library_version")
                                and df["module_version"] != df["library_version"]),
               "later": bool(inst and env_installed_ts and inst > env_installed_ts + LATER_S),
               "cuda_older_than_torch": bool(tc and snap.driver.get("cuda") and ver(snap.driver["cuda"])[:1] < ver(tc)[:1])}
    hf = snap.host_facts
    host = {"governor": hf.governor if hf else None, "cores": hf.cores if hf else 0, "load1": hf.load1 if hf else 0.0,
            "hostname": hf.hostname if hf else ""} if hf else {"governor": None, "cores": 0, "load1": 0.0, "hostname": ""}
    gpus = [gpu_view(g.model_dump(), knowledge.get("thermal_reasons", THERMAL)) for g in snap.gpus]
    # tenants by pid, never by name: a second server from the same binary is a tenant
    server_pids = {server["pid"], *(server.get("workers") or [])} if server else set()
    foreign = [p for p in snap.gpu_processes if p.get("pid") not in server_pids]
    d = None
    changes: list[dict[str, Any]] = []
    base: dict[str, Any] = {}
    if baseline is not None:
        found = diff(baseline, snap)
        changes = [c.model_dump(mode="json") for c in found]
        d = {h: [c.model_dump(mode="json") for c in cs] for h, cs in group(found).items()}
        base = {"repo_head": baseline.repo.head if baseline.repo else None,
                "flags": baseline.server.flags if baseline.server else {},
                "env": baseline.server.env if baseline.server else {}}
    return {
        "server": server, "packages": packages, "later_packages": later, "env_installed": iso(env_installed_ts),
        "repo": repo, "driver": drv, "host": host, "gpus": gpus,
        "gpus_loaded": bool(gpus) and all(g.get("under_load") for g in gpus),
        "gpu_processes": foreign, "diff": d, "changes": changes, "baseline": base, "regression": regression or {},
        "knowledge": knowledge, "symptom": symptom,
    }
