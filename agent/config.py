"""A run's configuration, declared once: ``RunConfig``.

Each field declares its flag (``Flag``: the option names, the metavar, whether the recording keeps it), its
help (the field's description), its default and its bounds (``ge``/``le``/``gt``). From these:

::

    RunConfig ──► debugagent run's options     (agent/cli.py, ``cli.options_of``: names, help, defaults, bounds)
              ──► run.json                     (``saved``: the model_dump, plus the run id)
              ──► run_started's ``inputs``     (``recorded_inputs``: the fields whose ``Flag`` says ``recorded``)
    run.json  ──► RunConfig                    (``from_saved``: what resume and undo read back; an older file,
                                                without the fields added since, gets their defaults)

The flags ``debugagent resume`` takes again (``--allow-mutations``, ``--json``, ``--bench``, ``--llm``,
``--force-unlock``) are these fields too, with their own help.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeGuard

from debugagent.tools.errors import UsageError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .symptom import Direction, direction_flag

REPRODUCE_RUNS = 12     # the most; the reproduce step stops at 3 when the answer is clear
READY_TIMEOUT_S = 600.0
CONNECT_TIMEOUT_S = 10.0
LLM_MODEL = "gpt-4o-mini"


@dataclass(frozen=True)
class Flag:
    """A field's command-line option: its names (the long one first), its metavar, and whether the recording's
    ``run_started`` ``inputs`` keep it (``True``: as given; a function: what it makes of the value, e.g. ``bool``
    for a URL that may hold a secret)."""

    names: tuple[str, ...]
    metavar: str | None = None
    recorded: bool | Callable[[Any], Any] = False

    @property
    def name(self) -> str:
        return self.names[0]


def flag(*names: str, metavar: str | None = None, recorded: bool | Callable[[Any], Any] = False) -> Flag:
    return Flag(names, metavar, recorded)


def when_given(value: Any) -> Any:
    """``recorded=when_given``: kept as given, and only when given (a field added after the kept recordings, whose
    headers do not name it: a run without it records the same inputs as they do)."""
    return value


class SSHOptions(BaseModel):
    """How to reach the host (``run.json``'s ``ssh``): the SSH login, and the container on it commands run in."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    identity_file: Annotated[str | None, flag("--identity-file", "-i", metavar="KEY")] = Field(
        default=None, description="private key file for SSH")
    known_hosts: Annotated[str | None, flag("--known-hosts", metavar="FILE")] = Field(
        default=None, description="known_hosts file in place of the user's (default: the files ssh reads, as ssh -G names them)")
    accept_new_host_key: Annotated[bool, flag("--accept-new-host-key")] = Field(
        default=False, description="record an unknown host key (as OpenSSH's accept-new); a changed key is always refused")
    connect_timeout: Annotated[float, flag("--connect-timeout", metavar="SECONDS")] = Field(
        default=CONNECT_TIMEOUT_S, gt=0, description="seconds to wait for the SSH connection")
    container: Annotated[str | None, flag("--container", metavar="NAME")] = Field(
        default=None, description="run every command in this container on the host (SSH or local): NAME (docker), "
                          "podman:NAME, k8s:NAMESPACE/POD[/CONTAINER] or nsenter:PID")


class RunConfig(BaseModel):
    """What ``debugagent run`` was asked, as ``run.json`` saves it."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    host: Annotated[str, flag("--host", metavar="HOST")] = Field(
        description="the host: user@host[:port], an ~/.ssh/config alias, `local`, or sim:NAME")
    symptom: Annotated[str, flag("--symptom", metavar="'METRIC VALUE UNIT'")] = Field(
        description="what got worse: `verify 30ms`, `decode 82 tok/s`, `ttft 1.2 s`")
    baseline: Annotated[str | None, flag("--baseline", metavar="'METRIC VALUE UNIT'")] = Field(
        default=None, description="what it was when good: `verify 20ms`")
    baseline_snapshot: Annotated[str | None, flag("--baseline-snapshot", metavar="FILE")] = Field(
        default=None, description="a snapshot of the good state (debugagent snapshot)")
    peer: Annotated[str | None, flag("--peer", metavar="HOST", recorded=when_given)] = Field(
        default=None, description="a healthy peer of the host (same model, same benchmark), read now and never changed: "
                          "its snapshot is the baseline snapshot and its benchmark runs, alternating with the host's, "
                          "the baseline's numbers (in place of --baseline)")
    playbook: Annotated[str | None, flag("--playbook", metavar="NAME|FILE")] = Field(
        default=None, description="playbook name or YAML path (default gpu-inference-regression)")
    bench: Annotated[str | None, flag("--bench", metavar="CMD", recorded=True)] = Field(
        default=None, description="benchmark command printing METRIC=VALUE UNIT")
    repo: Annotated[str | None, flag("--repo", metavar="DIR", recorded=True)] = Field(
        default=None, description="the server's git checkout on the host")
    python: Annotated[str | None, flag("--python", metavar="PATH", recorded=True)] = Field(
        default=None, description="the server's Python interpreter on the host")
    allow_mutations: Annotated[bool, flag("--allow-mutations", "--yes", "-y", recorded=True)] = Field(
        default=False, description="run experiments (each undone afterwards) without asking (--yes is the same)")
    read_only: Annotated[bool, flag("--read-only")] = Field(
        default=False, description="run no experiment, on any host: the suspects are named with the experiment that "
                          "would decide each (without a terminal to ask, a real host needs this or --allow-mutations)")
    as_json: Annotated[bool, flag("--json")] = Field(default=False, description="print one JSON object on stdout")
    out: Annotated[str | None, flag("--out", "-o", metavar="DIR")] = Field(
        default=None, description="run folder (default $XDG_STATE_HOME/debugagent/runs/<UTC time>-<slug>/, ~/.local/state "
                          "when unset)")
    llm: Annotated[str | None, flag("--llm", metavar="URL", recorded=bool)] = Field(
        default=None, description="OpenAI-compatible base URL of an LLM that advises on the plan (optional)")
    llm_model: Annotated[str, flag("--llm-model", metavar="NAME")] = Field(default=LLM_MODEL, description="model name for --llm")
    llm_insecure: Annotated[bool, flag("--llm-insecure")] = Field(
        default=False, description="send the API key to an --llm URL over plain http (by default only https or loopback)")
    server_pattern: Annotated[str | None, flag("--server-pattern", metavar="REGEX", recorded=True)] = Field(
        default=None, description="regex for the server's command line (default: SGLang, vLLM, TGI, TensorRT-LLM)")
    bench_regex: Annotated[str | None, flag("--bench-regex", metavar="REGEX", recorded=True)] = Field(
        default=None, description="regex whose group 1 is the metric in the benchmark's output")
    reproduce_runs: Annotated[int, flag("--reproduce-runs", metavar="N", recorded=True)] = Field(
        default=REPRODUCE_RUNS, ge=2, description="most benchmark runs to reproduce the regression (3 when clear; no "
                                          "upper limit: an undecided step names the N it needs)")
    min_reproduce_runs: Annotated[int | None, flag("--min-reproduce-runs", metavar="N", recorded=when_given)] = Field(
        default=None, ge=2, description="fewest benchmark runs of the host as found, even once the answer is clear: "
                                "every experiment compares with them, one that restarts the server with them alone "
                                "(default 3, or 2 with a baseline snapshot; raises --reproduce-runs to N where that is "
                                "lower; an experiment left undecided by too few of them names the N that would do)")
    max_runs: Annotated[int | None, flag("--max-runs", metavar="N", recorded=True)] = Field(
        default=None, ge=3, description="most benchmark runs per experiment (default: a budget from the noise and the "
                                "regression)")
    code_root: Annotated[str | None, flag("--code-root", metavar="DIR", recorded=True)] = Field(
        default=None, description="the folder inside the checkout the server imports its code from (default: found from "
                          "its cwd, PYTHONPATH, .pth or editable finder)")
    wheelhouse: Annotated[str | None, flag("--wheelhouse", metavar="DIR", recorded=True)] = Field(
        default=None, description="a folder of wheels (or one .whl) on the host holding the baseline builds, for the "
                          "package experiment")
    restart_cmd: Annotated[str | None, flag("--restart-cmd", metavar="CMD", recorded=True)] = Field(
        default=None, description="command that restarts the server on the host (systemd, container, supervisor); gets "
                          "DEBUGAGENT_ARGV, DEBUGAGENT_CWD, DEBUGAGENT_SET_ENV, DEBUGAGENT_UNSET_ENV, "
                          "DEBUGAGENT_PYTHONPATH_FIRST, DEBUGAGENT_PHASE")
    ready_timeout: Annotated[float, flag("--ready-timeout", metavar="SECONDS", recorded=True)] = Field(
        default=READY_TIMEOUT_S, ge=1.0, description="seconds to wait for a restarted server to be ready")
    shadow_gpus: Annotated[str | None, flag("--shadow-gpus", metavar="LIST", recorded=when_given)] = Field(
        default=None, description="shadow experiments: instead of restarting the server, start a changed copy and an "
                          "unchanged one beside it on these GPUs (CUDA_VISIBLE_DEVICES, e.g. `4,5`) and measure them in "
                          "turn; the server itself is never stopped (needs --shadow-port)")
    shadow_port: Annotated[int | None, flag("--shadow-port", metavar="N", recorded=when_given)] = Field(
        default=None, ge=1, le=65534, description="the changed copy's port (the unchanged copy's is N+1); both must be "
                                           "free (needs --shadow-gpus)")
    allow_container_recreate: Annotated[bool, flag("--allow-container-recreate", recorded=when_given)] = Field(
        default=False, description="where the server is a docker or podman container's main process, an experiment "
                          "recreates the container from its own inspect with only the change (with consent, as any "
                          "experiment), and the undo puts the very container back; without it the commands are printed")
    force_unlock: Annotated[bool, flag("--force-unlock")] = Field(
        default=False, description="take over the host's lock left by a run that is gone (a stale lock)")
    higher_is_better: Annotated[bool, flag("--higher-is-better")] = Field(
        default=False, description="the metric is better when higher (for a unit debugagent does not know)")
    lower_is_better: Annotated[bool, flag("--lower-is-better")] = Field(
        default=False, description="the metric is better when lower (for a unit debugagent does not know)")
    ssh: SSHOptions = Field(default_factory=SSHOptions)

    # ------------------------------------------------------------ the outputs made from it
    @property
    def direction(self) -> Direction | None:
        """``higher``, ``lower`` or None (from the units); both flags given is exit 2."""
        return direction_flag(self.higher_is_better, self.lower_is_better)

    def recorded_inputs(self) -> dict[str, Any]:
        """The recording's ``run_started`` ``inputs``: what a replay needs to ask the same (no secret: ``--llm``
        is kept as whether one was given)."""
        d: dict[str, Any] = {}
        for name, f in type(self).model_fields.items():
            fl = flag_of(f.metadata)
            if fl is not None and fl.recorded:
                value = getattr(self, name)
                if fl.recorded is when_given and (value is None or value is False):
                    continue
                d[name] = fl.recorded(value) if callable(fl.recorded) else value
        d["direction"] = self.direction
        return d

    def saved(self, run_id: str) -> dict[str, Any]:
        """``run.json`` (written redacted by the session)."""
        return {**self.model_dump(mode="json"), "run_id": run_id}

    @classmethod
    def from_saved(cls, data: Any) -> tuple[RunConfig, str | None]:
        """``run.json`` read back: the configuration and the run id; a ``ValueError`` when it is no run.json."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a JSON object expected, not {type(data).__name__}")
        d = dict(data)
        run_id = d.pop("run_id", None)
        return cls.model_validate(d), run_id if isinstance(run_id, str) else None

    @classmethod
    def from_flags(cls, values: Mapping[str, Any]) -> RunConfig:
        """The configuration from the command line's values (named as the fields, the SSH options among them
        flat); a value out of its bounds is exit 2 naming its flag."""
        nested = {name for name, f in cls.model_fields.items() if is_model(f.annotation)}
        d: dict[str, Any] = {k: v for k, v in values.items() if k not in nested}
        for name in nested:
            sub = cls.model_fields[name].annotation
            inner = {k: d.pop(k) for k in list(d) if k in sub.model_fields}   # type: ignore[union-attr]
            d[name] = inner
        try:
            return cls.model_validate(d)
        except ValidationError as exc:
            raise usage_error(cls, exc) from None


# ---------------------------------------------------------------- the fields' flags
def flag_of(metadata: list[Any]) -> Flag | None:
    return next((m for m in metadata if isinstance(m, Flag)), None)


def is_model(annotation: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def bounds(metadata: list[Any]) -> dict[str, float]:
    """A field's bounds as ``ge``/``le``/``gt``/``lt`` (from its ``Field``)."""
    out: dict[str, float] = {}
    for m in metadata:
        for k in ("ge", "le", "gt", "lt"):
            if getattr(m, k, None) is not None:
                out[k] = getattr(m, k)
    return out


def flag_fields(model: type[BaseModel]) -> dict[str, tuple[Any, Any, Flag]]:
    """Every field that has a flag, nested models' fields flat: name -> (annotation, FieldInfo, Flag)."""
    out: dict[str, tuple[Any, Any, Flag]] = {}
    for name, f in model.model_fields.items():
        if is_model(f.annotation):
            out.update(flag_fields(f.annotation))
            continue
        fl = flag_of(f.metadata)
        if fl is not None:
            out[name] = (f.annotation, f, fl)
    return out


def range_text(b: Mapping[str, float]) -> str:
    lo = f"at least {b['ge']:g}" if "ge" in b else f"more than {b['gt']:g}" if "gt" in b else ""
    hi = f"at most {b['le']:g}" if "le" in b else f"less than {b['lt']:g}" if "lt" in b else ""
    return " and ".join(x for x in (lo, hi) if x)


RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def usage_error(model: type[BaseModel], exc: ValidationError) -> UsageError:
    """A validation error as exit 2 naming the flag, the value and the range."""
    fields = flag_fields(model)
    e = exc.errors()[0]
    name = str(e["loc"][-1]) if e["loc"] else ""
    if name not in fields:
        return UsageError(f"the run's configuration: {e['msg']} ({'.'.join(map(str, e['loc']))})",
                          fix="see `debugagent run --help`")
    _, info, fl = fields[name]
    b = range_text(bounds(info.metadata))
    if b and e["type"] in RANGE_ERRORS:
        return UsageError(f"{fl.name} {e.get('input')!r}: must be {b}", fix=f"give {fl.name} a value {b}")
    return UsageError(f"{fl.name} {e.get('input')!r}: {e['msg']}", fix=f"see `debugagent run --help` for {fl.name}")
