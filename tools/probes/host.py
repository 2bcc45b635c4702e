"""The host: hostname, kernel, cores, load, the CPU frequency governor and the host profile.

``host_info`` is sent by discovery (the profile names the benchmark); snapshot fields ``cpu`` and
``host_facts``; difference path ``cpu.governor``; fact ``host``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from .. import host
from .base import Add, Gathering, Probe, Tool

if TYPE_CHECKING:
    from ..snapshot import Snapshot


class Fields(BaseModel):
    cpu: dict[str, Any] = Field(default_factory=dict)
    host_facts: host.HostFacts | None = None


def _fill(g: Gathering) -> dict[str, Any]:
    facts = g.discovery.host_facts if g.discovery else None
    return {"cpu": {"governor": facts.governor, "cores": facts.cores, "kernel": facts.kernel} if facts else {},
            "host_facts": facts}


def _diff(a: Snapshot, b: Snapshot, add: Add) -> None:
    if a.cpu.get("governor") != b.cpu.get("governor"):
        add("cpu.governor", a.cpu.get("governor"), b.cpu.get("governor"))


def host_facts(snap: Snapshot) -> dict[str, Any]:
    hf = snap.host_facts
    if not hf:
        return {"governor": None, "cores": 0, "load1": 0.0, "hostname": ""}
    return {"governor": hf.governor, "cores": hf.cores, "load1": hf.load1, "hostname": hf.hostname}


PROBE = Probe(
    "host",
    tools=(Tool("host_info", host.HostInfo, lambda i, r: host.parse_host_info(r.stdout), check=True),),
    fill=_fill, diff_paths=("cpu.governor",), diff=_diff, facts=lambda snap, fx: {"host": host_facts(snap)},
)
