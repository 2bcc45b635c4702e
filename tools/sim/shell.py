"""How a command reaches a simulated host: entered into its namespace (sealed) or rewritten onto
its folder (not sealed). Standard library only.

Shared by ``SimHost.exec`` (``--host sim:…``) and by ``remote.py``, the command an
OpenSSH server runs for ``debugagent sim serve``: so what ``ssh`` shows is what
``sim:`` shows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path


def enter(init_pid: int, home: str, env: dict[str, str], argv: list[str]) -> list[str]:
    """The command line that runs ``argv`` inside the sealed host whose namespace ``init_pid`` holds."""
    user = [] if os.geteuid() == 0 else ["--user", "--preserve-credentials"]
    return ["nsenter", f"--target={init_pid}", *user, "--mount", "--pid", "--uts", "--ipc", "--net", "--root", f"--wdns={home}",
            "--", "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]


def pids_where(match: Callable[[list[bytes]], bool]) -> list[int]:
    """The pids of this machine whose argv (a list of bytes) ``match`` accepts."""
    pids: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if match(argv):
            pids.append(int(entry.name))
    return pids


class SimShell:
    def __init__(self, sandbox: str, bin_dir: str, roots: list[str], user: str, aliases: dict[str, str] | None = None) -> None:
        self.sandbox = sandbox
        self.aliases = aliases or {}   # folder in the sandbox -> the path the host shows for it
        self.bin = bin_dir
        self.roots = roots
        self.user = user
        self._re = re.compile(
            # a path starts a word, or follows the \x1f that joins a command line's arguments (a restart's check)
            r"(?:(?<![\w.~/-])|(?<=\\x1f))(" + "|".join(re.escape(r) for r in sorted(roots, key=len, reverse=True))
            + r")(?=[/\s'\";|&)<>:*\[]|\\x1f|$)")
        self._marker = sandbox.encode()

        self.sealed = False
        self.init_pid = 0

    @classmethod
    def load(cls, base: str) -> SimShell:
        d = json.loads((Path(base) / "exec.json").read_text())
        sh = cls(d["sandbox"], d["bin"], d["roots"], d["user"], d.get("aliases"))
        sh.sealed, sh.init_pid = bool(d.get("sealed")), int(d.get("init_pid") or 0)
        return sh

    def save(self, base: Path, *, sealed: bool = False, init_pid: int = 0) -> None:
        self.sealed, self.init_pid = sealed, init_pid
        (base / "exec.json").write_text(json.dumps({"sandbox": self.sandbox, "bin": self.bin, "roots": self.roots,
                                                    "user": self.user, "sealed": sealed, "init_pid": init_pid,
                                                    "aliases": self.aliases}))

    def home_inside(self) -> str:
        return "/root" if self.user == "root" else "/home/" + self.user

    def argv(self, command: str, *, sealed: bool | None = None, init_pid: int | None = None, args: list[str] | None = None) -> list[str]:
        """``bash -c COMMAND`` (or ``bash ARGS``) as it runs on the host: entered into its namespace where
        sealed, rewritten onto the sandbox folder where not."""
        sealed = self.sealed if sealed is None else sealed
        bash = ["bash", *(args if args is not None else ["-c", command if sealed else self.rewrite(command)])]
        if not sealed:
            return bash
        return enter(self.init_pid if init_pid is None else init_pid, self.home_inside(), self.env(sealed=True), bash)

    def rewrite(self, command: str) -> str:
        return self._re.sub(lambda m: self.sandbox + m.group(1), command)

    def unrewrite(self, text: str) -> str:
        for inside, shown in self.aliases.items():
            text = text.replace(inside, shown)
        return text.replace(self.sandbox, "")

    def home(self) -> str:
        return self.sandbox + ("/root" if self.user == "root" else "/home/" + self.user)

    def env(self, sealed: bool | None = None) -> dict[str, str]:
        # pip on a simulated host resolves only from what the scenario lays out (its wheelhouse, given with
        # --find-links): never from this machine's pip configuration or the network, sealed or not, so the
        # two modes give one answer (a sealed host has no network; an unsealed one would reach the index)
        offline = {"PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INDEX": "1"}
        if self.sealed if sealed is None else sealed:
            return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": self.home_inside(),
                    "USER": self.user, "LOGNAME": self.user, "LANG": "C.UTF-8", "SHELL": "/bin/bash", **offline}
        return {
            "PATH": f"{self.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": self.home(), "USER": self.user, "LOGNAME": self.user, "LANG": "C.UTF-8", "SHELL": "/bin/bash",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", **offline,
            **({"TMPDIR": self.sandbox + "/tmp"} if "/tmp" in self.roots else {}),
        }

    def own_pids(self) -> list[int]:
        """Real pids of every process started from this sandbox (its python)."""
        return pids_where(lambda argv: self._marker in argv[0])

    def sync_proc(self) -> None:
        """Make the sandbox's /proc hold exactly the live processes of this sandbox (each a link to this machine's
        /proc/PID; one whose cgroup the host shows otherwise, a folder of links with that ``cgroup`` file)."""
        proc = Path(self.sandbox) / "proc"
        live = set(self.own_pids())
        cgroups = Path(self.sandbox).parent / "cgroups"   # written by supervised.show_cgroup
        for p in proc.iterdir():
            if p.name.isdigit() and int(p.name) not in live:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
        for pid in live:
            link = proc / str(pid)
            cg = cgroups / str(pid)
            if cg.is_file():
                if not link.is_dir() or link.is_symlink() or (link / "cgroup").is_symlink():
                    _proc_folder(pid, link, cg.read_text())
            elif not link.is_symlink():
                try:
                    link.symlink_to(f"/proc/{pid}")
                except FileExistsError:
                    pass


def _proc_folder(pid: int, folder: Path, cgroup: str) -> None:
    """``folder`` as this machine's /proc/PID: a link to each entry (``cwd``, ``exe`` and ``root`` to where they
    point, so ``readlink`` reads the same and a path rewritten onto the host's folder resolves under ``root``), but
    ``cgroup``, a file of the given text."""
    # a name of this process and thread: commands run at once each sync /proc (the first made wins)
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.{threading.get_ident()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        names = os.listdir(f"/proc/{pid}")
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    for name in names:
        try:
            if name == "cgroup":
                (tmp / name).write_text(cgroup)
            elif name in ("cwd", "exe", "root"):
                (tmp / name).symlink_to(os.readlink(f"/proc/{pid}/{name}"))
            else:
                (tmp / name).symlink_to(f"/proc/{pid}/{name}")
        except OSError:
            continue
    try:
        if folder.is_symlink() or folder.is_file():
            folder.unlink()
        elif folder.is_dir():
            shutil.rmtree(folder)
        os.rename(tmp, folder)
    except OSError:   # another command's sync made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)


class StreamUnrewrite:
    """Removes the sandbox prefix from a byte stream, also where a chunk boundary splits it."""

    def __init__(self, sandbox: str) -> None:
        self.needle = sandbox.encode()
        self.tail = b""

    def feed(self, chunk: bytes) -> bytes:
        data = (self.tail + chunk).replace(self.needle, b"")
        keep = 0
        for k in range(min(len(self.needle) - 1, len(data)), 0, -1):
            if self.needle.startswith(data[-k:]):
                keep = k
                break
        self.tail = data[len(data) - keep:] if keep else b""
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        out, self.tail = self.tail, b""
        return out
