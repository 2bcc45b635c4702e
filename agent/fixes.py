"""What to do now: the exact command that undoes each confirmed cause, from what the run saw.

The words and commands are the playbook's: a ``fix:`` template on the experiment that confirmed the
cause, else its kind's (``agent/lab/kinds``), else the hypothesis' ``fix:``, rendered in the rules'
sandbox (``playbook.render_fix``) on what the run saw. A text that renders empty passes to the next.
A command the experiment found (a build to reinstall) comes first; causes fixed by the same kind of
restart are fixed by one. Commands for a remote host are shown as ``ssh HOST "…"``.

The templates see:

- ``hypothesis``: its id; ``cause``: the conclusion's root cause (``summary``, ``evidence``, ``culprit``: the first bad
  commit bisection found, with ``sha``, ``short``, ``subject``, or none, …); templates read these fields, not the prose;
- ``experiment``: the experiment that decided it (``title``, ``kind``, ``spec`` as it ran, ``restart``: the
  input of its ``restart_server`` call, or none); empty fields when it was decided by the evidence;
- ``server``: the server as found (``pid``, ``argv``, ``cwd``, ``python``); ``repo``: its checkout (or ``.``), ``branch``: the branch it is on (or none);
  ``python``: its interpreter; ``gpu_processes``: the GPUs' processes; ``outputs``: every probe's output;
- ``restart_line(argv, unset=[], set_env={})``: the command that starts the server so, in its folder;
- ``packages_of(names)``: the server's packages of those names, each with ``baseline_version`` (the baseline
  snapshot's, else its own) and ``local`` (that version has a local label, ``+…``); ``changed_packages``: the names
  of those whose version or compiled files differ from the baseline snapshot's;
- the filters ``quote`` (every value from the host goes through it), ``shjoin`` and ``regex_search``.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Sequence
from typing import Any

from debugagent.tools.errors import PlaybookError
from debugagent.tools.transport import ssh_line
from pydantic import BaseModel, Field

from .lab import FixTemplate, kind_of
from .playbook import PARSED, Playbook, builtin_playbooks, load_playbook, render_fix
from .runfacts import ExperimentView, RunFacts


class Fix(BaseModel):
    hypothesis: str
    text: str
    commands: list[str] = Field(default_factory=list)


def on_host(f: RunFacts, command: str) -> str:
    return ssh_line(f.target, command) if f.target else command


def restart_line(f: RunFacts, argv: list[str], unset: Sequence[str] = (), set_env: dict[str, str] | None = None) -> str:
    """How the server is started again with a change: its own command line, in its own folder (not on the host)."""
    srv = f.outputs.get("server_details") or {}
    if not argv:
        return ""
    env = ""
    if unset or set_env:
        env = "env " + " ".join([f"-u {shlex.quote(u)}" for u in unset] + [shlex.quote(f"{k}={v}") for k, v in (set_env or {}).items()]) + " "
    cwd = srv.get("cwd")
    return (f"cd {shlex.quote(cwd)} && " if cwd else "") + env + shlex.join(argv)


def _restart_call(x: ExperimentView) -> dict[str, Any] | None:
    """The restart the experiment made; for a shadow experiment, the server's own command line with the change (the
    changed copy's ``fix_argv``: its port and GPUs are the copy's, not the fix's)."""
    for c, _ in x.calls:
        inp = c.get("input") or {}
        if c.get("tool") == "restart_server":
            return inp
        if c.get("tool") == "start_copy" and inp.get("role") == "changed":
            return {**inp, "argv": inp.get("fix_argv") or inp.get("argv") or []}
    return None


def _supervised_call(x: ExperimentView) -> dict[str, Any] | None:
    """The input of the experiment's restart through the server's supervisor (``supervisor_apply`` or
    ``systemd_dropin``), with ``tool`` naming which."""
    return next(({**(c.get("input") or {}), "tool": c.get("tool")} for c, _ in x.calls
                 if c.get("tool") in ("supervisor_apply", "systemd_dropin", "container_recreate")), None)


def supervised_fix(sv: dict[str, Any]) -> tuple[str, list[str]]:
    """The change made permanent in the supervisor's own terms: supervisord's program section and
    ``supervisorctl update``, or the unit's drop-in, ``daemon-reload`` and a restart."""
    if sv.get("tool") == "container_recreate":   # the container made again with the change, as the experiment's
        rt, name = str(sv.get("runtime")), str(sv.get("name"))
        run = " ".join(shlex.quote(str(a)) for a in sv.get("run") or [])
        return (f"make the change permanent by recreating the {rt} container {name} with it (the experiment's command, "
                "from the container's own inspect with only the change):",
                [f"{rt} stop {shlex.quote(name)} && {rt} rm {shlex.quote(name)} && {run}"])
    if sv.get("tool") == "systemd_dropin":
        unit = str(sv.get("unit"))
        body = "".join(ln + "\n" for ln in str(sv.get("content") or "").splitlines() if not ln.startswith("#"))
        d = f"/etc/systemd/system/{unit}.d"
        return (f"make the change permanent with a drop-in of the unit {unit} (as the experiment's), then reload and "
                "restart it:", [f"mkdir -p {shlex.quote(d)} && printf %s {shlex.quote(body)} > {shlex.quote(d + '/override.conf')}"
                                f" && systemctl daemon-reload && systemctl restart {shlex.quote(unit)}"])
    ctl = " ".join(shlex.quote(a) for a in sv.get("ctl") or ["supervisorctl"])
    lines = "; ".join(f"`{k}={v}`" for k, v in (sv.get("values") or {}).items())
    return (f"make the change permanent in supervisord's config: in {sv.get('file')}, set in [program:{sv.get('program')}] "
            f"{lines}; then apply it (supervisord restarts the program):",
            [f"{ctl} reread && {ctl} update {shlex.quote(str(sv.get('group')))}"])


def _decisive(f: RunFacts, hid: str) -> ExperimentView | None:
    h = f.hyps.get(hid)
    if not h:
        return None
    sig = [x for x in h.experiments if x.significant]
    # a group that recovered and was split down: the narrowest group that still recovered decides (its fix
    # leaves the group's other flags as they are), as the hypothesis's confirming changes are kept
    groups = [set(x.spec.get("group") or []) for x in sig]
    return next((x for x, g in zip(sig, groups, strict=True) if not (g and any(o and o < g for o in groups))), None)


def packages_of(f: RunFacts, names: Sequence[str]) -> list[dict[str, Any]]:
    """The server's packages of these names, each with the version to put back (the baseline snapshot's, else its
    own) and whether that version has a local label (``+…``)."""
    pk = {p["name"]: p for p in (f.outputs.get("python_packages") or {}).get("packages") or []}
    base = {p["name"]: p for p in ((f.baseline_snapshot or {}).get("packages") or {}).get("packages", [])}
    out = []
    for name in dict.fromkeys(n for n in names if n):
        p = pk.get(name) or base.get(name)
        if p is None:
            continue
        want = (base.get(name) or {}).get("version") or p["version"]
        out.append({**p, "baseline_version": want, "local": "+" in want})
    return out


def changed_packages(f: RunFacts) -> list[str]:
    """The packages whose version or compiled files differ from the baseline snapshot's (none without one)."""
    base = {p["name"]: p for p in ((f.baseline_snapshot or {}).get("packages") or {}).get("packages", [])}
    if not base:
        return []
    return [p["name"] for p in (f.outputs.get("python_packages") or {}).get("packages") or []
            if p["name"] not in base or (p.get("version"), p.get("build_hash"))
            != (base[p["name"]].get("version"), base[p["name"]].get("build_hash"))]


def context(f: RunFacts, hid: str, cause: dict[str, Any]) -> dict[str, Any]:
    """What a fix template sees (the module's docstring names it)."""
    x = _decisive(f, hid)
    srv = f.outputs.get("server_details") or {}
    return {
        "hypothesis": hid, "cause": cause,
        "experiment": {"title": x.title if x else "", "kind": x.spec.get("kind") if x else None,
                       "spec": dict(x.spec) if x else {}, "restart": _restart_call(x) if x else None},
        "server": srv, "outputs": f.outputs,
        "repo": (f.outputs.get("git_state") or {}).get("repo") or ".",
        "branch": (f.outputs.get("git_state") or {}).get("branch"),
        "python": (f.outputs.get("python_packages") or {}).get("python") or srv.get("python") or "python3",
        "gpu_processes": (f.outputs.get("gpu_processes") or {}).get("processes") or [],
        "restart_line": lambda argv, unset=(), set_env=None: restart_line(f, list(argv or []), list(unset or []),
                                                                         dict(set_env or {})),
        "packages_of": lambda names: packages_of(f, [str(n) for n in names or []]),
        "changed_packages": changed_packages(f),
    }


def templates(pb: Playbook | None, f: RunFacts, hid: str) -> list[tuple[str, FixTemplate]]:
    """(where, template) for a cause, in the order they are tried."""
    out: list[tuple[str, FixTemplate]] = []
    x = _decisive(f, hid)
    if x is not None:
        if x.spec.get("fix"):
            out.append((f"{hid}: experiment \"{x.title}\".fix", FixTemplate.model_validate(x.spec["fix"])))
        kind = kind_of(x.spec)
        if kind is not None and kind.fix is not None:
            out.append((f"experiment kind {kind.name()}: fix", kind.fix))
    hp = next((h for h in pb.hypotheses if h.id == hid), None) if pb else None
    if hp is not None and hp.fix is not None:
        out.append((f"{hid}.fix", hp.fix))
    return out


def fix_of(f: RunFacts, pb: Playbook | None, cause: dict[str, Any]) -> Fix:
    hid = cause["hypothesis"]
    x = _decisive(f, hid)
    sv = _supervised_call(x) if x is not None else None
    if sv is not None:   # restarted through its supervisor: the fix is made there, never a kill and a start by hand
        text, commands = supervised_fix(sv)
        return Fix(hypothesis=hid, text=f"{x.title if x else hid}: {text}", commands=[on_host(f, c) for c in commands])
    ctx = context(f, hid, cause)
    for where, t in templates(pb, f, hid):
        text, commands = render_fix(t, ctx, where, pb.source if pb else "")
        if text:
            return Fix(hypothesis=hid, text=text, commands=[on_host(f, c) for c in commands])
    return Fix(hypothesis=hid, text=f"Undo what {hid} names above.")


def merged_restart(f: RunFacts, hids: list[str]) -> Fix | None:
    """Several causes fixed by restarting the server (a flag and a variable): one restart with every change,
    on the command line of the one that changed it."""
    inputs = [(_restart_call(x) or {}) for x in (_decisive(f, h) for h in hids) if x]
    srv = f.outputs.get("server_details") or {}
    argv = next((i["argv"] for i in inputs if i.get("argv") and i["argv"] != srv.get("argv")),
                next((i["argv"] for i in inputs if i.get("argv")), None))
    if len(inputs) < 2 or argv is None:
        return None
    unset = sorted({u for i in inputs for u in (i.get("unset") or [])})
    set_env = {k: v for i in inputs for k, v in (i.get("set") or {}).items()}
    line = restart_line(f, argv, unset, set_env)
    where = f"remove {', '.join(unset)} from wherever the server's environment is set, " if unset else ""
    return Fix(hypothesis="+".join(hids), text=f"Make every experiment's change permanent at once ({' and '.join(hids)}): "
               f"{where}then restart the server (stop pid {srv.get('pid', '?')} first) with the changed flags:",
               commands=[on_host(f, line)] if line else [])


@functools.lru_cache(maxsize=8)
def _builtin(name: str | None) -> Playbook | None:
    try:
        return load_playbook(name)
    except PlaybookError:
        return None


def playbook_of(f: RunFacts) -> Playbook | None:
    """The playbook a recording ran: parsed in this process (by its digest), else the built-in of its name, else
    the default playbook."""
    if f.playbook_digest in PARSED:
        return PARSED[f.playbook_digest]
    return _builtin(f.playbook if f.playbook in builtin_playbooks() else None)


def fixes_for(f: RunFacts, playbook: Playbook | None = None) -> list[Fix]:
    pb = playbook or playbook_of(f)
    causes = (f.conclusion or {}).get("root_causes") or []
    restarts = [c["hypothesis"] for c in causes
                if (x := _decisive(f, c["hypothesis"])) is not None and (k := kind_of(x.spec)) is not None
                and k.fixed_by_restart]
    merged = merged_restart(f, restarts) if len(restarts) > 1 else None
    out = [merged] if merged else []
    for cause in causes:
        hid = cause["hypothesis"]
        if cause.get("fix"):
            out.append(Fix(hypothesis=hid, text="Apply the fix:", commands=[str(cause["fix"])]))
        elif not (merged and hid in restarts):
            out.append(fix_of(f, pb, cause))
    return out
