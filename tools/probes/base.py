"""What a probe plugin declares, and what the framework hands it.

A ``Probe`` is one diagnostic area (as an sos plugin is): its typed tools (``Tool``: the input model whose
``command()`` is the exact, quoted, read-only command; the pure parser; the transcript summary), the calls
it adds to a snapshot's waves, the snapshot fields it fills, the difference paths it reports, and the facts
it adds for the playbook's rules. Every hook is optional; the framework (``tools.snapshot.collect``,
``tools.snapshot.diff``, ``tools.registry``, ``agent.facts``) runs them in ``PROBES`` order.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

from ..errors import ParseError
from ..transport import CommandResult

if TYPE_CHECKING:
    from ..discovery import Discovery
    from ..registry import Outcome, Runner
    from ..snapshot import Snapshot

Parser = Callable[[Any, CommandResult], BaseModel]
# the tool_result event -> its readable lines in transcript.md; None: the plain rendering of its text
Summary = Callable[[dict[str, Any]], "list[str] | None"]
Call = tuple[str, Any, str]   # (tool, input, why)


def _need_ok(r: CommandResult, tool: str) -> None:
    if r.timed_out:
        raise ParseError(f"cut at its timeout after {r.duration_ms / 1000:.1f} s", tool=tool)
    if r.exit_code != 0:
        raise ParseError(f"exit {r.exit_code}: {r.tail(2) or 'no output'}", tool=tool)


@dataclass(frozen=True)
class Tool:
    """One typed tool, one row: its name, its input model (whose ``command()`` is the exact command it
    sends), the parser of what came back, its timeout, and whether it changes the host (experiments
    only, each with its undo; never sent twice). A ``checked`` tool's failing or cut command is an
    error before its parser sees it; an unchecked parser reads whatever came back. ``summary`` makes
    its output readable in the transcript; ``optional``: a snapshot sends it only when asked (a
    playbook's ``checks`` choose); ``wave``: the snapshot's wave that sends it (1: with discovery,
    2: after it; 0: none); ``check``: a playbook hypothesis may name it in its ``checks``."""

    name: str
    input: type[BaseModel]
    parse: Parser
    timeout: float = 60.0
    mutates: bool = False
    checked: bool = True
    summary: Summary | None = None
    optional: bool = False
    wave: int = 0
    check: bool = False
    stands_for: str = ""   # the tool it is sent in place of: a playbook's check of that one cites this one's call

    def read(self, inp: Any, r: CommandResult) -> BaseModel:
        """The typed output of ``r``, or ``ParseError``."""
        if self.checked:
            _need_ok(r, self.name)
        return self.parse(inp, r)


class Add(Protocol):
    """Records one difference (``tools.snapshot.Change``) between two snapshots."""

    def __call__(self, path: str, a: Any, b: Any, /, note: str = "", *, editable: bool = False,
                 follows_load: bool = False) -> None: ...


@dataclass
class Gathering:
    """One snapshot being taken, as the probes' hooks see it: the runner, what discovery found and
    resolved, the outcomes so far (by tool), the errors to record, and what a probe kept between its hooks."""

    runner: Runner
    discovery: Discovery | None = None
    python: str | None = None
    repo: str | None = None
    bench: str | None = None
    metric: str | None = None
    bench_regex: str | None = None
    sample_seconds: float = 1.5
    bench_runs: int = 0
    probes: Collection[str] | None = None
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    kept: dict[str, Any] = field(default_factory=dict)   # what a probe's ``after`` keeps for its ``fill``

    def want(self, tool: str) -> bool:
        """Is ``tool`` to run (every optional tool when the caller named none)?"""
        return self.probes is None or tool in self.probes

    def output(self, tool: str) -> Any:
        """The typed output of ``tool``'s call in this snapshot, or None (not sent, or failed)."""
        o = self.outcomes.get(tool)
        return o.output if o is not None and o.ok else None


@dataclass(frozen=True)
class FactsInput:
    """What a probe's facts may read besides the snapshot: the baseline snapshot, the playbook's
    knowledge, and the facts the probes before it added."""

    baseline: Snapshot | None
    knowledge: dict[str, Any]
    so_far: dict[str, Any]


@dataclass(frozen=True)
class Probe:
    """One diagnostic area. ``first``/``second``: the calls it adds to the snapshot's first wave (with
    discovery) and second (once python, repo and benchmark are known); ``after``: sequential calls after
    the second wave; ``fill``: its snapshot fields' values (it may make a follow-up call); ``diff``:
    the differences of its fields, whose paths ``diff_paths`` lists (NAME, FLAG, VAR, N stand for one
    segment); ``facts``: what it adds to the rules' facts; ``quiet``: error texts of its calls that a
    snapshot does not record (an expected absence)."""

    name: str
    tools: tuple[Tool, ...] = ()
    first: Callable[[Gathering], list[Call]] | None = None
    second: Callable[[Gathering], list[Call]] | None = None
    after: Callable[[Gathering], None] | None = None
    fill: Callable[[Gathering], dict[str, Any]] | None = None
    diff_paths: tuple[str, ...] = ()
    diff: Callable[[Snapshot, Snapshot, Add], None] | None = None
    facts: Callable[[Snapshot, FactsInput], dict[str, Any]] | None = None
    quiet: tuple[str, ...] = ()
