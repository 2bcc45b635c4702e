"""A scenario made from two real snapshots (``debugagent sim from-snapshots GOOD.json BAD.json -o FILE``).

The host is the bad snapshot's (its GPUs, driver, CPU, python and the packages that matter, the repository's
commits, the server's command line, flags, environment and folder, its benchmark's metric); every difference
``debugagent diff`` reports that is a factor path becomes a factor, and the benchmarks' numbers give the effects:
the good snapshot's mean is the base, the bad one's the symptom. A difference that only follows the GPUs' load
(power draw, temperature) is no factor. With one factor it carries the whole change; with several, the change is
shared equally unless ``--effect PATH=DELTA`` says otherwise (snapshots cannot tell which difference cost what).

What the simulator cannot take as it is, it adapts, and says so in the story: a path under a folder of the
system (a lab's ``/tmp/…``) moves under ``/opt``; the packages kept are those that differ, those of the server's
engine and of the GPU stack, the rest counted in ``environment.extra``; a repository's history is the bad
snapshot's commits (the good head among them).
"""

from __future__ import annotations

import re
import statistics
from datetime import UTC, datetime
from typing import Any

from ..errors import UsageError
from ..snapshot import Snapshot, diff
from .scenario import _PATH_RE

SYSTEM = ("/tmp/", "/var/tmp/", "/run/", "/dev/shm/")
KEEP = re.compile(r"^(sglang|sgl[-_]kernel|vllm|torch|triton|flashinfer.*|xformers|nvidia-nccl.*|transformers|"
                  r"tensorrt.*|deep[-_]gemm|flash[-_]attn)$", re.I)
DROP_ENV = {"PWD", "OLDPWD", "SHLVL", "_", "HOME", "PATH", "TERM", "HOSTNAME", "LS_COLORS"}


def _mover(paths: list[str]) -> dict[str, str]:
    """Top folders under a system folder (``/tmp/gpu-lab-x``) and where they move (``/opt/gpu-lab-x``)."""
    moves: dict[str, str] = {}
    for p in paths:
        for s in SYSTEM:
            if p.startswith(s):
                top = s + p[len(s):].split("/")[0]
                moves[top] = "/opt/" + p[len(s):].split("/")[0]
    return moves


def _move(value: Any, moves: dict[str, str]) -> Any:
    if isinstance(value, str):
        for a, b in moves.items():
            value = re.sub(re.escape(a) + r"(?=/|$|\s)", b, value)
        return value
    if isinstance(value, dict):
        return {k: _move(v, moves) for k, v in value.items()}
    if isinstance(value, list):
        return [_move(v, moves) for v in value]
    return value


def _samples(s: Snapshot, which: str, given: float | None) -> list[float]:
    samples = [float(x) for x in (s.bench or {}).get("samples") or []]
    if samples:
        return samples
    if given is not None:
        return [given]
    raise UsageError(f"the {which} snapshot holds no benchmark numbers",
                     fix=f"take it with `debugagent snapshot --bench-runs 5 …`, or give the {which} state's number "
                         f"(--{'baseline' if which == 'good' else 'symptom'}-value)")


def _label(h: str | None) -> str | None:
    return h[:8] if h else None


def _cmd_and_args(argv: list[str], flags: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The server's program part (``PYTHON -m M``, ``PYTHON script``, ``vllm serve MODEL``) and its flags."""
    head: list[str] = [argv[0]]
    i = 1
    if argv[0].rsplit("/", 1)[-1].startswith("python"):
        while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
            head.append(argv[i])
            i += 1
        if i < len(argv) and argv[i] == "-m":
            head += argv[i:i + 2]
            i += 2
        elif i < len(argv):
            head.append(argv[i])
            i += 1
    while i < len(argv) and not argv[i].startswith("-"):
        head.append(argv[i])
        i += 1
    args: dict[str, Any] = {}
    for k, v in flags.items():
        args[k] = True if v in (None, "", True) else v
    return " ".join(head), args


def _packages(good: Snapshot, bad: Snapshot, changed: set[str], server_top: str | None
              ) -> tuple[dict[str, dict[str, Any]], int, dict[str, tuple[Any, Any]]]:
    """The packages kept (name -> spec), how many were left to ``environment.extra``, and the good value of each
    changed package field (``version``/``build``)."""
    def index(s: Snapshot) -> dict[str, Any]:
        return {p.name: p for p in (s.packages.packages if s.packages else [])}
    g, b = index(good), index(bad)
    kept: dict[str, dict[str, Any]] = {}
    goods: dict[str, tuple[Any, Any]] = {}
    for name, p in b.items():
        top = (p.modules[0] if p.modules else name.replace("-", "_")).split("/")[0]
        if not (name in changed or KEEP.match(name) or (server_top and top == server_top)):
            continue
        spec: dict[str, Any] = {"version": p.version}
        if p.modules and p.modules[0].split("/")[0] != name.replace("-", "_").lower():
            spec["module"] = p.modules[0].split("/")[0]
        if p.build_hash:
            spec["build"] = _label(p.build_hash)
        if p.installed_at:
            spec["installed_at"] = datetime.fromtimestamp(p.installed_at, UTC).isoformat().replace("+00:00", "Z")
        if p.editable:
            spec["editable"] = p.editable
        kept[name] = spec
        if name in g:
            goods[name] = (g[name].version, _label(g[name].build_hash))
    return kept, max(0, len(b) - len(kept)), goods


def _repo(bad: Snapshot, good: Snapshot) -> tuple[dict[str, Any] | None, tuple[str, str] | None]:
    r = bad.repo
    if r is None or not r.head:
        return None, None
    commits = [{"sha": c.short or c.sha[:7], "subject": c.subject or "(no subject)",
                **({"date": c.date} if c.date else {})} for c in reversed(r.commits)]
    labels = {c["sha"] for c in commits}
    head = next((c["sha"] for c in commits if r.head.startswith(c["sha"])), None)
    if head is None:
        commits.append({"sha": r.head[:7], "subject": "(head)"})
        head = r.head[:7]
    change = None
    gr = good.repo
    if gr and gr.head and gr.head != r.head:
        glabel = gr.head[:7]
        if not any(gr.head.startswith(x) for x in labels):
            commits.insert(max(0, len(commits) - 1), {"sha": glabel, "subject": next(
                (c.subject for c in gr.commits if c.sha == gr.head), "(the good head)")})
        else:
            glabel = next(x for x in labels if gr.head.startswith(x))
        change = (glabel, head)
    # the head is the last commit
    commits = [c for c in commits if c["sha"] != head] + [next(c for c in commits if c["sha"] == head)]
    return {"path": r.repo, "commits": commits}, change


def scenario_from_snapshots(good: Snapshot, bad: Snapshot, *, name: str, expect: str | None,
                            mentions: str | None = None, effects: dict[str, float] | None = None,
                            good_value: float | None = None, bad_value: float | None = None,
                            ) -> tuple[dict[str, Any], list[str]]:
    """(the scenario as a mapping, notes on what was adapted or left out)."""
    notes: list[str] = []
    if bad.server is None:
        raise UsageError("the bad snapshot found no server", fix="take it where the server runs (`--server-pattern`)")
    gb, bb = _samples(good, "good", good_value), _samples(bad, "bad", bad_value)
    base, now = statistics.fmean(gb), statistics.fmean(bb)
    rel = [abs(x - statistics.fmean(s)) / statistics.fmean(s) for s in (gb, bb) if len(s) > 1 for x in s]
    noise = round(max(1.0, 100 * statistics.fmean(rel) * 1.25), 1) if rel else 2.0
    bench = bad.bench or good.bench or {}
    metric, unit = bench.get("metric") or "throughput", bench.get("unit") or "tok/s"

    changes = [c for c in diff(good, bad) if not c.follows_load]
    factors: list[dict[str, Any]] = []
    for c in changes:
        if not _PATH_RE.match(c.path):
            notes.append(f"left out `{c.path}` ({c.a!r} -> {c.b!r}): not a difference the simulator can set")
            continue
        factors.append({"path": c.path, "good": c.a, "bad": c.b})
    if not factors and abs(now - base) > 0:
        notes.append("no difference the simulator can set: the scenario has no factor, so its bad state runs as the "
                     "good one does (the regression cannot be placed)")
    delta = now - base
    given = dict(effects or {})
    unknown = [p for p in given if p not in {f["path"] for f in factors}]
    if unknown:
        raise UsageError(f"--effect {unknown[0]}: no such factor", fix="one of: " + ", ".join(f["path"] for f in factors))
    rest = [f for f in factors if f["path"] not in given]
    share = (delta - sum(given.values())) / len(rest) if rest else 0.0
    for f in factors:
        f["effect"] = round(given.get(f["path"], share), 4)
    if len(rest) > 1:
        notes.append(f"the change ({delta:+.4g} {unit}) is shared equally by {len(rest)} factors: snapshots cannot "
                     "tell which difference cost what (--effect PATH=DELTA)")

    srv = bad.server
    cmd, args = _cmd_and_args(list(srv.argv), dict(srv.flags))
    shaped, added_env = _shape(srv, notes)
    env = {k: v for k, v in srv.env.items() if k not in DROP_ENV and k not in added_env}
    server_top = srv.entry.split(".")[0] if srv.entry and not srv.entry.startswith("/") else None
    changed = {f["path"].split(".")[1] for f in factors if f["path"].startswith("packages.")}
    packages, extra, goods = _packages(good, bad, changed, server_top)
    for f in factors:   # a package's good value as the kept spec labels it
        if f["path"].startswith("packages."):
            pkg, field = f["path"].split(".")[1:]
            gv, gbuild = goods.get(pkg, (None, None))
            f["good"] = gv if field == "version" else gbuild
            f["bad"] = packages[pkg][field]
    repo, head_change = _repo(bad, good)
    if head_change:
        for f in factors:
            if f["path"] == "repo.head":
                f["good"], f["bad"] = head_change
    if repo and server_top and not any(p.get("editable") for p in packages.values()):
        repo["package"] = server_top
    wheels = [{"dist": f["path"].split(".")[1], "version": f["good"] if f["path"].endswith(".version") else
               packages[f["path"].split(".")[1]]["version"],
               **({"build": f["good"]} if f["path"].endswith(".build") else {})}
              for f in factors if f["path"].startswith("packages.") and f["good"] is not None
              and not packages[f["path"].split(".")[1]].get("editable")]
    gpus = []
    for g in bad.gpus:
        d = g.model_dump()
        gpus.append({k: d[k] for k in ("name", "sm_clock", "sm_clock_max", "mem_clock", "power_draw", "power_limit",
                                       "power_limit_max", "temperature", "pcie_gen", "pcie_gen_max", "pcie_width",
                                       "pcie_width_max", "event_reasons") if d.get(k) is not None}
                    | {"reset_required": bool(d.get("reset_required"))})
    own = {srv.pid, *[w for w in getattr(srv, "workers", []) or [] if isinstance(w, int)]}
    tenants = [{"pid": p.get("pid"), "name": p.get("process_name") or p.get("name") or "?",
                "used_memory_mib": p.get("used_memory_mib") or 0} for p in bad.gpu_processes if p.get("pid") not in own]
    facts = bad.host_facts
    cpu = {"governor": bad.cpu.get("governor") or "performance",
           "cores": bad.cpu.get("cores") or (facts.cores if facts and facts.cores else 64)}
    host: dict[str, Any] = {
        "hostname": bad.hostname or "gpu-host",
        **({"kernel": bad.cpu["kernel"]} if bad.cpu.get("kernel") else {}),
        "driver": {"version": bad.driver.get("version") or "580.159.04", "cuda": bad.driver.get("cuda") or "13.0"},
        "gpus": gpus or [{}],
        "python": srv.python or bad.python,
        "packages": packages,
        **({"repo": repo} if repo else {}),
        "server": {"cmd": cmd, "args": args, "env": env, **({"cwd": srv.cwd} if srv.cwd else {})},
        "gpu_processes": tenants,
        "cpu": cpu,
        "environment": {"extra": extra},
        **({"wheelhouse": {"path": "/root/wheelhouse", "wheels": wheels}} if wheels else {}),
        **shaped,
    }
    moves = _mover([str(v) for v in (host["python"], srv.cwd, (repo or {}).get("path"), *env.values(), cmd)
                    if isinstance(v, str)])
    if moves:
        notes.append("moved from folders of the system: " + ", ".join(f"{a} -> {b}" for a, b in moves.items()))
    host = _move(host, moves)
    for f in factors:
        f["good"], f["bad"] = _move(f["good"], moves), _move(f["bad"], moves)
    if any(f["path"] == "gpu_processes" for f in factors):
        for f in factors:
            if f["path"] == "gpu_processes":
                f["good"] = [t for t in tenants if any(t["pid"] == x.get("pid") for x in (f["good"] or []))]
                f["bad"] = tenants
    story = (f"Made by `debugagent sim from-snapshots` from {good.host} ({good.taken_at}, good) and {bad.host} "
             f"({bad.taken_at}, bad): {metric} {base:.4g} -> {now:.4g} {unit}. " + " ".join(notes))
    sc: dict[str, Any] = {
        "version": 1, "name": name, "story": story.strip(),
        "symptom": f"{metric} {now:.4g} {unit}", "baseline": f"{metric} {base:.4g} {unit}",
        "expect": {"root_cause": expect, **({"mentions": mentions} if mentions else {})},
        "host": host,
        "bench": {"metric": metric, "unit": unit, "base": round(base, 4), "noise_pct": noise},
        "factors": factors,
    }
    return sc, notes


PROGRAM = re.compile(r"^[A-Za-z0-9_.@:+-]{1,64}$")
SUPERVISORD_CONF = re.compile(r"/etc/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+\.conf")


def _shape(srv: Any, notes: list[str]) -> tuple[dict[str, Any], set[str]]:
    """``host.supervisor`` and ``host.container`` from how the server was found running (the snapshot's
    ``server.shape``), and the variables its supervisor or runtime gives it (the simulator gives them again)."""
    shape = getattr(srv, "shape", None)
    out: dict[str, Any] = {}
    added: set[str] = set()
    if shape is None:
        return out, added
    c, sup = shape.container, shape.supervisor
    if c is not None and c.runtime not in ("docker", "podman"):
        notes.append(f"left out its {c.runtime} container: the simulator runs docker and podman containers")
        c = None
    if c is not None:
        cont: dict[str, Any] = {"runtime": c.runtime}
        if c.id and re.fullmatch(r"[0-9a-f]{64}", c.id):
            cont["id"] = c.id
        if c.shared:   # debugagent's shell ran in it (as through `docker exec`)
            if srv.pid == 1:
                cont["pid1"] = True
        else:          # it ran on the host that runs the container
            cont["connect"] = "host"
            cont["name"] = (c.id or "server")[:12]
            notes.append(f"the {c.runtime} container is named {cont['name']} (a snapshot holds its id, not its name)")
        out["container"] = cont
        if c.runtime == "podman":
            added.add("container")
    if sup is not None and not (c is not None and (not c.shared or srv.pid == 1)):
        if sup.kind == "systemd" and sup.unit and PROGRAM.match(sup.unit.removesuffix(".service")):
            out["supervisor"] = {"kind": "systemd", "program": sup.unit.removesuffix(".service")}
            added |= {"INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID"}
        elif sup.kind == "supervisord" and sup.program and PROGRAM.match(sup.program):
            out["supervisor"] = {"kind": "supervisord", "program": sup.program,
                                 **({"config": sup.config} if sup.config and SUPERVISORD_CONF.fullmatch(sup.config)
                                    and sup.config != "/etc/supervisor/supervisord.conf" else {})}
            added |= {"SUPERVISOR_ENABLED", "SUPERVISOR_PROCESS_NAME", "SUPERVISOR_GROUP_NAME", "SUPERVISOR_SERVER_URL"}
        else:
            notes.append(f"left out its supervisor ({sup.kind} {sup.name or sup.unit or ''}): the simulator runs "
                         "systemd units and supervisord programs")
    elif sup is not None:
        notes.append(f"left out its supervisor ({sup.kind}): a container's main process here is the server itself")
    return out, added


def snapshots_from_recording(events: list[dict[str, Any]]) -> tuple[Snapshot | None, Snapshot]:
    """The snapshots a recorded run holds: the baseline snapshot it was given (None where it had a number), and the
    host as the run probed it, made again by the same probes answered from the recording; its benchmark numbers
    are the reproduce step's runs (those before the first hypothesis)."""
    from ..benchfmt import read_bench
    from ..discovery import DiscoveryInput, discover
    from ..registry import Runner
    from ..replay import ReplayTransport
    from ..snapshot import collect
    head = events[0]
    inp = head.get("inputs") or {}
    t = ReplayTransport(events)
    runner = Runner(t)
    d = discover(runner, DiscoveryInput(server_pattern=inp.get("server_pattern"), python=inp.get("python"),
                                        repo=inp.get("repo"), bench=inp.get("bench"),
                                        bench_regex=inp.get("bench_regex")))
    optional = [x for x in (t.recorded_tools or ())]
    metric = d.metric or (str(head.get("symptom") or "").split() or [""])[0]
    bad = collect(runner, bench=d.bench, python=d.python, repo=d.repo, known=d, metric=d.metric,
                  bench_regex=d.bench_regex, probes=optional)
    samples, unit = [], None
    for ev in events:
        if ev.get("event") == "hypothesis_opened":
            break
        if ev.get("event") == "tool_result" and ev.get("tool") == "bench" and ev.get("exit_code") == 0:
            try:
                v, u = read_bench(ev["stdout"], metric, d.bench_regex)
            except Exception:  # noqa: BLE001 - a run that printed no number is no sample
                continue
            samples.append(v)
            unit = unit or u
    bad.hostname = bad.hostname or (bad.host_facts.hostname if bad.host_facts else "")
    bad.host, bad.taken_at = str(head.get("host") or bad.host), str(head.get("started_at") or bad.taken_at)
    bad.bench = {"cmd": d.bench, "metric": metric, "regex": d.bench_regex, "unit": unit, "runs": len(samples),
                 "samples": samples}
    good = Snapshot.model_validate(head["baseline_snapshot_data"]) if head.get("baseline_snapshot_data") else None
    return good, bad


def write_scenario(sc: dict[str, Any], path: str, source: str) -> None:
    """Validated as the simulator reads it, then written (nothing is written when it does not validate)."""
    import yaml

    from .scenario import parse_scenario
    text = f"# made by `debugagent sim from-snapshots {source}`\n" + yaml.safe_dump(sc, sort_keys=False, width=110,
                                                                                   allow_unicode=True)
    parse_scenario(text, path)
    with open(path, "x", encoding="utf-8") as f:
        f.write(text)
