"""The command an OpenSSH server runs for ``debugagent sim serve`` (its ``ForceCommand``).

``python -S remote.py BASE``: runs ``$SSH_ORIGINAL_COMMAND`` in the simulated host laid
out under BASE, exactly as ``SimHost.exec`` does, streaming stdout and stderr back with
the sandbox folder removed. With no command (an interactive login) it reads commands
line by line at a prompt. Standard library only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shell import SimShell, StreamUnrewrite  # noqa: E402


def pump(src, dst, sandbox: str) -> None:
    u = StreamUnrewrite(sandbox)
    while True:
        chunk = src.read1(65536) if hasattr(src, "read1") else src.read(65536)
        if not chunk:
            break
        dst.write(u.feed(chunk))
        dst.flush()
    dst.write(u.flush())
    dst.flush()


def run(sh: SimShell, command: str, stdin=None) -> int:
    sh.sync_proc()
    os.makedirs(sh.home(), exist_ok=True)
    p = subprocess.Popen(["bash", "-c", sh.rewrite(command)], stdin=stdin, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=sh.env(), cwd=sh.home())
    ts = [threading.Thread(target=pump, args=(p.stdout, sys.stdout.buffer, sh.sandbox)),
          threading.Thread(target=pump, args=(p.stderr, sys.stderr.buffer, sh.sandbox))]
    for t in ts:
        t.start()
    code = p.wait()
    for t in ts:
        t.join()
    sh.sync_proc()
    return code


def main() -> int:
    sh = SimShell.load(sys.argv[1])
    hostname = sys.argv[2] if len(sys.argv) > 2 else "sim"
    command = os.environ.get("SSH_ORIGINAL_COMMAND")
    if command is not None:
        return run(sh, command)
    code = 0
    while True:
        sys.stdout.write(f"{sh.user}@{hostname}:~# ")
        sys.stdout.flush()
        line = sys.stdin.readline()
        if not line or line.strip() in ("exit", "logout"):
            return code
        if line.strip():
            code = run(sh, line.rstrip("\n"), stdin=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
