"""A "container" made of real namespaces on this machine: bubblewrap's new mount, pid, net, IPC and UTS namespaces,
``/`` read-only, its own ``/tmp`` and ``/run`` (tmpfs), the test's folder bound in (and, read-only, the repository and
this interpreter's prefix where they live under ``/tmp``); a ``sleep`` holds it (as a
container's init does) and the server is started in it by ``nsenter``, as ``docker exec -d`` would.

Nothing here stands in for debugagent's side: runs reach it through ``--host nsenter:PID`` (or a runtime CLI on
PATH that really enters it), and what they leave is read from the namespace's own ``/proc`` and ``/tmp``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .conftest import Host

REPO = Path(__file__).resolve().parents[2]


def kept() -> list[str]:
    """bwrap arguments that bind back, read-only, what the box's own ``/tmp`` and ``/run`` would hide and the runs
    need: this interpreter's prefixes and the repository (a checkout, or its venv, may live under ``/tmp``)."""
    paths = sorted({Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, REPO,
                                                Path(sys.executable).resolve().parent)})
    hidden = [p for p in paths if p.parts[:2] in (("/", "tmp"), ("/", "run")) and len(p.parts) > 2]
    outer = [p for p in hidden if not any(q != p and q in p.parents for q in hidden)]
    return [a for p in outer for a in ("--ro-bind", str(p), str(p))]


def why_not() -> str:
    """Why no namespace can be made here ("" when it can)."""
    if os.geteuid() != 0:
        return "entering another process's namespaces with nsenter needs root"
    for tool in ("bwrap", "nsenter"):
        if not shutil.which(tool):
            return f"{tool} is not installed (apt-get install {'bubblewrap' if tool == 'bwrap' else 'util-linux'})"
    r = subprocess.run(["bwrap", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                        "true"], capture_output=True, text=True)
    return "" if r.returncode == 0 else f"bwrap cannot make namespaces here: {r.stderr.strip()[:200]}"


@dataclass
class Box:
    """One namespace: ``pid`` is its holder as this machine numbers it (what ``nsenter:PID`` names)."""

    proc: subprocess.Popen
    pid: int
    dir: Path

    def enter(self, *argv: str) -> list[str]:
        return ["nsenter", "--target", str(self.pid), "--mount", "--uts", "--ipc", "--net", "--pid", "--root", "--wd",
                "--", *argv]

    def sh(self, script: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.enter("sh", "-c", script), capture_output=True, text=True, timeout=60, **kw)

    def tmp(self) -> list[str]:
        """The namespace's own /tmp, read through its root."""
        return sorted(os.listdir(f"/proc/{self.pid}/root/tmp"))

    def stop(self) -> None:
        try:   # the namespace's pid 1 (bwrap's init, the holder's parent): killing it ends every process in it
            init = int(Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            os.kill(init, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def make_box(folder: Path, hostname: str = "box", binds: tuple[Path, ...] = ()) -> Box:
    """The namespace, ready: its holder's pid once bwrap has set up the mounts. ``binds``: more folders of this
    machine bound in, writable, at the same path (a home shared with the machine, as an NFS home would be)."""
    info_r, info_w = os.pipe()
    argv = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--hostname", hostname,
            "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--tmpfs", "/run", *kept(), "--bind", str(folder), str(folder),
            *(a for b in binds for a in ("--bind", str(b), str(b))), "--info-fd", str(info_w), "sleep", "infinity"]
    proc = subprocess.Popen(argv, pass_fds=(info_w,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(info_w)
    with os.fdopen(info_r, "rb") as r:
        init = int(json.loads(r.read() or b"{}").get("child-pid", 0))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            kids = Path(f"/proc/{init}/task/{init}/children").read_text().split()
            if kids and os.readlink(f"/proc/{kids[0]}/exe").endswith("/sleep"):
                return Box(proc, int(kids[0]), folder)
        except OSError:
            pass
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("the namespace did not start")


def server_box(folder: Path, h: Host) -> Box:
    """A box whose pid 1 is ``h``'s server itself (as in a container whose entrypoint is the server): ``pid`` is the
    server as this machine numbers it. Returns once it answers there."""
    (h.dir / "bench.py").write_text(__import__("tests.realhost.conftest", fromlist=["BENCH"]).BENCH)
    argv = ["bwrap", "--as-pid-1", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--hostname", "srv",
            "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--tmpfs", "/run", *kept(), "--bind", str(folder), str(folder), "--chdir", str(h.cwd), *h.argv()]
    with open(h.log, "ab") as log:
        proc = subprocess.Popen(argv, env=h.server_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if kids and "infer.serve" in Path(f"/proc/{kids[0]}/cmdline").read_text():
                box = Box(proc, int(kids[0]), folder)
                if bench_in(box, h) is not None:
                    return box
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the server did not start as the box's pid 1; log: {h.log.read_text()[-500:]}")


def start_in(box: Box, h: Host) -> None:
    """Start ``h``'s server inside the namespace (detached, its output in its log), and wait until it answers there."""
    (h.dir / "bench.py").write_text(__import__("tests.realhost.conftest", fromlist=["BENCH"]).BENCH)
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in h.server_env().items())
    cmd = (f"cd {shlex.quote(str(h.cwd))} && exec env -i {env} {' '.join(shlex.quote(a) for a in h.argv())} "
           f">> {shlex.quote(str(h.log))} 2>&1 < /dev/null")
    subprocess.run(box.enter("setsid", "-f", "sh", "-c", cmd), check=True, timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if bench_in(box, h) is not None:
            return
        time.sleep(0.1)
    raise AssertionError(f"the server did not start in the namespace; log: {h.log.read_text()[-500:]}")


def bench_in(box: Box, h: Host) -> float | None:
    r = box.sh(h.bench_cmd())
    return float(r.stdout.split("=")[1].split()[0]) if r.returncode == 0 else None
