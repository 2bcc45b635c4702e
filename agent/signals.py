"""SIGINT, SIGTERM and SIGHUP during a run: raised once as :class:`Interrupted`, never half-way through a change.

A signal that arrives while a mutation's command is under way on the host (``held``) is
kept until that command has returned and its result is recorded: stopping the wait
would not stop the command on the host, and an undo sent at once could reach the host
before it and be undone by it (a restart still starting a server after the undo looked).

One that arrives inside the SSH transport's work (``tools/interrupts.py``: paramiko takes locks
an exception must not leave taken) is kept too, and raised at the transport's next point where it
can stop (at most 50 ms later while a command runs).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Generator
from contextlib import contextmanager
from types import FrameType
from typing import Any, ClassVar

from debugagent.tools.interrupts import GATE

# what signal.signal takes and returns: a function, SIG_DFL or SIG_IGN, or None (a handler not set from Python)
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP: the run stops, restores the host, and exits 130."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class Signals:
    """SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` once; later ones are ignored, so a
    second Ctrl-C (or systemd's follow-up) cannot cut the undo short. Inside ``held()`` the first
    one waits for the end of the held section; inside the transport's sections, for its next stop."""

    NAMES = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    active: ClassVar[Signals | None] = None

    def __init__(self, on_held: Callable[[int], object] | None = None,
                 on_first: Callable[[int, bool], object] | None = None) -> None:
        self.old: dict[int, Handler] = {}
        self.received: list[int] = []
        self.on_held: Callable[[int], object] = on_held or (lambda signum: None)
        # told of the first signal at once (signum, whether it waits for a held section): the live view's header
        self.on_first: Callable[[int, bool], object] = on_first or (lambda signum, waits: None)

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if len(self.received) == 1:
            waits = bool(GATE.holding)
            self.on_first(signum, waits)
            if GATE.defer(Interrupted(signum)):
                if waits:
                    self.on_held(signum)
                return
            raise Interrupted(signum)

    @contextmanager
    def hold(self) -> Generator[None, None, None]:
        with GATE.section(holds=True):
            yield

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():   # handlers can only be set there
            for sig in self.NAMES:
                self.old[sig] = signal.signal(sig, self.handler)
            Signals.active = self
        return self

    def __exit__(self, *a: object) -> None:
        if self.old:   # the command's own handler again (agent/entry.py): it no longer says "while starting"
            from . import entry
            entry.WHEN["now"] = entry.AFTER_RUN
        for sig, h in self.old.items():
            signal.signal(sig, h)
        if Signals.active is self:
            Signals.active = None
            if not GATE.depth:
                GATE.pending = None   # every section has ended: nothing kept may outlive the run


@contextmanager
def held() -> Generator[None, None, None]:
    """A section a signal does not cut (a mutation's command and the recording of its result); outside a run's
    ``Signals``, a plain section."""
    s = Signals.active
    if s is None:
        yield
        return
    with s.hold():
        yield
