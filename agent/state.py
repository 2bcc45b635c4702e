"""The typed state of one investigation: what crosses the graph's nodes.

The graph's state schema is :class:`RunState`; LangGraph validates the saved channels into
it before each node, so nodes read typed fields and write models. The checkpointer saves
the models as JSON (``to_jsonable``, then redacted: ``agent/run.py``'s ``RedactingSerde``),
and a resumed run gets them back as models the same way.

::

    RunState
     ├─ discovered   dict  (discovery's JSON: server, python, repo, bench, metric, host facts)
     ├─ snapshot     Snapshot
     ├─ regression   Regression           the reproduce step's answer
     ├─ facts        dict                 the rule-facing facts (the playbook's contract)
     ├─ hyps         {id: Hyp}            verdicts.Hyp: status, because, share, results
     ├─ current      Current | None       the experiment under way: spec, result (ExperimentResult)
     └─ conclusion   RunConclusion | None the --json object's source
"""

from __future__ import annotations

from typing import Any

from debugagent.tools.snapshot import Snapshot
from pydantic import BaseModel, ConfigDict, Field

from .conclusion import RunConclusion
from .results import ExperimentResult, Regression
from .verdicts import Hyp

__all__ = ["Current", "ExperimentResult", "Regression", "RunState", "to_jsonable"]


class Current(BaseModel):
    """The experiment the plan chose, and (once run) its result."""

    hyp: str
    spec: dict[str, Any]
    result: ExperimentResult | None = None
    retried: int = 0


class RunState(BaseModel):
    """The graph's state; each node returns the fields it changes."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    discovered: dict[str, Any] = Field(default_factory=dict)
    snapshot: Snapshot | None = None
    regression: Regression = Field(default_factory=Regression)
    facts: dict[str, Any] | None = None
    hyps: dict[str, Hyp] = Field(default_factory=dict)
    current: Current | None = None
    done: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    bench_runs: int = 0
    joint: dict[str, Any] | None = None   # the confirmed causes reverted together (verdicts.joint_result)
    conclusion: RunConclusion | None = None


def to_jsonable(obj: Any) -> Any:
    """Models as their JSON, inside dicts, lists and tuples (what the checkpointer saves)."""
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_jsonable(v) for v in obj)
    return obj


def conclusion_of(out: dict[str, Any]) -> dict[str, Any]:
    """The ``--json`` source from what ``graph.invoke`` returned (models, or their JSON after a resume)."""
    c = RunState.model_validate(out).conclusion if out.get("conclusion") is not None else None
    return c.to_json() if c else {}
