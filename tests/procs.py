"""Process-tree helpers for the tests that kill or stop an sshd listener and its connections.

A connection can end on its own between being listed and being signalled: every helper skips a
process that is gone, since it cannot answer either."""

from __future__ import annotations

import os
import signal
import subprocess


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (an sshd listener's connections and their sessions), deepest first."""
    out: list[int] = []
    for child in children(pid):
        out += descendants(child) + [child]
    return out


def signal_if_alive(pid: int, sig: int) -> bool:
    """Send ``sig``; False when the process ended after it was listed (a connection closing on its own)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def freeze_tree(listener: int) -> list[int]:
    """SIGSTOP the listener first (no new connection can start), then every process under it, walking down
    until a pass finds none new. Returns what was stopped, for ``thaw``."""
    os.kill(listener, signal.SIGSTOP)
    stopped, todo = [listener], [listener]
    while todo:
        for pid in children(todo.pop()):
            if pid not in stopped and signal_if_alive(pid, signal.SIGSTOP):
                stopped.append(pid)
                todo.append(pid)
    return stopped


def thaw(pids: list[int]) -> None:
    for pid in pids:
        signal_if_alive(pid, signal.SIGCONT)
