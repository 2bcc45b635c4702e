"""Facts for playbook rules: a plain, JSON-ready view of what the probes found (each probe's own facts,
``tools.probes``), the baseline's diff and what the run adds; and ``LabFacts``, the typed part of it that
experiments read.

Pure functions over snapshots; the rules only ever see the dictionary (the playbook's
contract: its keys are what rules name).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from debugagent.tools.host import Package
from debugagent.tools.probes import PROBES, FactsInput
from debugagent.tools.snapshot import Change, GpuFacts, Snapshot, diff
from pydantic import BaseModel, Field

from .verdicts import not_judged


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
                 knowledge: dict[str, Any], bench_cmd: str | None = None) -> dict[str, Any]:
    """Where the server's code comes from (an editable checkout or a package), and what no list judges."""
    top = ((server or {}).get("entry") or "").split(".")[0]
    pk = packages.values()
    return {
        "server_editable": any(p.get("editable") and top in (p.get("modules") or [p["name"]]) for p in pk),
        "server_package": next((f"{p['name']} {p['version']}" for p in pk if top and top in (p.get("modules") or [])),
                               top),
        "not_judged": not_judged(server, knowledge, bench_cmd).model_dump(),
        "install_times_distinct": len({p.get("installed_at") for p in pk
                                       if p.get("installed_at") and not p.get("editable")}),
    }


def build_facts(snap: Snapshot, *, baseline: Snapshot | None, regression: dict[str, Any] | None,
                knowledge: dict[str, Any], symptom: dict[str, Any],
                group: Callable[[list[Change]], dict[str, list[Change]]]) -> dict[str, Any]:
    """Every probe's facts (``tools.probes``, in order) and the run's, in the one dictionary the rules see.
    ``group`` files the baseline snapshot's changes under hypothesis ids (the playbook's ``Playbook.group``)."""
    facts: dict[str, Any] = {}
    for p in PROBES:
        if p.facts:
            facts.update(p.facts(snap, FactsInput(baseline=baseline, knowledge=knowledge, so_far=facts)))
    d, changes, base = baseline_facts(snap, baseline, group)
    return {
        **facts, "diff": d, "changes": changes, "baseline": base,
        "regression": regression or {}, "knowledge": knowledge, "symptom": symptom,
        **server_facts(facts.get("server"), facts.get("packages") or {}, knowledge,
                       (facts.get("bench") or {}).get("cmd")),
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
