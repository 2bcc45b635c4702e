"""What one investigation holds besides its state: the transport, the transcript, the
playbook, the journal, the user's inputs and overrides (``Ctx``), built once by the
session (``agent/session.py``) and passed to ``build_graph``."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from debugagent.tools.registry import Runner
from debugagent.tools.snapshot import Snapshot
from debugagent.tools.transport import BaseTransport
from pydantic import AliasChoices, BaseModel, Field

from .config import READY_TIMEOUT_S, REPRODUCE_RUNS
from .journal import Journal
from .playbook import Playbook
from .signals import held
from .symptom import Symptom
from .transcript import Transcript

__all__ = ["READY_TIMEOUT_S", "REPRODUCE_RUNS", "Ctx", "Overrides", "Peer", "Warmth"]


class Overrides(BaseModel):
    """What the user gave instead of what discovery finds, and the run's budgets: read from the recording's
    ``inputs`` (``RunConfig.recorded_inputs``, the same for a live run and its replay); other keys are ignored."""

    bench: str | None = None
    repo: str | None = None
    python: str | None = None
    server_pattern: str | None = None
    bench_regex: str | None = None
    reproduce_runs: int | None = None
    min_reproduce_runs: int | None = None
    max_runs: int | None = None
    code_root: str | None = None
    wheelhouse: str | None = None
    restart_cmd: str | None = None
    shadow_gpus: str | None = None
    shadow_port: int | None = None
    allow_container_recreate: bool | None = None
    ready_timeout_s: float | None = Field(default=None, validation_alias=AliasChoices("ready_timeout", "ready_timeout_s"))

    @property
    def most_reproduce_runs(self) -> int:
        return max(2, int(self.reproduce_runs or REPRODUCE_RUNS), int(self.min_reproduce_runs or 0))

    @property
    def ready_timeout(self) -> float:
        return float(self.ready_timeout_s or READY_TIMEOUT_S)


@dataclass
class Warmth:
    """Whether the server was restarted since the last benchmark run: a fresh server's first requests pay for
    loading kernels, building caches and allocating memory, so the next run is a warm-up, not a sample. It lives
    for the whole run, since an experiment's undo restarts the server that the next experiment measures first."""

    cold: bool = False
    # whether this server needs the warm-up: unknown until the first warm-up run is compared with the runs after
    # it; a server that is not slower on its first run after a restart is not warmed up again
    needed: bool | None = None

    @property
    def due(self) -> bool:
        """The next benchmark run is a warm-up."""
        return self.cold and self.needed is not False


@dataclass
class Peer:
    """``--peer``: the healthy peer, open during the reproduce step only (its benchmark runs alternate with the
    host's); read, never changed, and closed before any experiment. ``owned``: closed here (a replay's peer is the
    replayed recording itself)."""

    name: str
    transport: BaseTransport
    bench: str | None
    metric: str
    cwd: str | None = None
    regex: str | None = None
    owned: bool = True
    closed: bool = False
    # opens the peer's connection again (``--peer``'s own way in); an experiment that reads the peer's build of a
    # package (``lab.kinds.package``) opens it, reads, and closes it again: the peer is only ever read
    reopen: Callable[[], BaseTransport] | None = None
    python: str | None = None   # the peer's server's Python (its snapshot's)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.owned:
                self.transport.close()

    def open_again(self) -> BaseTransport:
        """The peer's connection, opened again where it was closed (a replay's is the recording: always open)."""
        if self.closed:
            if self.owned:
                if self.reopen is None:
                    raise RuntimeError("the peer's connection cannot be opened again")
                self.transport = self.reopen()
            self.closed = False
        return self.transport


@dataclass
class Ctx:
    transport: BaseTransport
    transcript: Transcript
    playbook: Playbook
    run_id: str
    undo: Journal
    symptom: Symptom
    baseline: Symptom | None = None
    baseline_snapshot: Snapshot | None = None
    allow_mutations: bool = False
    confirm: Callable[..., bool] | None = None   # (title, hypothesis=, spec=) -> yes (agent/consent.py)
    advisor: Any = None
    on_status: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
    overrides: Overrides = field(default_factory=Overrides)
    warmth: Warmth = field(default_factory=Warmth)
    # the server as found, restarted: the runs an experiment's control measured, which later controls of the same
    # run start from (what a plain restart gives is a property of the server, not of the change being tested)
    found_restarted: list[float] = field(default_factory=list)
    # what showed, earlier in the run, that the speed moves: the server as found reading differently from one start
    # to the next (a control's runs against the reproduce step's), or runs of one start that are not normal; the
    # words, for later rulings (``Lab._moved``)
    speed_moved: list[str] = field(default_factory=list)
    peer: Peer | None = None
    _runners: dict[str | None, Runner] = field(default_factory=dict)
    _peer_runners: dict[str | None, Runner] = field(default_factory=dict)
    _peer_spent: int = 0
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def runner(self, hypothesis: str | None = None) -> Runner:
        if hypothesis not in self._runners:
            obs = self.transcript.observer(hypothesis)

            def observe(event: str, data: dict[str, Any], _obs=obs) -> None:
                _obs(event, data)
                self.on_status(event, {**data, "hypothesis": hypothesis})
            r = Runner(self.transport, observe, ids=self._ids, hold=held)
            self._runners[hypothesis] = r
        return self._runners[hypothesis]

    def peer_runner(self, hypothesis: str | None = None) -> Runner:
        """The peer's runner: its calls are recorded in the run's transcript as the host's are (``why`` names it);
        under ``hypothesis`` for an experiment's reads of the peer."""
        assert self.peer is not None
        r = self._peer_runners.get(hypothesis)
        if r is None or r.transport is not self.peer.transport:
            obs = self.transcript.observer(hypothesis)

            def observe(event: str, data: dict[str, Any], _obs=obs) -> None:
                _obs(event, data)
                self.on_status(event, {**data, "hypothesis": hypothesis})
            r = Runner(self.peer.transport, observe, ids=self._ids, hold=held)
            if hypothesis in self._peer_runners:
                self._peer_spent += self._peer_runners[hypothesis].count
            self._peer_runners[hypothesis] = r
        return r

    @property
    def commands(self) -> int:
        return (sum(r.count for r in self._runners.values()) + sum(r.count for r in self._peer_runners.values())
                + self._peer_spent)

    def say(self, text: str, hypothesis: str | None = None, kind: str = "reasoning") -> None:
        """Reasoning in the transcript; ``kind="not_run"`` for an experiment left out (agent/events.py)."""
        self.transcript.emit("reasoning", text=text, hypothesis=hypothesis, kind=kind)
        self.on_status("reasoning", {"text": text})
