"""The LangGraph graph of one investigation: the table of contents of a run.

::

    intake -> discover -> probe -> evaluate -> plan -> experiment -> judge -> plan -> ... -> conclude -> report
                                       \\______________________________________________________/

The state is ``state.RunState`` (typed; the SQLite checkpointer saves it after each node);
the transport, the transcript and the playbook are held by ``Ctx`` (``context.py``), built
once by the session and passed to ``build_graph``. Each node reads the state, calls one
step (``steps.py``: the I/O) or one pure function (``verdicts``, ``conclusion``), and
returns the fields it changes.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from debugagent.tools.errors import UsageError

from . import conclusion as concl
from . import steps
from . import verdicts as vd
from .context import REPRODUCE_RUNS, Ctx, Overrides
from .discovery import discover as find_host_server
from .discovery import narrate, run_input, state_of
from .lab.shadow import server_bench
from .preflight import check_benchmark
from .state import RunState

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver

__all__ = ["RECURSION_LIMIT", "REPRODUCE_RUNS", "Ctx", "Overrides", "build_graph"]

RECURSION_LIMIT = 200


def build_graph(ctx: Ctx, checkpointer: BaseCheckpointSaver | None = None):
    """The compiled graph; ``checkpointer`` (SQLite in the run folder) makes it resumable."""
    # imported here: a command that stops at its input's check (exit 2) never loads the graph library
    from langgraph.graph import END, START, StateGraph  # noqa: PLC0415
    g = StateGraph(RunState)
    for name, node in (("intake", intake), ("discover", discover), ("probe", probe), ("evaluate", evaluate),
                       ("plan", plan), ("experiment", experiment), ("judge", judge), ("conclude", conclude),
                       ("report", report)):
        g.add_node(name, partial(node, ctx))
    g.add_edge(START, "intake")
    g.add_edge("intake", "discover")
    g.add_edge("discover", "probe")
    g.add_edge("probe", "evaluate")
    g.add_conditional_edges("evaluate", after_evaluate, {"plan": "plan", "conclude": "conclude"})
    g.add_conditional_edges("plan", after_plan, {"experiment": "experiment", "conclude": "conclude"})
    g.add_edge("experiment", "judge")
    g.add_edge("judge", "plan")
    g.add_edge("conclude", "report")
    g.add_edge("report", END)
    return g.compile(checkpointer=checkpointer)


# ---------------------------------------------------------------- routers (pure)
def after_evaluate(s: RunState) -> str:
    """No regression beyond the noise: nothing to test, conclude at once."""
    return "conclude" if s.regression.refuted else "plan"


def after_plan(s: RunState) -> str:
    return "experiment" if s.current else "conclude"


# ---------------------------------------------------------------- nodes
def intake(ctx: Ctx, state: RunState) -> dict[str, Any]:
    """Say what the user reported and the plan; every hypothesis pending."""
    ctx.say(steps.intro(ctx))
    return {"hyps": {h: vd.Hyp() for h in ctx.playbook.order()}, "done": [], "notes": [], "bench_runs": 0,
            "current": None}


def discover(ctx: Ctx, state: RunState) -> dict[str, Any]:
    """Find the server, its interpreter, checkout and benchmark; check the benchmark prints the metric."""
    d = find_host_server(ctx.runner(None), run_input(ctx.overrides, ctx.symptom.metric))
    for line in narrate(d):
        ctx.say(line)
    found = state_of(d)
    if not found.get("bench") and ctx.transport.live and not ctx.transport.sandbox:
        raise no_benchmark(ctx)
    raw = found.get("bench")
    found["bench"] = server_bench(raw, found.get("server"))   # `{port}` in --bench: the server's port
    notes = list(state.notes)
    if ctx.overrides.shadow_gpus or ctx.overrides.shadow_port:   # before any benchmark run: exit 2 with the fix
        found["shadow"] = steps.shadow_check(ctx, found, raw)
        notes += [f"shadow experiments: {n}" for n in found["shadow"]["notes"]]   # in the answer and --json too
    steps.systemd_check(ctx, found)   # before any benchmark run: exit 2 with the fix
    found["first_run"] = check_benchmark(ctx, found)   # the reproduce step's first run
    return {"discovered": found, **({"notes": notes} if notes != state.notes else {})}


def no_benchmark(ctx: Ctx) -> UsageError:
    """A real host with no benchmark (no --bench, none in its host profile): nothing could be reproduced or
    measured, so every hypothesis would stay undecided; refused before any probe."""
    m = ctx.symptom.metric
    return UsageError(f"no benchmark for {ctx.transport.host}: no --bench was given and the host has no host profile "
                      f"naming one, so the regression cannot be reproduced nor any experiment measured",
                      fix=f"give the command that measures it: --bench 'CMD' (it prints `{m}=VALUE UNIT`; or add "
                          f"--bench-regex 'REGEX'), or name it once in the host's /etc/debugagent/host.json")


def probe(ctx: Ctx, state: RunState) -> dict[str, Any]:
    """The read-only evidence in one pass, then the regression reproduced."""
    snap = steps.snapshot(ctx, state.discovered)
    regression, runs = steps.reproduce_regression(ctx, state.discovered)
    return {"snapshot": snap, "regression": regression, "bench_runs": runs}


def evaluate(ctx: Ctx, state: RunState) -> dict[str, Any]:
    """Every hypothesis' rules over the facts: its verdict on the evidence."""
    facts = steps.rule_facts(ctx, state)
    return {"hyps": steps.judge_all(ctx, facts), "facts": facts}


def plan(ctx: Ctx, state: RunState) -> dict[str, Any]:
    """The next experiment, or none (no benchmark, nothing left, or the causes explain the regression)."""
    if not state.discovered.get("bench") or not state.regression.samples:
        return {"current": None}
    return steps.choose(ctx, state)


def experiment(ctx: Ctx, state: RunState) -> dict[str, Any]:
    """Change one thing, measure, put it back."""
    cur, runs = steps.run_experiment(ctx, state)
    return {"current": cur, "bench_runs": state.bench_runs + runs}


def judge(ctx: Ctx, state: RunState) -> dict[str, Any]:
    """The experiment's result applied to its hypothesis."""
    cur = state.current
    assert cur is not None and cur.result is not None
    if cur.spec.get(vd.ON_TOP):
        hid = cur.spec[vd.ON_TOP]
        causes = [c for c in cur.spec[vd.JOINT] if c != hid]
        base = cur.spec.get("base") or [0.0, 0.0]
        h = vd.on_top_result(hid, state.hyps[hid], causes, cur.result, (float(base[0]), float(base[1])),
                             f"in this run {ctx.speed_moved[0]}" if ctx.speed_moved else None)
        steps.emit_verdict(ctx, hid, h, h.because[-1])
        hyps = {**state.hyps, hid: h}
        out: dict[str, Any] = {"hyps": hyps, "current": None, "done": state.done + [vd.exp_key(cur.hyp, cur.spec)]}
        if h.status == "confirmed":   # the causes, this one too, were measured together
            # one at a time: the others' shares, and what this one recovered alone (too little to count)
            j = vd.joint_result(cur.spec[vd.JOINT], cur.result, state.hyps)
            alone = [r.share for r in state.hyps[hid].results if not r.error and not r.group]
            out["joint"] = {**j, "sum_alone": round(j["sum_alone"] + (alone[-1] if alone else 0.0), 3)}
            ctx.say(steps.joint_words(out["joint"]))
        return out
    if cur.spec.get(vd.JOINT):
        joint = vd.joint_result(cur.spec[vd.JOINT], cur.result, state.hyps)
        ctx.say(steps.joint_words(joint))
        return {"joint": joint, "current": None, "done": state.done + [vd.exp_key(cur.hyp, cur.spec)]}
    h = vd.after_experiment(cur.hyp, state.hyps[cur.hyp], cur.spec, cur.result)
    steps.emit_verdict(ctx, cur.hyp, h, h.because[-1])
    return {"hyps": {**state.hyps, cur.hyp: h}, "current": None, "done": state.done + [vd.exp_key(cur.hyp, cur.spec)]}


def conclude(ctx: Ctx, state: RunState) -> dict[str, Any]:
    """The verdicts as a conclusion (``conclusion.run_conclusion``), with the run's counts. A hypothesis ruled out on
    what it measured while values no list judges were never decided by removal is "not decided" first
    (``verdicts.unjudged_left``)."""
    hyps, targets = state.hyps, ctx.playbook.group_targets()
    nj = vd.without_judged(hyps, vd.NotJudged.model_validate((state.facts or {}).get("not_judged") or {}))
    if ctx.baseline_snapshot is None and not state.regression.refuted:
        left = vd.unjudged_left(hyps, nj, targets)
        for hid, h in left.items():
            steps.emit_verdict(ctx, hid, h, h.because[-1])
        hyps = {**hyps, **left}
    c = concl.run_conclusion(hyps, ctx.playbook.order(), state.regression,
                             baseline_snapshot=ctx.baseline_snapshot is not None,
                             next_steps=ctx.playbook.knowledge.get("next_steps") or {},
                             not_judged=vd.removed_not_cause(hyps, nj, targets),
                             commands=ctx.commands, bench_runs=state.bench_runs, notes=state.notes,
                             joint=state.joint)
    ctx.transcript.emit("conclusion", **c.to_json())
    return {"conclusion": c, "hyps": hyps}


def report(ctx: Ctx, state: RunState) -> dict[str, Any]:
    """Every output format (agent/outputs.py: the Markdown transcript, the HTML report), from the events."""
    from .outputs import write_outputs
    write_outputs(ctx.transcript.folder)
    return {}
