"""The read-only checks experiments make before they act: how the server is run (a plain process, a systemd
unit, a container), where its modules are imported from, whether it is ready, and the wheels and overlay
packages a package experiment would use. No snapshot fields, no facts: only tools and their summaries.
"""

from __future__ import annotations

from typing import Any

from .. import host, mutate, recreate, supervise
from .base import Probe, Tool
from .text import clip_words, code, collapsed


def _server_control(ev: dict[str, Any]) -> list[str] | None:
    parsed = ev.get("output") or {}
    if not parsed.get("kind"):
        return None
    how = [f"a {parsed['kind']} process" if parsed["kind"] == "plain" else f"run by {parsed['kind']}"]
    if parsed.get("unit"):
        how.append(f"unit {code(parsed['unit'])}")
    if parsed.get("parent_pid") is not None:
        how.append(f"parent pid {parsed['parent_pid']}" + (f" ({code(parsed['parent'])})" if parsed.get("parent") else ""))
    if parsed.get("evidence"):
        how.append(clip_words(str(parsed["evidence"]), 120))
    if parsed.get("stdout"):
        how.append(f"its output goes to {code(parsed['stdout'])}")
    return ["Output: " + "; ".join(how), *collapsed(ev.get("stdout") or "")]


def _import_roots(ev: dict[str, Any]) -> list[str] | None:
    parsed = ev.get("output") or {}
    if parsed.get("modules") is None:
        return None
    mods = "; ".join(f"{code(m.get('module'))} from {code(m.get('root') or m.get('origin') or '?')}"
                     + (f" ({m['how']})" if m.get("how") else "") + (f", error: {m['error']}" if m.get("error") else "")
                     for m in parsed["modules"]) or "no module"
    return [f"Output: {mods}; cwd {code(parsed.get('cwd') or '?')}", *collapsed(ev.get("stdout") or "")]


PROBE = Probe(
    "control",
    tools=(Tool("server_control", mutate.ServerControl, lambda i, r: mutate.parse_server_control(i.pid, r.stdout),
                summary=_server_control),
           Tool("import_roots", mutate.ImportRoots, lambda i, r: mutate.parse_import_roots(r.stdout), summary=_import_roots),
           Tool("supervisor_program", supervise.SupervisorProgram,
                lambda i, r: supervise.parse_supervisor_program(r.stdout)),
           # the pre-flight check of a systemd unit's experiments (``agent.steps.systemd_check``)
           Tool("systemd_access", supervise.SystemdAccess, lambda i, r: supervise.parse_systemd_access(r.stdout)),
           Tool("server_ready", mutate.ServerReady, lambda i, r: mutate.parse_server_ready(r.stdout)),
           Tool("find_wheels", mutate.FindWheels, lambda i, r: mutate.parse_wheels(r.stdout)),
           Tool("find_older_wheels", mutate.FindWheels, lambda i, r: mutate.parse_wheels(r.stdout)),
           Tool("container_inspect", recreate.ContainerInspect,
                lambda i, r: recreate.ContainerSpec.of_inspect(r.stdout, runtime=i.runtime)),
           Tool("overlay_packages", mutate.OverlayPackages, lambda i, r: host.parse_python_packages(r.stdout),
                timeout=120.0)),
)
