"""Where a signal's exception may stop the main thread, and where it must wait.

Python runs a signal's handler on the main thread between two bytecodes, wherever that thread is, and an
exception the handler raises leaves from there. Inside a library that takes a lock and calls Python code before its
``try`` the lock stays taken. paramiko's ``Transport._send_user_message`` is one: ``clear_to_send_lock.acquire()``,
then ``clear_to_send.is_set()``. An interrupt raised at that call left the lock taken, and the next message on the
connection (closing the interrupted command's channel, the undo's first command, paramiko's own keepalive) waited for
it for ever: a run stopped by SIGHUP hung instead of undoing (tests/test_signals_ssh.py makes it happen on purpose).

So the main thread's work inside such a library runs in a ``section``. A signal's exception that arrives in one
is ``defer``-red: kept, and raised where the code that owns the section can stop cleanly. That is ``check()``
(the SSH transport calls it between reads of a command's output, at most 50 ms apart) or the end of the outermost
section. A section that ``holds`` (a mutation's command and the recording of its result: ``agent/signals.py``
``held``) is not cut at ``check()`` either: its exception waits for the section's end.

Only the main thread's sections count: a signal's handler never runs on another thread, so the others' work is
never cut and needs no section.
"""

from __future__ import annotations

import threading
from collections.abc import Generator
from contextlib import AbstractContextManager, contextmanager


class Gate:
    """The main thread's sections, and the one exception waiting for their end (or a ``check``)."""

    def __init__(self) -> None:
        self.depth = 0        # sections open on the main thread
        self.holding = 0      # of them, those ``check()`` must not cut
        self.pending: BaseException | None = None

    @staticmethod
    def _main() -> bool:
        return threading.current_thread() is threading.main_thread()

    def defer(self, exc: BaseException) -> bool:
        """Called by a signal's handler: True when ``exc`` is kept for later (a section is open), False when the
        handler may raise it now. The first one kept wins."""
        if not self.depth:
            return False
        if self.pending is None:
            self.pending = exc
        return True

    @contextmanager
    def section(self, holds: bool = False) -> Generator[None, None, None]:
        """A stretch a signal's exception must not cut. Where one was kept, the outermost section's end raises it
        (also over an exception of the section's own: the interrupt comes first). Off the main thread, plain."""
        if not self._main():
            yield
            return
        # the counts change in this order so that a signal between two of these lines finds them consistent: it is
        # kept while ``depth`` counts this section, and ``holding`` never outlives it
        self.depth += 1
        self.holding += holds
        try:
            yield
        finally:
            self.holding -= holds
            self.depth -= 1
            if not self.depth and self.pending is not None:
                exc, self.pending = self.pending, None
                raise exc

    def check(self) -> None:
        """A point where the section's owner can stop: the exception kept, if any, is raised here, unless a
        section that holds is open (it waits for that section's end)."""
        if self.pending is not None and not self.holding and self._main():
            exc, self.pending = self.pending, None
            raise exc


GATE = Gate()


def shielded() -> AbstractContextManager[None]:
    """A section of library work that ``check()`` may still stop (the SSH transport's commands)."""
    return GATE.section()


def check() -> None:
    """Raise the exception a signal left for this point, if any (``Gate.check``)."""
    GATE.check()
