"""Undo: every change is preceded by its undo step, journalled (``agent/journal.py``: in the run folder and on
the host, durably) and recorded in the transcript before the change; the steps run newest first, each marked
done only once it succeeded, and the host is then checked "as found" (``asfound``).

The undo is itself journalled and re-entrant: a step is marked ``started`` (durably, on both sides) before its
tool runs, and every step's tool finds the host as it is (a removed file stays removed, a server already
restarted as found is kept), so a second ``undo`` after any interruption finishes the job. A signal during the
undo waits until the step under way has finished and its result is recorded; the undo then goes on, and the
signal is raised once the host has been checked.

Only steps this debugagent wrote are run: each is signed (``journal.step_mac``) with a key outside the run
folder, names paths under its own ``/tmp/debugagent-…<run id>…`` prefixes, and fits its tool's input model;
anything else is refused and named (a step with wrong types is exit 2).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from debugagent.tools import mutate, supervise
from debugagent.tools.errors import UsageError
from debugagent.tools.registry import TOOLS, Runner
from pydantic import ValidationError

from ..config import READY_TIMEOUT_S
from ..journal import HOST_TIMEOUT_S, Journal, Step, digest
from ..signals import Interrupted, held
from . import asfound
from .errors import ExperimentError

# the tools an undo step may name, and the fields of each that must be paths debugagent made
UNDO_TOOLS: dict[str, tuple[str, ...]] = {
    "remove_file": ("path",), "remove_tree": ("path",), "git_worktree_remove": ("path",),
    "git_worktree_checkout": ("path",), "restart_server": ("stop_pid_file", "env_file", "pid_file"),
    "restart_hook": (), "set_power_limit": (), "set_governor": (), "lock_clocks": (), "stop_copy": ("pid_file", "env_file", "log"),
    "supervisor_restore": ("backup",), "systemd_dropin_remove": (), "container_restore": (),
}
PREFIX = "/tmp/debugagent-"
STOPPING_S = 30.0   # how long the check waits for a server still stopping (one still loading: the ready timeout)


def own_path(path: str, run_id: str) -> bool:
    """A path debugagent makes for run ``run_id``: one name directly in /tmp, ``debugagent-…`` with the run id."""
    name = path.rstrip("/").removeprefix(PREFIX)
    return (path.startswith(PREFIX) and bool(name) and "/" not in name and ".." not in name and bool(run_id)
            and run_id in name)


class Undo:
    """The journal as the lab writes and replays it. ``on_restart(found_again)`` is told when a step started the
    server as found again: ``found_again`` its pid and log, or None when the step was a restart hook; it is not
    told when that server was already running. ``pattern()`` is the run's server pattern (what "the server
    processes" are, read before the first restart and after the undo); ``settle_s`` how long the check after the
    undo waits for a server still starting or stopping."""

    def __init__(self, journal: Journal, emit: Callable[..., None],
                 on_restart: Callable[[dict[str, Any] | None, bool], None],
                 pattern: Callable[[], str | None] = lambda: None, settle_s: float = READY_TIMEOUT_S) -> None:
        self.journal = journal
        self.emit = emit
        self.on_restart = on_restart
        self.pattern = pattern
        self.settle_s = settle_s
        self.differences: list[asfound.Difference] = []

    # ------------------------------------------------------------ recording
    def push(self, tool: str, inp: dict[str, Any], text: str) -> None:
        """Journal an undo step before the change it undoes, after reading what that change touches as found
        (once per area and run); nothing is changed if either fails."""
        self.emit("experiment", phase="undo_recorded", text=text, tool=tool, input=inp)
        try:
            self._read_before(tool, inp)
            self.journal.record(tool, inp, text)
        except OSError as exc:
            raise ExperimentError(f"the undo step could not be journalled ({exc}); nothing was changed") from exc

    def note_started(self, pid_file: str, pid: int, start: int) -> None:
        """The experiment started server ``pid`` (start time ``start``): its undo step names it, so the undo finds
        it by command line and start time even without the pid file."""
        for s in self.journal.pending():
            if s.tool == "restart_server" and s.input.get("stop_pid_file") == pid_file and pid and start:
                self.journal.update(s, stop_pid=int(pid), stop_start=int(start))
                return

    def _run_host(self, command: str) -> Any:
        remote = self.journal.remote
        assert remote is not None
        return remote.transport.run(command, timeout=HOST_TIMEOUT_S)

    def _digest(self, data: bytes) -> str:
        return digest(self.journal.key, data)

    def _read_before(self, tool: str, inp: dict[str, Any]) -> None:
        if self.journal.remote is None:   # a replay: there is no host to read
            return
        for area, how in asfound.areas_of(tool, inp, self.journal.data.run_id, self.pattern()).items():
            if area in self.journal.data.before:
                continue
            got = asfound.read(self._run_host, area, how, self._digest)
            self.journal.note_before(area, got if got is not None else {"how": how, "unreadable": True})

    # ------------------------------------------------------------ what may run
    def check(self, step: Step) -> str | None:
        """Why ``step`` is refused (None: it may run). A step whose input does not fit its tool is a ``UsageError``
        (exit 2) naming the journal, the step and the field."""
        j = self.journal
        if step.tool not in UNDO_TOOLS:
            return f"refused step {step.id} ({step.tool!r}): not a tool an undo runs"
        try:
            TOOLS[step.tool].input.model_validate(step.input)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err.get("loc", ())) or "input"
            raise UsageError(f"{j.path}: undo step {step.id} ({step.tool}): input.{where}: {err.get('msg', 'invalid')}",
                             fix="the journal was edited or damaged; what is left must be undone by hand (the run's "
                                 "transcript lists every undo step it recorded)") from None
        if not j.signed(step):
            return (f"refused step {step.id} ({step.text}): its signature does not match (the journal was edited, or "
                    f"written with another undo key than {j.key_path()})")
        if step.tool == "systemd_dropin_remove" and step.input.get("path") != supervise.dropin_path(
                str(step.input.get("unit")), j.data.run_id):
            return (f"refused step {step.id} ({step.text}): {step.input.get('path')!r} is not the drop-in debugagent "
                    f"writes for run {j.data.run_id} ({supervise.dropin_path(str(step.input.get('unit')), j.data.run_id)})")
        for name in UNDO_TOOLS[step.tool]:
            path = step.input.get(name)
            if path and not own_path(str(path), j.data.run_id):
                return (f"refused step {step.id} ({step.text}): {name} {path!r} is not a path debugagent makes for run "
                        f"{j.data.run_id} (one name under {PREFIX}… with the run id)")
        return None

    # ------------------------------------------------------------ running
    def run(self, r: Runner) -> list[str]:
        """Run the journal's pending steps, newest first, each marked done once it succeeded; then check the
        host as found. Returns what could not be undone and each difference from the host as found.

        A failed or refused step stays pending (with its error) and stops the undo there: the older steps may be
        what it needs (the saved environment of a restart). A lost connection raises with the step still pending.
        A signal waits for the step under way; the undo goes on, and the signal is raised at its end.
        """
        interrupted: Interrupted | None = None
        ran = False
        for step in self.journal.pending():
            refused = self.check(step)
            if refused:
                self.journal.mark_failed(step, refused)
                self.emit("error", kind="undo", message=refused)
                return self._left()
            try:
                with held():   # the step, its result and its record: a signal waits for all three
                    ok = self._step(r, step)
            except Interrupted as exc:   # raised as the held section ended: the step is finished and recorded
                interrupted = interrupted or exc
                ok = step.done
                self.emit("experiment", phase="undo", text=f"{exc.args[0]}: the undo goes on (step {step.id} "
                          f"finished {'and is done' if ok else 'and failed'}); the run stops once the host is checked")
            ran = True
            if not ok:
                if interrupted:
                    raise interrupted
                return self._left()
        left = self.verify(r) if (ran or not self.journal.data.verified) else []
        if interrupted:
            raise interrupted
        return left

    def _step(self, r: Runner, step: Step) -> bool:
        self.journal.mark_started(step)
        self.emit("experiment", phase="undo", text=step.text, tool=step.tool, step=step.id)
        o = r.call(step.tool, step.input, why="undo: " + step.text)
        if not o.ok:
            self.journal.mark_failed(step, o.error or "failed")
            self.emit("error", kind="undo", message=f"undo failed: {step.text}: {o.error}")
            return False
        self.journal.mark_done(step)
        if isinstance(o.output, mutate.Restarted) and o.output.pid:   # the server as found, started again
            self.on_restart({"pid": o.output.pid, "log": o.output.log}, not o.output.already_running)
        elif step.tool == "restart_hook":
            self.on_restart(None, True)
        return True

    def _left(self) -> list[str]:
        return [f"{s.text}" + (f": {s.error}" if s.error else "") for s in self.journal.pending()]

    # ------------------------------------------------------------ as found
    def verify(self, r: Runner) -> list[str]:
        """Read again every area the journal read before its first change and compare (a server still starting
        or stopping is waited for, up to ``settle_s``); each difference is returned with the command that fixes
        it. Nothing to compare (a replay, no change made) is no difference."""
        before = self.journal.data.before
        self.differences = []
        if self.journal.remote is None or not before or self.journal.steps:
            return []
        started = time.monotonic()
        while True:
            diffs: list[asfound.Difference] = []
            for area, b in sorted(before.items()):
                if b.get("unreadable"):
                    continue
                diffs += asfound.compare(area, b, asfound.read(self._run_host, area, b["how"], self._digest))
            waited = time.monotonic() - started
            if not any(d.area == "server" for d in diffs) or waited >= self.settle_s or (
                    waited >= STOPPING_S and not all(d.starting for d in diffs if d.area == "server")):
                break
            time.sleep(0.5)
        self.differences = diffs
        unread = [asfound.describe(a) for a, b in sorted(before.items()) if b.get("unreadable")]
        self.journal.mark_verified(not diffs)
        if diffs:
            for d in diffs:
                self.emit("error", kind="undo", message=f"not as found: {d.line()}")
            return [f"not as found: {d.line()}" for d in diffs]
        self.emit("experiment", phase="undo", text="checked after the undo: the host is as it was found ("
                  + asfound.summary({a: b for a, b in before.items() if not b.get("unreadable")})
                  + (f"; not readable, so not checked: {', '.join(unread)}" if unread else "") + ")")
        return []
