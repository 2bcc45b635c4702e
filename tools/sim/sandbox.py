"""A simulated GPU host: the scenario's folders, sealed in their own mount and pid namespace.

The host's own folders (``/root/ml-env``, ``/root/sglang``, ``/etc``, ``/sys/…/cpufreq``,
``/usr/local``, ``/run``) are laid out under one folder and bound at their paths by
Debian's ``bubblewrap`` (``tools.sim.seal``) into a mount, pid, UTS and IPC namespace: ``/``,
``ps`` and ``/proc`` show the simulated host only, and every command enters that namespace.
The scenario itself (factors, effects, ``expect``) never exists inside: the GPU service
(``tools.sim.controller``) runs in this process, outside, and answers over a bound unix
socket with observations only.

What is real inside: a Python environment with the scenario's distributions and a few
hundred more (metadata, ``RECORD``, compiled files whose bytes follow the build and a
per-host random salt, install times), ``pip`` and a wheelhouse to reinstall from, a git
repository with real commits whose code the server imports when it starts, the server as
a real process (``python -m``, a script or a console-script launcher) and its worker with
their own environments, CPU governor files. ``nvidia-smi`` and the benchmark are clients
of the GPU service (``guest/client.py``).

Where ``bwrap`` cannot run, the host is laid out the same way but commands are rewritten
onto its folder instead (``tools.sim.shell``): it works, and it says plainly that it is
not sealed.
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import io
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import zipfile
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from ..errors import ScenarioError, UsageError
from ..transport import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_TIMEOUT_S,
    BaseTransport,
    CommandResult,
    run_subprocess,
    ssh_line,
)
from . import seal, supervised
from .controller import Controller
from .environment import PIP_VERSION, extra_distributions
from .scenario import Scenario, load_scenario, python_entry
from .shell import SimShell
from .standin import so_bytes

DEFAULT_INSTALLED = "2026-11-02T09:00:00+00:00"
LOADAVG = "0.42 0.37 0.31 1/812 41235\n"  # /proc/loadavg of every simulated host, whatever this machine's load


def cpuinfo(model: str, cores: int) -> str:
    """/proc/cpuinfo of a simulated host: ``cores`` processors of ``model``."""
    one = ("processor\t: {i}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: {model}\n"
           "stepping\t: 8\ncpu MHz\t\t: 2000.000\ncache size\t: 107520 KB\nphysical id\t: {sock}\nsiblings\t: {per}\n"
           "core id\t\t: {core}\ncpu cores\t: {per}\nflags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr "
           "avx2 avx512f amx_bf16 amx_tile amx_int8\nbogomips\t: 4000.00\n\n")
    per = max(1, cores // 2) if cores > 1 else 1
    return "".join(one.format(i=i, model=model, sock=i // per, per=per, core=i % per) for i in range(cores))


def meminfo(gib: int) -> str:
    """/proc/meminfo of a simulated host with ``gib`` GiB, mostly free (its first lines, as `free` reads them)."""
    total = gib * 1024 * 1024
    free, avail = total * 93 // 100, total * 97 // 100
    return (f"MemTotal:       {total} kB\nMemFree:        {free} kB\nMemAvailable:   {avail} kB\n"
            f"Buffers:          {total // 2000} kB\nCached:         {total // 40} kB\nSwapCached:            0 kB\n"
            "SwapTotal:             0 kB\nSwapFree:              0 kB\n")


def uname_script(hostname: str, kernel: str) -> str:
    """`uname` of a simulated host: its kernel release and node name; the machine and system as a GPU node's.
    Options as GNU uname takes them (clustered short ones, long ones, ``-a``); fields in uname's order."""
    values = {"s": "Linux", "n": hostname, "r": kernel, "v": "#1 SMP PREEMPT_DYNAMIC Tue Nov 11 09:12:44 UTC 2025",
              "m": "x86_64", "p": "x86_64", "i": "x86_64", "o": "GNU/Linux"}
    longs = {"kernel-name": "s", "nodename": "n", "kernel-release": "r", "kernel-version": "v", "machine": "m",
             "processor": "p", "hardware-platform": "i", "operating-system": "o", "all": "snrvmpio"}
    sets = " ".join(f"{k}={shlex.quote(v)}" for k, v in values.items())
    cases = "".join(f"    --{name}) want=\"${{want}}{keys}\";;\n" for name, keys in longs.items())
    return ("#!/bin/sh\n" + sets + "\nwant=\n[ $# -eq 0 ] && want=s\nfor a in \"$@\"; do\n  case \"$a\" in\n" + cases +
            "    --*) echo \"uname: unrecognized option '$a'\" >&2; exit 1;;\n"
            "    -?*) x=${a#-}; case \"$x\" in *[!asnrvmpio]*) echo \"uname: invalid option -- '$x'\" >&2; exit 1;; esac\n"
            "         case \"$x\" in *a*) want=snrvmpio;; *) want=\"$want$x\";; esac;;\n"
            "    *) echo \"uname: extra operand '$a'\" >&2; exit 1;;\n  esac\ndone\nout=\n"
            "for k in s n r v m p i o; do case \"$want\" in *$k*) eval \"out=\\\"\\${out:+\\$out }\\$$k\\\"\";; esac; done\n"
            "echo \"$out\"\n")


FIRST_COMMIT = 1763283600  # 2025-11-16T09:00Z
GUEST = Path(__file__).resolve().parent / "guest"
SERVICE_DIR = "/run/nvidia-gpu"
PYV = f"python{sys.version_info.major}.{sys.version_info.minor}"
LEGACY_PACKAGE = ("sglang", "python")  # what a repository held before `repo.package` (format 1's first files)


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


# the longest unix socket a host makes under its folder (its supervisor's, engine's and GPU service's sockets)
LONGEST_SOCKET = max((f"{SERVICE_DIR}/service.sock", supervised.SOCKET, *supervised.ENGINE_SOCKET.values(),
                      "/run/systemd/private"), key=len)
SUN_PATH = 108   # bytes a unix socket's path holds (sockaddr_un.sun_path; Linux and Python take it without a NUL)


def _short_enough(sandbox: Path, temporary: bool) -> None:
    """A host folder too deep for its sockets' paths is refused before anything is made there, naming what to
    shorten (a socket's bind would fail later with no word of why)."""
    longest = len(os.fsencode(f"{sandbox}{LONGEST_SOCKET}"))
    if longest > SUN_PATH:
        where = "the temporary folder ($TMPDIR)" if temporary else "the host's folder"
        raise UsageError(f"a simulated host in {sandbox.parent} would need a unix socket path of {longest} bytes "
                         f"({sandbox}{LONGEST_SOCKET}); a socket's path holds {SUN_PATH}",
                         fix=f"give {where} a path at least {longest - SUN_PATH} bytes shorter, e.g. under /tmp")


def _scratch() -> str | None:
    """Memory-backed scratch space for a host's folders where there is room (a host writes ~1500 small
    files), else the default temporary folder."""
    try:
        st = os.statvfs("/dev/shm")
        if os.access("/dev/shm", os.W_OK) and st.f_bavail * st.f_frsize > 2 << 30:
            return "/dev/shm"
    except OSError:
        pass
    return None


_built: dict[str, Path] = {}   # the clients this process compiled, by key


def compiled_client(service: str) -> Path | None:
    """``guest/client.c`` compiled for ``service`` (cached per user; None where no C compiler is)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or os.environ.get("DEBUGAGENT_SIM_NO_CC") == "1":
        return None
    src = (GUEST / "client.c").read_bytes()
    key = hashlib.sha256(src + service.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "debugagent"
    out = cache / f"sim-client-{key}"
    if out.exists():
        return out
    built = _built.get(key)   # this process built it already, under another cache folder (a test's own HOME)
    if built is not None and built.exists():
        return built
    cache.mkdir(parents=True, exist_ok=True)
    # a name of this process and thread: hosts started at once in one process (threads) compile side by side
    tmp = cache / f".sim-client-{key}.{os.getpid()}.{threading.get_ident()}"
    r = subprocess.run([cc, "-O2", "-o", str(tmp), f'-DSERVICE="{service}"', "-x", "c", "-"], input=src,
                       capture_output=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        return None
    os.replace(tmp, out)
    _built[key] = out
    return out


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


_pip_copies: dict[tuple[str, int], tuple[int, Path]] = {}   # (pip's folder, file system) -> (this pid, its copy there)
_pip_lock = threading.Lock()


def _pip_tree(src: Path, site: Path) -> Path:
    """The pip folder a host's pip is hard-linked from: this interpreter's own where ``site`` is on its file system,
    else one copy this process makes on the scratch file system (``/dev/shm``) the first time, removed when it exits:
    each host is then ~1000 links, not 17 MB copied file by file. Copies that exited processes left are removed."""
    dev = os.stat(site).st_dev
    if os.stat(src).st_dev == dev:
        return src
    scratch = Path(_scratch() or tempfile.gettempdir())
    if os.stat(scratch).st_dev != dev:   # a host laid out elsewhere (a given root): copied file by file
        return src
    with _pip_lock:
        have = _pip_copies.get((str(src), dev))
        if have is not None and have[0] == os.getpid() and (have[1] / src.name).is_dir():
            return have[1] / src.name
        for old in scratch.glob("sim-pip-*-*"):
            try:
                pid = int(old.name.split("-")[2])
                if old.stat().st_uid == os.getuid() and pid != os.getpid():
                    os.kill(pid, 0)
            except ProcessLookupError:
                shutil.rmtree(old, ignore_errors=True)
            except (OSError, ValueError):
                pass
        root = Path(tempfile.mkdtemp(prefix=f"sim-pip-{os.getpid()}-", dir=scratch))
        try:
            shutil.copytree(src, root / src.name)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        pid = os.getpid()
        atexit.register(lambda: os.getpid() == pid and shutil.rmtree(root, ignore_errors=True))   # not a forked child's
        _pip_copies[(str(src), dev)] = (pid, root)
        return root / src.name


def host_salt(name: str) -> str:
    """The salt of a scenario's build bytes: from a random secret of this machine's user (outside every
    sealed host), so the good and bad states of one scenario agree, and nothing inside a host, nor anyone
    who only has the scenario file, can compute a build's bytes."""
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "debugagent"
    f = state / "sim-salt"
    if not f.exists():
        state.mkdir(parents=True, exist_ok=True)
        # one temporary name per process and thread: hosts started at once in one process race here
        tmp = state / f".sim-salt.{os.getpid()}.{threading.get_ident()}"
        tmp.write_text(secrets.token_hex(32))
        tmp.chmod(0o600)
        try:
            os.link(tmp, f)   # atomic: the first one made wins, every other host reads that one
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    return hashlib.sha256(f"{f.read_text().strip()}:{name}".encode()).hexdigest()[:32]


class SimHost:
    """Lays out one scenario state, seals it, runs commands in it, tears it down."""

    def __init__(self, scenario: Scenario, state: Literal["good", "bad"] = "bad", root: str | None = None,
                 sealed: bool | None = None) -> None:
        self.scenario = scenario
        self.which = state
        self.state = scenario.state(state)
        self.base = Path(root or tempfile.mkdtemp(prefix="sim-", dir=_scratch()))
        self.sandbox = self.base / "fs"
        try:
            _short_enough(self.sandbox, root is None)
        except UsageError:
            if root is None:
                shutil.rmtree(self.base, ignore_errors=True)
            raise
        self.salt = host_salt(scenario.name)
        self.sealed = seal.available() if sealed is None else sealed
        self.unsealed_reason = "" if self.sealed else seal.why_not()
        self.init_pid = 0
        self._bwrap: subprocess.Popen | None = None
        self.controller: Controller | None = None
        self.labels: dict[str, str] = {}
        self._code: str | None = None   # the package whose modules the commits change (the repository's)
        self._code_dir: str | None = None   # or their folder, relative to the server's script
        self.roots = self._roots()
        self.shell = SimShell(str(self.sandbox), str(self.path("/usr/local/bin")), self.roots, self.state["user"],
                              self.aliases())
        try:
            self._layout()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ layout
    def _roots(self) -> list[str]:
        """Top-level folders the scenario owns (bound or rewritten at their paths)."""
        h = self.state
        roots = {"/root" if h["user"] == "root" else "/home"}
        paths = [h["python"], (h.get("repo") or {}).get("path"), h["server"].get("cwd"), self._script()]
        if h.get("wheelhouse"):
            paths.append(h["wheelhouse"]["path"])
        local: set[str] = set()   # folders under /usr/local (bound with it where sealed, rewritten where not)
        if self.system_python():
            paths.remove(h["python"])   # the system's interpreter: its packages are in /usr/local's dist-packages
            local.add("/usr/local/lib")
        for p in paths:
            if p and p.startswith("/usr/local/"):
                local.add("/usr/local/" + p.split("/")[3])
            elif p and not p.startswith("/tmp/"):
                roots.add("/" + p.strip("/").split("/")[0])
        bad = roots & {"/usr", "/etc", "/proc", "/sys", "/dev", "/run", "/tmp", "/bin", "/lib", "/sbin"}
        if bad:
            raise ScenarioError(f"paths under {', '.join(sorted(bad))} belong to the system", file=self.scenario.source,
                                field="host.python", fix="put the environment, repository and scripts under /root, /opt, "
                                "/home or /usr/local, or use the system's python (/usr/bin/python3)")
        if not self.sealed:
            # the host's /tmp too (its server log, debugagent's worktrees): nothing lands in this machine's /tmp
            # and its /run/lock (debugagent's host lock): each simulated host has its own
            roots |= {"/proc", "/sys", "/etc/debugagent", "/usr/local/bin", "/usr/local/nvidia", SERVICE_DIR, "/tmp",
                      "/run/lock", *local, *supervised.MARKS, *supervised.unsealed_roots(self)}
            if self.system_python():
                roots.add(h["python"])
        return sorted(roots)

    def aliases(self) -> dict[str, str]:
        """Folders of an unsealed host that its programs name otherwise than the host shows them (the system
        python's dist-packages, which the interpreter there reaches through a venv's site-packages)."""
        if self.sealed or not self.system_python():
            return {}
        pyv = self.system_pyv()
        return {f"{self.sandbox}/usr/lib/{pyv}/site-packages": f"/usr/local/lib/{pyv}/dist-packages"}

    def system_pyv(self) -> str:
        real = os.path.realpath(self.state["python"])
        return os.path.basename(real) if re.fullmatch(r"python3\.\d+", os.path.basename(real)) else PYV

    def path(self, p: str) -> Path:
        return self.sandbox / p.lstrip("/")

    def inside(self, p: str | Path) -> str:
        """A path as programs inside the host must name it (the sandbox folder where not sealed)."""
        return str(p) if self.sealed else str(self.sandbox) + str(p)

    def _layout(self) -> None:
        for prog, pkg in (("git", "git"), ("bash", "bash")):
            if shutil.which(prog) is None:
                raise ScenarioError(f"`{prog}` is not installed here; simulated hosts need it", file=self.scenario.source,
                                    fix=f"apt-get install {pkg}")
        for d in ("/proc", "/etc", "/usr/local/bin", "/usr/local/nvidia/lib64", SERVICE_DIR, "/tmp", "/run/lock", *self.roots):
            if d != self.state["python"] and d not in supervised.MARKS:   # a root that is a file (the system python,
                # a container's mark where not sealed)
                self.path(d).mkdir(parents=True, exist_ok=True)
        self.path("/root" if self.state["user"] == "root" else f"/home/{self.state['user']}").mkdir(parents=True, exist_ok=True)
        if self.state.get("repo"):
            self._git()
        self._python()
        self._sys()
        self._etc()
        self._clients()
        supervised.layout(self)
        self.controller = Controller(self.scenario, self.state, self.salt, self.path(SERVICE_DIR) / "service.sock",
                                     self.path("/sys"), strip="" if self.sealed else str(self.sandbox))
        if self.offline:   # the folder the workload runs in exists, as the job's own would (a `-m` workload has no script there)
            self.path(self._cwd()).mkdir(parents=True, exist_ok=True)
        if self.sealed:
            self._bwrap, self.init_pid = seal.start(self)
        self.controller.on_cgroup = lambda pid, path: supervised.show_cgroup(self, pid, path)
        self._save_exec()
        if not self.offline:
            self.start_server()

    @property
    def offline(self) -> bool:
        """No server: the workload program is the benchmark (``host.server.offline``)."""
        return bool(self.state["server"].get("offline"))

    def workload_command(self) -> str:
        """An offline workload as the host profile names it: its folder, its environment, its command line."""
        h = self.state
        envs = " ".join(shlex.quote(f"{k}={v}") for k, v in h["server"]["env"].items())
        argv = " ".join(shlex.quote(a) for a in self.server_argv())
        return f"cd {shlex.quote(self._cwd())} && " + (f"{envs} " if envs else "") + argv

    def _git_env(self) -> dict[str, str]:
        return dict(os.environ, GIT_AUTHOR_NAME="dev", GIT_AUTHOR_EMAIL="dev@example.com", GIT_COMMITTER_NAME="dev",
                    GIT_COMMITTER_EMAIL="dev@example.com", GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")

    def repo_package(self) -> tuple[str, str, str]:
        """The package the repository holds: (import name, its folder in the repository, its distribution).
        ``repo.package`` / ``repo.package_dir`` name it; else the editable install whose folder is in the
        repository, else the package of the server's ``-m MODULE`` (at the repository's top), else sglang
        under python/ (what every repository held before these fields)."""
        repo = self.state["repo"]
        root = repo["path"].rstrip("/")
        found: tuple[str, str, str] | None = None
        for dist, spec in self.state["packages"].items():
            e = (spec.get("editable") or "").rstrip("/")
            if e and (e == root or e.startswith(root + "/")):
                found = (spec.get("module") or dist.replace("-", "_"), os.path.relpath(e, root), dist)
                break
        if found is None:
            entry = self._entry()
            top = entry[1].split(".")[0] if entry and entry[0] == "module" else None
            installed = {spec.get("module") or d.replace("-", "_") for d, spec in self.state["packages"].items()}
            if top and top not in installed:
                found = (top, ".", top)
        script = self._script()
        if found is None and script and self._in_repo(script):   # a script's repository: a package named as it
            found = (re.sub(r"\W+", "_", os.path.basename(root)).strip("_").lower() or "code", ".", "")
        name, folder, dist = found or (LEGACY_PACKAGE[0], LEGACY_PACKAGE[1], LEGACY_PACKAGE[0])
        dist = dist or name
        if repo.get("package"):
            name = repo["package"]
            dist = next((d for d, s in self.state["packages"].items() if (s.get("module") or d.replace("-", "_")) == name), name)
        if repo.get("package_dir") is not None:
            folder = repo["package_dir"]
        return name, os.path.normpath(folder), dist

    def _git(self) -> None:
        repo = self.state["repo"]
        d = self.path(repo["path"])
        name, folder, dist = self.repo_package()
        base = d / folder
        changes = "srt" if name == "sglang" else "core"   # the subpackage each commit changes
        pkg_dir = base / name
        (pkg_dir / changes).mkdir(parents=True, exist_ok=True)
        env = self._git_env()

        def git(*args: str, when: float | None = None) -> str:
            e = dict(env)
            if when is not None:
                stamp = f"@{int(when)} +0000"
                e.update(GIT_AUTHOR_DATE=stamp, GIT_COMMITTER_DATE=stamp)
            r = subprocess.run(["git", "-C", str(d), *args], env=e, capture_output=True, text=True, check=True)
            return r.stdout.strip()

        git("init", "-q", "-b", "main")
        pkg = self.state["packages"].get(dist) or {}
        init = "" if not pkg.get("has_version_attr", True) else f'__version__ = "{pkg.get("version", "0.0.0")}"\n'
        title = "SGLang" if name == "sglang" else name
        (pkg_dir / "__init__.py").write_text(f'"""{title}."""\n' + init)
        (pkg_dir / changes / "__init__.py").write_text('"""The SGLang runtime."""\n' if name == "sglang" else f'"""{name} core."""\n')
        (d / ".gitignore").write_text("__pycache__/\n*.py[cod]\n*.egg-info/\nbuild/\n")
        (base / "pyproject.toml").write_text(f'[project]\nname = "{dist}"\nversion = "0.0.0"\n')
        subs = ("sgl-kernel", "scripts", "test", "docs", "benchmark") if name == "sglang" else ("tests", "docs", "benchmarks")
        for sub in subs:
            (d / sub).mkdir(exist_ok=True)
            (d / sub / "README.md").write_text(f"# {sub}\n")
        self._code = f"{name}.{changes}"
        if name == "sglang":   # a checkout of SGLang holds its benchmark client, committed with it
            (pkg_dir / "bench_serving.py").write_text((GUEST / "bench_serving.py").read_text())
        entry = self._entry()
        if entry and entry[0] == "module" and entry[1].split(".")[0] == name:
            self._write_server_module(base, entry[1])
        script = self._script()
        if script and self._in_repo(script):
            # part of the repository, committed with it; it reads its code from the folder beside it
            self._code_dir = os.path.relpath(pkg_dir / changes, self.path(os.path.dirname(script)))
            self._write_script(script)
        times: list[float] = []
        for i, c in enumerate(repo["commits"]):
            when = _ts(c["date"]) if c.get("date") else FIRST_COMMIT + 3600 * 7 * i
            times.append(when)
            slug = re.sub(r"[^a-z0-9]+", "_", c["subject"].lower()).strip("_")[:40] or f"change_{i}"
            (pkg_dir / changes / f"{slug}.py").write_text(f'"""{c["subject"]}."""\n\nCHANGE = {i}\n')
            git("add", "-A")
            git("commit", "-q", "-m", c["subject"], when=when)
            self.labels[c["sha"]] = git("rev-parse", "HEAD")
        # One history for both states: the commits, then (where a factor moves HEAD) a reset to the good
        # commit; the bad state goes on from there to its HEAD, as a pull (a fast-forward) or a checkout
        # would move it. So @good and the bad host share hashes and reflog up to where the factor acts.
        last = repo["commits"][-1]["sha"]
        moved = _ts(repo["moved_at"]) if repo.get("moved_at") else times[-1] + 1800
        factor = next((f for f in self.scenario.factors if f.path == "repo.head"), None)
        if factor is None:
            if repo["head"] != last:
                git("reset", "-q", "--hard", self.labels[repo["head"]], when=moved)
            return
        good, bad = str(factor.good), str(factor.bad)
        if good != last:
            git("reset", "-q", "--hard", self.labels[good], when=moved - 60)
        if self.which == "good":
            return
        order = [c["sha"] for c in repo["commits"]]
        if order.index(bad) > order.index(good):
            git("merge", "-q", "--ff-only", self.labels[bad], when=moved)
        else:
            git("reset", "-q", "--hard", self.labels[bad], when=moved)

    # ---------------------------------------------------------------- python
    def base_python(self) -> str:
        """The interpreter the host's environment is made from, as the host names it."""
        if self.sealed:
            debian = f"/usr/bin/{PYV}"
            if os.access(debian, os.X_OK):
                return debian
        return str(Path(getattr(sys, "_base_executable", sys.executable)).resolve())

    def _python(self) -> None:
        h = self.state
        if self.system_python():
            return self._system_python()
        py = self.path(h["python"])
        env_root = py.parent.parent
        base = self.base_python()
        (env_root / "bin").mkdir(parents=True, exist_ok=True)
        site = env_root / "lib" / PYV / "site-packages"
        site.mkdir(parents=True, exist_ok=True)
        (env_root / "lib64").symlink_to("lib")
        (env_root / "pyvenv.cfg").write_text(
            f"home = {os.path.dirname(base)}\ninclude-system-site-packages = false\n"
            f"version = {sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}\n")
        (env_root / "bin" / PYV).symlink_to(base)
        for name in ("python3", "python"):
            if not (env_root / "bin" / name).exists():
                (env_root / "bin" / name).symlink_to(PYV)
        if not py.exists():
            py.symlink_to(PYV)
        self.env_root_inside = str(Path(h["python"]).parent.parent)
        self._fill(env_root, site)

    def _system_python(self) -> None:
        """The system's python (``/usr/bin/python3``, as official images run it) with the scenario's packages in
        ``/usr/local/lib/python3.X/dist-packages``. Sealed, it is this machine's system interpreter with its own
        dist-packages hidden; not sealed, a venv at the sandbox's ``/usr`` whose site-packages is that folder."""
        h = self.state
        real = os.path.realpath(h["python"])
        if not os.access(real, os.X_OK) or self.system_pyv() != PYV:
            have = os.path.realpath("/usr/bin/python3") if os.path.exists("/usr/bin/python3") else "none"
            raise ScenarioError(f"this machine has no system python {h['python']} of this interpreter's version ({PYV}; "
                                f"its /usr/bin/python3 is {have})", file=self.scenario.source, field="host.python",
                                fix="a virtual environment (`/opt/venv/bin/python3`), or run debugagent with the system's python")
        pyv = self.system_pyv()
        site = self.path(f"/usr/local/lib/{pyv}/dist-packages")
        site.mkdir(parents=True, exist_ok=True)
        if not self.sealed:
            usr = self.path("/usr")
            (usr / "bin").mkdir(parents=True, exist_ok=True)
            (usr / "lib" / pyv).mkdir(parents=True, exist_ok=True)
            (usr / "lib" / pyv / "site-packages").symlink_to(site)
            (usr / "pyvenv.cfg").write_text(f"home = {os.path.dirname(real)}\ninclude-system-site-packages = false\n")
            self.path(h["python"]).symlink_to(real)
        self.env_root_inside = "/usr/local"
        self._fill(self.path("/usr/local"), site)

    def _fill(self, env_root: Path, site: Path) -> None:
        h = self.state
        self.site = site
        self._pip(env_root, site)
        extra = h.get("environment") or {"extra": 0}
        skip = {re.sub(r"[-_.]+", "_", d).lower() for d in h["packages"]}
        when = extra.get("installed_at") or DEFAULT_INSTALLED
        for dist, version, compiled in extra_distributions(int(extra.get("extra", 0)), skip):
            self._package(site, dist, {"version": version, "installed_at": when, "build": None}, compiled=compiled)
        for dist, spec in h["packages"].items():
            self._package(site, dist, spec)
        self._server_code()
        if h.get("wheelhouse"):
            self._wheelhouse(h["wheelhouse"])

    def _pip(self, env_root: Path, site: Path) -> None:
        """pip in the environment (this interpreter's own code, pure Python), so experiments can reinstall. It
        is the host's pip at the simulator's ``PIP_VERSION``: nothing of the environment debugagent runs in
        (its pip's version) shows on a simulated host."""
        import pip  # noqa: PLC0415 - only where a host is laid out
        src = Path(pip.__file__).parent
        info = next(src.parent.glob("pip-*.dist-info"), None)
        when = _ts(DEFAULT_INSTALLED)
        # the package as hard links where the file system allows (no bytes copied); never a bind, whose
        # source folder /proc/self/mountinfo would name. Its metadata is written, dated as the image. Its compiled
        # bytecode comes too, as an installed pip's does (pip compiles at install): the host's first pip command
        # then starts in a third of the CPU time; the rewritten __init__.py's is left out (compiled when run)
        shutil.copytree(_pip_tree(src, site), site / src.name, copy_function=_link_or_copy)
        init = site / src.name / "__init__.py"
        for stale in (site / src.name / "__pycache__").glob("__init__.*"):
            stale.unlink()
        text = init.read_text()
        init.unlink()  # a hard link: the real pip's file stays as it is
        init.write_text(re.sub(r'(?m)^__version__ = "[^"]*"', f'__version__ = "{PIP_VERSION}"', text, count=1))
        if info is not None:
            dst = site / f"pip-{PIP_VERSION}.dist-info"
            dst.mkdir()
            for f in info.iterdir():
                if not f.is_file():
                    continue
                data = f.read_text(errors="replace")
                if f.name == "METADATA":
                    data = re.sub(r"(?m)^Version: .*$", f"Version: {PIP_VERSION}", data, count=1)
                elif f.name == "RECORD":
                    data = data.replace(f"{info.name}/", f"{dst.name}/")
                (dst / f.name).write_text(data)
            for f in [dst, *dst.iterdir()]:
                os.utime(f, (when, when))
        launcher = f"#!{self.inside(self.state['python'])}\nimport sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n"
        for name in ("pip", "pip3"):
            (env_root / "bin" / name).write_text(launcher)
            (env_root / "bin" / name).chmod(0o755)

    def _package(self, site: Path, dist: str, spec: dict[str, Any], compiled: bool = True) -> None:
        module = spec.get("module") or dist.replace("-", "_")
        norm = re.sub(r"[-_.]+", "_", dist)
        version = spec["version"]
        info = site / f"{norm}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        when = _ts(spec.get("installed_at") or DEFAULT_INSTALLED)
        files: list[str] = []
        editable = spec.get("editable")
        if self.state.get("repo") and module == self.repo_package()[0] and not editable:
            folder = self.repo_package()[1]
            editable = self.state["repo"]["path"].rstrip("/") + ("" if folder == "." else "/" + folder)
        if editable:
            pth = site / f"__editable__.{norm}-{version}.pth"
            pth.write_text(self.inside(editable) + "\n")
            files.append(pth.name)
            (info / "direct_url.json").write_text(json.dumps({"url": f"file://{self.inside(editable)}", "dir_info": {"editable": True}}))
            files.append(f"{info.name}/direct_url.json")
        else:
            for rel, data in self._module_files(dist, module, version, spec, compiled).items():
                p = site / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
                files.append(rel)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "top_level.txt").write_text(module + "\n")
        files += [f"{info.name}/METADATA", f"{info.name}/INSTALLER", f"{info.name}/top_level.txt", f"{info.name}/RECORD"]
        (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
        for f in files:
            p = site / f
            if p.exists():
                os.utime(p, (when, when))
        for p in [info, site / module]:
            if p.exists():
                os.utime(p, (when, when))

    def _module_files(self, dist: str, module: str, version: str, spec: dict[str, Any], compiled: bool) -> dict[str, bytes]:
        init = f'__version__ = "{version}"\n' if spec.get("has_version_attr", True) else ""
        out = {f"{module}/__init__.py": (f'"""{dist}."""\n' + init).encode()}
        if compiled:
            out[f"{module}/_C.abi3.so"] = so_bytes(dist, version, spec.get("build"), self.salt)
        return out

    def _wheelhouse(self, wh: dict[str, Any]) -> None:
        """Real wheels of the builds the scenario lists: ``pip install --no-index --find-links DIR``."""
        d = self.path(wh["path"])
        d.mkdir(parents=True, exist_ok=True)
        for w in wh["wheels"]:
            spec = dict(self.state["packages"][w["dist"]], version=w["version"], build=w.get("build"))
            module = spec.get("module") or w["dist"].replace("-", "_")
            norm = re.sub(r"[-_.]+", "_", w["dist"])
            info = f"{norm}-{w['version']}.dist-info"
            files = self._module_files(w["dist"], module, w["version"], spec, True)
            files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {w['dist']}\nVersion: {w['version']}\n".encode()
            files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: bdist_wheel (0.45.1)\nRoot-Is-Purelib: false\nTag: cp39-abi3-linux_x86_64\n"
            files[f"{info}/top_level.txt"] = (module + "\n").encode()
            record = "".join(
                f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}\n"
                for k, v in files.items()) + f"{info}/RECORD,,\n"
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
                for k, v in files.items():
                    z.writestr(k, v)
                z.writestr(f"{info}/RECORD", record)
            (d / f"{norm}-{w['version']}-cp39-abi3-linux_x86_64.whl").write_bytes(buf.getvalue())

    # ---------------------------------------------------------------- the server's code
    def _cwd(self) -> str:
        h = self.state
        return h["server"].get("cwd") or (h.get("repo") or {}).get("path") or "/root"

    def _script(self) -> str | None:
        """The server's script as an absolute path (a relative one is the server's cwd's), if it runs one."""
        entry = self._entry()
        if not entry or entry[0] != "script":
            return None
        return os.path.normpath(os.path.join(self._cwd(), entry[1]))

    def _in_repo(self, path: str) -> bool:
        repo = (self.state.get("repo") or {}).get("path")
        return bool(repo) and (path + "/").startswith(repo.rstrip("/") + "/")

    def system_python(self) -> bool:
        """The scenario's python is the system's (``/usr/bin/python3``), its packages in dist-packages."""
        return self.state["python"].startswith("/usr/bin/")

    def _entry(self) -> tuple[str, str] | None:
        """How the server's command line reaches its code: ("module", M), ("script", PATH) or ("console", NAME)."""
        argv = self.state["server"]["cmd"].split()
        if os.path.basename(argv[0]).startswith("python"):
            return python_entry(argv)
        return ("console", os.path.basename(argv[0]))

    def server_code(self) -> str:
        deps = []
        for dist, spec in self.state["packages"].items():
            module = spec.get("module") or dist.replace("-", "_")
            if not spec.get("editable") and not (self.state.get("repo") and module == self.repo_package()[0]):
                deps.append(module)
        worker = self.state["server"].get("worker")
        srv = self.state["server"]
        engine = srv.get("engine") or next((e for e in ("sglang", "vllm") if e in srv["cmd"]), None)
        pkg = self.state["packages"].get(engine or "")
        config = {"deps": deps, "code": self._code, "code_dir": self._code_dir, "offline": bool(srv.get("offline")),
                  "log": srv.get("log") or [], "worker": (worker or {}).get("env") if worker else None,
                  "engine": engine, "version": (pkg or {}).get("version"), "port": srv.get("port"),
                  "defaults": dict(srv.get("defaults") or {})}
        text = (GUEST / "server.py").read_text()
        return text.replace("CONFIG: dict = {}", f"CONFIG: dict = {config!r}", 1)

    def _write_server_module(self, base: Path, module: str) -> None:
        parts = module.split(".")
        d = base
        for p in parts[:-1]:
            d = d / p
            d.mkdir(parents=True, exist_ok=True)
            if not (d / "__init__.py").exists():
                (d / "__init__.py").write_text("")
        (d / f"{parts[-1]}.py").write_text(self.server_code())

    def _write_env_report(self, base: Path, top: str) -> None:
        """The engine's own environment report (``python -m sglang.check_env``, ``python -m vllm.collect_env``): the
        versions installed now, as the engine's prints them, and the driver nvidia-smi reports."""
        name = {"sglang": "check_env", "vllm": "collect_env"}.get(top)
        if name is None or not (base / top).is_dir():
            return
        (base / top / f"{name}.py").write_text((GUEST / "envreport.py").read_text().replace(
            'STYLE = ""', f"STYLE = {name!r}", 1))
        if top == "sglang":   # and its benchmark client, `python -m sglang.bench_serving`
            (base / top / "bench_serving.py").write_text((GUEST / "bench_serving.py").read_text())

    def _write_script(self, script: str) -> None:
        p = self.path(script)
        if p.is_dir():
            raise ScenarioError(f"the server's script `{script}` is a folder", file=self.scenario.source,
                                field="host.server.cmd", fix="name the script file (`PYTHON /root/app/serve.py`)")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.server_code())

    def _package_base(self, top: str) -> Path:
        """Where ``import top`` finds its package: an editable install's folder, else site-packages."""
        for dist, spec in self.state["packages"].items():
            if (spec.get("module") or dist.replace("-", "_")) == top and spec.get("editable"):
                return self.path(spec["editable"])
        return self.site

    def _server_code(self) -> None:
        entry = self._entry()
        if entry is None:
            raise ScenarioError("the server's command runs no code: give `-m MODULE`, a script or a console script",
                                file=self.scenario.source, field="host.server.cmd",
                                fix="e.g. `/root/ml-env/bin/python3 -m sglang.launch_server`")
        kind, what = entry
        if kind == "module":
            if self.state.get("repo") and what.split(".")[0] == self.repo_package()[0]:
                return  # committed in the repository
            self._write_server_module(self._package_base(what.split(".")[0]), what)
            self._write_env_report(self._package_base(what.split(".")[0]), what.split(".")[0])
        elif kind == "script":
            script = self._script() or what
            if not self._in_repo(script):
                self._write_script(script)
        else:
            module = f"{what.replace('-', '_')}.entrypoints.cli.main"
            self._write_server_module(self._package_base(what.replace("-", "_")), module)
            self._write_env_report(self._package_base(what.replace("-", "_")), what.replace("-", "_"))
            launcher = self.path(self.state["server"]["cmd"].split()[0])
            launcher.parent.mkdir(parents=True, exist_ok=True)
            launcher.write_text(f"#!{self.inside(self.state['python'])}\nimport sys\nfrom {module} import main\n"
                                "if __name__ == \"__main__\":\n    sys.exit(main())\n")
            launcher.chmod(0o755)

    # ---------------------------------------------------------------- system files
    def _sys(self) -> None:
        cpu = self.state["cpu"]
        for i in range(cpu["cores"]):
            d = self.path(f"/sys/devices/system/cpu/cpu{i}/cpufreq")
            d.mkdir(parents=True, exist_ok=True)
            (d / "scaling_governor").write_text(cpu["governor"] + "\n")
            (d / "scaling_available_governors").write_text("performance powersave schedutil ondemand\n")
        drv = self.state["driver"]
        (self.base / "proc-loadavg").write_text(LOADAVG)  # bound over /proc/loadavg: the host's, not this machine's
        (self.base / "proc-cpuinfo").write_text(cpuinfo(cpu["model"], int(cpu["cores"])))   # and these too
        (self.base / "proc-meminfo").write_text(meminfo(int(self.state["memory_gib"])))
        d = self.base / "proc-driver-nvidia"
        d.mkdir(parents=True, exist_ok=True)
        (d / "version").write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {drv['version']}  Release Build  (dvs-builder@U16-I3-B03-4-3)\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n")
        if not self.sealed:
            (self.path("/proc/driver")).mkdir(parents=True, exist_ok=True)
            shutil.copytree(d, self.path("/proc/driver/nvidia"))
            (self.path("/proc") / "loadavg").write_text(LOADAVG)
            for name in ("cpuinfo", "meminfo"):
                shutil.copy(self.base / f"proc-{name}", self.path("/proc") / name)
        lib = self.path("/usr/local/nvidia/lib64")
        so = lib / f"libcuda.so.{drv['version']}"
        so.write_bytes(b"\x7fELF" + drv["version"].encode() * 8)
        when = _ts(drv.get("installed_at") or "2026-10-01T08:00:00+00:00")
        os.utime(so, (when, when))
        (lib / "libcuda.so.1").symlink_to(so.name)

    def _etc(self) -> None:
        etc = self.path("/etc")
        if self.sealed:
            for name in ("passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
                         "os-release", "debian_version", "alternatives", "bash.bashrc", "profile", "inputrc"):
                src = Path("/etc") / name
                if src.is_symlink() or src.is_file():
                    shutil.copy2(src, etc / name, follow_symlinks=False)
                elif src.is_dir():
                    shutil.copytree(src, etc / name, symlinks=True, ignore_dangling_symlinks=True)
            (etc / "hostname").write_text(self.state["hostname"] + "\n")
            (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{self.state['hostname']}\n::1\tlocalhost\n")
        if self.state.get("profile", True):
            (etc / "debugagent").mkdir(exist_ok=True)
            profile = {"bench": self.workload_command() if self.offline else
                       self.scenario.bench.model_copy(update={"args": self.state["bench_args"]}).command(),
                       "metric": self.scenario.bench.metric, "unit": self.scenario.bench.unit}
            if self.scenario.host.wheelhouse:   # a team that keeps its wheels names the folder in the profile
                profile["wheelhouse"] = self.scenario.host.wheelhouse.path
            (etc / "debugagent" / "host.json").write_text(json.dumps(profile) + "\n")

    def _clients(self) -> None:
        service = f"{self.inside(SERVICE_DIR)}/service.sock"
        bindir = self.path("/usr/local/bin")
        binary = compiled_client(service)
        script = ""   # the Python client, where no compiled one could be built
        if binary is None:
            text = (GUEST / "client.py").read_text().replace(f'SERVICE = "{SERVICE_DIR}/service.sock"', f'SERVICE = "{service}"', 1)
            shebang = f"#!{self.inside(self.base_python())} -SE\n" if self.sealed else f"#!{sys.executable} -SE\n"
            script = shebang + text
        # an offline workload is its own benchmark: no benchmark client to install
        for name in ("nvidia-smi", *(() if self.offline else (os.path.basename(self.scenario.bench.cmd.split()[0]),))):
            if binary is not None:
                shutil.copy(binary, bindir / name)
            else:
                (bindir / name).write_text(script)
            (bindir / name).chmod(0o755)
        (bindir / "nproc").write_text(f"#!/bin/sh\necho {int(self.state['cpu']['cores'])}\n")
        (bindir / "nproc").chmod(0o755)
        (bindir / "uname").write_text(uname_script(self.state["hostname"], self.state["kernel"]))
        (bindir / "uname").chmod(0o755)
        if not self.sealed:
            (bindir / "hostname").write_text(f"#!/bin/sh\necho {shlex.quote(self.state['hostname'])}\n")
            (bindir / "hostname").chmod(0o755)

    def _save_exec(self) -> None:
        self.shell.save(self.base, sealed=self.sealed, init_pid=self.init_pid)

    # ------------------------------------------------------------------ processes
    def server_argv(self) -> list[str]:
        h = self.state
        argv = h["server"]["cmd"].split()
        for k, v in h["server"]["args"].items():
            if v is True:
                argv.append(f"--{k}")
            elif v is False or v is None:
                continue
            else:
                argv += [f"--{k}", str(v)]
        return argv

    def start_server(self, timeout: float = 60.0) -> None:
        """Start the server as the host's init would: its command line, environment and cwd; wait until it
        has imported its code and registered with the GPU service."""
        h = self.state
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
               "LANG": "C.UTF-8", **supervised.server_env(self), **h["server"]["env"]}
        cwd = self._cwd()
        self.path(cwd).mkdir(parents=True, exist_ok=True)
        log = h["server"].get("log_file") or "/tmp/server.log"
        assert self.controller is not None
        before = self.controller.registered
        argv = " ".join(shlex.quote(a) for a in self.server_argv())
        envs = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        if supervised.supervisor(self) or supervised.engine(self):   # its supervisor (or its container's runtime) starts it
            r = self.exec(supervised.start_command(self), timeout=30)
        elif supervised.pid1(self) and self.sealed:   # the container's pid 1 becomes the server
            supervised.start_pid1(self, envs, argv, cwd, log)
            r = self.exec("echo started", timeout=30)
        else:
            r = self.exec(f"mkdir -p {shlex.quote(os.path.dirname(log))} && cd {shlex.quote(cwd)} && "
                          f"{{ setsid nohup env -i {envs} {argv} > {shlex.quote(log)} 2>&1 < /dev/null & }}; echo started",
                          timeout=30)
        if r.exit_code != 0 or not self.controller.wait_server(timeout, before):
            tail = self.exec(f"tail -5 {shlex.quote(log)}", timeout=10).stdout.strip()
            raise ScenarioError(f"the simulated server did not start: {tail or r.stderr.strip() or 'no output'}",
                                file=self.scenario.source, field="host.server.cmd",
                                fix="use `PYTHON -m MODULE`, `PYTHON SCRIPT.py` or a console script, PYTHON = host.python")
        if supervised.pid1(self) and not self.sealed:
            # not sealed, no process of this machine can be pid 1: the server shows its container's scope in
            # /proc/PID/cgroup instead (as a container's process does without a cgroup namespace of its own), which
            # tells debugagent the same: the container's main process
            c = supervised.inside(self) or {}
            scope = (f"/system.slice/docker-{supervised.container_id(self)}.scope" if c.get("runtime") == "docker"
                     else f"/machine.slice/libpod-{supervised.container_id(self)}.scope")
            for p in [p for p in self.controller.procs if p.role == "server"][-1:]:
                supervised.show_cgroup(self, p.real_pid, scope)

    def _own_pids(self) -> list[int]:
        if self.sealed:
            return [self.init_pid] if self.init_pid else []
        return self.shell.own_pids()

    # ------------------------------------------------------------------ commands
    def rewrite(self, command: str) -> str:
        return command if self.sealed else self.shell.rewrite(command)

    def unrewrite(self, text: str) -> str:
        return text if self.sealed else self.shell.unrewrite(text)

    def env(self) -> dict[str, str]:
        return self.shell.env(sealed=self.sealed)

    def argv(self, command: str) -> list[str]:
        """The program that runs ``command`` in the host (what ``remote.py`` runs for ``sim serve`` too)."""
        return self.shell.argv(command, sealed=self.sealed, init_pid=self.init_pid)

    def exec(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT,
             host: str = "sim") -> CommandResult:
        if not self.sealed:
            self.shell.sync_proc()
        r = run_subprocess(self.argv(command), host=host, command=command, timeout=timeout, max_output=max_output,
                           env=None if self.sealed else self.env(), cwd=None if self.sealed else self.shell.home())
        if self.sealed:
            return r
        self.shell.sync_proc()
        return r.model_copy(update={"stdout": self.unrewrite(r.stdout), "stderr": self.unrewrite(r.stderr)})

    def close(self) -> None:
        if self._bwrap is not None:
            seal.stop(self._bwrap, self.init_pid)
            self._bwrap = None
        elif not self.sealed:
            for pid in self.shell.own_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.controller is not None:
            self.controller.close()
            self.controller = None
        shutil.rmtree(self.base, ignore_errors=True)


_warned = threading.Event()


class SimTransport(BaseTransport):
    """``--host sim:NAME`` / ``sim:PATH.yaml`` / ``sim:NAME@good``: a simulated host."""

    max_parallel = 8
    sandbox = True   # experiments need no consent: the host dies with the transport

    def __init__(self, spec: str) -> None:
        ref = spec[4:] if spec.startswith("sim:") else spec
        which: Literal["good", "bad"] = "bad"
        if ref.endswith("@good"):
            ref, which = ref[:-5], "good"
        elif ref.endswith("@bad"):
            ref = ref[:-4]
        self.scenario = load_scenario(ref)
        self.sim = SimHost(self.scenario, which)
        if not self.sim.sealed and not _warned.is_set():
            _warned.set()
            print(f"note: the simulated host is NOT sealed ({self.sim.unsealed_reason}); commands are rewritten onto "
                  "its folder, and a program inside can read this machine. Install Debian's bubblewrap to seal it.",
                  file=sys.stderr)
        self.host = f"sim:{self.scenario.name}" + ("@good" if which == "good" else "")
        self.user = self.sim.state["user"]
        self.hostname = self.sim.state["hostname"]

    def run(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT) -> CommandResult:
        return self.sim.exec(command, timeout=timeout, max_output=max_output, host=self.host)

    @property
    def instance(self) -> str:  # type: ignore[override]
        """The sandbox's folder: its changes die with it."""
        return str(self.sim.base)

    def display(self, command: str) -> str:
        return ssh_line(f"{self.user}@{self.hostname}", command)

    def close(self) -> None:
        self.sim.close()

