"""The typed tools by name, and the runner that sends them and parses what comes back.

A tool is one row of ``TOOLS`` (a ``tools.probes.base.Tool``): its input model builds the exact
command; its parser turns the ``CommandResult`` into a typed output or raises ``ParseError``; the
row also holds its timeout and whether it changes the host. The read-only rows are the probes'
(``tools.probes``, one module per area), the mutations are listed here. The runner
reports every call to an observer (the transcript), runs independent calls
concurrently, and never lets a parse failure escape as a traceback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from . import mutate, peerwheel, probes, recreate, shadow, supervise
from .errors import ParseError
from .probes.base import Parser, Tool
from .transport import CommandResult, Transport


class Done(BaseModel):
    """The typed output of a mutation: it ran, and what it printed last."""

    ok: bool = True
    detail: str = ""


def _done(lines: int = 1) -> Parser:
    """A mutation's output: it ran, and its last ``lines`` lines."""
    return lambda i, r: Done(detail=r.tail(lines))


# The tools that change the host: experiments only, each with its undo. The read-only tools are the probes'
# (``tools.probes``).
MUTATIONS: tuple[Tool, ...] = (
    Tool("git_worktree_add", mutate.WorktreeAdd, _done(), mutates=True),
    Tool("git_worktree_remove", mutate.WorktreeRemove, _done(), mutates=True),
    Tool("restart_server", mutate.RestartServer, lambda i, r: mutate.parse_restart(r.stdout), timeout=300.0, mutates=True),
    Tool("set_power_limit", mutate.SetPowerLimit, _done(), mutates=True),
    Tool("set_governor", mutate.SetGovernor, _done(), mutates=True),
    Tool("reset_clocks", mutate.ResetClocks, _done(), mutates=True),
    Tool("lock_clocks", mutate.LockClocks, _done(), mutates=True),
    Tool("git_worktree_checkout", mutate.WorktreeCheckout, _done(), mutates=True),
    Tool("remove_file", mutate.RemoveFile, _done(), mutates=True),
    Tool("restart_hook", mutate.RestartHook, _done(3), timeout=600.0, mutates=True),
    Tool("overlay_install", mutate.OverlayInstall, _done(), timeout=300.0, mutates=True),
    Tool("remove_tree", mutate.RemoveTree, _done(), mutates=True),
    Tool("write_chunk", peerwheel.WriteChunk, _done(), timeout=120.0, mutates=True),
    Tool("pip_download", mutate.PipDownload, lambda i, r: mutate.parse_wheels(r.stdout), timeout=120.0, mutates=True),
    Tool("supervisor_apply", supervise.SupervisorApply, lambda i, r: mutate.parse_restart(r.stdout), timeout=300.0,
         mutates=True),
    Tool("supervisor_restore", supervise.SupervisorRestore, lambda i, r: mutate.parse_restart(r.stdout), timeout=300.0,
         mutates=True),
    Tool("systemd_dropin", supervise.SystemdDropin, lambda i, r: mutate.parse_restart(r.stdout), timeout=300.0,
         mutates=True),
    Tool("systemd_dropin_remove", supervise.SystemdDropinRemove, lambda i, r: mutate.parse_restart(r.stdout),
         timeout=300.0, mutates=True),
    Tool("container_recreate", recreate.ContainerRecreate, lambda i, r: mutate.parse_restart(r.stdout), timeout=300.0,
         mutates=True),
    Tool("container_restore", recreate.ContainerRestore, lambda i, r: mutate.parse_restart(r.stdout), timeout=300.0,
         mutates=True),
    Tool("start_copy", shadow.StartCopy, lambda i, r: mutate.parse_restart(r.stdout), timeout=120.0, mutates=True),
    Tool("stop_copy", shadow.StopCopy, _done(), timeout=120.0, mutates=True),
)
TOOLS: dict[str, Tool] = {**probes.tools(), **{t.name: t for t in MUTATIONS}}


class Outcome(BaseModel):
    """One tool call: its input, the command, the raw result, and the typed output or error."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    tool: str
    input: dict[str, Any]
    result: CommandResult
    output: Any = None
    error: str | None = None
    call_id: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


Observer = Callable[[str, dict[str, Any]], None]


class Runner:
    """Sends typed tool calls over a transport and reports each to ``observer``."""

    def __init__(self, transport: Transport, observer: Observer | None = None, ids: Any = None,
                 hold: Callable[[], AbstractContextManager[Any]] | None = None) -> None:
        self.transport = transport
        # a mutation's command and the recording of its result run inside ``hold()``: a run's signal
        # handling keeps a signal until both are done (an interrupted wait would not stop the command on the host)
        self.hold = hold or nullcontext
        self.observer = observer or (lambda event, data: None)
        self.count = 0
        self._ids = ids  # a shared itertools.count when several runners share one transcript
        self._lock = threading.Lock()

    def command_of(self, tool: str, inp: BaseModel) -> str:
        return inp.command()  # type: ignore[attr-defined]

    def call(self, tool: str, inp: BaseModel | dict[str, Any] | None = None, *, why: str = "", timeout: float | None = None) -> Outcome:
        row = TOOLS[tool]
        if not isinstance(inp, BaseModel):
            inp = row.input.model_validate(inp or {})
        with self._lock:
            self.count += 1
            call_id = next(self._ids) if self._ids is not None else self.count
        command = self.command_of(tool, inp)
        display = getattr(inp, "display_command", None)
        shown = str(display()) if callable(display) else command
        data_in = inp.model_dump(mode="json")
        self.observer("tool_call", {"call_id": call_id, "tool": tool, "input": data_in, "command": command,
                                    "display": self.transport.display(shown), "why": why})
        with self.hold() if row.mutates else nullcontext():
            return self._send(row, tool, inp, command, data_in, call_id, timeout)

    def _send(self, row: Tool, tool: str, inp: BaseModel, command: str, data_in: dict[str, Any], call_id: int,
              timeout: float | None) -> Outcome:
        t = timeout or row.timeout
        start = time.monotonic()
        kw = {"retry": not row.mutates} if self.transport.supports_retry else {}
        result = self.transport.run(command, timeout=t, **kw)
        output: Any = None
        error = None
        try:
            output = row.read(inp, result)
        except ParseError as exc:
            error = str(exc)
        self.observer("tool_result", {
            "call_id": call_id, "tool": tool, "host": result.host, "command": command, "stdout": result.stdout,
            "stderr": result.stderr, "exit_code": result.exit_code, "duration_ms": result.duration_ms,
            "wall_ms": round((time.monotonic() - start) * 1000, 3), "truncated": result.truncated,
            "timed_out": result.timed_out, "output": output.model_dump(mode="json") if output is not None else None,
            "error": error,
        })
        return Outcome(tool=tool, input=data_in, result=result, output=output, error=error, call_id=call_id)

    def call_many(self, calls: Sequence[tuple[str, BaseModel | dict[str, Any] | None, str]]) -> list[Outcome]:
        """Run independent calls concurrently; outcomes come back in the given order."""
        if len(calls) <= 1:
            return [self.call(t, i, why=w) for t, i, w in calls]
        with ThreadPoolExecutor(max_workers=min(8, len(calls))) as pool:
            futures = [pool.submit(self.call, t, i, why=w) for t, i, w in calls]
            return [f.result() for f in futures]
