"""One number per fact: the live view, transcript.md, report.html and ``--json`` print the same numbers for the
same fact, on every kept recording (each output reads them from agent/runfacts.py)."""

from __future__ import annotations

import html
import io
import re
import statistics
from pathlib import Path

import pytest
from debugagent.agent.outputs import render_all
from debugagent.agent.run import output_of
from debugagent.agent.runfacts import gather, pct, runs_text
from debugagent.agent.transcript import read_events
from debugagent.agent.view import View
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
KEPT = sorted(p.parent for p in [*(ROOT / "transcripts").glob("*/events.jsonl"), *(ROOT / "transcripts").glob("h200/*/events.jsonl")])


def outputs(run: Path) -> dict:
    events = read_events(run / "events.jsonl")
    view_out = io.StringIO()
    view = View([], quiet=False, console=Console(file=view_out, width=4000, force_terminal=False))
    for ev in events:
        view.feed(ev.event, ev)
    conclusion = next(ev for ev in events if ev.event == "conclusion")
    texts = render_all(events)
    return {"facts": gather(events), "md": texts["markdown"], "html": html.unescape(texts["html"]),
            "view": view_out.getvalue(), "json": output_of(conclusion.model_dump(mode="json", by_alias=True), run, 0.0)}


# ---------------------------------------------------------------- what a person should never read

CODE = re.compile(r"```.*?```|`[^`\n]*`|<code>.*?</code>|<pre>.*?</pre>", re.S)
CHECKS = {
    "a number in e-notation": re.compile(r"(?<![\w.=<])(?<!p=)[+-]?\d(?:\.\d+)?e[+-]\d+"),
    "a cut after a word that leads to a number": re.compile(
        r"\b(?:mean|median|to|of|by|vs|at|a|an|the|gives|CI|and|or|with|recovers|explains)\s+…"),
    "a parenthesis cut open": re.compile(r"\([^()\n]*…(?![^()\n]*\))"),
    "one with a plural": re.compile(r"(?<!GPU )(?<![\w.])1 (?:commits|runs|commands|steps|changes|hosts|hypotheses|"
                                    r"experiments|files|packages)\b"),
    "a doubled or dangling separator": re.compile(r";;|;[ \t]*\||;[ \t]*$|;\.(?!\d)", re.M),
}
INTERVAL = re.compile(r"(?:(?:recovers|changes) ([+-]?[\d.]+), )?(-?\d+)% of the regression \(95% CI (-?\d+)% to (-?\d+)%\)"
                      r"|explains (-?\d+)%\)?, (?:95% CI|interval) (-?\d+)%(?: to |–)(-?\d+)%")


def garbled(text: str) -> list[str]:
    """What a person should never read: e-notation, a cut after "mean", "1 commits", ";;", and one share given two
    different 95% intervals."""
    prose = CODE.sub(" ", text)
    found = [f"{what}: …{prose[max(0, m.start() - 50):m.end() + 10]}…" for what, rx in CHECKS.items()
             for m in rx.finditer(prose)]
    # one experiment's share (its sentence names the change it measured: "recovers +313, 28% …") has one interval
    # wherever it is given; two experiments may round to the same share with intervals of their own
    seen: dict[tuple[str, str], set[tuple[str, str]]] = {}
    short: dict[str, set[tuple[str, str]]] = {}   # a share given without its change (the headline's "explains")
    for m in INTERVAL.finditer(prose):
        if m.group(2):
            seen.setdefault((m.group(2), m.group(1) or ""), set()).add((m.group(3), m.group(4)))
        else:
            short.setdefault(m.group(5), set()).add((m.group(6), m.group(7)))
    found += [f"{share}% with two intervals: {sorted(iv)}" for (share, _), iv in seen.items() if len(iv) > 1]
    for share, ivs in short.items():
        known = set().union(*(iv for (sh, _), iv in seen.items() if sh == share))
        if (known and not ivs <= known) or (not known and len(ivs) > 1):
            found.append(f"{share}% with two intervals: {sorted(ivs | known)}")
    return found


def human(o: dict) -> str:
    """What `debugagent run` prints at the end (the headline, the evidence list, the counts)."""
    from debugagent.agent import run as runmod
    buf = io.StringIO()
    old = runmod.console
    runmod.console = lambda *a, **k: Console(file=buf, width=4000, force_terminal=False)   # type: ignore[assignment]
    try:
        runmod.print_human(o["json"])
    finally:
        runmod.console = old
    return buf.getvalue()


def garbled_outputs(run: Path) -> list[str]:
    """``garbled`` over every output of a run folder: transcript.md, report.html's text, the live view's lines and
    the printed answer."""
    o = outputs(run)
    page = re.sub(r"<[^>]+>", "\n", re.sub(r"<code>.*?</code>|<pre>.*?</pre>", " ", o["html"], flags=re.S))
    return [f"{name}: {g}" for name, text in (("transcript.md", o["md"]), ("report.html", page), ("live view", o["view"]),
                                               ("printed answer", human(o))) for g in garbled(text)]


def test_garbled_catches_what_people_reported():
    """Each defect of the kind reported once (numbers as `+1.77e+03`, "mean …", "1 commits", "x16;", ";;", two
    intervals for one share) is caught; p-values and a shell's `;;` in code are not."""
    for bad in ("recovers +1.77e+03 tok/s", "gives mean …", "(95% CI -42% to …", "(1 commits apart)", "gen 5 x16; |",
                "float32;; with", "99% of the regression (95% CI 72% to 126%) and 99% of the regression (95% CI 73% to 126%)"):
        assert garbled(bad), bad
    for good in ("t-test p=5.6e-05: a cause", "`case x in a) echo;; esac`", "GPU 1 runs SM 1980 MHz", "(attention mode, …)",
                 "explains 99%, interval 73%–126% … 99% of the regression (95% CI 73% to 126%)"):
        assert not garbled(good), (good, garbled(good))


def measures(view: str, label: str) -> list[str]:
    lines = [ln for ln in view.splitlines() if ln.startswith(f"[measure] {label}: ")]
    assert lines, f"the view measured no {label}"
    return lines


def last_measure(view: str, label: str) -> str:
    return measures(view, label)[-1]


def reproduce_table(md: str) -> tuple[int, str]:
    """The transcript's table of the reproduce step: its number of runs and its mean ± sd cell."""
    lines = md.splitlines()
    i = next(i for i, ln in enumerate(lines) if re.search(r"×\d+ — reproduce$", ln))
    head, row = lines[i + 1], lines[i + 3]
    runs = len(head.strip("|").split("|")) - 2
    return runs, row.strip().strip("|").split("|")[-1].strip()


@pytest.mark.parametrize("run", KEPT, ids=[r.name for r in KEPT])
def test_reproduce_step_numbers_agree(run):
    """The reproduce step's mean ± sd and run count: the same in the view, the transcript, the report and --json."""
    o = outputs(run)
    f = o["facts"]
    assert f.reproduce, "a kept run without a reproduce step"
    text = runs_text(f.reproduce, f.unit)
    mean, sd, n = statistics.fmean(f.reproduce), statistics.stdev(f.reproduce), len(f.reproduce)
    assert last_measure(o["view"], "reproduce") == f"[measure] reproduce: {text}"
    assert f"The regression is real: {text}" in o["html"] or f"The regression is not reproduced: {text}" in o["html"]
    assert reproduce_table(o["md"]) == (n, f"{mean:.2f} ± {sd:.2f}")
    reg = o["json"]["regression"]
    assert f"{reg['mean']:.2f}" == f"{mean:.2f}"
    assert reg["runs"] == n and last_measure(o["view"], "reproduce").endswith(f" over {n} run{'s' if n != 1 else ''}")
    if not (f.baseline_snapshot or {}).get("bench"):   # with a baseline snapshot's runs, sd is the pooled noise
        assert f"{reg['sd']:.2f}" == f"{sd:.2f}"


@pytest.mark.parametrize("run", KEPT, ids=[r.name for r in KEPT])
def test_experiment_numbers_agree(run):
    """Each experiment's runs and recovered share, and each cause's share: the same in every output."""
    o = outputs(run)
    f = o["facts"]
    page = o["html"]
    seen: dict[str, int] = {}   # a hypothesis may have several experiments: the view's lines for it, in order
    for hid in f.order:
        for x in f.hyps[hid].experiments:
            share = x.measured_share
            after = runs_text(x.samples, f.unit)
            assert f"Experiment: <b>{x.title}</b> — before {runs_text(f.reproduce, f.unit)}, after {after}" in page
            if share is None:
                continue
            assert f"after {after}; recovered {pct(share)} of the regression" in page
            label = f"together ({', '.join(x.spec['joint'])})" if x.spec.get("joint") else hid   # causes reverted together
            k = seen[label] = seen.get(label, -1) + 1   # each experiment's last line (the ones before: "so far")
            done = [m for m in measures(o["view"], label) if "; recovered " in m and not m.endswith(" so far")]
            assert done[k] == f"[measure] {label}: {after}; recovered {pct(share)}"
            # the engine's sentence, in the transcript: "recovers +313, 28% of the regression (95% CI …)" (a rule
            # after it may name another share: "the 80% upper bound … is 1.7% of the regression")
            # an experiment made again over two starts says its first start's share, then all runs' (the last)
            said = re.findall(r"(?:recovers|changes) [^,;]*, (-?\d+)% of the regression \(95% CI", x.result)
            assert said and f"{said[-1]}%" == pct(share), x.result
            # a suspect's change made again with the causes reverted: its verdict, what it adds, is the result shown
            shown = f"reverted too: {x.result}; against " if x.spec.get("on_top") else f"Result: {x.result}."
            assert shown in o["md"]
    for cause in o["json"]["root_causes"]:
        if cause["explains"] is None:
            continue
        share = f"explains {pct(cause['explains'])}"
        assert f"{cause['hypothesis']} ({share}" in o["md"]   # the answer's headline, as the console's
        assert f"Root cause: {cause['hypothesis']}</b> ({share}" in page
        assert f"{cause['hypothesis']} ({share})" in o["view"]
