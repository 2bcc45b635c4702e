"""Undo: every change is preceded by its undo step, journalled (``agent/journal.py``: in the run folder and on
the host, durably) and recorded in the transcript before the change; the steps run newest first, each marked
done only once it succeeded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from debugagent.tools import mutate
from debugagent.tools.registry import Runner

from ..journal import Journal
from .errors import ExperimentError


class Undo:
    """The journal as the lab writes and replays it. ``on_restart(found_again)`` is told when a step started the
    server as found again: ``found_again`` its pid and log, or None when the step was a restart hook; it is not
    told when that server was already running."""

    def __init__(self, journal: Journal, emit: Callable[..., None],
                 on_restart: Callable[[dict[str, Any] | None, bool], None]) -> None:
        self.journal = journal
        self.emit = emit
        self.on_restart = on_restart

    def push(self, tool: str, inp: dict[str, Any], text: str) -> None:
        """Journal an undo step before the change it undoes; nothing is changed if that fails."""
        self.emit("experiment", phase="undo_recorded", text=text, tool=tool, input=inp)
        try:
            self.journal.record(tool, inp, text)
        except OSError as exc:
            raise ExperimentError(f"the undo step could not be journalled ({exc}); nothing was changed") from exc

    def run(self, r: Runner) -> list[str]:
        """Run the journal's pending steps, newest first, each marked done once it succeeded.

        A failed step stays pending (with its error) and stops the undo there: the older
        steps may be what it needs (the saved environment of a restart). A lost connection
        raises with the step still pending. Returns what could not be undone.
        """
        for step in self.journal.pending():
            self.emit("experiment", phase="undo", text=step.text, tool=step.tool, step=step.id)
            o = r.call(step.tool, step.input, why="undo: " + step.text)
            if not o.ok:
                self.journal.mark_failed(step, o.error or "failed")
                self.emit("error", kind="undo", message=f"undo failed: {step.text}: {o.error}")
                return [f"{s.text}" + (f": {s.error}" if s.error else "") for s in self.journal.pending()]
            self.journal.mark_done(step)
            if isinstance(o.output, mutate.Restarted) and o.output.pid:   # the server as found, started again
                self.on_restart({"pid": o.output.pid, "log": o.output.log}, not o.output.already_running)
            elif step.tool == "restart_hook":
                self.on_restart(None, True)
        return []
