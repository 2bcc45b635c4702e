"""An offline workload: no inference server at all, the benchmark is the program (``python
benchmarks/benchmark_throughput.py --batch-size 64 …``, as many regression reports are written).

``parse`` reads the benchmark's command line (``cd DIR && [env [-u VAR]…] [VAR=VALUE]… PYTHON SCRIPT|-m MODULE
ARGS``) into a ``ServerInfo`` that stands for the server everywhere the run reads one (its interpreter, its code
and folder, its flags and environment: the suspects), with ``found_by="workload"`` and no pid. ``command``
writes the same program back with an experiment's change (variables unset or set, folders first on
``PYTHONPATH``, another folder): each run of the workload is a new process, so the change takes effect at the
next run, with nothing to restart. Its flags are its work, never changed."""

from __future__ import annotations

import re
import shlex

from .host import ServerInfo, parse_flags, split_argv
from .redact import redact_env, redact_flags

FOUND_BY = "workload"
_CD = re.compile(r"^\s*cd\s+(?P<dir>'[^']*'|\"[^\"]*\"|\S+)\s*&&\s*(?P<rest>.*)$", re.S)
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SHELL = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "(", ")"}
# a benchmark that names where a server listens is its client (`bench_serving --port 30000`, a URL), no workload
_CLIENT = re.compile(r"https?://|(?:^|\s)--(?:port|host|base-url|backend-url)(?:[= ]|$)")


def parse(bench: str | None) -> ServerInfo | None:
    """The workload a benchmark command runs, or None where it is no python program (a client of a server, a
    shell pipeline, a binary)."""
    if not bench:
        return None
    cwd = ""
    text = bench.strip()
    m = _CD.match(text)
    if m:
        try:
            cwd = shlex.split(m.group("dir"))[0]
        except (ValueError, IndexError):
            return None
        text = m.group("rest")
    try:
        words = shlex.split(text)
    except ValueError:
        return None
    if any(w in _SHELL or w.startswith(("|", ";", ">", "&")) for w in words) or _CLIENT.search(text):
        return None
    unset: list[str] = []
    if words and words[0].rsplit("/", 1)[-1] == "env":
        words = words[1:]
        while words and words[0] == "-u" and len(words) > 1:
            unset.append(words[1])
            words = words[2:]
        if words and words[0].startswith("-"):
            return None
    env: dict[str, str] = {}
    while words and _ASSIGN.match(words[0]):
        k, _, v = words[0].partition("=")
        env[k] = v
        words = words[1:]
    python, entry, rest = split_argv(words)
    if python is None or not entry or entry.startswith("-") or not (entry.endswith(".py") or "-m" in words[1:3]):
        return None
    kind = "sglang" if "sglang" in entry else "vllm" if "vllm" in " ".join(words[:3]) else "unknown"
    return ServerInfo(pid=0, argv=words, python=python, entry=entry, flags=redact_flags(parse_flags(rest)),
                      env=redact_env(env), cwd=cwd, kind=kind, found_by=FOUND_BY)


def is_workload(server: object) -> bool:
    """``server`` (a ServerInfo or its dump) stands for an offline workload."""
    by = server.get("found_by") if isinstance(server, dict) else getattr(server, "found_by", None)
    return by == FOUND_BY


def raw_env(bench: str) -> dict[str, str]:
    """The variables the benchmark's command line sets, unredacted (``parse`` redacts what it reports)."""
    text = bench.strip()
    m = _CD.match(text)
    if m:
        text = m.group("rest")
    words = shlex.split(text)
    if words and words[0].rsplit("/", 1)[-1] == "env":
        words = words[1:]
        while words and words[0] == "-u" and len(words) > 1:
            words = words[2:]
    env: dict[str, str] = {}
    while words and _ASSIGN.match(words[0]):
        k, _, v = words[0].partition("=")
        env[k] = v
        words = words[1:]
    return env


def command(bench: str, argv: list[str], cwd: str, *, unset: list[str] | None = None,
            set_env: dict[str, str] | None = None, path_first: list[str] | None = None) -> str:
    """The workload's command line with a change: ``argv`` in ``cwd``, ``unset`` variables removed (from the
    command line and from the environment it inherits), ``set_env`` set, ``path_first`` first on PYTHONPATH
    (before what the command line or the inherited environment puts there)."""
    unset = list(unset or [])
    env = {k: v for k, v in raw_env(bench).items() if k not in set(unset)}
    env.update(set_env or {})
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items() if not (path_first and k == "PYTHONPATH")]
    if path_first:
        first = shlex.quote(":".join(path_first))
        old = env.get("PYTHONPATH")
        words.append(f"PYTHONPATH={first}" + (f":{shlex.quote(old)}" if old is not None else '"${PYTHONPATH:+:$PYTHONPATH}"'))
    if unset:
        words += ["env", *[x for u in unset for x in ("-u", shlex.quote(u))]]
    words += [shlex.quote(a) for a in argv]
    body = " ".join(words)
    return f"cd {shlex.quote(cwd)} && {body}" if cwd else body
