"""The command an OpenSSH server runs for ``debugagent sim serve`` (its ``ForceCommand``) where the host is not
sealed (a sealed host's ``ForceCommand`` is a line of the login shell that runs ``nsenter`` itself:
``serve.remote_command``; the sealed path below does the same, for a host laid out by hand).

``python -S remote.py BASE``: runs ``$SSH_ORIGINAL_COMMAND`` in the simulated host laid out
under BASE, exactly as ``SimHost.exec`` does. On a sealed host it replaces itself with
``nsenter … bash -c COMMAND`` in the host's namespace, so the SSH channel's stdin, stdout
and stderr are bash's own (the shell sessions of ``tools/session.py`` included); with no
command (an interactive login) it starts an interactive bash there. On a host that is not
sealed it runs bash on the rewritten command and removes the sandbox folder from what it
prints. Standard library only: ``serve.remote_command`` runs it without site-packages, with
``tools/`` on ``PYTHONPATH`` for ``session`` (its own folder is on the path as the script's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO

from session import SESSION_COMMAND, frame, parse_frame  # tools/session.py: tools/ is on PYTHONPATH
from shell import SimShell, StreamUnrewrite  # tools/sim/shell.py, beside this script


def pump(src: IO[bytes], dst: IO[bytes], sandbox: str) -> None:
    u = StreamUnrewrite(sandbox)
    read = getattr(src, "read1", src.read)   # a buffered pipe's read1: what has come, without waiting for 64 KiB
    while True:
        chunk = read(65536)
        if not chunk:
            break
        dst.write(u.feed(chunk))
        dst.flush()
    dst.write(u.flush())
    dst.flush()


def bash_unsealed(sh: SimShell, args: list[str], stdin: int | None,
                  feed: Callable[[IO[bytes]], None] | None = None) -> int:
    """Runs ``bash ARGS`` on the sandbox folder, its output streamed back unrewritten; ``feed(w)``, if
    given (with ``stdin`` a pipe), writes its stdin ``w``. Returns bash's exit code."""
    sh.sync_proc()
    os.makedirs(sh.home(), exist_ok=True)
    p = subprocess.Popen(["bash", *args], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=sh.env(),
                         cwd=sh.home())
    ts = [threading.Thread(target=pump, args=(p.stdout, sys.stdout.buffer, sh.sandbox)),
          threading.Thread(target=pump, args=(p.stderr, sys.stderr.buffer, sh.sandbox))]
    for t in ts:
        t.start()
    if feed is not None:
        assert p.stdin is not None   # stdin=subprocess.PIPE
        feed(p.stdin)
    code = p.wait()
    for t in ts:
        t.join()
    sh.sync_proc()
    return code


def session_unsealed(sh: SimShell) -> int:
    """A shell session (tools/session.py): one bash, each frame rewritten on its way in."""

    def feed(w: IO[bytes]) -> None:
        try:
            for line in iter(sys.stdin.buffer.readline, b""):
                sh.sync_proc()
                text = line.decode("utf-8", "surrogateescape")
                parsed = parse_frame(text)
                w.write(frame(sh.rewrite(parsed[0]), parsed[1]) if parsed
                        else sh.rewrite(text).encode("utf-8", "surrogateescape"))
                w.flush()
            w.close()
        except BrokenPipeError:
            pass

    return bash_unsealed(sh, ["--noprofile", "--norc"], subprocess.PIPE, feed)


def main() -> int:
    sh = SimShell.load(sys.argv[1])
    hostname = sys.argv[2] if len(sys.argv) > 2 else "sim"
    command = os.environ.get("SSH_ORIGINAL_COMMAND")
    if sh.sealed:
        argv = sh.argv(command) if command is not None else sh.argv("", args=["-i"])
        os.execvp(argv[0], argv)
    if command == SESSION_COMMAND:
        return session_unsealed(sh)
    if command is not None:
        return bash_unsealed(sh, ["-c", sh.rewrite(command)], None)
    code = 0
    while True:
        sys.stdout.write(f"{sh.user}@{hostname}:~# ")
        sys.stdout.flush()
        line = sys.stdin.readline()
        if not line or line.strip() in ("exit", "logout"):
            return code
        if line.strip():
            code = bash_unsealed(sh, ["-c", sh.rewrite(line.rstrip("\n"))], subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
