"""The ``debugagent`` command's entry point: SIGTERM and SIGHUP answered as Ctrl-C is (exit 130) from the
first instant, before the command's heavy imports (a run installs its own handlers once it starts: ``signals``)."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

from debugagent.tools.interrupts import GATE

# what a signal interrupts once no run's handlers answer it: the start (nothing changed yet), or, once a run's handlers
# are gone again (``agent/signals.py``), the run's end (its undo has run, its outputs are being written)
STARTING = "while starting; nothing on the host was changed"
WHEN = {"now": STARTING}
AFTER_RUN = "as the run ended, after its undo (its folder says how the run ended)"


def _stop(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    try:   # said here (a plain write): the command line library turns the interrupt into a silent exit 130
        os.write(2, f"interrupted ({name}) {WHEN['now']}\n".encode())
    except OSError:
        pass
    exc = KeyboardInterrupt(name)
    if GATE.defer(exc):   # inside the SSH transport's work: raised where it can stop (tools/interrupts.py)
        return
    raise exc


def main() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:   # one ignored on purpose (nohup) stays ignored
            signal.signal(sig, _stop)
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt as exc:
        if not exc.args:   # Ctrl-C (a signal's handler said it already)
            sys.stderr.write("interrupted (SIGINT) while starting; nothing on the host was changed\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
