"""The experiment kinds: one class per kind (``kinds/``), and what is built from them: the table the lab runs
them by, and the union of their spec models that a playbook's ``experiment:`` is validated against.

A new kind is a module under ``kinds/`` with its spec model and its ``Kind`` class, named in ``ALL`` below."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field

from .kinds.clocks import ClockReset
from .kinds.code import CodeRevert
from .kinds.knobs import Governor, PowerLimit
from .kinds.package import PackageRestore
from .kinds.restart import RestoreBaselineEnv, RestoreBaselineFlags, ServerRestart
from .spec import ExperimentSpec, Kind

ALL: tuple[type[Kind], ...] = (CodeRevert, ServerRestart, RestoreBaselineFlags, RestoreBaselineEnv, PowerLimit, ClockReset,
                               Governor, PackageRestore)

KINDS: dict[str, type[Kind]] = {k.name(): k for k in ALL}

# a playbook's experiment: the kind's own model, chosen by `kind` (built from ALL at run time; a type checker
# sees the base model every kind's spec derives from)
if TYPE_CHECKING:
    Experiment = ExperimentSpec
else:
    Experiment = Annotated[Union[tuple(k.spec for k in ALL)], Field(discriminator="kind")]  # noqa: UP007


def kind_of(spec: dict[str, Any] | ExperimentSpec | None) -> type[Kind] | None:
    """The kind class of a spec (a dict as the run carries it, or a model); None when there is none or it is unknown."""
    if spec is None:
        return None
    name = spec.kind if isinstance(spec, ExperimentSpec) else spec.get("kind")
    return KINDS.get(str(name))
