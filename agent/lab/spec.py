"""What an experiment kind is: the spec model a playbook writes (``experiment: {kind: …}``), and the
class that applies it. ``registry`` builds the kinds' table and the playbook's union from these.

A kind declares:

- ``spec``: its pydantic model (``kind`` a one-value ``Literal``; fields that may hold ``{{ … }}``
  templates are text, rendered on the host's facts when a rule matches);
- ``restarts``: whether it restarts the server (the lab then controls a recovery with a plain restart,
  and budgets the restarted server's warm-up run);
- ``fresh``: whether the reference state is re-measured just before the change (a change nothing
  re-measures the reference after: no restart to control it by, no worktree to interleave with);
  ``fresh_first`` False when the kind asks for it itself, once it knows (``Lab.reference``);
- ``apply``: the change and its measurement. Every change is preceded by its undo step
  (``Lab.push_undo``: journalled in the run folder and on the host), which the lab runs, newest
  first, after ``apply`` returns or raises: that is how a kind is undone;
- ``evidence_rank``: how strong the evidence behind such an experiment is, for the order they run in;
- ``fix``: the default fix template, when the playbook's experiment gives none (``fixes.py``
  renders it in the playbook's sandbox).
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from debugagent.tools.snapshot import Change
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from ..evidence import EvidenceGlob, evidence_matches, glob_matches_some_path

if TYPE_CHECKING:
    from debugagent.tools.registry import Runner

    from ..facts import LabFacts
    from ..results import ExperimentResult
    from .lab import Lab


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FixTemplate(Strict):
    """How to make a confirmed cause's fix permanent: a sentence and the commands, Jinja2 templates rendered
    in the playbook's sandbox on what the run saw (``fixes.py`` names the variables). A text that renders
    empty gives no fix here (the next template is tried); a command that renders empty is left out."""

    text: str
    commands: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _text_alone(cls, v: Any) -> Any:
        return {"text": v} if isinstance(v, str) else v


def _scalar_as_text(v: Any) -> Any:
    return str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v


Text = Annotated[str, BeforeValidator(_scalar_as_text)]   # a value or a `{{ … }}` template; a number is its text


def is_template(v: str) -> bool:
    return "{{" in v


# the fields of the one experiment model of earlier playbooks, at their defaults
LEGACY_DEFAULTS: dict[str, Any] = {"to": None, "bisect": True, "set_flags": {}, "unset_flags": [], "set_env": {},
                                   "unset_env": [], "gpu": None, "watts": None, "governor": None, "package": None,
                                   "paths": None}


class ExperimentSpec(Strict):
    """Fields every kind has. ``fix`` stays a template until the report renders it (it reads the run's
    results, which a rule cannot see)."""

    kind: str
    title: str = ""
    fix: FixTemplate | None = None

    @model_validator(mode="before")
    @classmethod
    def _fields_of_other_kinds(cls, data: Any) -> Any:
        """A field of another kind is refused by name (``paths`` on a governor). Before each kind had its own
        model, one model held every kind's fields: a playbook written then may carry the others at their
        defaults (``to: null``, ``bisect: true``), and those are dropped."""
        if not isinstance(data, dict):
            return data
        from .registry import KINDS
        out = dict(data)
        for key, value in data.items():
            if key in cls.model_fields:
                continue
            owners = [k for k, c in KINDS.items() if key in c.spec.model_fields]
            if not owners:
                continue   # an unknown key: refused as one, with a did-you-mean
            if key in LEGACY_DEFAULTS and value == LEGACY_DEFAULTS[key]:
                del out[key]
                continue
            raise ValueError(f"`{key}` applies to {', '.join(owners)}, not to {data.get('kind')}")
        return out

    def needs(self, *names: str) -> None:
        """Each field a kind needs is there (a template counts: it is rendered on the host's facts)."""
        for name in names:
            if getattr(self, name) in (None, ""):
                raise ValueError(f"experiment kind {self.kind} needs `{name}`")

    def typed(self, *fields: tuple[str, Any, str]) -> None:
        """Each (field, conversion, what) not a template converts: ``watts`` a number, ``gpu`` an index."""
        for name, conv, what in fields:
            v = getattr(self, name)
            if v is not None and not is_template(v):
                try:
                    conv(v)
                except ValueError:
                    raise ValueError(f"`{name}: {v!r}` is not {what} (or a `{{{{ … }}}}` template)") from None

    def dump(self) -> dict[str, Any]:
        """The spec as the run carries it (state, events): its fields, ``fix`` only when given."""
        d = self.model_dump()
        if d.get("fix") is None:
            d.pop("fix", None)
        return d


class RestoreSpec(ExperimentSpec):
    """A kind that puts back baseline changes: those under ``area`` that its ``paths`` globs match."""

    area: ClassVar[str]   # the changes it can put back, e.g. ``server.args.*`` (its `paths` default)
    paths: list[EvidenceGlob] | None = None

    @model_validator(mode="after")
    def _paths_in_area(self) -> RestoreSpec:
        if self.paths is not None:
            if not self.paths:
                raise ValueError("`paths: []` would put nothing back; name a glob or leave `paths` out (the whole area)")
            under = self.area.removesuffix("*")
            for g in self.paths:
                if not glob_matches_some_path(g, under):
                    raise ValueError(f"{self.kind} puts back changes under `{under}*`; `{g}` matches none of them")
        return self

    def restored(self, changes: list[Any]) -> list[Any]:
        """The baseline changes it puts back: those in its area that match its ``paths`` globs (by default,
        the whole area), editable packages left out (a build cannot put back source)."""
        globs = [self.area] if self.paths is None else self.paths
        under = self.area.removesuffix("*")
        out = []
        for c in changes:
            ch = c if isinstance(c, Change) else Change.model_validate(c)
            if ch.path.startswith(under) and not ch.editable and any(evidence_matches(g, ch) for g in globs):
                out.append(c)
        return out


class Kind:
    """One experiment kind (see the module's docstring); subclasses set the class attributes and ``apply``."""

    spec: ClassVar[type[ExperimentSpec]]
    restarts: ClassVar[bool] = False
    fresh: ClassVar[bool] = False
    fresh_first: ClassVar[bool] = True
    fix: ClassVar[FixTemplate | None] = None
    # its fix is the restart it made, so the causes it confirmed with others of the same are fixed by one restart
    fixed_by_restart: ClassVar[bool] = False

    @classmethod
    def name(cls) -> str:
        return typing.get_args(cls.spec.model_fields["kind"].annotation)[0]

    @classmethod
    def evidence_rank(cls, spec: dict[str, Any], baseline_head: str | None) -> int:
        """How strong the evidence that chose this experiment is (``verdicts.evidence_rank``): 0, a difference from
        the baseline snapshot or a value known to cost performance; 1, weaker evidence."""
        return 0

    def apply(self, lab: Lab, r: Runner, spec: Any, facts: LabFacts, bad: list[float],
              regression: float | None) -> ExperimentResult:
        raise NotImplementedError
