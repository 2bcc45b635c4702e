"""Scenario files, format version 1: one simulated host in a good and a bad state.

``host`` is the bad state as the agent finds it; the good state is ``host`` with every
factor at its ``good`` value. Validation is strict: an unknown key, or a factor whose
path matches nothing, is a ``ScenarioError`` naming the file and the field.
"""

from __future__ import annotations

import copy
import os
import random
import re
from collections.abc import Callable
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from ..errors import ScenarioError
from ..yamlfile import describe_validation, line_of, load_yaml_mapping, read_yaml_file, resolve_yaml_ref

Scalar = str | int | float | bool | None


def python_entry(argv: list[str]) -> tuple[str, str] | None:
    """How a python command line reaches its code: ("module", M) for ``-m M``, ("script", PATH) for the first
    argument that is no interpreter option; None for ``-c`` or no program (the interactive prompt)."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-m" and i + 1 < len(argv):
            return ("module", argv[i + 1])
        if a.startswith("-m") and len(a) > 2:
            return ("module", a[2:])
        if a.startswith("-c"):
            return None
        if a in ("-X", "-W", "--check-hash-based-pycs"):
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return ("script", a)
    return None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _quoted(v: Any) -> Any:
    """Version strings must be strings: a bare YAML number (``2.9``, ``13``) loses digits (``2.10`` reads as 2.1)."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        raise ValueError(f"`{v}` is a bare YAML number; quote it (\"{v}\") so it stays a version string")
    return v


# A hypothesis id as a plain word; which ids exist is the playbook's to say (a test checks the
# built-in scenarios against the default playbook).
HypothesisId = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")]


class Expect(Strict):
    root_cause: HypothesisId | None
    mentions: str | list[str] | None = None
    also: list[HypothesisId] = Field(default_factory=list)


class Driver(Strict):
    version: str
    cuda: str
    installed_at: datetime | None = None  # extension: mtime of the user-space driver library

    _q = field_validator("version", "cuda", mode="before")(_quoted)


class Gpu(Strict):
    name: str = "NVIDIA H200"
    memory_mib: int = 143771
    sm_clock: int = 1980
    sm_clock_max: int = 1980
    mem_clock: int = 3201
    power_draw: float = 430
    power_limit: float = 700
    power_limit_max: float = 700
    temperature: int = 51
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    event_reasons: list[str] = Field(default_factory=list)
    reset_required: bool = False
    locked_sm_clock: int | None = None  # `nvidia-smi -lgc MIN,MAX` (MAX); `-rgc` clears it
    locked_sm_clock_min: int | None = None  # its MIN (where an idle GPU sits); default: MAX
    locked_mem_clock: int | None = None  # `nvidia-smi -lmc MIN,MAX` (MAX); `-rmc` clears it
    locked_mem_clock_min: int | None = None


class PackageSpec(Strict):
    version: str
    module: str | None = None
    build: str | None = None
    installed_at: datetime | None = None
    editable: str | None = None
    has_version_attr: bool = True

    _q = field_validator("version", mode="before")(_quoted)


class Wheel(Strict):
    """A wheel the host's wheelhouse holds: ``pip install --no-index --find-links DIR`` can install it."""

    dist: str
    version: str
    build: str | None = None

    _q = field_validator("version", mode="before")(_quoted)


class Wheelhouse(Strict):
    path: str = "/root/wheelhouse"
    wheels: list[Wheel] = Field(default_factory=list)


class Environment(Strict):
    """Distributions beyond ``packages``, as a container image has them (one install time shared)."""

    extra: int = 200
    installed_at: datetime | None = None


class CommitSpec(Strict):
    sha: str
    subject: str
    date: datetime | None = None

    @field_validator("sha", mode="before")
    @classmethod
    def _label(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v  # `sha: 3207427` reads as a YAML number


class Repo(Strict):
    path: str
    commits: list[CommitSpec]
    moved_at: datetime | None = None
    package: str | None = Field(default=None, description="the import name of the package the repository holds "
                                "(default: the editable install in it, else the server's `-m` package, else sglang)")
    package_dir: str | None = Field(default=None, description="its folder in the repository, relative (default: where "
                                    "the editable install points, else the top; `python` for the default sglang)")

    @field_validator("commits")
    @classmethod
    def _nonempty(cls, v: list[CommitSpec]) -> list[CommitSpec]:
        if not v:
            raise ValueError("a repo needs at least one commit")
        labels = [c.sha for c in v]
        if len(set(labels)) != len(labels):
            raise ValueError("commit labels (sha) must be unique")
        return v


class Worker(Strict):
    """A worker process the server starts (multiprocessing spawn): the server's environment plus ``env``.
    It does the GPU work, so environment factors are read from it."""

    env: dict[str, str] = Field(default_factory=dict)


class Server(Strict):
    cmd: str
    args: dict[str, Scalar] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    worker: Worker | None = None
    log: list[str] = Field(default_factory=list)  # printed at start; `{flag:NAME}` / `{env:NAME}` are filled in
    log_file: str = "/tmp/server.log"
    engine: Literal["sglang", "vllm"] | None = Field(
        default=None, description="the engine the server answers as (its endpoints and start-up lines); "
                                  "default: read from `cmd`")
    port: int | None = Field(default=None, description="where it listens; default: --port, else 30000 (SGLang) or 8000 (vLLM)")
    offline: bool = Field(
        default=False, description="no server at all: `cmd` with `args` is the workload program itself, the benchmark "
                                   "(`PYTHON benchmarks/benchmark_throughput.py --input-len 1024`), run as the host "
                                   "profile names it with `env` before it and in `cwd`; it imports its code when it runs "
                                   "and prints `METRIC=VALUE UNIT`")
    defaults: dict[str, Scalar] = Field(
        default_factory=dict,
        description="the values the engine chooses when no flag sets them (`attention_backend: fa3`), which its "
                    "endpoints and start-up log report; a flag of the same name (`-` for `_`) overrides one; factor "
                    "path `server_view.NAME`")

    @field_validator("cmd")
    @classmethod
    def _cmd(cls, v: str) -> str:
        if not v.strip() or not v.startswith("/"):
            raise ValueError("give the absolute path of the program first: `/root/env/bin/python3 -m MODULE`, "
                             "`/root/env/bin/python3 /root/serve.py` or a console script `/root/env/bin/vllm serve`")
        return v


class GpuProcessSpec(Strict):
    """Another process holding GPU memory: ``nvidia-smi --query-compute-apps`` lists it."""

    pid: int
    name: str
    used_memory_mib: int
    gpu: int = 0


PROGRAM_NAME = r"^[A-Za-z0-9_.@:+-]{1,64}$"   # a supervisord program name, a systemd unit's stem


class SupervisorSpec(Strict):
    """What runs the server and restarts it when it exits: a real ``supervisord`` inside the host, whose
    ``[program:NAME]`` (in ``CONFIG``'s ``conf.d/NAME.conf``) holds the server's command line, folder and environment;
    ``supervisorctl`` answers and restarts it as on any host."""

    kind: Literal["supervisord", "systemd"] = Field(
        description="`supervisord` (the `supervisor` package's, run with `-n -c CONFIG`), or `systemd`: a service "
                    "unit `/etc/systemd/system/NAME.service` run by the host's service manager")
    program: str = Field(pattern=PROGRAM_NAME, description="the program's name: `[program:NAME]`, "
                         "`supervisorctl status NAME`; systemd: the unit's name without `.service`")
    config: str = Field(default="/etc/supervisor/supervisord.conf",
                        description="supervisord's config (Debian's place); the program's section is in "
                                    "`conf.d/NAME.conf` beside it")


class ContainerSpec(Strict):
    """The host is a container the server runs in (debugagent's commands run inside it, as through `docker exec`):
    its runtime's marks in its root (docker: `/.dockerenv`; podman: `/run/.containerenv` naming the container, and
    `container=podman` in its processes' environment)."""

    runtime: Literal["docker", "podman"]
    id: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                           description="the container's id (64 hex digits; default: derived from the scenario's name)")
    name: str = Field(default="", description="the container's name (podman's /run/.containerenv names it; with "
                      "`connect: host`, the name `RUNTIME ps` shows)")
    image: str = Field(default="", description="the image it runs (podman's /run/.containerenv names it)")
    connect: Literal["inside", "host"] = Field(
        default="inside", description="`inside`: debugagent's commands run in the container (as through `docker "
        "exec`); `host`: they run on the host that runs it, whose `docker`/`podman` CLI answers from the simulated "
        "runtime (`ps`, `inspect`, `run -d`, `stop`, `rename`, `rm`, `start`, `exec`, `logs`), and the server's "
        "`/proc/PID/cgroup` is the container's scope")
    pid1: bool = Field(default=False, description="the server is its container's pid 1 (its main process; sealed "
                       "only: not sealed, its `/proc/PID/cgroup` names the container's scope instead)")
    network: str = Field(default="host", description="`connect: host`: the container's `--network` (the server's "
                         "port is the host's: `host`)")
    gpus: str = Field(default="all", description="`connect: host`: its `--gpus`")
    ipc: str = Field(default="host", description="`connect: host`: its `--ipc`")
    restart: str = Field(default="unless-stopped", description="`connect: host`: its `--restart` policy")
    mounts: list[str] = Field(default_factory=list, description="`connect: host`: its `-v SRC:DST[:ro]` binds")
    labels: dict[str, str] = Field(default_factory=dict, description="`connect: host`: its `--label`s")


class Cpu(Strict):
    governor: str = "performance"
    cores: int = 64
    model: str = "Intel(R) Xeon(R) Platinum 8480+"   # /proc/cpuinfo's "model name"


class Host(Strict):
    hostname: str
    user: str = "root"
    kernel: str = "6.8.0-49-generic"   # `uname -r`
    memory_gib: int = 2048             # /proc/meminfo's MemTotal
    driver: Driver
    gpus: list[Gpu]
    python: str
    packages: dict[str, PackageSpec]
    repo: Repo | None = None
    server: Server
    gpu_processes: list[GpuProcessSpec] = Field(default_factory=list)
    cpu: Cpu = Field(default_factory=Cpu)
    profile: bool = True  # /etc/debugagent/host.json naming the benchmark; false: the user must give --bench
    environment: Environment = Field(default_factory=Environment)
    wheelhouse: Wheelhouse | None = None
    supervisor: SupervisorSpec | None = None
    container: ContainerSpec | None = None


class Streaks(Strict):
    """The host's speed in streaks, ``speeds`` in turn (cycled), each held for a seeded number of consecutive
    benchmark runs between 1 and ``2 × runs − 1`` (``runs`` on average): a rate is multiplied by it, a time divided."""
    speeds: list[Annotated[float, Field(gt=0)]] = Field(min_length=2)
    runs: int = Field(default=4, ge=1)

    def speed(self, seed: str, n: int) -> float:
        """The factor for the ``n``-th benchmark run (from 1) of a host seeded by ``seed``."""
        rng = random.Random(f"{seed}:streaks")
        end, i = 0, -1
        while end < n:
            end += rng.randint(1, 2 * self.runs - 1)
            i += 1
        return self.speeds[i % len(self.speeds)]


class BenchSpec(Strict):
    metric: str
    unit: str
    base: float
    noise_pct: float = 2.0
    # the server's speed at each of its starts in turn (a factor on the value; cycled): a server whose speed
    # changes at restarts, as one that picks a mode at start (empty: the same at every start)
    modes: list[float] = Field(default_factory=list)
    # the host's own speed in streaks of benchmark runs, whatever the server does (as a virtual machine whose CPU
    # runs at two speeds in streaks of seconds, unseen by the guest, slows a launch-bound server): absent, none
    streaks: Streaks | None = None
    cmd: str = "gpu-bench"
    seconds: float = 0.15
    args: dict[str, Scalar] = Field(default_factory=dict)  # the client's workload flags, in the host profile's command

    def command(self) -> str:
        """The benchmark command line the host profile names (``cmd`` and the workload flags)."""
        parts = [self.cmd]
        for k, v in self.args.items():
            if v is True:
                parts.append(f"--{k}")
            elif v not in (False, None):
                parts += [f"--{k}", str(v)]
        return " ".join(parts)


class Factor(Strict):
    path: str
    good: Any
    bad: Any
    effect: float
    culprit: str | None = None
    # an interaction: the effect holds only while each factor path named here is at its bad value too (what
    # two differences cost together beyond their own effects; negative where one masks the other)
    with_: list[str] = Field(default_factory=list, alias="with")

    @model_validator(mode="after")
    def _labels(self) -> Factor:
        if self.path == "repo.head":
            for k in ("good", "bad", "culprit"):
                v = getattr(self, k)
                if isinstance(v, int) and not isinstance(v, bool):
                    object.__setattr__(self, k, str(v))
        return self


FORMAT_VERSION = 1
# A change of a field's meaning bumps the format's version with a migration here: MIGRATIONS[N] turns the mapping
# of a version-N file into version N+1, so every file written for an earlier version still starts.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


class Scenario(Strict):
    version: Literal[1]
    name: str
    story: str = ""
    symptom: str
    baseline: str
    expect: Expect
    host: Host
    bench: BenchSpec
    factors: list[Factor] = Field(default_factory=list)

    source: str = Field(default="", exclude=True)

    def state(self, which: Literal["good", "bad"]) -> dict[str, Any]:
        """The host as a plain dict in the given state, with the repo's HEAD label resolved (and the
        benchmark's workload flags under ``bench_args``)."""
        host = self.host.model_dump(mode="json")
        host["bench_args"] = dict(self.bench.args)
        if host.get("repo"):
            host["repo"]["head"] = host["repo"]["commits"][-1]["sha"]
        if which == "bad":
            return host
        for f in self.factors:
            set_path(host, f.path, f.good)
        return host


_PATH_RE = re.compile(
    r"^(packages\.[^.]+\.(version|build)|repo\.head|server\.args\.[^.]+|server\.env\.[^.]+|server_view\.[a-z_]+|"
    r"gpus\.[0-9]+\.[a-z_]+|gpu_processes|cpu\.governor|driver\.version|bench\.args\.[^.]+)$"
)


def get_path(host: dict[str, Any], path: str) -> Any:
    parts = path.split(".")
    if parts[0] == "packages":
        pkg = host["packages"].get(parts[1])
        return None if pkg is None else pkg.get(parts[2])
    if parts[0] == "server_view":
        return host["server"]["defaults"].get(parts[1])
    if parts[0] == "server":
        return host["server"][parts[1]].get(parts[2])
    if parts[0] == "gpus":
        return host["gpus"][int(parts[1])].get(parts[2])
    if path == "repo.head":
        return host["repo"]["head"]
    if path == "gpu_processes":
        return host["gpu_processes"]
    if path == "cpu.governor":
        return host["cpu"]["governor"]
    if path == "driver.version":
        return host["driver"]["version"]
    if parts[0] == "bench":
        return host["bench_args"].get(parts[2])
    raise KeyError(path)


def set_path(host: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    if parts[0] == "packages":
        host["packages"][parts[1]][parts[2]] = value
    elif parts[0] == "server_view":
        if value is None:
            host["server"]["defaults"].pop(parts[1], None)
        else:
            host["server"]["defaults"][parts[1]] = value
    elif parts[0] == "server":
        target = host["server"][parts[1]]
        if value is None:
            target.pop(parts[2], None)
        else:
            target[parts[2]] = value
    elif parts[0] == "gpus":
        host["gpus"][int(parts[1])][parts[2]] = value
    elif path == "repo.head":
        host["repo"]["head"] = value
    elif path == "gpu_processes":
        host["gpu_processes"] = copy.deepcopy(value) or []
    elif path == "cpu.governor":
        host["cpu"]["governor"] = value
    elif path == "driver.version":
        host["driver"]["version"] = value
    elif parts[0] == "bench":
        if value is None:
            host["bench_args"].pop(parts[2], None)
        else:
            host["bench_args"][parts[2]] = value


def _check_factors(sc: Scenario, file: str) -> None:
    host = sc.state("bad")
    labels = [c.sha for c in sc.host.repo.commits] if sc.host.repo else []
    for i, f in enumerate(sc.factors):
        field = f"factors[{i}].path"
        if not _PATH_RE.match(f.path):
            raise ScenarioError(
                f"path `{f.path}` matches nothing", file=file, field=field,
                fix="use packages.NAME.version|build, repo.head, server.args.FLAG, server.env.VAR, server_view.NAME, "
                    "gpus.N.FIELD, gpu_processes, cpu.governor, driver.version or bench.args.FLAG")
        parts = f.path.split(".")
        if parts[0] == "packages" and parts[1] not in sc.host.packages:
            raise ScenarioError(f"no package `{parts[1]}` under host.packages", file=file, field=field,
                                fix=f"one of: {', '.join(sc.host.packages)}")
        if parts[0] == "gpus":
            n = int(parts[1])
            if n >= len(sc.host.gpus):
                raise ScenarioError(f"GPU {n} does not exist (host has {len(sc.host.gpus)})", file=file, field=field)
            if parts[2] not in Gpu.model_fields:
                raise ScenarioError(f"GPU field `{parts[2]}` does not exist", file=file, field=field,
                                    fix=f"one of: {', '.join(Gpu.model_fields)}")
        if f.path == "repo.head":
            if not sc.host.repo:
                raise ScenarioError("repo.head without a host.repo", file=file, field=field)
            for which in ("good", "bad", "culprit"):
                v = getattr(f, which)
                if v is not None and v not in labels:
                    raise ScenarioError(f"{which} `{v}` is not a commit label of host.repo", file=file,
                                        field=f"factors[{i}].{which}", fix=f"one of: {', '.join(labels)}")
        elif f.culprit is not None:
            raise ScenarioError("`culprit` only applies to repo.head", file=file, field=f"factors[{i}].culprit")
        others = {g.path for j, g in enumerate(sc.factors) if j != i and not g.with_}
        for k, p in enumerate(f.with_):
            if p == f.path or p not in others:
                raise ScenarioError(f"`with` names `{p}`, which is no other factor's path", file=file,
                                    field=f"factors[{i}].with[{k}]",
                                    fix=f"one of: {', '.join(sorted(others - {f.path})) or '(no other factor)'}")
        current = get_path(host, f.path)
        if f.path == "gpu_processes":
            for k in ("good", "bad"):
                try:
                    norm = [GpuProcessSpec.model_validate(p).model_dump() for p in (getattr(f, k) or [])]
                except ValidationError as exc:
                    raise ScenarioError(f"not a list of GPU processes: {exc.errors()[0]['msg']}", file=file,
                                        field=f"factors[{i}].{k}") from exc
                object.__setattr__(f, k, norm)
        if _norm(current) != _norm(f.bad):
            raise ScenarioError(
                f"host has `{current}` at `{f.path}` but the factor's bad value is `{f.bad}`", file=file,
                field=f"factors[{i}].bad", fix="host is the bad state: make them agree")
        if _norm(f.good) == _norm(f.bad):
            raise ScenarioError("good and bad are equal: not a difference", file=file, field=f"factors[{i}]")


def _norm(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int | float):
        return float(v)
    return v


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema of a scenario file (for editors); validation itself adds the cross-field checks."""
    schema = Scenario.model_json_schema()
    schema["properties"].pop("source", None)
    schema["title"] = "debugagent simulated host scenario, format version 1"
    return schema


def _check_wheels(sc: Scenario, file: str) -> None:
    if not sc.host.wheelhouse:
        return
    for i, w in enumerate(sc.host.wheelhouse.wheels):
        spec = sc.host.packages.get(w.dist)
        if spec is None:
            raise ScenarioError(f"no package `{w.dist}` under host.packages", file=file,
                                field=f"host.wheelhouse.wheels[{i}].dist", fix=f"one of: {', '.join(sc.host.packages)}")
        if spec.editable:
            raise ScenarioError(f"`{w.dist}` is an editable install; a wheel cannot stand for it", file=file,
                                field=f"host.wheelhouse.wheels[{i}].dist")


def builtin_dir() -> Path:
    return Path(str(resources.files("debugagent.tools.sim") / "scenarios"))


def builtin_names() -> list[str]:
    return sorted(p.stem for p in builtin_dir().glob("*.yaml"))


def load_scenario(ref: str) -> Scenario:
    """Load ``NAME`` (built-in) or a path to a ``.yaml`` file; strict validation."""
    p = resolve_yaml_ref(ref, builtin_dir(), ScenarioError, "scenario", "debugagent sim list")
    return parse_scenario(read_yaml_file(p, ScenarioError, "scenario", "debugagent sim list"), str(p))


def _migrate(data: dict[str, Any], text: str, file: str) -> dict[str, Any]:
    """A file of an earlier format version, migrated to this one; a later or unknown version refused."""
    v = data.get("version")
    if isinstance(v, int) and not isinstance(v, bool):
        if v > FORMAT_VERSION:
            raise ScenarioError(f"format version {v} is newer than this debugagent reads (1 to {FORMAT_VERSION})",
                                file=file, field=_at(text, ("version",)),
                                fix="upgrade debugagent, or write the file in version "
                                    f"{FORMAT_VERSION} (docs/simulator.md)")
        while 1 <= v < FORMAT_VERSION:
            data = MIGRATIONS[v](data)
            v += 1
            data["version"] = v
    return data


def _at(text: str, loc: tuple[str | int, ...]) -> str:
    line = line_of(text, loc)
    where = ".".join(str(x) for x in loc)
    return f"line {line}: {where}" if line else where


_SYSTEM = ("/usr", "/etc", "/proc", "/sys", "/dev", "/run", "/tmp", "/bin", "/lib", "/sbin")


def _check_hostable(sc: Scenario, text: str, file: str) -> None:
    """What the simulator cannot host, refused before anything is laid out (naming the field and the fix), where it
    would otherwise fail while the host is built or its server started."""
    h, srv = sc.host, sc.host.server
    argv = srv.cmd.split()
    program = argv[0]
    is_python = os.path.basename(program).startswith("python")
    entry = python_entry(argv) if is_python else ("console", os.path.basename(program))
    if not h.python.startswith("/"):
        raise ScenarioError(f"`{h.python}` is not an absolute path", file=file, field=_at(text, ("host", "python")),
                            fix="give the interpreter's absolute path (`/root/ml-env/bin/python3`, `/usr/bin/python3`)")
    if entry is None:
        raise ScenarioError("the server's command runs no code", file=file, field=_at(text, ("host", "server", "cmd")),
                            fix="give `-m MODULE`, a script or a console script: `/root/ml-env/bin/python3 -m "
                                "sglang.launch_server`")
    if is_python and program != h.python:
        raise ScenarioError(f"the server runs `{program}` but the host's python is `{h.python}`", file=file,
                            field=_at(text, ("host", "server", "cmd")),
                            fix=f"start the command with `{h.python}`, or set host.python to `{program}`")
    if srv.offline:
        for key, bad in (("worker", srv.worker is not None), ("engine", srv.engine is not None),
                         ("port", srv.port is not None), ("defaults", bool(srv.defaults))):
            if bad:
                raise ScenarioError(f"an offline workload has no {key}: it is no server", file=file,
                                    field=_at(text, ("host", "server", key)),
                                    fix="remove it, or set offline: false for a server")
        if not is_python:
            raise ScenarioError("an offline workload is a python program", file=file,
                                field=_at(text, ("host", "server", "cmd")),
                                fix="`PYTHON benchmarks/benchmark_throughput.py` or `PYTHON -m MODULE`")
        if sc.bench.args:
            raise ScenarioError("an offline workload's flags are `host.server.args`", file=file,
                                field=_at(text, ("bench", "args")), fix="move them to host.server.args")
    if h.supervisor is not None:
        if srv.offline:
            raise ScenarioError("an offline workload has no supervisor: it is no server", file=file,
                                field=_at(text, ("host", "supervisor")),
                                fix="remove host.supervisor, or set offline: false for a server")
        conf = h.supervisor.config
        if h.supervisor.kind == "systemd" and "config" in h.supervisor.model_fields_set:
            raise ScenarioError("a systemd unit has no `config`: it is /etc/systemd/system/NAME.service", file=file,
                                field=_at(text, ("host", "supervisor", "config")), fix="remove `config`")
        if not re.fullmatch(r"/etc/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+\.conf", conf) or conf.startswith("/etc/debugagent/"):
            raise ScenarioError(f"`{conf}` is not a supervisord config this simulator can lay out", file=file,
                                field=_at(text, ("host", "supervisor", "config")),
                                fix="give a `.conf` file in a folder of /etc: `/etc/supervisor/supervisord.conf` "
                                    "(Debian's and Ubuntu's place), the program's section beside it in conf.d/")
    if h.container is not None:
        _check_container(sc, text, file)
    cwd = srv.cwd or (h.repo.path if h.repo else "/root")
    places: list[tuple[tuple[str | int, ...], str | None]] = [
        (("host", "python"), None if h.python.startswith("/usr/bin/") else h.python),
        (("host", "repo", "path"), h.repo.path if h.repo else None),
        (("host", "server", "cwd"), srv.cwd),
        (("host", "wheelhouse", "path"), h.wheelhouse.path if h.wheelhouse else None),
        (("host", "server", "cmd"), os.path.normpath(os.path.join(cwd, entry[1])) if entry[0] == "script"
         else None if is_python else program),
    ]
    for loc, p in places:
        if not p or p.startswith(("/usr/local/", "/tmp/")):
            continue
        top = "/" + p.strip("/").split("/")[0]
        if top in _SYSTEM:
            raise ScenarioError(f"`{p}` is under {top}, which belongs to the system", file=file, field=_at(text, loc),
                                fix="put the environment, repository and scripts under /root, /opt, /home or "
                                    "/usr/local, or use the system's python (/usr/bin/python3)")


def _check_container(sc: Scenario, text: str, file: str) -> None:
    c, h = sc.host.container, sc.host
    assert c is not None
    at = ("host", "container")
    if c.connect == "host":
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", c.name or ""):
            raise ScenarioError("a container seen from its host needs a name (`docker ps` shows it)", file=file,
                                field=_at(text, (*at, "name")), fix="give host.container.name: vllm (letters, digits, "
                                "`_`, `.`, `-`)")
        for key, bad, why in (("pid1", c.pid1, "the host sees the server under its own pid; it is the container's "
                               "main process anyway"),
                              ("supervisor", h.supervisor is not None, "the container's main process is the server "
                               "itself here"),
                              ("offline", h.server.offline, "an offline workload is no container's server")):
            if bad:
                raise ScenarioError(f"`connect: host` with {key}: {why}", file=file,
                                    field=_at(text, ("host", key) if key == "supervisor" else
                                              ("host", "server", key) if key == "offline" else (*at, key)),
                                    fix=f"remove {key}, or use `connect: inside`")
        for i, m in enumerate(c.mounts):
            parts = m.split(":")
            if len(parts) not in (2, 3) or not all(p.startswith("/") for p in parts[:2]) or parts[2:] not in ([], ["ro"], ["rw"]):
                raise ScenarioError(f"`{m}` is not a bind `SRC:DST[:ro]`", file=file, field=_at(text, (*at, "mounts", i)),
                                    fix="give absolute paths: `/root/.cache/huggingface:/root/.cache/huggingface`")
        return
    for key in ("network", "gpus", "ipc", "restart", "mounts", "labels"):
        if key in c.model_fields_set:
            raise ScenarioError(f"host.container.{key} is what `docker run` was given: only a host that runs the "
                                "container (`connect: host`) shows it", file=file, field=_at(text, (*at, key)),
                                fix=f"remove {key}, or set connect: host")
    if c.pid1 and (h.supervisor is not None or h.server.offline):
        raise ScenarioError("`pid1: true`: the server is the container's main process, so no supervisor and no "
                            "offline workload", file=file, field=_at(text, (*at, "pid1")),
                            fix="remove pid1, or the supervisor / offline")


def parse_scenario(text: str, file: str = "<scenario>") -> Scenario:
    data = _migrate(load_yaml_mapping(text, file, ScenarioError, "version: 1, name: …"), text, file)
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as exc:
        loc, msg = describe_validation(exc)
        line = line_of(text, exc.errors()[0]["loc"])
        raise ScenarioError(msg, file=file, field=f"line {line}: {loc}" if line else loc,
                            fix="see the scenario format (version 1) in docs/simulator.md, or `debugagent sim schema`") from exc
    sc.source = file
    _check_hostable(sc, text, file)
    _check_factors(sc, file)
    _check_wheels(sc, file)
    return sc
