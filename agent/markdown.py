"""``transcript.md``: the run told in the seeds' voice, rendered from ``events.jsonl``.

The events stay the source of truth; this module only reads them. The shape:

    title, one-line answer
    1. the regression: discovery, the evidence pass, the reproduction (one table), the arithmetic
    2. the timeline of changes on the host
    3. one section per hypothesis: why it is looked at, what decides it, its checks,
       its experiment (runs as one table) and its verdict
    4. the closing table, and what to do now (the exact fix command)

Messages are numbered in the order they are printed (``[msg N]``); every command is shown
exactly as it was sent, in a code span, or as a heredoc when it is long.
"""

from __future__ import annotations

import re
import statistics
from datetime import datetime
from typing import Any

from debugagent.tools import probes
from debugagent.tools.discovery import DiscoveryInput
from debugagent.tools.escape import OWN_HTML
from debugagent.tools.escape import markdown as safe_markdown
from debugagent.tools.gpu import GpuProcess
from debugagent.tools.probes import server as server_probe
from debugagent.tools.probes.text import clip_words, code, fenced, plural, table, when
from debugagent.tools.transport import ssh_line
from pydantic import BaseModel, Field

from .answer import headline
from .events import Cause, Event, ToolCall, ToolResult, Verdict
from .fixes import Fix, fixes_for
from .results import LEAD
from .runfacts import Pair, RunFacts, gather, pct

STATUS_WORD = {"confirmed": "CONFIRMED", "ruled_out": "ruled out", "suspect": "suspect", "inconclusive": "inconclusive",
               "pending": "not reached"}
NOTICES = ("reconnected", "sessions")  # transport events that say the connection carried on


# ---------------------------------------------------------------- small pure helpers
def fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"


def mean_sd(vals: list[float]) -> str:
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return fmt(vals[0])
    return f"{statistics.fmean(vals):.2f} ± {statistics.stdev(vals):.2f}"


def sort_key(ts: float | int | str | None) -> float:
    if isinstance(ts, int | float):
        return float(ts)
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except (TypeError, ValueError):
        return float("inf")


# ---------------------------------------------------------------- commands, pasteable
class Shown(BaseModel):
    """How one command is printed: inline (a code span) or as a block (a heredoc)."""

    inline: str | None = None
    block: str | None = None


def ssh_target(display: str) -> str | None:
    """``root@gpu-node-3`` or ``-p 2222 root@h`` from a display line; None when it is not ssh."""
    m = re.match(r"ssh ((?:-p \d+ )?\S+) ", display or "")
    return m.group(1) if m else None


def shown_command(call: ToolCall, target: str | None) -> Shown:
    """The command as it was run, pasteable: the recorded display line when it is the full command,
    else (a placeholder, or too long to read inline) the real command sent as a heredoc."""
    command = call.command
    display = call.display or command
    exact = display in (command, ssh_line(target, command) if target else command)
    if exact and "\n" not in display:
        return Shown(inline=display)
    mark = "EOF"
    while re.search(rf"^{mark}$", command, re.M):
        mark += "_"
    if not target:
        return Shown(block=command)
    # the command is ssh's argument, as debugagent sends it; the quoted heredoc keeps it byte for byte
    return Shown(block=f"ssh {target} \"$(cat <<'{mark}'\n{command}\n{mark}\n)\"")


# ---------------------------------------------------------------- outputs, readable
class RunDiscovery(BaseModel):
    """What the run's discovery was given: the user's overrides (``--server-pattern`` …) and the processes
    holding GPU memory, so the transcript names the server the run picked."""

    inp: DiscoveryInput = Field(default_factory=DiscoveryInput)
    gpu: list[GpuProcess] = Field(default_factory=list)


def render_output(tool: str, ev: Any, discovery: RunDiscovery | None = None) -> list[str]:
    """The output of one tool call, made readable by its probe's summary (``tools.probes``); a process table
    with the run's own discovery input. The raw text is in events.jsonl."""
    parsed = ev.get("output") or {}
    if tool == "process_table" and discovery is not None and parsed.get("procs") is not None:
        return server_probe.render_process_table(parsed, discovery.inp, discovery.gpu) + probes.tail(tool, ev)
    return probes.render_output(tool, ev)


# ---------------------------------------------------------------- the document
class Doc(BaseModel):
    """The lines being written and the message counter."""

    lines: list[str] = Field(default_factory=list)
    n: int = 0
    by_call: dict[int, int] = Field(default_factory=dict)   # call id -> msg number
    check_run: tuple[int, float] | None = None   # the check's run (msg, value): the reproduce step's first
    discovery: RunDiscovery | None = None   # what the run's discovery was given

    def msg(self, text: str, tag: str = "assistant") -> int:
        self.n += 1
        self.lines += [f"[msg {self.n}] [{tag}] {text}", ""]
        return self.n

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)


def render_call(doc: Doc, call: ToolCall, res: ToolResult, target: str | None) -> None:
    # a call to another host than the run's (``--peer``) is shown with its own ssh target
    s = shown_command(call, ssh_target(call.display or "") or target)
    shown = render_output(call.tool or res.tool, res, doc.discovery)
    value = bench_value(call, res)
    said = ""   # a benchmark's reading, or "(no output)": said on the command's own line
    if value is not None and not res.stderr.strip():
        out = res.output or {}
        metric = out.get("metric")
        said = f": {(metric + ' ') if metric else ''}{fmt(value)} {out.get('unit') or ''}".rstrip()
        shown = []
    elif shown == ["(no output)"]:
        said, shown = " (no output)", []
    why = f" — {call.why}" if call.why else ""
    doc.n += 1
    doc.by_call[call.call_id] = doc.n
    if s.inline:
        doc.add(f"[msg {doc.n}] [assistant] [bash] {code(s.inline)}{why}{said}")
    else:   # the collapsed block ends the message: what it printed goes before it
        first = call.command.strip().splitlines()[0][:60]
        doc.add(f"[msg {doc.n}] [assistant] [bash] {code(first + ' …')}{why}{said} (sent as this heredoc:)",
                "<details><summary>the command in full</summary>", "", *fenced(s.block or "", "bash"), "", "</details>")
    doc.add(*shown, "")


def bench_value(call: ToolCall, res: ToolResult) -> float | None:
    """A benchmark run's reading; None for another tool or a failed run."""
    return res.value if call.tool == "bench" else None


def render_bench_group(doc: Doc, items: list[Pair], target: str | None, metric: str, unit: str, label: str,
                       lead: tuple[int, float] | None = None) -> list[float]:
    """Repeated benchmark runs: one message, one table (run, value), mean ± sd. ``lead`` (its message and
    value) is an earlier run that belongs to the same sample: the check's run, the reproduce step's first."""
    call, _ = items[0]
    s = shown_command(call, target)
    first, last = doc.n + 1, doc.n + len(items)
    for i, (c, _) in enumerate(items):
        doc.by_call[c.call_id] = first + i
    doc.n = last
    vals: list[float] = [lead[1]] if lead else []
    rows: list[list[Any]] = [[f"1 (msg {lead[0]})", fmt(lead[1])]] if lead else []
    for i, (c, r) in enumerate(items, len(rows) + 1):
        v = bench_value(c, r)
        if v is not None:
            vals.append(v)
            rows.append([i, fmt(v)])
        else:
            rows.append([i, "failed: " + clip_words((r.error or r.stderr or r.stdout or "").strip(), 120)])
    span = f"msg {first}" if first == last else f"msg {first}–{last}"
    runs = table(["run", *[str(r[0]) for r in rows], "mean ± sd"], [[f"{metric} ({unit})", *[r[1] for r in rows], mean_sd(vals)]])
    if s.inline:
        doc.add(f"[{span}] [assistant] [bash] {code(s.inline)} ×{len(items)} — {label}", *runs, "")
    else:   # a command of several lines (one that prints its result file): pasteable from its collapsed heredoc
        head = call.command.strip().splitlines()[0][:60]
        doc.add(f"[{span}] [assistant] [bash] {code(head + ' …')} ×{len(items)} — {label}",
                *runs, "", "<details><summary>the command in full</summary>", "",
                *fenced(s.block or "", "bash"), "",
                "</details>", "")
    return vals


def bench_label(call: ToolCall) -> str:
    """The reason a group of benchmark runs shows: the first run's, without its run number."""
    return re.sub(r",? run \d+(?: of \d+)?$", "", call.why or "the benchmark")


def same_step(a: ToolCall, b: ToolCall) -> bool:
    """Two benchmark calls of one step: the same purpose, hypothesis and input."""
    return b.tool == "bench" and (a.purpose, a.hypothesis, a.input) == (b.purpose, b.hypothesis, b.input)


REDISCOVER = ("process_table", "gpu_processes", "server_details", "server_shape", "import_roots", "server_control")


def group_of(call: ToolCall) -> str | None:
    """Routine steps shown as one collapsed message: the undo steps, and finding the server again."""
    if call.purpose == "undo":
        return "undo"
    if call.tool in REDISCOVER:
        return "find"
    return None


def render_group(doc: Doc, kind: str, items: list[Pair], target: str | None) -> None:
    """One message saying what the steps did; each command and its output (pasteable as ever) collapsed below it."""
    first = doc.n + 1
    inner = Doc(n=doc.n, discovery=discovery_of(doc.discovery, items))
    for call, res in items:
        render_call(inner, call, res, target)
    doc.by_call.update(inner.by_call)
    doc.n = inner.n
    bad = [f"{c.tool} exit {r.exit_code}" for c, r in items if r.exit_code not in (0, None)]
    status = "; failed: " + ", ".join(bad) if bad else ""
    if kind == "undo":
        what = "; ".join(c.why.removeprefix("undo:").strip().split(" (")[0] for c, _ in items)
        text = f"Undo, {plural(len(items), 'step')}: {clip_words(what, 300)}{status or '; each one done'}."
    else:
        table_res = next((r for c, r in items if c.tool == "process_table"), None)
        found = ""
        if table_res and table_res.output and table_res.output.get("procs") is not None:
            d = inner.discovery
            found = server_probe.render_process_table(table_res.output, d.inp if d else None,
                                                      d.gpu if d else None)[0].removeprefix("Output: ")
        more = [render_output(c.tool, r, inner.discovery)[0].removeprefix("Output: ") for c, r in items
                if c.tool in ("server_shape", "server_control", "import_roots") and r.exit_code == 0]
        said = "; ".join([found] + more if found else more) or "see below"
        text = f"Where the server is ({', '.join(c.tool for c, _ in items)}): {said}{status}."
    body = [ln for ln in inner.lines if not OWN_HTML.fullmatch(ln)]
    span = f"msg {first}" if first == doc.n else f"msg {first}–{doc.n}"
    doc.add(f"[{span}] [assistant] {text}", "<details><summary>the commands and their output</summary>", "", *body, "",
            "</details>", "")


def gpu_processes_of(pairs: list[Pair]) -> list[GpuProcess] | None:
    """The processes holding GPU memory that these calls read (None when none of them read it)."""
    res = next((r for c, r in pairs if c.tool == "gpu_processes" and r.output), None)
    if res is None or res.output is None:
        return None
    try:
        return [GpuProcess.model_validate(p) for p in res.output.get("processes") or []]
    except ValueError:
        return None


def discovery_of(base: RunDiscovery | None, pairs: list[Pair]) -> RunDiscovery | None:
    """The run's discovery input, with the GPU processes these calls read (a discovery done again reads its own)."""
    gpu = gpu_processes_of(pairs)
    if base is None or gpu is None:
        return base
    return base.model_copy(update={"gpu": gpu})


def render_calls(doc: Doc, pairs: list[Pair], target: str | None, metric: str, unit: str) -> None:
    i = 0
    while i < len(pairs):
        call, res = pairs[i]
        kind = group_of(call)
        if kind:
            j = i
            while j < len(pairs) and group_of(pairs[j][0]) == kind:
                j += 1
            if j - i > 1 or kind == "find":   # a lone look at the server is as routine: collapsed as well
                render_group(doc, kind, pairs[i:j], target)
                i = j
                continue
        if call.tool == "bench":
            j = i
            while j < len(pairs) and same_step(call, pairs[j][0]):
                j += 1
            lead = doc.check_run if call.purpose == "reproduce" else None
            if j - i > 1 or lead:
                render_bench_group(doc, pairs[i:j], target, metric, unit, bench_label(call), lead)
                i = j
                continue
        render_call(doc, call, res, target)
        value = bench_value(call, res)
        if value is not None and doc.check_run is None and call.purpose == "probe" and call.hypothesis is None:
            doc.check_run = (doc.by_call.get(call.call_id, doc.n), value)   # the check's run: the reproduce step's first
        i += 1


def arithmetic(f: RunFacts) -> list[str]:
    """The regression in the user's units and its rate/latency counterpart, as the seeds work it out."""
    reg = f.regression
    if reg.mean is None or reg.baseline is None:
        return []
    bad, good, unit = reg.mean, reg.baseline, f.unit
    if not good or not bad:
        return []
    delta = bad - good
    pct_ = delta / good * 100
    line = f"The arithmetic: {fmt(bad)} {unit} against {fmt(good)} {unit} is {delta:+.4g} {unit} ({pct_:+.1f}%)"
    if f.direction == "lower":
        scale = 1000.0 if unit == "ms" else 1e6 if unit == "us" else 1.0
        r_good, r_bad = scale / good, scale / bad
        line += (f"; as a rate, 1/{fmt(good)} {unit} = {r_good:.1f} per second, 1/{fmt(bad)} {unit} = {r_bad:.1f} per "
                 f"second ({(r_bad / r_good - 1) * 100:+.1f}%)")
        if f.tokens_per_step:
            k = f.tokens_per_step
            line += (f"; with {k:g} tokens accepted per {f.metric} step, {k:g}/{fmt(good)} {unit} = {k * r_good:.0f} tok/s "
                     f"before and {k:g}/{fmt(bad)} {unit} = {k * r_bad:.0f} tok/s now")
        else:
            line += f" (with k tokens per {f.metric} step: {r_good:.1f}·k tok/s before, {r_bad:.1f}·k tok/s now)"
    else:
        line += (f"; per item that is 1000/{fmt(good)} = {1000 / good:.2f} ms before and 1000/{fmt(bad)} = "
                 f"{1000 / bad:.2f} ms now ({(good / bad - 1) * 100:+.1f}%)")
    return [line + ".", ""]


def render_timeline(f: RunFacts, doc: Doc) -> list[str]:
    if not f.timeline:
        return []
    rows = sorted(f.timeline, key=lambda r: sort_key(r[0]))
    return ["## Timeline of changes", "",
            *table(["when (UTC)", "what changed", "seen in"],
                   [[when(t), what, f"msg {doc.by_call[c]}" if c in doc.by_call else "this run"] for t, what, c in rows]), ""]


def verdict_text(ev: Verdict) -> str:
    how = f" by {ev.how}" if ev.how else ""
    because = ev.because.strip().rstrip(";").rstrip()
    return f"**{STATUS_WORD.get(ev.status, ev.status)}**{how}: {because}"


def render_hypothesis(doc: Doc, hid: str, f: RunFacts) -> None:
    h = f.hyps[hid]
    doc.add(f"### {hid}: {h.title} — {STATUS_WORD.get(h.status, h.status)}", "")
    checks = [f"{code(t)} msg {doc.by_call[c]}" for t in h.checks for c in f.calls_by_tool.get(t, []) if c in doc.by_call]
    seen = h.verdicts[0] if h.verdicts else None
    if seen is not None:
        src = f" ({', '.join(dict.fromkeys(checks))})" if checks else ""
        text = f"The evidence{src}: {verdict_text(seen)}."
        if h.experiments:
            text += (" What decides it: an experiment that undoes it; if that recovers a significant share of the "
                     "regression it is a cause, if the benchmark stays where it is, it is not.")
        doc.msg(text)
    shown = {seen.because} if seen else set()   # a verdict whose reason is already shown is not repeated
    followed: set[int] = set()
    before = None   # the status the experiments above left: a later one that decides nothing new says "still"
    for ex in h.experiments:
        reason = (ex.reason + " ") if ex.reason else ""
        undo = (" Its undo is recorded before it acts: " + "; ".join(ex.undo_recorded) + ".") if ex.undo_recorded else ""
        doc.msg(f"{reason}Experiment: {ex.title}.{undo}")
        render_calls(doc, ex.reference + ex.calls, f.target, f.metric, f.unit)
        after = ex.verdict
        if ex.result:
            still = after is not None and before == after.status == "confirmed" and not ex.significant
            # a suspect's change made again with the confirmed causes reverted: its verdict says what it adds to theirs
            said = after.because.strip().rstrip(".") if after is not None and ex.spec.get("on_top") else ex.result
            doc.msg(f"Result: {said}." + (
                f" Verdict: still **{STATUS_WORD.get(after.status, after.status)}**, by the experiment above."
                if still and after else
                f" Verdict: **{STATUS_WORD.get(after.status, after.status)}**{' by ' + after.how if after.how else ''}."
                if after else ""))
            before = after.status if after else before
            shown.add(ex.result)
            if after:
                followed.add(id(after))
    for v in h.verdicts[1:]:
        if id(v) not in followed and v.because not in shown:
            doc.msg(verdict_text(v))
    for note in h.notes:
        doc.msg(note)


def cause_share(rc: Cause) -> str:
    ci = rc.explains_ci
    part = f"explains {pct(rc.explains)}" if rc.explains is not None else "share not measured"
    if ci is not None and len(ci) == 2:
        part += f", interval {pct(ci[0])}–{pct(ci[1])}"
    return part


def render_conclusion(doc: Doc, f: RunFacts) -> None:
    c = f.conclusion
    if c is None:
        doc.add("## No conclusion", "", "The run ended before it concluded; see the last messages above.", "")
        return
    doc.add("## Conclusion", "")
    causes = c.root_causes or ([c.root_cause] if c.root_cause else [])
    if not causes:
        reg = f.regression
        if reg.measured and not reg.real:
            lead = ("Regression smaller than the noise can show" if reg.outcome == "more"
                    else LEAD.get(reg.outcome or "none", LEAD["none"]).rstrip(": "))
            doc.add(f"**{lead}**: {reg.why}.", "")
        else:
            doc.add("**No root cause was confirmed.**", "")
    for s in c.suspects:
        extra = "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in s.items() if k not in ("hypothesis", "because") and v)
        doc.add(f"- suspect **{s.hypothesis}**: {clip_words(s.because, 300)}" + (f" ({extra})" if extra else ""))
    if c.suspects:
        doc.add("")
    # an experiment left undecided: what would decide it (more runs of the changed state, or of the host as found)
    undecided = [(h.id, nxt) for h in c.table if h.id in f.hyps and (nxt := f.hyps[h.id].to_decide)]
    for hid, nxt in undecided:
        doc.add(f"- inconclusive **{hid}**, its experiment undecided: {clip_words(nxt, 400)}")
    if undecided:
        doc.add("")
    rows = []
    for h in c.table:
        evidence = clip_words("; ".join(h.because), 240)
        rows.append([h.id, STATUS_WORD.get(h.status, h.status), h.how or "",
                     pct(h.share) if h.share is not None else "", evidence])
    doc.add(*table(["hypothesis", "verdict", "how", "share", "evidence"], rows), "")
    for n in c.notes:
        doc.add(f"Note: {n}", "")


def todo_words(f: RunFacts) -> str:
    """What to do when no cause was confirmed: as the run went. Experiments not allowed: give --allow-mutations;
    experiments that ran (and were undone) but failed: fix what stopped them (a package's build: --wheelhouse)."""
    ran = any(x.result for h in f.hyps.values() for x in h.experiments)
    refused = any("--allow-mutations" in n for h in f.hyps.values() for n in h.notes)
    failed = [x for h in f.hyps.values() for x in h.experiments if x.result and not x.samples]
    said = "Nothing to undo on the host: no cause was confirmed" + (
        " (every change the experiments made was undone, as the section below says). " if ran else ". ")
    said += "Each suspect above names the experiment that would decide it"
    if refused:
        said += "; run it with `--allow-mutations` (experiments were not allowed in this run)"
    if failed:
        wheel = any(x.spec.get("kind") == "package_restore" for x in failed)
        said += ("; where its experiment failed, fix what stopped it and run again"
                 + (" (a package's other build: `--wheelhouse DIR` holding its wheel)" if wheel else ""))
    return said + (", or give a baseline snapshot (`--baseline-snapshot`)." if f.baseline_snapshot is None else ".")


def render_fixes(doc: Doc, fixes: list[Fix], f: RunFacts | None = None) -> None:
    doc.add("## What to do now", "")
    if not fixes:
        doc.add(todo_words(f) if f is not None else "Nothing to undo on the host: no cause was confirmed. Each suspect "
                "above names the experiment that would decide it, or give a baseline snapshot (`--baseline-snapshot`).", "")
        return
    for i, fx in enumerate(fixes, 1):
        doc.add(f"{i}. {fx.text}")
        if fx.commands:
            doc.add("", *["   " + ln for ln in fenced("\n".join(fx.commands), "bash")])
        doc.add("")
    if fixes:
        doc.add("Then run the benchmark again: it should be back at the baseline.")
    doc.add("")


def render_items(doc: Doc, items: list[tuple], f: RunFacts) -> None:
    """Messages outside the hypotheses: reasoning, commands, transport notices and errors."""
    for item in items:
        if item[0] == "say":
            doc.msg(item[1])
        elif item[0] == "calls":
            render_calls(doc, item[1], f.target, f.metric, f.unit)
        elif item[0] == "event":
            doc.msg(item[1], item[2])


def run_discovery(f: RunFacts) -> RunDiscovery:
    """What the run's discovery was given (its flags, from ``run_started``) and the GPU processes it read."""
    i = f.inputs
    try:
        inp = DiscoveryInput(server_pattern=i.server_pattern, python=i.python, repo=i.repo, bench=i.bench,
                             bench_regex=i.bench_regex, metric=f.metric or None)
    except ValueError:
        inp = DiscoveryInput()
    gpu = [GpuProcess.model_validate(p) for p in (f.outputs.get("gpu_processes") or {}).get("processes") or []]
    return RunDiscovery(inp=inp, gpu=gpu)


def render(events: list[Event]) -> str:
    """The whole transcript.md."""
    f = gather(events)
    doc = Doc(discovery=run_discovery(f))
    title = f"# {f.symptom}" + (f", was {f.baseline}" if f.baseline else "") + f" on {f.hostname or f.host}"
    doc.add(title, "")
    meta = [f"Host {code(f.host)}"] + ([f"reached as {code('ssh ' + f.target)}"] if f.target else [])
    meta += [f"playbook {code(f.playbook)} ({f.playbook_digest})", f"debugagent {f.version}", f"run {code(f.run_id)}"]
    c = f.conclusion
    if c is not None:
        meta.append(f"{plural(c.commands, 'command')}, {plural(c.bench_runs, 'benchmark run')}"
                    + (f" in {f.wall_s:.1f} s" if f.wall_s else "") + f", exit {c.exit_code}")
    doc.add(" · ".join(meta), "")
    if c is not None:
        if c.root_causes:
            # the same headline as the console and the live view (agent/answer.py): at most HEADLINE_MAX characters
            said = headline(c.model_dump(mode="json", by_alias=True)).rstrip(".")
            said += "" if said.endswith("…") else "."
            doc.add(f"**Answer**: {said} The fix is under [What to do now](#what-to-do-now); each cause's whole "
                    "result under its hypothesis below.", "")
        elif c.suspects:
            doc.add("**Answer**: no cause confirmed; suspects: " + ", ".join(s.hypothesis for s in c.suspects) + ".", "")
    doc.add("## The regression", "")
    render_items(doc, f.prelude, f)
    if doc.lines and not doc.lines[-1]:
        doc.lines.pop()
    said = arithmetic(f)
    if f.bench_source:   # the same paragraph
        said[-1:-1] = [f"The benchmark's numbers: {code(f.metric)}{f.bench_source[len(f.metric):]}."] + ([] if said else [""])
    doc.add(*said)
    doc.add(*render_timeline(f, doc))
    doc.add("## Hypotheses, in the playbook's order", "")
    for hid in f.order:
        render_hypothesis(doc, hid, f)
    render_items(doc, f.epilogue, f)
    render_conclusion(doc, f)
    render_fixes(doc, fixes_for(f), f)
    # every host's string in it is made safe for a Markdown renderer at once: no raw HTML, no code span a backtick
    # from the host can open or close, no control character (tools/escape.py)
    render_changes(doc, events)
    return safe_markdown("\n".join(tighten(own_lines(doc.lines)))).rstrip() + "\n"


def own_lines(elements: list[str]) -> list[str]:
    """The document's lines: each element split where a host's text held a newline, and a line made so that reads
    as one of debugagent's own ``<details>`` lines shown as text (``\\<``): only an element of its own opens or
    closes a collapsed block."""
    out: list[str] = []
    for el in elements:
        first, *rest = el.split("\n")
        out.append(first)
        out.extend("\\" + ln if OWN_HTML.fullmatch(ln) else ln for ln in rest)
    return out


def render_changes(doc: Doc, events: list[Event]) -> None:
    """Each change the run made on the host, when, and its undo (agent/changes.py)."""
    from . import changes
    body, _ = changes.rows(events)
    doc.add(f"## {changes.SECTION}", "", changes.summary(events), "")
    if body:
        doc.add("<details><summary>each change and its undo</summary>", "",
                *table(["when", "experiment", "what changed", "undone by"], [[c, code(h), w, u] for c, h, w, u in body]),
                "", "</details>", "")


def _kind(line: str) -> str:
    if not line.strip():
        return "blank"
    if OWN_HTML.fullmatch(line):
        return "html"   # a line of its own: never joined to the next (an HTML block runs to a blank line)
    if line.startswith("#"):
        return "heading"
    if line.startswith("|"):
        return "table"
    if re.match(r"(\d+\. |- |   )", line):
        return "list"
    return "text"


def opens(line: str) -> int:
    """1 for a line of debugagent's that opens a collapsed block, -1 for one that closes it, else 0."""
    if not OWN_HTML.fullmatch(line):
        return 0
    return -1 if line == "</details>" else 1


def tighten(lines: list[str]) -> list[str]:
    """Fewer lines, same rendering: consecutive messages share a paragraph with hard line breaks
    (a trailing backslash) instead of a blank line each; a heading needs no blank line after it.
    Fenced blocks and <details> blocks are left exactly as they are."""
    out: list[str] = []
    raw = False
    depth = 0
    for i, line in enumerate(lines):
        if depth:
            out.append(line)
            depth += opens(line)
            continue
        if raw:
            out.append(line)
            raw = line.strip() != "```" and not re.fullmatch(r"`{3,}", line.strip())
            continue
        if line.lstrip().startswith("```"):
            raw = True
            out.append(line)
            continue
        if opens(line) == 1:
            depth += 1
            out.append(line)
            continue
        k = _kind(line)
        if k not in ("blank", "table") and out and _kind(out[-1]) == "table":
            out.append("")   # a table ends only at a blank line
        if k == "blank" and out:
            prev = _kind(out[-1])
            nxt = next((x for x in lines[i + 1:] if x.strip()), "")
            if prev == "heading" or (prev == "text" and nxt.startswith("### ")) or (
                    prev == "text" and _kind(nxt) == "text" and not nxt.startswith(("<", "```"))):
                if prev == "text" and _kind(nxt) == "text":
                    out[-1] += "\\"
                continue
        elif k == "text" and out and _kind(out[-1]) == "text" and not out[-1].endswith("\\"):
            out[-1] += "\\"
        out.append(line)
    return out


def excerpt(md: str, hypotheses: list[str]) -> str:
    """The part of a transcript the README shows: the answer, some hypotheses' sections and what to do now."""
    lines = md.splitlines()
    out = [next((ln for ln in lines if ln.startswith("**Answer**")), ""), "", "…", ""]
    for hid in hypotheses:
        start = next(i for i, ln in enumerate(lines) if ln.startswith(f"### {hid}:"))
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")), len(lines))
        out += [*lines[start:end], "…", ""]
    fix = next(i for i, ln in enumerate(lines) if ln == "## What to do now")
    return "\n".join(out + lines[fix:]).rstrip() + "\n"
