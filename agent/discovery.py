"""Discovery for the agent: the run's overrides in, the transcript's sentences out.

The discovery itself (``tools.discovery``) is shared with ``debugagent snapshot``; this
module adapts it to a run: the overrides a run was given, what the graph's ``discover``
node says about what was found, and the server lookup experiments make after a restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from debugagent.tools.discovery import Discovery, DiscoveryInput, discover
from debugagent.tools.host import ServerInfo
from debugagent.tools.registry import Runner

if TYPE_CHECKING:
    from .context import Overrides

__all__ = ["Discovery", "DiscoveryInput", "discover", "find_server", "narrate", "run_input", "state_of"]


def run_input(overrides: Overrides, metric: str | None, known: dict[str, Any] | None = None) -> DiscoveryInput:
    """The discovery input of a run: its flags (``--server-pattern``, ``--python``, ``--repo``, ``--bench``,
    ``--bench-regex``), the symptom's metric, and the server found earlier (``known``: a ServerInfo dump)."""
    return DiscoveryInput(server_pattern=overrides.server_pattern, python=overrides.python,
                          repo=overrides.repo, bench=overrides.bench, bench_regex=overrides.bench_regex, metric=metric,
                          known_pid=(known or {}).get("pid"), known_argv=list((known or {}).get("argv") or []))


def state_of(d: Discovery) -> dict[str, Any]:
    """The graph state's ``discovered``: what the later nodes read, plus the whole discovery."""
    return {"host_facts": d.host_facts.model_dump() if d.host_facts else None,
            "server": d.server.model_dump() if d.server else None,
            "python": d.python, "repo": d.repo, "bench": d.bench, "metric": d.metric,
            "bench_regex": d.bench_regex, "sources": d.sources,
            "discovery": d.model_dump(mode="json", exclude={"host_facts", "server"})}


def narrate(d: Discovery) -> list[str]:
    """What the transcript says about discovery, in order."""
    lines: list[str] = []
    s = d.server
    if s and s.found_by == "workload":
        lines.append(d.how)
    elif s:
        flags = " ".join(f"--{k}" + ("" if v is True else f" {v}") for k, v in s.flags.items())
        # one message; how it runs (server_shape) is in the message that found it
        lines.append(f"The server is pid {s.pid}: `{s.entry}` run by {s.python or s.argv[0]} in "
                     f"{s.cwd} with {flags or 'no flags'}. {d.how}")
    else:
        lines.append(d.how + " Evidence about the server's flags and environment will be missing.")
    if d.bench:
        reads = f"group 1 of `{d.bench_regex}`" if d.bench_regex else f"`{d.metric}=VALUE UNIT`"
        lines.append(f"The benchmark is `{d.bench}` (reads {reads}) from {d.sources.get('bench', '?')}.")
    else:
        lines.append("No benchmark is known (no --bench and no host profile): the regression cannot be reproduced and "
                     "experiments cannot be measured; the run relies on read-only evidence.")
    return lines


def find_server(runner: Runner, inp: DiscoveryInput | None) -> ServerInfo | None:
    """The server as it runs now (an experiment's lookup before a restart), by the run's own discovery."""
    return discover(runner, inp or DiscoveryInput(), host_info=False).server


def check_input(inp: DiscoveryInput, *, bench_runs: int = 0) -> None:
    """Refuse bad overrides before anything connects (exit 2), naming the flag and a fix."""
    import re

    from debugagent.tools.errors import UsageError
    for flag, value in (("--server-pattern", inp.server_pattern), ("--bench-regex", inp.bench_regex)):
        if value is None:
            continue
        try:
            rx = re.compile(value)
        except re.error as exc:
            raise UsageError(f"{flag} `{value}` is not a regular expression: {exc}",
                             fix=f"quote it, and escape regex characters: {flag} 'sglang\\.launch_server'") from exc
        if flag == "--bench-regex" and rx.groups < 1:
            raise UsageError(f"--bench-regex `{value}` has no group: group 1 must capture the number",
                             fix="--bench-regex 'throughput: ([0-9.]+)'")
        if flag == "--server-pattern" and not value.strip():
            raise UsageError("--server-pattern is empty (it would match every process)",
                             fix="--server-pattern 'my_server\\.py'")
    if inp.bench and bench_runs > 0 and not (inp.metric or inp.bench_regex):
        raise UsageError("--bench is given but not what to read from its output",
                         fix="add --metric NAME (the benchmark prints NAME=VALUE UNIT, e.g. --metric throughput) "
                             "or --bench-regex 'REGEX' (group 1 is the number)")
