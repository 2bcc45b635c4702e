"""The events of ``events.jsonl`` as typed models: the contract between the run and its readers.

One model per event kind, a union keyed on ``event``. ``Transcript.emit`` builds the model
before anything is written (an unknown field or a wrong type fails loudly), and
``read_events`` returns models, so the readers (runfacts, markdown, report, the live view)
read fields, never prose. The schema is versioned: ``SCHEMA_VERSION`` is what is written
now; an older recording is migrated as it is read (``migrate``), its files left as they are.

Version 2 (this one) over 1:
- ``tool_call.purpose``: what the call is for (reproduce, probe, experiment, undo, control, warm-up)
- ``reasoning.kind``: ``not_run`` for an experiment that was not run (it needed --allow-mutations)

Models answer ``ev["field"]`` and ``ev.get("field")`` too, for code that still reads dicts;
new code reads attributes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

SCHEMA_VERSION = 2
Purpose = Literal["reproduce", "peer", "probe", "experiment", "undo", "control", "warm-up"]
PURPOSES: tuple[str, ...] = ("reproduce", "probe", "experiment", "undo", "control", "warm-up")
Status = Literal["pending", "suspect", "confirmed", "ruled_out", "inconclusive"]
Phase = Literal["start", "plan", "wait", "warm_up", "measure", "bisect", "undo", "undo_recorded", "result"]


class BadEvent(ValueError):
    """An event that does not fit its model: a bug in the code that emits it (raised before anything is written)."""


class _Mapping:
    """Read access by key, as the dicts these models replace had (``ev["tool"]``, ``ev.get("why")``)."""

    def _dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)  # type: ignore[attr-defined]

    def _name(self, key: str) -> str | None:
        fields = type(self).model_fields  # type: ignore[attr-defined]
        if key in fields:
            return key
        return next((n for n, f in fields.items() if f.alias == key), None)

    def _extra(self) -> dict[str, Any]:
        return getattr(self, "__pydantic_extra__", None) or {}

    def __getitem__(self, key: str) -> Any:
        name = self._name(key)
        if name is None:
            if key in self._extra():
                return self._extra()[key]
            raise KeyError(key)
        return _plain(getattr(self, name))

    def get(self, key: str, default: Any = None) -> Any:
        name = self._name(key)
        value = getattr(self, name) if name is not None else self._extra().get(key)
        return default if value is None else _plain(value)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        name = self._name(key)
        return key in self._extra() if name is None else name in self.model_fields_set  # type: ignore[attr-defined]

    def keys(self) -> list[str]:
        return list(self._dump())

    def items(self) -> list[tuple[str, Any]]:
        return list(self._dump().items())


def _plain(value: Any) -> Any:
    """Nested rows stay models (they answer ``get`` too); tuples become lists, as JSON has them."""
    return list(value) if isinstance(value, tuple) else value


class Row(_Mapping, BaseModel):
    """A nested record of an event (a cause, a table row): typed where read, other fields kept."""

    model_config = ConfigDict(extra="allow")


class EventBase(_Mapping, BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    run_id: str = ""
    seq: int = 0
    t: float = 0.0


# ---------------------------------------------------------------- the kinds
class RunInputs(Row):
    """What the user gave (``run.json``'s options); other fields are kept as given."""

    bench: str | None = None
    repo: str | None = None
    python: str | None = None
    server_pattern: str | None = None
    bench_regex: str | None = None
    reproduce_runs: int | None = None
    max_runs: int | None = None


class RunStarted(EventBase):
    event: Literal["run_started"] = "run_started"
    schema_version: int = 1
    debugagent_version: str = ""
    host: str = ""
    started_at: str | None = None
    symptom: str = ""
    baseline: str | None = None
    baseline_snapshot: str | None = None
    playbook: str = ""
    playbook_source: str = ""
    playbook_digest: str = ""
    inputs: RunInputs = Field(default_factory=RunInputs)
    baseline_snapshot_data: dict[str, Any] | None = None
    replay_of: str | None = None


class HypothesisOpened(EventBase):
    event: Literal["hypothesis_opened"] = "hypothesis_opened"
    hypothesis: str
    title: str = ""
    checks: list[str] = Field(default_factory=list)


class Reasoning(EventBase):
    event: Literal["reasoning"] = "reasoning"
    hypothesis: str | None = None
    text: str = ""
    kind: Literal["reasoning", "not_run"] = "reasoning"


def purpose_of(tool: str, hypothesis: str | None, why: str) -> str:
    """What a tool call is for, from what its caller gave it (the step it belongs to, the reason it states).
    Decided once, where the call is recorded (and for a recording of version 1, where it is read)."""
    if why.startswith("undo:"):
        return "undo"
    if why.startswith("warm-up"):
        return "warm-up"
    if why.startswith(("control:", "the reference state")):
        return "control"
    if why.startswith("peer "):   # --peer: the healthy peer's run, interleaved with the reproduce step's
        return "peer"
    if hypothesis is None:
        # the check that the benchmark prints the metric is a probe (its reading is the reproduce step's first run)
        return "reproduce" if tool == "bench" and why.startswith("reproduce") else "probe"
    return "experiment"


class ToolCall(EventBase):
    event: Literal["tool_call"] = "tool_call"
    hypothesis: str | None = None
    call_id: int = 0
    tool: str = ""
    input: dict[str, Any] = Field(default_factory=dict)
    command: str = ""
    display: str = ""
    why: str = ""
    purpose: Purpose = "probe"

    @model_validator(mode="before")
    @classmethod
    def _purpose(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("purpose") is None:
            data = {**data, "purpose": purpose_of(str(data.get("tool") or ""), data.get("hypothesis"),
                                                  str(data.get("why") or ""))}
        return data


class ToolResult(EventBase):
    event: Literal["tool_result"] = "tool_result"
    hypothesis: str | None = None
    call_id: int = 0
    tool: str = ""
    host: str = ""
    command: str = ""
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration_ms: float = 0.0
    wall_ms: float | None = None
    truncated: bool = False
    timed_out: bool = False
    output: dict[str, Any] | None = None
    error: str | None = None

    @property
    def value(self) -> float | None:
        """The benchmark's reading, when this is a benchmark run that gave one."""
        if self.tool != "bench" or self.exit_code != 0 or not self.output:
            return None
        v = self.output.get("value")
        return float(v) if v is not None else None


class Verdict(EventBase):
    event: Literal["verdict"] = "verdict"
    hypothesis: str
    status: Status = "pending"
    how: str | None = None
    because: str = ""
    share: float | None = None
    share_ci: list[float] | None = None
    next: str | None = None


class Experiment(EventBase):
    event: Literal["experiment"] = "experiment"
    hypothesis: str | None = None
    phase: Phase
    text: str = ""
    spec: dict[str, Any] | None = None          # start
    share: float | None = None                  # result: of the regression recovered
    significant: bool | None = None             # result
    tool: str | None = None                     # undo, undo_recorded
    step: int | None = None                     # undo
    input: dict[str, Any] | None = None         # undo_recorded
    needed: bool | None = None                  # warm_up
    mode: str | None = None                     # plan


class LlmCall(EventBase):
    event: Literal["llm_call"] = "llm_call"
    hypothesis: str | None = None
    model: str | None = None
    prompt: str | None = None
    answer: str | None = None
    used: bool | None = None
    note: str = ""
    order: list[Any] = Field(default_factory=list)


class Cause(Row):
    hypothesis: str
    summary: str = ""
    evidence: list[str] = Field(default_factory=list)
    how: str | None = None
    explains: float | None = None
    explains_ci: list[float] | None = None
    culprit: dict[str, Any] | None = None
    fix: str | None = None


class Suspect(Row):
    hypothesis: str
    because: str = ""
    next: str | None = None
    rank: str | None = None


class Open(Row):
    hypothesis: str
    because: str = ""
    next: str | None = None
    rule: str | None = None


class TableRow(Row):
    id: str
    status: Status = "pending"
    how: str | None = None
    because: list[str] = Field(default_factory=list)
    share: float | None = None
    share_ci: list[float] | None = None
    next: str | None = None


class RegressionFacts(Row):
    """The reproduce step's answer as the conclusion records it (``results.Regression`` without its samples)."""

    measured: bool | None = None
    real: bool | None = None
    why: str | None = None
    mean: float | None = None
    baseline: float | None = None
    baseline_source: str | None = None
    delta: float | None = None
    delta_se: float | None = None
    sd: float | None = None
    outcome: str | None = None
    runs_needed: int | None = None


class NotJudged(Row):
    flags: list[str] = Field(default_factory=list)
    env: list[str] = Field(default_factory=list)
    workload: list[str] = Field(default_factory=list)
    at_default: list[str] = Field(default_factory=list)


class Conclusion(EventBase):
    event: Literal["conclusion"] = "conclusion"
    schema_: int | None = Field(default=None, alias="schema")
    root_cause: Cause | None = None
    root_causes: list[Cause] = Field(default_factory=list)
    suspects: list[Suspect] = Field(default_factory=list)
    ruled_out: list[Open] = Field(default_factory=list)
    inconclusive: list[Open] = Field(default_factory=list)
    not_judged: NotJudged = Field(default_factory=NotJudged)
    summary: str = ""
    exit_code: int | None = None
    commands: int = 0
    bench_runs: int = 0
    regression: RegressionFacts = Field(default_factory=RegressionFacts)
    notes: list[str] = Field(default_factory=list)
    table: list[TableRow] = Field(default_factory=list)
    joint: Row | None = None   # the confirmed causes reverted together (conclusion.Joint)


class Error(EventBase):
    event: Literal["error"] = "error"
    hypothesis: str | None = None
    kind: str | None = None
    message: str = ""


class Interrupted(EventBase):
    event: Literal["interrupted"] = "interrupted"
    text: str = ""


class Resumed(EventBase):
    event: Literal["resumed"] = "resumed"
    text: str = ""


Event = Annotated[RunStarted | HypothesisOpened | Reasoning | ToolCall | ToolResult | Verdict | Experiment | LlmCall
                  | Conclusion | Error | Interrupted | Resumed, Field(discriminator="event")]
EVENTS: tuple[str, ...] = ("run_started", "hypothesis_opened", "reasoning", "tool_call", "tool_result", "verdict",
                           "experiment", "llm_call", "conclusion", "error", "interrupted", "resumed")
_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(data: dict[str, Any]) -> Event:
    """The model of one event (``data`` holds ``event``); ``ValidationError`` when it does not fit."""
    return _ADAPTER.validate_python(data)


def build(event: str, data: dict[str, Any]) -> Event:
    """An event about to be written: its model, or ``BadEvent`` naming the field."""
    if event not in EVENTS:
        raise BadEvent(f"unknown event `{event}` (one of {', '.join(EVENTS)})")
    try:
        return parse_event({**data, "event": event})
    except ValidationError as exc:
        raise BadEvent(f"event `{event}`: {describe(exc)}") from exc


def describe(exc: ValidationError) -> str:
    e = exc.errors()[0]
    loc = [str(x) for x in e["loc"]]
    if loc and loc[0] in EVENTS:   # the union's tag
        loc = loc[1:]
    return f"field `{'.'.join(loc) or '?'}`: {e['msg']}"


# ---------------------------------------------------------------- older recordings
def migrate(raw: dict[str, Any], version: int) -> dict[str, Any]:
    """One event of a recording written at schema ``version``, as this version writes it."""
    if version < 2 and raw.get("event") == "reasoning" and "kind" not in raw and "not run" in str(raw.get("text") or ""):
        # version 1 said so only in the text (agent/steps.py's note for an experiment left out)
        raw = {**raw, "kind": "not_run"}
    # tool_call.purpose: filled by ToolCall's validator from the call's step and reason
    return raw
