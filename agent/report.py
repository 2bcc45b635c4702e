"""``report.html``: one self-contained page per run (inline CSS and SVG, nothing fetched).

The hypothesis tree with verdicts, each experiment's benchmark runs before and after as an
SVG strip plot, the timeline of changes, the conclusion and the fix. Rendered from the
events, like transcript.md.
"""

from __future__ import annotations

import statistics
from html import escape
from pathlib import Path
from typing import Any

from .fixes import fixes_for
from .markdown import STATUS_WORD, clip_words, sort_key, when
from .runfacts import RunFacts, gather

CSS = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1000px;color:#1d2430;padding:0 1rem}
h1{font-size:1.5rem;margin-bottom:.2rem} h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #dde2ea;padding-bottom:.2rem}
.meta{color:#5b6575;font-size:.9rem} code,pre{font:13px ui-monospace,SFMono-Regular,Menlo,monospace;background:#f3f5f8;border-radius:4px}
code{padding:0 .25rem} pre{padding:.6rem .8rem;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
.answer{background:#eef8f0;border-left:4px solid #2f9e44;padding:.7rem 1rem;margin:1rem 0}
.answer.none{background:#fff8e6;border-color:#e8a100}
ul.tree{list-style:none;padding-left:0} ul.tree>li{margin:.5rem 0;padding:.5rem .8rem;border:1px solid #e3e7ee;border-radius:6px}
.badge{display:inline-block;min-width:6.5rem;text-align:center;font-size:.8rem;font-weight:600;border-radius:10px;padding:.05rem .5rem;margin-right:.5rem}
.confirmed{background:#2f9e44;color:#fff} .ruled_out{background:#e9ecef;color:#495057} .suspect{background:#ffd43b;color:#5c4400}
.inconclusive{background:#d0bfff;color:#3b2a7a} .pending{background:#f1f3f5;color:#868e96}
.why{color:#3d4654;font-size:.92rem;margin:.3rem 0 0 7.3rem} .exp{margin:.5rem 0 .2rem 7.3rem;font-size:.92rem}
table{border-collapse:collapse;width:100%;font-size:.9rem} th,td{border-bottom:1px solid #e3e7ee;text-align:left;padding:.3rem .5rem;vertical-align:top}
svg text{font:11px system-ui,sans-serif;fill:#3d4654}
"""


def strip_plot(before: list[float], after: list[float], baseline: float | None, unit: str, label_after: str) -> str:
    """An inline SVG: the runs before (the regression) and after (the experiment) on one axis, with the baseline."""
    vals = before + after + ([baseline] if baseline is not None else [])
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad
    w, h, left, right = 560, 118, 96, 16

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (w - left - right)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
             f'aria-label="benchmark runs before and after">',
             f'<line x1="{left}" y1="{h - 24}" x2="{w - right}" y2="{h - 24}" stroke="#adb5bd"/>']
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        parts.append(f'<text x="{x(v):.1f}" y="{h - 8}" text-anchor="middle">{v:.4g}</text>')
    parts.append(f'<text x="{w - right}" y="{h - 30}" text-anchor="end">{escape(unit)}</text>')
    if baseline is not None:
        parts.append(f'<line x1="{x(baseline):.1f}" y1="6" x2="{x(baseline):.1f}" y2="{h - 24}" stroke="#2f9e44" '
                     f'stroke-dasharray="4 3"/><text x="{x(baseline) + 3:.1f}" y="14">baseline {baseline:.4g}</text>')
    for row, (name, data, colour) in enumerate([("before", before, "#e03131"), (label_after, after, "#1c7ed6")]):
        y = 34 + row * 30
        parts.append(f'<text x="4" y="{y + 4}">{escape(name[:14])}</text>')
        for v in data:
            parts.append(f'<circle cx="{x(v):.1f}" cy="{y}" r="4" fill="{colour}" fill-opacity=".65"/>')
        if data:
            m = statistics.fmean(data)
            parts.append(f'<line x1="{x(m):.1f}" y1="{y - 9}" x2="{x(m):.1f}" y2="{y + 9}" stroke="{colour}" stroke-width="2"/>')
    parts.append("</svg>")
    return "".join(parts)


def _mean_sd(v: list[float], unit: str = "") -> str:
    if not v:
        return "no runs"
    return (f"{statistics.fmean(v):.2f}" + (f" ± {statistics.stdev(v):.2f}" if len(v) > 1 else "")
            + (f" {unit}" if unit else "") + f" over {len(v)} run{'s' if len(v) != 1 else ''}")


def render_html(events: list[dict[str, Any]]) -> str:
    f: RunFacts = gather(events)
    c = f.conclusion or {}
    causes = c.get("root_causes") or []
    out = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
           f"<title>debugagent: {escape(f.symptom)} on {escape(f.hostname or f.host)}</title>",
           f"<style>{CSS}</style></head><body>",
           f"<h1>{escape(f.symptom)}{(', was ' + escape(f.baseline)) if f.baseline else ''} on {escape(f.hostname or f.host)}</h1>",
           f"<div class='meta'>host <code>{escape(f.host)}</code> · playbook <code>{escape(f.playbook)}</code> · "
           f"run <code>{escape(f.run_id)}</code> · {c.get('commands', 0)} commands, {c.get('bench_runs', 0)} benchmark runs</div>"]
    if causes:
        out.append("<div class='answer'>" + "<br>".join(
            f"<b>Root cause: {escape(rc['hypothesis'])}</b> "
            f"({'explains ' + format(rc['explains'], '.0%') if rc.get('explains') is not None else 'share not measured'}, "
            f"by {escape(str(rc.get('how')))}): {escape(rc.get('summary', ''))}" for rc in causes) + "</div>")
    else:
        out.append(f"<div class='answer none'><b>No root cause confirmed.</b> {escape(c.get('summary') or '')}</div>")
    fixes = fixes_for(f)
    if fixes:
        out.append("<h2>What to do now</h2><ol>")
        for fx in fixes:
            out.append(f"<li>{escape(fx.text)}" + "".join(f"<pre>{escape(cmd)}</pre>" for cmd in fx.commands) + "</li>")
        out.append("</ol>")
    reg = f.regression
    if f.reproduce:
        word = "real" if reg.get("real", True) else "not reproduced"
        out.append(f"<h2>The regression</h2><p>The regression is {word}: {escape(reg.get('why') or _mean_sd(f.reproduce, f.unit))}.</p>")
    out.append("<h2>Hypotheses</h2><ul class='tree'>")
    for hid in f.order:
        h = f.hyps[hid]
        st = h.status
        because = h.verdicts[-1].get("because", "") if h.verdicts else "not reached"
        how = h.verdicts[-1].get("how") if h.verdicts else None
        out.append(f"<li><span class='badge {escape(st)}'>{escape(STATUS_WORD.get(st, st))}</span><b>{escape(hid)}</b> "
                   f"{escape(h.title)}{(' · by ' + escape(how)) if how else ''}"
                   f"<div class='why'>{escape(clip_words(because, 400))}</div>")
        for x in h.experiments:
            # a plot only where the experiment measured something (one that failed before measuring has no runs)
            plot = strip_plot(f.reproduce, x.samples, reg.get("baseline"), f.unit, "after") if x.samples else ""
            share = f"recovered {x.share:.0%} of the regression" if x.share is not None else ""
            out.append(f"<div class='exp'>Experiment: <b>{escape(x.title)}</b> — before {_mean_sd(f.reproduce)}, after "
                       f"{_mean_sd(x.samples)}; {escape(share)}<br>{plot}</div>")
        out.append("</li>")
    out.append("</ul>")
    if f.timeline:
        out.append("<h2>Timeline of changes</h2><table><tr><th>when (UTC)</th><th>what changed</th></tr>")
        for t, what, _ in sorted(f.timeline, key=lambda r: sort_key(r[0])):
            out.append(f"<tr><td>{escape(when(t))}</td><td>{escape(what)}</td></tr>")
        out.append("</table>")
    if c.get("table"):
        out.append("<h2>Conclusion</h2><table><tr><th>hypothesis</th><th>verdict</th><th>how</th><th>evidence</th></tr>")
        for row in c["table"]:
            out.append(f"<tr><td>{escape(row['id'])}</td><td><span class='badge {escape(row['status'])}'>"
                       f"{escape(STATUS_WORD.get(row['status'], row['status']))}</span></td><td>{escape(row.get('how') or '')}</td>"
                       f"<td>{escape(clip_words('; '.join(row.get('because') or []), 400))}</td></tr>")
        out.append("</table>")
    out.append("<p class='meta'>The full record: <code>events.jsonl</code> and <code>transcript.md</code> in this folder.</p>")
    out.append("</body></html>\n")
    return "\n".join(out)


def write_report(folder: Path) -> Path:
    from tools.redact import write_private

    from .transcript import read_events
    return write_private(folder / "report.html", render_html(read_events(folder / "events.jsonl")))  # redacted, 0600
