"""The answer as a person reads it on the console: a headline of at most ``HEADLINE_MAX`` characters (the cause,
its share with the interval, how it was shown), then the evidence as a short list.

Both are made from the conclusion's typed fields (the ``conclusion`` event, whose dump is the ``--json``
object's source): the share and its interval are ``explains`` and ``explains_ci``, never re-read from a sentence.
``summary`` (the long sentence in ``--json`` and in the transcript's and the report's sections) is left as it is;
the transcript's and the report's answer line give each cause's share and ``cause_what``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from debugagent.tools.probes.text import clip_words
from debugagent.tools.units import whole_pct

from .conclusion import not_judged_words
from .results import undecided_next
from .verdicts import NotJudged

HEADLINE_MAX = 160
ITEM_MAX = 220




def clip(text: str, n: int) -> str:
    return clip_words(str(text), n)   # a clause's end where it can, never "mean …"


def _share(c: Mapping[str, Any]) -> str:
    if c.get("explains") is None:
        return f"{c['hypothesis']} (share not measured)"
    ci = c.get("explains_ci")
    return f"{c['hypothesis']} (explains {whole_pct(c['explains'])})" + (
        f", 95% CI {whole_pct(ci[0])} to {whole_pct(ci[1])}" if ci else "")


def _what(c: Mapping[str, Any]) -> str:
    """What the cause is, in the words of its own result: the text before its numbers (``with GPU 0 power limit
    450 -> 700 W``), or its first piece of evidence."""
    text = str(c.get("summary") or (c.get("evidence") or [""])[0])
    head = text.split(": mean ", 1)[0]
    return head if head != text or len(text) < 100 else text.split(": ", 1)[0]


def cause_what(summary: str, evidence: Sequence[str] = ()) -> str:
    """The short form of a cause's result for the transcript's and the report's answer line (what was changed,
    without its numbers: the share and interval stand beside it, and the whole sentence is in the hypothesis's
    section)."""
    return _what({"summary": summary, "evidence": list(evidence)})


def together(joint: Mapping[str, Any] | None) -> str:
    """``together they recover X% (95% CI a to b); Y% unexplained``, or "" when the causes were not measured
    together."""
    j = joint or {}
    if j.get("share") is None or not j.get("share_ci"):
        return ""
    lo, hi = j["share_ci"]
    shown = math.floor(j["share"] * 100 + 0.5)
    # what is left is 100 less the share as shown, so the two always add up (0.875 and 0.125, each rounded, did not)
    return (f"together they recover {shown:.0f}% (95% CI {whole_pct(lo)} to {whole_pct(hi)}); "
            f"{max(0, 100 - shown):.0f}% unexplained")


def headline(c: Mapping[str, Any]) -> str:
    """At most ``HEADLINE_MAX`` characters: the cause(s) with share and interval and how shown, the top suspect, or
    why nothing is blamed."""
    causes: Sequence[Mapping[str, Any]] = c.get("root_causes") or []
    suspects: Sequence[Mapping[str, Any]] = c.get("suspects") or []
    if causes:
        how = sorted({str(x.get("how") or "evidence") for x in causes})
        by = f"shown by {' and '.join(how)}"
        if len(causes) == 1:
            head = f"Root cause: {_share(causes[0])}, {by}"
            what = _what(causes[0])
            room = HEADLINE_MAX - len(head) - 2
            return f"{head}: {clip(what, room)}" if what and room > 20 else clip(head, HEADLINE_MAX)
        joint = c.get("joint") or {}
        if together(joint):
            both = "; " + together(joint)
            names = "Root causes: " + ", ".join(str(x["hypothesis"]) + (f" (explains {whole_pct(x['explains'])})" if x.get(
                "explains") is not None else "") for x in causes)
            if len(names + both) > HEADLINE_MAX:   # the joint numbers first: they are the answer's point
                names = "Root causes: " + ", ".join(str(x["hypothesis"]) for x in causes)
            return clip(names + both, HEADLINE_MAX)
        return clip("Root causes: " + "; ".join(_share(x) for x in causes) + f"; {by}", HEADLINE_MAX)
    if suspects:
        top = suspects[0]
        head = f"No confirmed root cause. Top suspect: {top['hypothesis']}"
        because = str(top.get("because") or "")
        room = HEADLINE_MAX - len(head) - 2
        return f"{head}: {clip(because, room)}" if because and room > 20 else head
    summary = str(c.get("summary") or "No confirmed root cause.")
    first = summary.split(". ", 1)[0].rstrip(".") + "."
    return clip(first, HEADLINE_MAX)


def _names(rows: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(str(r.get("hypothesis")) for r in rows)


def evidence_lines(o: Mapping[str, Any]) -> list[str]:
    """The evidence under the headline, one short item a line: each cause's evidence and fix, each suspect with
    what would decide it, the undecided and ruled out by name (the transcript has the why of each), and under the
    undecided the runs that would decide an experiment left undecided at its budget."""
    out: list[str] = []
    causes = o.get("root_causes") or []
    for c in causes:
        what = _what(c) if len(causes) == 1 else ""
        for e in (c.get("evidence") or [])[:3]:
            if what and e.strip() == what.strip():   # the headline said it whole
                continue
            if what and e.startswith(what + ": "):   # the headline said what changed: here its numbers
                e = "measured " + e[len(what) + 2:]
            out.append(f"- {c['hypothesis']}: {clip(e, ITEM_MAX)}")
        if c.get("culprit"):
            cul = c["culprit"]
            conf = f" (confidence {whole_pct(cul['confidence'])})" if isinstance(cul.get("confidence"), int | float) else ""
            subject = f' "{cul["subject"]}"' if cul.get("subject") else ""
            out.append(f"- first bad commit: {clip(str(cul.get('short') or cul.get('sha') or '?') + subject, ITEM_MAX)}{conf}")
        if c.get("fix"):
            out.append(f"- fix: {c['fix']}")
    for i, s in enumerate(o.get("suspects") or []):
        because = str(s.get("because") or "")
        if i == 0 and not causes:   # the headline began it: the rest of the why, a piece a line
            pieces = [p for p in because.split("; ") if p.strip()]
            for p in pieces[1:4]:
                out.append(f"- {clip(p, ITEM_MAX)}")
        else:
            out.append(f"- suspect {s['hypothesis']}: {clip(because, ITEM_MAX)}")
        if s.get("next"):
            out.append(f"  to decide it: {clip(s['next'], ITEM_MAX)}")
    if o.get("inconclusive"):
        out.append(f"- not decided: {_names(o['inconclusive'])}")
        for h in o["inconclusive"]:   # an experiment undecided at its budget: the runs that would decide it
            if undecided_next(h.get("next")):
                out.append(f"  to decide {h['hypothesis']}: {clip(h['next'], ITEM_MAX)}")
    if o.get("ruled_out"):
        out.append(f"- ruled out: {_names(o['ruled_out'])}")
    untested, removed = not_judged_words(NotJudged.model_validate(o.get("not_judged") or {}))
    if untested:
        out.append(f"- not judged (no knowledge list names them): {', '.join(untested)}")
    if removed:
        out.append(f"- removed by experiment, not a cause (no knowledge list names them): {', '.join(removed)}")
    return out
