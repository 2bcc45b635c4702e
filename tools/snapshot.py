"""A host's fingerprint (``debugagent snapshot``) and the difference of two (``debugagent diff``).

Both are built from the probes (``tools.probes``, one module per area): each adds its calls,
fills its fields and reports its differences. Difference paths use the vocabulary of scenario
factors (``packages.NAME.build``, ``repo.head``, ``server.args.FLAG``, ``server.env.VAR``,
``gpus.N.FIELD``, ``gpu_processes``, ``cpu.governor``, ``driver.version``); ``DIFF_PATHS`` lists
every path the diff can report. A change is plain data (path, before and after, a note): which
hypothesis it is evidence of is the playbook's to say, not this module's.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from . import probes
from .discovery import Discovery, DiscoveryInput, finish, resolve
from .discovery import calls as discovery_calls
from .errors import UsageError
from .host import HostFacts, ServerInfo
from .probes import PROBES, Gathering, plan
from .probes import diff_paths as all_diff_paths
from .probes.gpu import GpuFacts
from .redact import redact
from .registry import Outcome, Runner

__all__ = ["DIFF_PATHS", "OPTIONAL_PROBES", "PLACEHOLDERS", "Change", "GpuFacts", "Snapshot", "collect", "diff", "dump"]

SNAPSHOT_VERSION = 1
# The read-only tools a caller may leave out of a snapshot (a playbook's `checks` choose them).
OPTIONAL_PROBES = probes.optional()


class Head(BaseModel):
    snapshot_version: int = SNAPSHOT_VERSION
    host: str
    hostname: str = ""
    taken_at: str = ""
    commands: int = 0


class Tail(BaseModel):
    errors: list[str] = Field(default_factory=list)
    discovery: Discovery | None = None  # how the server was found (its process tree, other servers)


class Snapshot(Tail, probes.Fields, Head):
    """A host's fingerprint: who took it and when, every probe's fields (``tools.probes.Fields``), what failed,
    and how the server was found."""

    @classmethod
    def load(cls, path: str) -> Snapshot:
        from .yamlfile import read_text_file
        text, why = read_text_file(Path(path))
        if text is None:
            raise UsageError(f"snapshot `{path}`: {why}",
                             fix="give a snapshot file; make one with `debugagent snapshot --host H -o FILE`")
        try:
            version = json.loads(text).get("snapshot_version", SNAPSHOT_VERSION)
        except (ValueError, AttributeError):
            version = SNAPSHOT_VERSION   # not JSON, or not an object: said below
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SNAPSHOT_VERSION:
            raise UsageError(f"snapshot `{path}`: snapshot_version {version!r} is not one this debugagent reads "
                             f"(1 to {SNAPSHOT_VERSION})",
                             fix="take the snapshot again with this debugagent (`debugagent snapshot --host H -o FILE`), "
                             "or read it with the debugagent that wrote it")
        try:
            return cls.model_validate_json(text)
        except ValueError as exc:
            first = str(exc).splitlines()[0]
            raise UsageError(f"snapshot `{path}` is not a debugagent snapshot: {first}",
                             fix="make one with `debugagent snapshot --host H -o FILE`") from exc


def _discovery(runner: Runner, inp: DiscoveryInput, outs: list[Outcome],
               known: Discovery | tuple[HostFacts | None, ServerInfo | None] | None) -> Discovery:
    """The server as discovery finds it from its calls (``outs``), or as ``known`` gives it."""
    if known is None:
        host_o, table_o, gp_o = outs
        return finish(runner, inp, table_o, gp_o, host_o.output if host_o.ok else None)
    if isinstance(known, Discovery):
        return known
    facts0, server0 = known
    gp_o = outs[0]
    values = resolve(inp, facts0, server0)
    return Discovery(server=server0, host_facts=facts0, gpu_processes=list(gp_o.output.processes) if gp_o.ok else [],
                     python=values["python"][0], repo=values["repo"][0], bench=values["bench"][0],
                     metric=values["metric"][0], bench_regex=values["bench_regex"][0])


def collect(runner: Runner, *, bench: str | None = None, python: str | None = None, repo: str | None = None,
            server_pattern: str | None = None, sample_seconds: float = 1.5,
            known: Discovery | tuple[HostFacts | None, ServerInfo | None] | None = None, bench_runs: int = 0,
            metric: str | None = None, bench_regex: str | None = None,
            probes: Collection[str] | None = None) -> Snapshot:
    """Gather the fingerprint in concurrent waves; record what failed instead of raising.

    The first wave is every probe's first calls and discovery's; the second, every probe's calls that need
    what discovery found (the python, the repo, the benchmark); then the probes' sequential calls (the
    benchmark runs), and each probe fills its fields (``tools.probes``).

    ``probes`` names the optional read-only tools to run (``OPTIONAL_PROBES``; None: all of them);
    discovery's calls and ``gpu_query`` always run, since finding the server and the GPUs needs them.

    The server is found by ``tools.discovery`` (the same overrides as ``run``), in the
    same concurrent wave as the GPU reads. ``known`` passes a discovery already made (or,
    as before, host facts and the server), so it is not made again. ``bench_runs`` > 0
    also runs the benchmark that many times (a baseline snapshot then carries its own
    baseline numbers).
    """
    inp = DiscoveryInput(server_pattern=server_pattern, python=python, repo=repo, bench=bench, metric=metric,
                         bench_regex=bench_regex)
    g = Gathering(runner, sample_seconds=sample_seconds, bench_runs=bench_runs, probes=probes)
    calls = plan(g, 1)
    fixed = len(calls)
    if known is None:
        calls += discovery_calls(inp)
    elif not isinstance(known, Discovery):
        calls.append(("gpu_processes", None, "processes holding GPU memory"))
    wave1 = runner.call_many(calls)
    g.outcomes.update({o.tool: o for o in wave1[:fixed]})
    g.errors += [o.error or "" for o in wave1 if not o.ok]
    disc = _discovery(runner, inp, wave1[fixed:], known)
    if known is None:
        g.errors += [e for e in disc.errors if e not in g.errors]
    g.discovery = disc
    g.bench, g.metric, g.bench_regex = bench or disc.bench, metric or disc.metric, bench_regex or disc.bench_regex
    g.python, g.repo = python or disc.python, repo or disc.repo
    wave2 = runner.call_many(plan(g, 2))
    g.outcomes.update({o.tool: o for o in wave2})
    for p in PROBES:
        if p.after:
            p.after(g)
    quiet = tuple(q for p in PROBES for q in p.quiet)
    g.errors += [o.error or "" for o in {o.tool: o for o in wave2}.values()
                 if not o.ok and not any(q in (o.error or "") for q in quiet)]
    fields: dict[str, Any] = {}
    for p in PROBES:
        if p.fill:
            fields.update(p.fill(g))
    facts = disc.host_facts
    return Snapshot(
        host=runner.transport.host, hostname=facts.hostname if facts else "",
        taken_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), commands=runner.count, **fields,
        discovery=disc.model_copy(update={"server": None, "host_facts": None}), errors=[e for e in g.errors if e],
    )


# ---------------------------------------------------------------- diff
class Change(BaseModel):
    """One difference between two snapshots: ``a`` is the value before (the good snapshot), ``b`` after."""

    path: str
    a: Any = None
    b: Any = None
    note: str = ""
    editable: bool = False  # a package installed editable (from a source checkout): its change is a change of source
    # a reading that follows the work the GPU is given (power draw, temperature under load): a slower server draws
    # less, so such a change alone says nothing of a cause
    follows_load: bool = False


# Every path ``diff`` reports (each probe's ``diff_paths``); NAME, FLAG, VAR and N stand for one path segment.
DIFF_PATHS = all_diff_paths()
PLACEHOLDERS = ("NAME", "FLAG", "VAR", "N")


def diff(a: Snapshot, b: Snapshot) -> list[Change]:
    """Every probe's differences between ``a`` (good) and ``b`` (bad), in ``PROBES`` order."""
    out: list[Change] = []

    def add(path: str, va: Any, vb: Any, note: str = "", *, editable: bool = False, follows_load: bool = False) -> None:
        out.append(Change(path=path, a=va, b=vb, note=note, editable=editable, follows_load=follows_load))

    for p in PROBES:
        if p.diff:
            p.diff(a, b, add)
    return out


def dump(snap: Snapshot) -> str:
    """The snapshot as JSON text, redacted (it is written to a file or printed)."""
    return json.dumps(redact(snap.model_dump(mode="json")), indent=1, sort_keys=False)
