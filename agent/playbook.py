"""Playbooks: YAML diagnostic trees, validated strictly, with rules in Jinja2's sandbox.

A playbook lists hypotheses in the order they are worth checking. Each hypothesis names
the checks it needs (typed tools; the probe step collects what some hypothesis checks),
its evidence (globs over the snapshot diff's paths: the playbook, not tools/, says which
change bears on which hypothesis), its cost (orders experiments whose evidence is equally
strong), rules (``when`` expressions, as Ansible authors write them, evaluated in an
immutable sandbox) that give a verdict with a ``because`` template citing the evidence,
the experiment a ``suspect`` verdict may lead to (its model is its kind's: ``agent/lab``),
and its ``fix`` once confirmed (templates in the same sandbox, rendered by ``fixes.py``).

Rule semantics, read top to bottom: every matching ``suspect`` or ``confirmed`` rule
counts (a hypothesis can have several suspects); the first matching ``ruled_out`` or
``inconclusive`` rule ends the list, and gives the verdict only if no suspect or
confirmed rule matched above it. So a guard at the top (``repo is none`` ->
inconclusive) protects the rules below it, and ``when: "true"`` at the end is the
default. ``foreach`` evaluates a rule once per item of a list expression, binding
``item``.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import shlex
import threading
import time
import typing
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from debugagent.tools.errors import PlaybookError
from debugagent.tools.gpu import EVENT_REASON_BITS
from debugagent.tools.probes import checks
from debugagent.tools.snapshot import Change
from debugagent.tools.yamlfile import load_yaml_mapping, read_yaml_file, resolve_yaml_ref
from jinja2 import StrictUndefined, TemplateError, Undefined
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .evidence import EDITABLE, EvidenceGlob, evidence_matches, glob_matches_some_path
from .lab.registry import KINDS, Experiment, kind_of
from .lab.spec import FixTemplate, RestoreSpec

__all__ = ["EDITABLE", "OTHER", "Experiment", "FixTemplate", "Hypothesis", "Playbook", "Rule", "evaluate",
           "evidence_matches", "glob_matches_some_path", "load_playbook", "parse_playbook", "render_fix", "restored"]

Verdict = Literal["ruled_out", "confirmed", "suspect", "inconclusive"]
CHECKS = checks()   # the tools a hypothesis's `checks` may name: the probes' own (tools.probes)


OTHER = "other"          # where a change goes that no hypothesis claims as evidence


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def restored(spec: dict[str, Any], changes: list[Any]) -> list[Any]:
    """The baseline changes a restoring experiment (a spec as the run carries it) puts back
    (``RestoreSpec.restored``)."""
    kind = kind_of(spec)
    if kind is None or not issubclass(kind.spec, RestoreSpec):
        raise KeyError(f"experiment kind {spec.get('kind')} puts nothing back")
    model = kind.spec.model_validate({k: v for k, v in spec.items() if k in kind.spec.model_fields})
    assert isinstance(model, RestoreSpec)
    return model.restored(changes)


class Rule(Strict):
    when: str
    verdict: Verdict
    because: str
    foreach: str | None = None
    experiment: Experiment | None = None


class Hypothesis(Strict):
    id: str
    title: str
    cost: int = 1
    checks: list[str] = Field(default_factory=list)
    evidence: list[EvidenceGlob] = Field(default_factory=list)  # snapshot paths whose changes bear on it
    rules: list[Rule]
    next: str | None = None
    fix: FixTemplate | None = None   # how to make the fix permanent once it is confirmed (``fixes.py``)
    # the not-judged values it tests in groups when the known suspects do not explain the regression: the server's
    # flags no knowledge list names, or its variables (``verdicts.add_groups``)
    groups: Literal["flags", "env"] | None = None

    @model_validator(mode="after")
    def _checks_known(self) -> Hypothesis:
        for i, c in enumerate(self.checks):
            if c not in CHECKS:
                close = difflib.get_close_matches(c, CHECKS, n=1)
                hint = f"; did you mean `{close[0]}`?" if close else f"; known: {', '.join(CHECKS)}"
                raise ValueError(f"checks[{i}]: unknown tool `{c}`{hint}")
        return self


class Playbook(Strict):
    version: Literal[1]
    name: str
    description: str = ""
    knowledge: dict[str, Any] = Field(default_factory=dict)
    hypotheses: list[Hypothesis]

    source: str = Field(default="", exclude=True)
    digest: str = Field(default="", exclude=True)

    @field_validator("knowledge")
    @classmethod
    def _thermal_reasons_known(cls, v: dict[str, Any]) -> dict[str, Any]:
        """``thermal_reasons`` (read by the clocks rules as ``item.thermal``) names event reasons nvidia-smi reports."""
        reasons = v.get("thermal_reasons", [])
        known = sorted(set(EVENT_REASON_BITS.values()))
        if not isinstance(reasons, list):
            raise ValueError("thermal_reasons must be a list of event reasons, e.g. [sw_thermal_slowdown, hw_thermal_slowdown]")
        for i, r in enumerate(reasons):
            if r not in known:
                close = difflib.get_close_matches(str(r), known, n=1)
                hint = f"; did you mean `{close[0]}`?" if close else f"; known: {', '.join(known)}"
                raise ValueError(f"thermal_reasons[{i}]: unknown event reason `{r}`{hint}")
        return v

    @model_validator(mode="after")
    def _edges(self) -> Playbook:
        ids = [h.id for h in self.hypotheses]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"hypothesis ids must be unique: {', '.join(sorted(dup))}")
        for n, h in enumerate(self.hypotheses):
            if h.next is not None and h.next not in ids:
                close = difflib.get_close_matches(h.next, ids, n=1)
                raise ValueError(f"hypotheses[{n}].next: `{h.next}` is not a hypothesis id"
                                 + (f"; did you mean `{close[0]}`?" if close else ""))
        return self

    def order(self) -> list[str]:
        """Hypothesis ids in the order the tree visits them (following ``next`` edges)."""
        ids = [h.id for h in self.hypotheses]
        by = {h.id: h for h in self.hypotheses}
        seen: list[str] = []
        cur: str | None = ids[0] if ids else None
        while cur and cur not in seen:
            seen.append(cur)
            nxt = by[cur].next
            if nxt is None:
                rest = [i for i in ids if i not in seen]
                nxt = rest[0] if rest else None
            cur = nxt
        return seen + [i for i in ids if i not in seen]

    def shadow_warnings(self) -> list[str]:
        """Evidence globs a glob of a hypothesis listed before always wins over (``evidence.shadowed``)."""
        from .evidence import shadowed
        return shadowed([(h.id, list(h.evidence)) for h in self.hypotheses])

    def get(self, hid: str) -> Hypothesis:
        return next(h for h in self.hypotheses if h.id == hid)

    def probes(self) -> set[str]:
        """The read-only tools some hypothesis's ``checks`` name: what the probe step collects."""
        return {c for h in self.hypotheses for c in h.checks}

    def group_targets(self) -> dict[str, str]:
        """Which hypothesis tests the not-judged flags and which the variables, in groups: as the hypotheses'
        ``groups`` say; a playbook where none says it (written before the field) gives each to the hypothesis whose
        evidence covers the server's flags (``server.args.*``) or its environment (``server.env.*``)."""
        declared = {h.id: h.groups for h in self.hypotheses if h.groups}
        if declared:
            return declared
        out: dict[str, str] = {}
        for what, path in (("flags", "server.args.x"), ("env", "server.env.X")):
            hid = self.evidence_of(Change(path=path))
            if hid != OTHER:
                out.setdefault(hid, what)
        return out

    def evidence_of(self, change: Change) -> str:
        """The hypothesis a change is evidence of: the first listed whose ``evidence`` matches its path."""
        return next((h.id for h in self.hypotheses if any(evidence_matches(g, change) for g in h.evidence)), OTHER)

    def group(self, changes: list[Change]) -> dict[str, list[Change]]:
        """Changes filed under the hypotheses they are evidence of, in the order the changes come."""
        out: dict[str, list[Change]] = {}
        for c in changes:
            out.setdefault(self.evidence_of(c), []).append(c)
        return out


RULE_SECONDS = 2.0        # of CPU time, one rule on one host's facts (a loaded machine's stalls do not count)
MAX_SIZE = 100_000        # items or characters an expression may build by `*`; jinja's range() caps at 100000 too
MAX_TEXT = 4_000          # characters a `because` keeps


class LimitedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, plus limits: sizes built by ``*`` and ``**``, and a time limit per
    rule checked at every attribute, item and call (``range(10**9)``, ``'x' * 10**9`` end in an error). The
    time is the evaluating thread's CPU time, so a rule is never failed by the machine being busy elsewhere."""

    intercepted_binops = frozenset({"*", "**"})
    _deadline = threading.local()

    def start(self) -> None:
        self._deadline.t = time.thread_time() + RULE_SECONDS

    def _tick(self) -> None:
        t = getattr(self._deadline, "t", None)
        if t is not None and time.thread_time() > t:
            raise SecurityError(f"the expression ran past its limit of {RULE_SECONDS:g} s of CPU time")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self._tick()
        if operator == "**":
            if isinstance(right, int | float) and abs(right) > 64:
                raise SecurityError(f"exponent {right} is past the limit of 64")
            return left ** right
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(n, int) and len(seq) * n > MAX_SIZE:
                raise SecurityError(f"`*` would build {len(seq) * n} items, past the limit of {MAX_SIZE}")
        return left * right

    def getattr(self, obj: Any, attribute: str) -> Any:
        self._tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self._tick()
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja's signature
        __self._tick()
        return super().call(__context, __obj, *args, **kwargs)


def regex_search(value: Any, pattern: str) -> Any:
    """``text | regex_search('…')``: the first match's groups (a list), the match itself when it has none,
    or None."""
    m = re.search(pattern, str(value))
    if m is None:
        return None
    return list(m.groups()) if m.groups() else m.group(0)


# filters for fix templates (commands are shell lines: every value from the host goes through `quote`)
FILTERS = {"quote": shlex.quote, "shjoin": shlex.join, "regex_search": regex_search}

_ENV = LimitedSandbox(undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_LENIENT = LimitedSandbox(undefined=Undefined, trim_blocks=True, lstrip_blocks=True)
for _env in (_ENV, _LENIENT):
    _env.filters.update(FILTERS)


# Each rule's text compiled once per process (compiling is most of a rule's cost, and every host's facts, every
# run and every replay evaluates the same rules); a compiled template holds no state of a rendering.
@lru_cache(maxsize=4096)
def _expression(text: str) -> Any:
    return _ENV.compile_expression(text)


@lru_cache(maxsize=4096)
def _strict(text: str) -> Any:
    return _ENV.from_string(text)


@lru_cache(maxsize=4096)
def _lenient(text: str) -> Any:
    return _LENIENT.from_string(text)


def _templates(h: Hypothesis, n: int) -> list[tuple[str, str | None, str]]:
    """(field path, text, expr or tmpl) of every Jinja text of a hypothesis."""
    out: list[tuple[str, str | None, str]] = []
    for m, r in enumerate(h.rules):
        where = f"hypotheses[{n}] ({h.id}).rules[{m}]"
        out += [(f"{where}.when", r.when, "expr"), (f"{where}.foreach", r.foreach, "expr"),
                (f"{where}.because", r.because, "tmpl")]
        fx = r.experiment.fix if r.experiment else None
        if fx:
            out += [(f"{where}.experiment.fix.text", fx.text, "tmpl")]
            out += [(f"{where}.experiment.fix.commands[{i}]", c, "tmpl") for i, c in enumerate(fx.commands)]
    if h.fix:
        out += [(f"hypotheses[{n}] ({h.id}).fix.text", h.fix.text, "tmpl")]
        out += [(f"hypotheses[{n}] ({h.id}).fix.commands[{i}]", c, "tmpl") for i, c in enumerate(h.fix.commands)]
    return out


def _compile_all(pb: Playbook, file: str) -> None:
    for n, h in enumerate(pb.hypotheses):
        for field, text, kind in _templates(h, n):
            if text is None:
                continue
            try:
                if kind == "expr":
                    _expression(text)
                else:
                    _strict(text)
            except TemplateError as exc:
                raise PlaybookError(f"bad Jinja {('expression' if kind == 'expr' else 'template')}: {exc}",
                                    file=file, field=field,
                                    fix="rules use Jinja2 expressions, e.g. `server.flags.get('disable-cuda-graph')`") from exc


def builtin_playbooks() -> list[str]:
    return sorted(p.stem for p in Path(str(resources.files("debugagent.playbooks"))).glob("*.yaml"))


def load_playbook(ref: str | None) -> Playbook:
    p = resolve_yaml_ref(ref or "gpu-inference-regression", Path(str(resources.files("debugagent.playbooks"))), PlaybookError,
                         "playbook", "debugagent playbook list")
    return parse_playbook(read_yaml_file(p, PlaybookError, "playbook", "debugagent playbook list"), str(p))


def parse_playbook(text: str, file: str = "<playbook>") -> Playbook:
    data = load_yaml_mapping(text, file, PlaybookError, "version: 1, name: …, hypotheses: […]")
    try:
        pb = Playbook.model_validate(data)
    except ValidationError as exc:
        where, field, msg, fix = explain_validation(exc, text, file)
        raise PlaybookError(msg, file=where, field=field, fix=fix) from exc
    _compile_all(pb, file)
    pb.source = file
    pb.digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    PARSED[pb.digest] = pb
    return pb


# the playbooks parsed in this process, by digest: a recording names its playbook's digest, so its fixes are
# rendered from the very playbook it ran (``fixes.playbook_of``)
PARSED: dict[str, Playbook] = {}


# ---------------------------------------------------------------- validation messages
def _untagged(loc: tuple) -> tuple[tuple, dict[int, str]]:
    """``loc`` without the kind a discriminated union inserts after ``experiment`` (as the YAML has it), and
    the kind at each place it was."""
    out: list[Any] = []
    tags: dict[int, str] = {}
    for i, part in enumerate(loc):
        if i and loc[i - 1] == "experiment" and part in KINDS:
            tags[len(out)] = str(part)
            continue
        out.append(part)
    return tuple(out), tags


def _model_at(loc: tuple, tags: dict[int, str] | None = None) -> type[BaseModel] | None:
    """The pydantic model that holds the last key of ``loc`` (walking lists, optionals and, by ``tags``, the
    experiment's kind)."""
    cls: Any = Playbook
    for i, part in enumerate(loc[:-1]):
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(part) if isinstance(cls, type) and issubclass(cls, BaseModel) else None
        if field is None:
            return None
        if part == "experiment" and issubclass(cls, Rule):
            kind = KINDS.get((tags or {}).get(i + 1, ""))
            cls = kind.spec if kind else None
            continue
        ann = field.annotation
        while typing.get_origin(ann) is not None:
            ann = next((a for a in typing.get_args(ann) if a is not type(None)), None)
        cls = ann
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _mark(text: str, loc: tuple) -> tuple[int, int] | None:
    """(line, column), 1-based, of the key ``loc`` names in the YAML text (its parent when it is missing)."""
    try:
        node: Any = yaml.compose(text)
    except yaml.YAMLError:
        return None
    mark = node.start_mark if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
            if hit is None:
                break
            mark, node = hit[0].start_mark, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            mark = node.start_mark
        else:
            break
    return (mark.line + 1, mark.column + 1) if mark is not None else None


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def explain_validation(exc: ValidationError, text: str, file: str) -> tuple[str, str, str, str]:
    """(file:line:column, field path, message, fix) for the most useful problem: an unknown key first
    (with a did-you-mean), since a misspelt key also makes the right one look missing."""
    errors = exc.errors()
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc, tags = _untagged(tuple(e["loc"]))
    msg = e["msg"].removeprefix("Value error, ")
    fix = "`debugagent playbook schema` prints the JSON Schema"
    if e["type"] == "extra_forbidden":
        key = str(loc[-1])
        model = _model_at(loc, tags)
        known = sorted(model.model_fields) if model else []
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        msg = f"unknown key `{key}`" + (f"; did you mean `{close[0]}`?" if close else "")
        fix = (f"rename `{key}:` to `{close[0]}:`" if close else f"the keys allowed here: {', '.join(known)}") if known else fix
    elif e["type"] == "missing":
        msg = f"`{loc[-1]}` is required here"
    elif e["type"] == "union_tag_not_found":
        msg = "`kind` is required here"
    elif e["type"] == "union_tag_invalid":
        tag = str((e.get("ctx") or {}).get("tag", ""))
        close = difflib.get_close_matches(tag, list(KINDS), n=1)
        msg = f"unknown experiment kind `{tag}`" + (f"; did you mean `{close[0]}`?" if close else "")
        fix = f"the kinds: {', '.join(KINDS)}"
    at = _mark(text, loc)
    where = f"{file}:{at[0]}:{at[1]}" if at else file
    return where, _path(loc), msg, fix


# ---------------------------------------------------------------- evaluation
class Finding(BaseModel):
    verdict: Verdict
    because: str
    rule: int
    experiment: dict[str, Any] | None = None


def _render(value: Any, ctx: dict[str, Any]) -> Any:
    if isinstance(value, str) and "{{" in value:
        return _lenient(value).render(**ctx).strip()
    if isinstance(value, dict):
        return {(_render(k, ctx) if isinstance(k, str) else k): _render(v, ctx) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, ctx) for v in value]
    return value


def evaluate(h: Hypothesis, facts: dict[str, Any], file: str = "") -> list[Finding]:
    """Apply a hypothesis' rules to the facts. Errors in a rule name the rule; they never pass silently."""
    strong: list[Finding] = []
    weak: Finding | None = None
    for m, r in enumerate(h.rules):
        where = f"{h.id}.rules[{m}]"
        try:
            _ENV.start()
            _LENIENT.start()
            items = [None]
            if r.foreach:
                items = list(_expression(r.foreach)(**facts) or [])
            for item in items:
                ctx = dict(facts, item=item) if r.foreach else facts
                if not _expression(r.when)(**ctx):
                    continue
                # a loop's separator left after its last item (`x16; `) is not part of the sentence
                because = _lenient(r.because).render(**ctx).strip().rstrip(";, ")[:MAX_TEXT]
                exp = None
                if r.experiment:
                    # the fix stays a template: it reads the run's results, rendered by the report (``render_fix``)
                    spec = r.experiment.dump()
                    fix = spec.pop("fix", None)
                    exp = _render(spec, ctx) | ({"fix": fix} if fix else {})
                f = Finding(verdict=r.verdict, because=because, rule=m, experiment=exp)
                if r.verdict in ("suspect", "confirmed"):
                    strong.append(f)
                elif weak is None:
                    weak = f
            if weak is not None:
                break
        except (TemplateError, ArithmeticError, TypeError, ValueError, LookupError, AttributeError, RecursionError,
                MemoryError) as exc:
            raise PlaybookError(f"rule failed on this host's facts: {type(exc).__name__}: {exc}", file=file, field=where,
                                fix="guard the rule, e.g. `server is not none and …`; rules may not build more than "
                                    f"{MAX_SIZE} items or run past {RULE_SECONDS:g} s of CPU time") from exc
    if strong:
        return strong
    return [weak] if weak else [Finding(verdict="inconclusive", because="no rule matched", rule=-1)]


def render_fix(fix: FixTemplate, ctx: dict[str, Any], where: str = "", file: str = "") -> tuple[str, list[str]]:
    """A fix template rendered in the rules' sandbox: its text, and its commands that render to something."""
    try:
        _LENIENT.start()
        text = _lenient(fix.text).render(**ctx).strip()[:MAX_TEXT]
        commands = [c for c in (_lenient(t).render(**ctx).strip() for t in fix.commands) if c]
    except (TemplateError, ArithmeticError, TypeError, ValueError, LookupError, AttributeError, RecursionError,
            MemoryError) as exc:
        raise PlaybookError(f"fix failed on this run's facts: {type(exc).__name__}: {exc}", file=file, field=where,
                            fix="guard the template, e.g. `{% if experiment %}…{% endif %}`") from exc
    return text, commands


def render_tree(pb: Playbook) -> str:
    lines = [f"{pb.name} (version {pb.version}): {pb.description.strip().splitlines()[0] if pb.description else ''}"]
    for i, hid in enumerate(pb.order(), 1):
        h = pb.get(hid)
        lines.append(f"{i}. {h.id}: {h.title}  [cost {h.cost}; checks: {', '.join(h.checks) or '-'}; "
                     f"evidence: {', '.join(h.evidence) or '-'}]")
        for r in h.rules:
            exp = f"  -> experiment {r.experiment.kind}" if r.experiment else ""
            each = f" for each item in {r.foreach}" if r.foreach else ""
            lines.append(f"     {r.verdict:<12} when {r.when}{each}{exp}")
    return "\n".join(lines)


def new_playbook(path: str) -> None:
    p = Path(path)
    if p.exists():
        raise PlaybookError("file exists; not overwriting", file=path, fix="choose a new path")
    src = Path(str(resources.files("debugagent.playbooks"))) / "gpu-inference-regression.yaml"
    text = src.read_text().replace("name: gpu-inference-regression", f"name: {p.stem}", 1)
    p.write_text("# Started from the default playbook. Validate: debugagent playbook validate " + path + "\n" + text)
