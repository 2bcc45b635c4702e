"""The answer on the console, for every kept recording: a headline of at most ~160 characters naming the cause,
its share with the interval (the typed fields' numbers) and how it was shown, then the evidence as a short list."""

from __future__ import annotations

from pathlib import Path

import pytest
from debugagent.agent.answer import HEADLINE_MAX, ITEM_MAX, evidence_lines, headline
from debugagent.agent.runfacts import pct
from debugagent.agent.transcript import read_events

ROOT = Path(__file__).resolve().parents[1]
KEPT = sorted(p.parent for p in (ROOT / "transcripts").glob("*/events.jsonl"))


def conclusion(run: Path) -> dict:
    ev = [e for e in read_events(run / "events.jsonl") if e.event == "conclusion"][-1]
    return ev.model_dump(mode="json", by_alias=True)


@pytest.mark.parametrize("run", KEPT, ids=[r.name for r in KEPT])
def test_headline_is_short_and_says_cause_share_and_how(run):
    c = conclusion(run)
    h = headline(c)
    assert len(h) <= HEADLINE_MAX, (len(h), h)
    if c.get("joint"):   # two or more causes reverted together: the joint share and what is left
        j = c["joint"]
        for cause in c["root_causes"]:
            assert cause["hypothesis"] in h
        assert (f"together they recover {pct(j['share'])} (95% CI {pct(j['share_ci'][0])} to {pct(j['share_ci'][1])}); "
                f"{pct(j['unexplained'])} unexplained") in h
    elif c["root_causes"]:
        for cause in c["root_causes"]:
            assert cause["hypothesis"] in h
            if cause["explains"] is not None:
                assert f"{cause['hypothesis']} (explains {pct(cause['explains'])})" in h
                lo, hi = cause["explains_ci"]
                assert f"95% CI {pct(lo)} to {pct(hi)}" in h
        assert "shown by experiment" in h or "shown by evidence" in h
    elif c["suspects"]:
        assert h.startswith(f"No confirmed root cause. Top suspect: {c['suspects'][0]['hypothesis']}")
    else:
        assert h.startswith(("No reproducible regression", "No regression", "Regression smaller", "No confirmed"))
    lines = evidence_lines(c)
    assert h not in lines                     # said once
    for ln in lines:
        assert ln.startswith(("- ", "  to decide it: ", "  to decide "))
        assert ln.startswith("- fix: ") or len(ln) <= ITEM_MAX + 60, ln


def test_the_evidence_does_not_repeat_the_headline():
    """What the headline says (the change, the top suspect's first reason) is not said again word for word under it."""
    for run in KEPT:
        c = conclusion(run)
        h = headline(c).rstrip(" …")
        tail = h.split(": ", 2)[-1]   # after "Root cause: X (share), shown by Y: " or "Top suspect: X: "
        for ln in evidence_lines(c):
            assert tail not in ln, (run.name, ln)


@pytest.mark.parametrize("run", KEPT, ids=[r.name for r in KEPT])
def test_changed_and_undone_section_in_transcript_and_report(run):
    """transcript.md and report.html each say what the run changed on the host, when, and its undo: every
    journalled undo step of the events, and whether it ran."""
    import html

    from debugagent.agent import changes
    from debugagent.agent.markdown import render
    from debugagent.agent.report import render_html
    events = read_events(run / "events.jsonl")
    md, page = render(events), html.unescape(render_html(events))
    recorded = [e for e in events if e.event == "experiment" and e.phase == "undo_recorded"]
    made, _, _ = changes.changes_made(events)
    assert sum(len(c.steps) for c in made) == len(recorded)
    for text in (md, page):
        assert changes.SECTION in text
        assert changes.summary(events) in text
        for c in made:
            assert c.what in text and c.hypothesis in text
    if not recorded:
        assert "Nothing on the host was changed." in md
    else:
        assert f"{sum(1 for c in made if c.undone)} undone" in md


def test_what_to_do_now_advises_what_stopped_the_experiments_not_flags_already_given():
    """The quick start's experiments ran (the host was changed and undone) and the one that would decide the top
    suspect failed for want of a wheel: "What to do now" says to fix that (`--wheelhouse`), never to give
    `--allow-mutations`, which would change nothing; a run whose experiment was not allowed still says it."""
    from debugagent.agent.markdown import todo_words
    from debugagent.agent.runfacts import gather
    f = gather(read_events(ROOT / "transcripts" / "eagle3-flashinfer-rebuilt" / "events.jsonl"))
    said = todo_words(f)
    assert "--allow-mutations" not in said and "--wheelhouse" in said and "every change the experiments made was undone" in said
    f.hyps["compiled_dependency"].notes.append("not run: restart the server … (give --allow-mutations)")
    assert "--allow-mutations" in todo_words(f)


def test_a_simulated_run_says_why_it_changed_the_host_without_the_flag():
    """The quick start restarted the server while its run.json keeps allow_mutations false: the changed-and-undone
    section says the host is simulated and what a real host needs; a run given the flag does not say it."""
    from debugagent.agent import changes
    events = read_events(ROOT / "transcripts" / "eagle3-flashinfer-rebuilt" / "events.jsonl")
    said = changes.summary(events)
    assert "without --allow-mutations because the host is simulated" in said and "a yes at the prompt" in said
    start = events[0]
    flagged = [start.model_copy(update={"inputs": start.inputs.model_copy(update={"allow_mutations": True})}), *events[1:]]
    assert "simulated" not in changes.summary(flagged)


@pytest.mark.parametrize("run", [*KEPT, ROOT / "transcripts" / "h200" / "two"], ids=lambda p: p.name)
def test_the_transcripts_answer_is_the_short_headline(run):
    """transcript.md opens with the same headline as the console (at most HEADLINE_MAX characters), not each
    cause's whole result sentence: those stay under their hypotheses."""
    from debugagent.agent.markdown import render
    events = read_events(run / "events.jsonl")
    conc = next(e for e in events if e["event"] == "conclusion")
    lines = [ln for ln in render(events).splitlines() if ln.startswith("**Answer**")]
    if not conc["root_causes"]:   # a suspect's answer is one short line already; no regression has none
        assert all(len(ln) <= HEADLINE_MAX for ln in lines)
        return
    (line,) = lines
    said = line.removeprefix("**Answer**: ").split(" The fix is under ", 1)[0]
    assert said.rstrip(".") == headline(conc.model_dump(mode="json", by_alias=True)).rstrip(".")
    assert len(said) <= HEADLINE_MAX + 1 and " vs " not in said and "t-test" not in said
