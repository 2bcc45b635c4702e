"""What to do now: the exact command that undoes each confirmed cause, from what the run saw.

Pure functions of ``RunFacts``: the package to reinstall with its version, the variable to
unset, the flag to change, the commit to revert, the power limit or governor to set. Every
argument is quoted with ``shlex``; commands for a remote host are shown as ``ssh HOST "…"``.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from pydantic import BaseModel, Field

from tools.transport import ssh_line

from .runfacts import ExperimentView, RunFacts


class Fix(BaseModel):
    hypothesis: str
    text: str
    commands: list[str] = Field(default_factory=list)


def on_host(f: RunFacts, command: str) -> str:
    return ssh_line(f.target, command) if f.target else command


def restart_line(f: RunFacts, argv: list[str], unset: list[str] = (), set_env: dict[str, str] | None = None) -> str | None:
    """How the server is started again with a change: its own command line, in its own folder."""
    srv = f.outputs.get("server_details") or {}
    if not argv:
        return None
    env = ""
    if unset or set_env:
        env = "env " + " ".join([f"-u {shlex.quote(u)}" for u in unset] + [shlex.quote(f"{k}={v}") for k, v in (set_env or {}).items()]) + " "
    cwd = srv.get("cwd")
    return on_host(f, (f"cd {shlex.quote(cwd)} && " if cwd else "") + env + shlex.join(argv))


def _restart_call(x: ExperimentView) -> dict[str, Any] | None:
    return next((c.get("input") or {} for c, _ in x.calls if c.get("tool") == "restart_server"), None)


def _decisive(f: RunFacts, hid: str) -> ExperimentView | None:
    h = f.hyps.get(hid)
    if not h:
        return None
    return next((x for x in h.experiments if x.significant), None)


def _packages_named(f: RunFacts, text: str) -> list[dict[str, Any]]:
    pk = (f.outputs.get("python_packages") or {}).get("packages") or []
    return [p for p in sorted(pk, key=lambda p: -len(p["name"])) if re.search(rf"(?<![\w-]){re.escape(p['name'])}(?![\w-])", text)]


def fix_compiled(f: RunFacts, cause: dict[str, Any]) -> Fix:
    text = cause.get("summary", "") + " " + " ".join(cause.get("evidence") or [])
    pkgs = _packages_named(f, text)
    python = (f.outputs.get("python_packages") or {}).get("python") or (f.outputs.get("server_details") or {}).get("python") or "python3"
    base = {p["name"]: p for p in ((f.baseline_snapshot or {}).get("packages") or {}).get("packages", [])}
    if not pkgs:
        return Fix(hypothesis="compiled_dependency", text="Reinstall the dependency named above at the version the good state had, "
                   "then restart the server.")
    wanted = [(p["name"], (base.get(p["name"]) or {}).get("version") or p["version"], p["version"]) for p in pkgs]
    parts = [f"{n} {v}" + (" (the same version, from the package index, replacing the rebuilt files)" if v == now
                           else f" (the baseline's, instead of {now})") for n, v, now in wanted]
    local = [n for n, v, _ in wanted if "+" in v]
    note = (f"; {', '.join(local)} carries a local version (+…): pip finds it on its own index, e.g. "
            "--index-url https://download.pytorch.org/whl/cu130 for torch" if local else "")
    cmds = [on_host(f, f"{shlex.quote(python)} -m pip install --force-reinstall --no-deps "
                       + " ".join(shlex.quote(f"{n}=={v}") for n, v, _ in wanted))]
    srv = f.outputs.get("server_details") or {}
    r = restart_line(f, srv.get("argv") or [])
    if r:
        cmds.append(r)
    return Fix(hypothesis="compiled_dependency",
               text=f"Reinstall {'; '.join(parts)}{note}. Then restart the server (stop pid {srv.get('pid', '?')} first) "
                    "the way it is normally started:", commands=cmds)


def fix_restart(f: RunFacts, hid: str, cause: dict[str, Any]) -> Fix:
    x = _decisive(f, hid)
    inp = _restart_call(x) if x else None
    srv = f.outputs.get("server_details") or {}
    if inp:
        what = x.title if x else "the change"
        unset, set_env = inp.get("unset") or [], inp.get("set") or {}
        where = ("remove " + ", ".join(unset) + " from wherever the server's environment is set (unit file, launch script), "
                 if unset else "")
        return Fix(hypothesis=hid, text=f"Make the experiment's change permanent ({what}): {where}then restart the server "
                   f"(stop pid {srv.get('pid', '?')} first) as the experiment did:",
                   commands=[c for c in [restart_line(f, inp.get("argv") or [], unset, set_env)] if c])
    var = re.search(r"\b([A-Z][A-Z0-9_]+)=\S* is set", cause.get("summary", ""))
    if var and srv.get("argv"):
        return Fix(hypothesis=hid, text=f"Unset {var.group(1)} where the server is launched, then restart it:",
                   commands=[c for c in [restart_line(f, srv["argv"], [var.group(1)])] if c])
    return Fix(hypothesis=hid, text="Restart the server without the setting named above.")


def fix_code(f: RunFacts, cause: dict[str, Any]) -> Fix:
    repo = (f.outputs.get("git_state") or {}).get("repo") or "."
    m = re.search(r"commit (\w+) \"[^\"]*\" \(([0-9a-f]{7,40})\)", cause.get("summary", ""))
    x = _decisive(f, "code_change")
    if m:
        return Fix(hypothesis="code_change", text=f"Revert the first bad commit {m.group(1)} in {repo} (a new commit; history "
                   "is kept), then restart the server:", commands=[on_host(f, f"git -C {shlex.quote(repo)} revert --no-edit {m.group(2)}")])
    to = (x.spec.get("to") if x else None)
    if to:
        return Fix(hypothesis="code_change", text=f"Go back to {to[:7]}, the commit that measured good, then restart the server:",
                   commands=[on_host(f, f"git -C {shlex.quote(repo)} checkout {to}")])
    return Fix(hypothesis="code_change", text="Revert the change named above and restart the server.")


def fix_simple(f: RunFacts, hid: str, cause: dict[str, Any]) -> Fix:
    x = _decisive(f, hid)
    spec = x.spec if x else {}
    if spec.get("kind") == "power_limit" or (hid == "gpu_clocks" and "power limit" in cause.get("summary", "")):
        gpu = spec.get("gpu", "0")
        watts = spec.get("watts") or "the maximum"
        return Fix(hypothesis=hid, text=f"Raise GPU {gpu}'s power limit back to {watts} W (and find what lowered it: a "
                   "startup script, a datacenter policy):", commands=[on_host(f, f"nvidia-smi -i {int(float(gpu))} -pl {float(watts):g}")]
                   if spec.get("watts") else [])
    if spec.get("kind") == "governor" or hid == "host_cpu":
        g = spec.get("governor") or "performance"
        return Fix(hypothesis=hid, text=f"Set the CPU governor to {g} (and make it persist across reboots):",
                   commands=[on_host(f, f"echo {shlex.quote(g)} | tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor")])
    if hid == "gpu_contention":
        srv = (f.outputs.get("server_details") or {}).get("pid")
        procs = [p for p in (f.outputs.get("gpu_processes") or {}).get("processes", []) if p.get("pid") != srv]
        return Fix(hypothesis=hid, text="Stop the other processes on the server's GPUs (check what they are first):",
                   commands=[on_host(f, "kill " + " ".join(str(p["pid"]) for p in procs))] if procs else [])
    if hid == "pcie_link":
        return Fix(hypothesis=hid, text="The link trains below its maximum: reseat the card or check the slot/BIOS "
                   "settings; read it again under load after the fix.", commands=[on_host(f, "nvidia-smi -q -d PCI")])
    if hid == "gpu_clocks":
        return Fix(hypothesis=hid, text="The GPU slows down for heat: check cooling and airflow; read the clocks again under "
                   "load afterwards.", commands=[on_host(f, "nvidia-smi -q -d PERFORMANCE,TEMPERATURE")])
    if hid == "driver_cuda":
        return Fix(hypothesis=hid, text="Bring the driver back in line: reboot if the kernel module and library differ, or "
                   "reinstall the driver the good state had.")
    return Fix(hypothesis=hid, text=f"Undo what {hid} names above.")


def merged_restart(f: RunFacts, hids: list[str]) -> Fix | None:
    """Several causes fixed by restarting the server (a flag and a variable): one restart with every change."""
    inputs = [(_restart_call(x) or {}) for x in (_decisive(f, h) for h in hids) if x]
    flag = next((i for h, i in zip(hids, inputs, strict=False) if h == "serving_config" and i.get("argv")), None)
    if len(inputs) < 2 or flag is None:
        return None
    unset = sorted({u for i in inputs for u in (i.get("unset") or [])})
    set_env = {k: v for i in inputs for k, v in (i.get("set") or {}).items()}
    srv = f.outputs.get("server_details") or {}
    line = restart_line(f, flag["argv"], unset, set_env)
    where = f"remove {', '.join(unset)} from wherever the server's environment is set, " if unset else ""
    return Fix(hypothesis="+".join(hids), text=f"Make every experiment's change permanent at once ({' and '.join(hids)}): "
               f"{where}then restart the server (stop pid {srv.get('pid', '?')} first) with the changed flags:",
               commands=[line] if line else [])


def fixes_for(f: RunFacts) -> list[Fix]:
    causes = [c["hypothesis"] for c in (f.conclusion or {}).get("root_causes") or []]
    restarts = [h for h in causes if h in ("env_var", "serving_config")]
    merged = merged_restart(f, restarts) if len(restarts) > 1 else None
    out = [merged] if merged else []
    for cause in (f.conclusion or {}).get("root_causes") or []:
        hid = cause["hypothesis"]
        if cause.get("fix"):
            out.append(Fix(hypothesis=hid, text="Apply the fix:", commands=[str(cause["fix"])]))
        elif hid == "compiled_dependency":
            out.append(fix_compiled(f, cause))
        elif hid in ("env_var", "serving_config"):
            if not merged:
                out.append(fix_restart(f, hid, cause))
        elif hid == "code_change":
            out.append(fix_code(f, cause))
        else:
            out.append(fix_simple(f, hid, cause))
    return out
