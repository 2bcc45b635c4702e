"""``debugagent bundle RUN``: one archive that answers an inference engine's bug-report template.

SGLang's and vLLM's issue templates ask for the launch command, the environment report (``python -m
sglang.check_env``, ``vllm collect-env``), the benchmark that shows the problem and what changed. The bundle holds
them as the run recorded them, built from the run folder alone (``events.jsonl`` and the baseline snapshot it
carries): the host is never contacted. Every member is redacted again on the way in, as every artifact is.

Parts (``PARTS``): the launch command, the engine's report before (the baseline snapshot) and now, the two
benchmark results, the version and effective-configuration differences, the clock-event summary, the kernel log's
Xid lines; a part the run did not read says so (never an empty file).
"""

from __future__ import annotations

import io
import json
import os
import shlex
import statistics
import tarfile
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from debugagent.tools import serverinfo as si
from debugagent.tools.errors import UsageError
from debugagent.tools.redact import redact, redact_text

from .runfacts import RunFacts, gather
from .transcript import read_events

# (file, what it holds); README.md comes first and lists them
PARTS: tuple[tuple[str, str], ...] = (
    ("launch.txt", "the server's launch command, working folder, interpreter and environment (redacted)"),
    ("env-before.txt", "the engine's environment report of the good state (the baseline snapshot)"),
    ("env-now.txt", "the engine's environment report now (`python -m sglang.check_env` / `vllm collect-env`)"),
    ("benchmarks.md", "the two benchmark results: the baseline and the runs that reproduced the regression"),
    ("diff.md", "versions and effective configuration: the baseline snapshot against now"),
    ("clocks.md", "clock-event summary: each GPU's clocks, power, PCIe and clock event reasons under load"),
    ("xid.txt", "the GPU driver's Xid lines of the kernel log (dmesg), where they were read"),
    ("summary.json", "what each part holds (read, or why not) and the run's conclusion, as JSON"),
)
KEY_PACKAGES = ("sglang", "sgl-kernel", "sgl_kernel", "vllm", "flashinfer-python", "flashinfer", "triton", "torch",
                "transformers", "xformers", "flash-attn", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-ml-py")
NOT_READ = "not read in this run"


def _packages(data: Any) -> dict[str, dict[str, Any]]:
    pkgs = (data or {}).get("packages") if isinstance(data, dict) else None
    if isinstance(pkgs, dict):   # a snapshot's packages field: {"packages": [...]} or a mapping
        pkgs = pkgs.get("packages", pkgs)
    if isinstance(pkgs, dict):
        return {str(k): v for k, v in pkgs.items() if isinstance(v, dict)}
    return {str(p.get("name")): p for p in pkgs or [] if isinstance(p, dict) and p.get("name")}


def _versions_block(pkgs: dict[str, dict[str, Any]], driver: str | None) -> list[str]:
    lines = [f"{name}: {pkgs[name].get('version')}" + (f" (compiled files {pkgs[name]['build_hash']})"
                                                        if pkgs[name].get("build_hash") else "")
             for name in KEY_PACKAGES if name in pkgs]
    return lines + ([f"NVIDIA driver: {driver}"] if driver else [])


def _report_text(view: dict[str, Any] | None) -> list[str]:
    eff = (view or {}).get("effective") or {}
    lines = [f"{k}: {v}" for k, v in (eff.get("versions") or {}).items()]
    if eff.get("env"):
        lines += ["", "environment block:", *(f"{k}={v}" for k, v in eff["env"].items())]
    return lines


def _launch(f: RunFacts) -> tuple[str, bool]:
    s = f.outputs.get("server_details")
    if not s:
        return f"The server was not found in this run: {NOT_READ}.\n", False
    env = s.get("env") or {}
    lines = ["# the server's command line, as /proc/PID/cmdline held it", shlex.join(str(a) for a in s.get("argv") or []), "",
             f"pid: {s.get('pid')}", f"engine: {s.get('kind') or 'unknown'}", f"working folder: {s.get('cwd') or '?'}",
             f"interpreter: {s.get('python') or '?'}", "", "# its environment (/proc/PID/environ)",
             *(f"{k}={v}" for k, v in env.items())]
    return "\n".join(lines) + "\n", True


def _env_before(f: RunFacts) -> tuple[str, bool]:
    b = f.baseline_snapshot
    if not b:
        return ("No baseline snapshot was given (`debugagent run --baseline-snapshot FILE`, taken with "
                "`debugagent snapshot` in the good state): the good state's report is unknown.\n"), False
    report = _report_text(b.get("server_view"))
    head = f"# the baseline snapshot of {b.get('host', '?')}, taken {b.get('taken_at', '?')}"
    if report:
        return "\n".join([head, "# the engine's own report, as the snapshot parsed it", *report]) + "\n", True
    block = _versions_block(_packages(b.get("packages")), (b.get("driver") or {}).get("version"))
    return "\n".join([head, "# the snapshot holds no engine report (taken before it was read, or the engine had none);",
                      "# the versions its package probe read:", *(block or ["none read"])]) + "\n", bool(block)


def _env_now(f: RunFacts, events: list[Any]) -> tuple[str, bool]:
    raw = next((e for e in events if getattr(e, "event", None) == "tool_result" and getattr(e, "tool", None) == "server_env"
                and getattr(e, "hypothesis", None) is None), None)
    if raw is not None and (raw.stdout or "").strip():
        return f"# $ {raw.command}\n{raw.stdout}", True
    view = f.outputs.get("server_view")
    report = _report_text(view)
    if report:
        return "\n".join(["# the engine's report as the server view parsed it", *report]) + "\n", True
    q = f.outputs.get("gpu_q") or {}
    block = _versions_block(_packages(f.outputs.get("python_packages")), q.get("driver_version"))
    return "\n".join(["# the engine's own report was not read in this run (`server_env`);",
                      "# the versions the package probe read:", *(block or ["none read"])]) + "\n", bool(block)


def _benchmarks(f: RunFacts) -> tuple[str, bool]:
    r = f.regression
    b = f.baseline_snapshot or {}
    bench = b.get("bench") or {}
    lines = [f"# Benchmarks of run {f.run_id}", "", f"Symptom: `{f.symptom}`; baseline: `{f.baseline or 'none given'}`",
             f"Benchmark command: `{(f.inputs.bench if f.inputs else None) or bench.get('cmd') or 'the host profile’s'}`", "",
             "## Baseline (the good state)", ""]
    if bench.get("samples"):
        lines.append(f"The baseline snapshot's runs: {', '.join(str(x) for x in bench['samples'])} {bench.get('unit') or ''}")
    if r.baseline is not None:
        lines.append(f"Baseline value: {r.baseline:g} {f.unit} ({r.baseline_source or 'as given'})")
    else:
        lines.append("No baseline value was measured or given.")
    lines += ["", "## Now (the runs that reproduced it)", ""]
    if f.reproduce:
        lines.append(f"Runs: {', '.join(f'{x:g}' for x in f.reproduce)} {f.unit}: {f.reproduce_text}")
    else:
        lines.append(f"No benchmark run was taken: {NOT_READ}.")
    if r.why:
        lines += ["", f"Regression: {r.outcome or '?'}; {r.why}"]
    return "\n".join(lines) + "\n", bool(f.reproduce)


def _diff(f: RunFacts) -> tuple[str, bool]:
    b = f.baseline_snapshot
    if not b:
        return ("No baseline snapshot was given: nothing to compare versions or the effective configuration with "
                "(`debugagent snapshot` in the good state, then `run --baseline-snapshot`).\n"), False
    lines = [f"# Differences: the baseline snapshot ({b.get('taken_at', '?')}) against this run", "", "## Versions", ""]
    before, now = _packages(b.get("packages")), _packages(f.outputs.get("python_packages"))
    changed = []
    for name in sorted(set(before) | set(now)):
        x, y = before.get(name) or {}, now.get(name) or {}
        if (x.get("version"), x.get("build_hash")) != (y.get("version"), y.get("build_hash")):
            def show(p: dict[str, Any]) -> str:
                return (str(p.get("version")) + (f" ({p['build_hash']})" if p.get("build_hash") else "")) if p else "absent"
            changed.append(f"- {name}: {show(x)} → {show(y)}")
    drv_b, drv_n = (b.get("driver") or {}).get("version"), (f.outputs.get("gpu_q") or {}).get("driver_version")
    if drv_b and drv_n and drv_b != drv_n:
        changed.append(f"- NVIDIA driver: {drv_b} → {drv_n}")
    if not now:
        lines.append("The packages were not read in this run.")
    else:
        lines += changed or ["No package version or compiled-file hash differs."]
    lines += ["", "## Server flags", ""]
    fb = ((b.get("server") or {}).get("flags")) or {}
    fn = (f.outputs.get("server_details") or {}).get("flags") or {}
    flags = [f"- --{k}: {fb.get(k, 'absent')} → {fn.get(k, 'absent')}" for k in sorted(set(fb) | set(fn)) if fb.get(k) != fn.get(k)]
    lines += flags or ["The same flags."]
    lines += ["", "## Effective configuration (what the server says it runs with)", ""]
    vb, vn = b.get("server_view"), f.outputs.get("server_view")
    if vb and vn:
        diffs = si.diff_configs(si.EffectiveConfig.model_validate(vb.get("effective") or {}),
                                si.EffectiveConfig.model_validate(vn.get("effective") or {}))
        lines += [f"- {c.path}: {c.before} → {c.after}" for c in diffs] or ["No effective setting differs."]
    else:
        lines.append("Not compared: " + ("the baseline snapshot holds no server view" if not vb else
                                         "the server's own view was not read in this run") + ".")
    return "\n".join(lines) + "\n", True


def _clocks(f: RunFacts) -> tuple[str, bool]:
    tool = "gpu_nvml_under_load" if f.outputs.get("gpu_nvml_under_load") else "gpu_sample_under_load"
    load = f.outputs.get(tool)
    lines = ["# Clock-event summary", ""]
    idle = (f.outputs.get("gpu_query") or {}).get("gpus") or []
    if not load:
        lines.append(f"The GPUs were not read under load: {NOT_READ}.")
    else:
        src = load.get("source") or "nvidia-smi"
        lines += [f"Read under load with {src} (`{tool}`): {len(load.get('samples') or [])} samples, "
                  f"{len(load.get('loaded') or [])} with the GPUs busy.", ""]
        pool = load.get("loaded") or load.get("samples") or []
        by_gpu: dict[int, list[dict[str, Any]]] = {}
        for s in pool:
            by_gpu.setdefault(int(s.get("index", 0)), []).append(s)
        lines += ["| GPU | samples | SM MHz min / median / max (of max) | power W median (limit / max) | PCIe | "
                  "reasons (samples) |", "| --- | --- | --- | --- | --- | --- |"]
        for i, ss in sorted(by_gpu.items()):
            sm = [s["sm_clock"] for s in ss if s.get("sm_clock") is not None]
            pw = [s["power_draw"] for s in ss if s.get("power_draw") is not None]
            reasons = Counter(r for s in ss for r in s.get("event_reasons") or [])
            last = ss[-1]
            sm_text = f"{min(sm)} / {statistics.median(sm):g} / {max(sm)} (of {last.get('sm_clock_max')})" if sm else "?"
            pw_text = (f"{statistics.median(pw):.0f} ({last.get('power_limit')} / {last.get('power_limit_max')})"
                       if pw else "?")
            link = f"gen {last.get('pcie_gen')}/{last.get('pcie_gen_max')} x{last.get('pcie_width')}/{last.get('pcie_width_max')}"
            rtext = ", ".join(f"{k} ({v})" for k, v in reasons.most_common()) or "none"
            lines.append(f"| {i} | {len(ss)} | {sm_text} | {pw_text} | {link} | {rtext} |")
    if idle:
        lines += ["", "Idle reading (`nvidia-smi --query-gpu`): " + "; ".join(
            f"GPU {g.get('index')}: {', '.join(g.get('event_reasons') or []) or 'no reason'}" for g in idle)]
    before = (f.baseline_snapshot or {}).get("gpus") or []
    if before:
        lines += ["", "The baseline snapshot's GPUs: " + "; ".join(
            f"GPU {g.get('index')}: SM {g.get('sm_clock')} of {g.get('sm_clock_max')} MHz, "
            f"{', '.join(g.get('event_reasons') or []) or 'no reason'}" + (" (under load)" if g.get("under_load") else "")
            for g in before)]
    lines += ["", "Reasons: applications_clocks_setting is locked clocks; sw_power_cap the power limit; hw_slowdown and "
              "hw_power_brake_slowdown a hardware slowdown; sw_/hw_thermal_slowdown heat; gpu_idle no work."]
    return "\n".join(lines) + "\n", bool(load)


def _xid(f: RunFacts) -> tuple[str, bool]:
    x = f.outputs.get("gpu_xid")
    if not x:
        return f"The kernel log (dmesg) was {NOT_READ} (`gpu_xid`; `debugagent snapshot` reads it).\n", False
    if not x.get("readable"):
        return f"The kernel log was not readable on the host: {x.get('why') or 'no reason given'}\n", True
    xids = x.get("xids") or []
    if not xids:
        return "The kernel log was read: no NVIDIA Xid line.\n", True
    return "\n".join(str(e.get("line") or "") for e in xids) + "\n", True


def build(run_dir: str) -> tuple[str, dict[str, bytes], dict[str, Any]]:
    """The bundle's top folder name, its members (name → redacted bytes) and its summary, from the run folder."""
    p = Path(run_dir)
    path = p / "events.jsonl" if p.is_dir() else p
    if not path.is_file():
        raise UsageError(f"{run_dir}: no events.jsonl (not a debugagent run folder)",
                         fix="give the folder `debugagent run` wrote (it prints it at the end), or a folder under transcripts/")
    events = read_events(path)
    f = gather(events)
    texts: dict[str, tuple[str, bool]] = {
        "launch.txt": _launch(f), "env-before.txt": _env_before(f), "env-now.txt": _env_now(f, events),
        "benchmarks.md": _benchmarks(f), "diff.md": _diff(f), "clocks.md": _clocks(f), "xid.txt": _xid(f),
    }
    conclusion = f.conclusion.summary if f.conclusion is not None else "the run did not conclude"
    summary = {"run_id": f.run_id, "host": f.host, "symptom": f.symptom, "baseline": f.baseline,
               "conclusion": conclusion, "exit_code": f.conclusion.exit_code if f.conclusion is not None else None,
               "parts": {name: {"read": read, "what": what} for name, what in PARTS if name in texts
                         for read in [texts[name][1]]}}
    readme = [f"# debugagent bundle of run {f.run_id}", "",
              f"Host `{f.host}`; symptom `{f.symptom}`; baseline `{f.baseline or 'none'}`.", f"Conclusion: {conclusion}", "",
              "Built from the run folder alone (its events.jsonl and the baseline snapshot it carries), redacted; the "
              "host was not contacted. Attach it to an SGLang or vLLM issue: its template asks for these parts.", "",
              "| part | holds | read in this run |", "| --- | --- | --- |"]
    readme += [f"| `{name}` | {what} | {'yes' if texts.get(name, ('', True))[1] else 'no: the file says why'} |"
               for name, what in PARTS]
    members = {"README.md": "\n".join(readme) + "\n", **{k: v[0] for k, v in texts.items()},
               "summary.json": json.dumps(redact(summary), indent=1) + "\n"}
    top = f"debugagent-bundle-{f.run_id}"
    return top, {k: redact_text(v).encode() for k, v in members.items()}, summary


def write_bundle(run_dir: str, out: str | None = None) -> Path:
    """Write the bundle as one .tar.gz (mode 0600): ``out``, or ``bundle.tar.gz`` in the run folder."""
    top, members, _ = build(run_dir)
    p = Path(run_dir)
    folder = p if p.is_dir() else p.parent
    dest = Path(out) if out else folder / "bundle.tar.gz"
    if dest.is_dir() or not dest.parent.is_dir():
        raise UsageError(f"-o {dest}: " + ("is a folder" if dest.is_dir() else f"the folder {dest.parent} does not exist"),
                         fix="give a file path (…/bundle.tar.gz) in an existing folder")
    buf = io.BytesIO()
    mtime = int(datetime.now().timestamp())
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o600, mtime
            tar.addfile(info, io.BytesIO(data))
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(buf.getvalue())
        os.replace(tmp, dest)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"-o {dest}: cannot write it ({exc.strerror})", fix="give a file in a folder you can write to") from exc
    return dest
