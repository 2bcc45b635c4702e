"""Probes as plugins: one small module per diagnostic area, each a ``Probe`` (see ``base``).

The tool table (``tools.registry.TOOLS``), a snapshot's calls and fields (``tools.snapshot.collect``), its
difference paths (``tools.snapshot.diff``, ``DIFF_PATHS``), the rules' facts (``agent.facts.build_facts``) and
each output's lines in the transcript (``render_output``) are all built from ``PROBES``, in its order.

Adding a probe: a module here that declares its ``PROBE`` (and its snapshot fields, a pydantic model), its
entry in ``PROBES``, and, if it adds snapshot fields, their model among ``Fields``' bases below.
"""

from __future__ import annotations

from typing import Any

from . import bench, control, driver, git, gpu, host, packages, server, serverview, shadow
from .base import Call, FactsInput, Gathering, Probe, Tool
from .text import plain, tail

# The order is the order of a snapshot's calls in each wave, of the differences ``diff`` reports and of
# ``DIFF_PATHS``.
PROBES: tuple[Probe, ...] = (packages.PROBE, git.PROBE, server.PROBE, serverview.PROBE, gpu.PROBE, host.PROBE,
                             driver.PROBE, shadow.PROBE, bench.PROBE, control.PROBE)


class Fields(driver.FileFields, bench.Fields, host.Fields, git.Fields, packages.Fields, serverview.Fields, server.Fields, gpu.Fields,
             driver.Fields):
    """Every probe's snapshot fields; pydantic orders them from the last base to the first."""


def tools() -> dict[str, Tool]:
    """Every probe's tools by name."""
    return {t.name: t for p in PROBES for t in p.tools}


def optional() -> tuple[str, ...]:
    """The read-only tools a caller may leave out of a snapshot (a playbook's ``checks`` choose them), in the
    order a snapshot sends them."""
    return tuple(t.name for w in (1, 2) for p in PROBES for t in p.tools if t.optional and t.wave == w)


def checks() -> tuple[str, ...]:
    """The tools a playbook hypothesis may name in its ``checks``."""
    return tuple(t.name for p in PROBES for t in p.tools if t.check)


def stands_for() -> dict[str, str]:
    """Tools sent in place of another (``gpu_nvml_under_load`` for ``gpu_sample_under_load``): name -> the other's."""
    return {t.name: t.stands_for for p in PROBES for t in p.tools if t.stands_for}


def diff_paths() -> tuple[str, ...]:
    """Every path ``diff`` reports; NAME, FLAG, VAR and N stand for one path segment."""
    return tuple(path for p in PROBES for path in p.diff_paths)


def plan(g: Gathering, wave: int) -> list[Call]:
    """The calls of a snapshot's ``wave`` (1: with discovery, 2: after it), every probe's in order; an
    optional tool only where ``g`` wants it, and, replaying a recording, only where the recording made its calls
    (a probe added since must not break the replay of a run recorded before it)."""
    table = tools()
    recorded = getattr(getattr(g.runner, "transport", None), "recorded_tools", None)
    out: list[Call] = []
    for p in PROBES:
        hook = p.first if wave == 1 else p.second
        for call in hook(g) if hook else []:
            t = table[call[0]]
            if not t.optional or (g.want(t.name) and (recorded is None or t.name in recorded)):
                out.append(call)
    return out


def render_output(tool: str, ev: dict[str, Any]) -> list[str]:
    """The output of one tool call (its ``tool_result`` event) made readable by its tool's summary, or plainly;
    then its stderr and error. The raw text is in events.jsonl."""
    t = tools().get(tool)
    lines = t.summary(ev) if t is not None and t.summary is not None else None
    return (plain(ev) if lines is None else lines) + tail(tool, ev, lines or [])


__all__ = ["PROBES", "Call", "FactsInput", "Fields", "Gathering", "Probe", "Tool", "checks", "diff_paths", "optional", "plan",
           "render_output", "stands_for", "tools"]
