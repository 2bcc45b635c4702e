"""Sealing a simulated host: Debian's ``bubblewrap`` binds its folders at their paths in a new
mount, pid, UTS, IPC and network namespace; commands enter it with ``nsenter``.

The namespace's first process is ``bwrap`` itself (pid 1, which reaps orphans as init
does) with one ``sleep`` (pid 2) that holds it; its arguments travel through a pipe
(``--args``), so its command line names no folder of this machine. ``/`` is a fresh
tmpfs: the system's ``/usr`` (without ``/usr/local``) read-only, and the host's own
folders. The network namespace has only its own loopback (this machine's listeners stay
outside; the GPU service is a bound unix socket), and ``/proc/loadavg`` is the host's. Killing pid 1 ends every process of the host.
Where the server is its container's pid 1 (``host.container.pid1``), bwrap runs with ``--as-pid-1``: no reaper, the
namespace's first process is a shell that waits for the server's start script and becomes the server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from functools import lru_cache
from typing import TYPE_CHECKING

from . import supervised
from .shell import pids_where

if TYPE_CHECKING:
    from .sandbox import SimHost

CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}  # what the namespace's pid 1 and 2 carry
USR = ("bin", "sbin", "lib", "lib32", "lib64", "libexec", "share", "include")


@lru_cache(maxsize=1)
def _probe() -> str:
    """Why this machine cannot seal a host ("" when it can)."""
    if not shutil.which("bwrap"):
        return "bwrap is not installed: apt-get install bubblewrap"
    if not shutil.which("nsenter"):
        return "nsenter is not installed: apt-get install util-linux"
    r = subprocess.run(["bwrap", "--unshare-pid", "--unshare-uts", "--unshare-net", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin",
                        "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc",
                        "--dev", "/dev", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"bwrap cannot create namespaces here: {r.stderr.strip()[:200]}"
    return ""


def _why() -> str:
    if os.environ.get("DEBUGAGENT_SIM_UNSEALED") == "1":   # read at each host's start, not cached
        return "DEBUGAGENT_SIM_UNSEALED=1 is set"
    return _probe()


def available() -> bool:
    return _why() == ""


def why_not() -> str:
    return _why() or "it can be sealed"


def bwrap_args(sim: SimHost) -> list[str]:
    a = ["--unshare-pid", "--unshare-uts", "--unshare-ipc", "--unshare-net", "--hostname", sim.state["hostname"], "--die-with-parent",
         "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--dir", "/var/tmp", "--dir", "/var/log", "--dir", "/usr"]
    for d in USR:
        if os.path.isdir(f"/usr/{d}") and not os.path.islink(f"/usr/{d}"):
            a += ["--ro-bind", f"/usr/{d}", f"/usr/{d}"]
    for d in ("bin", "sbin", "lib", "lib64"):
        if os.path.islink(f"/{d}"):
            a += ["--symlink", os.readlink(f"/{d}"), f"/{d}"]
        elif os.path.isdir(f"/{d}"):
            a += ["--ro-bind", f"/{d}", f"/{d}"]
    a += ["--bind", str(sim.path("/usr/local")), "/usr/local", "--bind", str(sim.path("/etc")), "/etc",
          "--bind", str(sim.path("/sys")), "/sys", "--bind", str(sim.path("/run")), "/run"]
    for r in sim.roots:
        a += ["--bind", str(sim.path(r)), r]
    if sim.system_python():   # the system python's own packages are no part of the host's
        for d in ("/usr/lib/python3/dist-packages", f"/usr/lib/{sim.system_pyv()}/dist-packages"):
            if os.path.isdir(d):
                a += ["--tmpfs", d]
    base = sim.base_python()
    if not base.startswith("/usr/") or base.startswith("/usr/local/"):
        prefix = os.path.dirname(os.path.dirname(base))
        a += ["--ro-bind", prefix, prefix]
    a += ["--ro-bind", str(sim.base / "proc-loadavg"), "/proc/loadavg", "--ro-bind", str(sim.base / "proc-cpuinfo"),
          "/proc/cpuinfo", "--ro-bind", str(sim.base / "proc-meminfo"), "/proc/meminfo", "--tmpfs", "/proc/driver", "--dir", "/proc/driver/nvidia",
          "--ro-bind", str(sim.base / "proc-driver-nvidia" / "version"), "/proc/driver/nvidia/version",
          "--chdir", "/", *supervised.bwrap_args(sim)]
    return a


def start(sim: SimHost) -> tuple[subprocess.Popen[bytes], int]:
    """Start the namespace; returns bwrap's process and the pid (here) of the process that holds it."""
    args_r, args_w = os.pipe()
    info_r, info_w = os.pipe()
    files: list[str] = []
    fds: list[int] = []   # files of the host's / itself (a container's /.dockerenv), copied in by bwrap: no mount
    for dest, content in supervised.root_files(sim).items():
        r, w = os.pipe()
        os.write(w, content)
        os.close(w)
        fds.append(r)
        files += ["--perms", "0755", "--file", str(r), dest]   # as docker makes it
    data = b"".join(x.encode() + b"\0" for x in [*bwrap_args(sim), *files, "--info-fd", str(info_w)])
    pid1 = supervised.pid1(sim)
    # the server as its container's pid 1 (``host.container.pid1``): no reaper, the namespace's first process waits
    # for the server's start script (supervised.PID1_SCRIPT) and becomes the server (exec), as a container's does
    first = (["--as-pid-1", "/bin/sh", "-c", f"until [ -e {supervised.PID1_SCRIPT} ]; do sleep 0.05; done; "
              f"exec /bin/sh {supervised.PID1_SCRIPT}"] if pid1 else ["sleep", "infinity"])
    proc = subprocess.Popen(["bwrap", "--args", str(args_r), *first], pass_fds=(args_r, info_w, *fds), env=CLEAN_ENV,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            # a session of its own: a terminal's Ctrl-C reaches debugagent, which undoes and then ends
                            # the host (--die-with-parent), not the host under the undo's feet
                            start_new_session=True)
    os.close(args_r)
    os.close(info_w)
    for fd in fds:
        os.close(fd)
    with os.fdopen(args_w, "wb") as w:
        w.write(data)
    info = b""
    with os.fdopen(info_r, "rb") as r:
        info = r.read()  # bwrap closes it once the namespace is set up (or it failed)
    try:
        pid = int(json.loads(info)["child-pid"])
    except (ValueError, KeyError):
        pid = 0
    # bwrap reports its pid 1 before it has set up the mounts; the namespace is ready once pid 1 has
    # started the holding process (pid 2), which is then the one to enter.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if pid1:   # bwrap itself becomes the waiting shell once the namespace is set up
                if os.readlink(f"/proc/{pid}/exe").rsplit("/", 1)[-1] in ("sh", "dash", "bash"):
                    return proc, pid
                raise OSError
            kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
            if kids and os.readlink(f"/proc/{kids[0]}/exe").endswith("/sleep"):
                return proc, int(kids[0])
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.005)
    assert proc.stderr is not None   # stderr=subprocess.PIPE
    err = proc.stderr.read().decode(errors="replace") if proc.poll() is not None else "it did not start in 30 s"
    stop(proc)
    from ..errors import ScenarioError
    raise ScenarioError(f"bwrap could not seal the host: {err.strip()[:300]}", file=sim.scenario.source)


def _entering(init_pid: int) -> list[int]:
    """The ``nsenter --target=INIT_PID`` processes of this machine (they live outside the namespace)."""
    want = f"--target={init_pid}".encode()
    return pids_where(lambda argv: argv[0].endswith(b"nsenter") and want in argv)


def stop(proc: subprocess.Popen[bytes], init_pid: int = 0) -> None:
    """End the host: SIGKILL to the namespace's pid 1 ends every process in it; then bwrap.

    First every ``nsenter`` into it is killed: its child inside the namespace dies with pid 1,
    and if the ``nsenter`` is stopped (a frozen SSH session) it never reaps that child, so the
    namespace's pid 1 would wait for it for ever."""
    if init_pid:
        for pid in _entering(init_pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        try:
            ppid = int(open(f"/proc/{init_pid}/stat").read().rsplit(")", 1)[1].split()[1])
            os.kill(ppid, 9)
        except (OSError, ValueError, IndexError):
            pass
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        print(f"bwrap {proc.pid} did not exit", file=sys.stderr)
    if proc.stderr:
        proc.stderr.close()
