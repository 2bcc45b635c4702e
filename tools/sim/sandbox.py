"""A simulated GPU host: a sandbox folder laid out at the scenario's paths.

The scenario's paths (``/root/ml-env/bin/python3``, ``/root/sglang``, ``/proc/PID``,
``/sys/…/scaling_governor``) live under one sandbox folder. Commands reach the sandbox
through ``SimHost.exec``: absolute paths under the mapped roots are rewritten onto the
sandbox at the command boundary, and the sandbox folder is rewritten back out of the
output, so the agent sees exactly the scenario's paths. This needs no privileges and no
extra program (no bubblewrap, no proot).

What is real: a Python virtual environment with the scenario's distributions (metadata,
``RECORD``, ``.so`` files whose bytes follow ``build``, install times), a git repository
with real commits, the inference server as a real process (a stand-in module that
sleeps) with the scenario's command line and environment, ``/proc/PID`` of that process,
CPU governor files. ``nvidia-smi``, ``hostname``, ``nproc`` and the benchmark are
stand-ins (``tools.sim.standin``) that read a control folder kept outside the sandbox;
nothing under the mapped roots reveals ``expect``, ``factors`` or which one matters.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import venv
from pathlib import Path
from typing import Any, Literal

from ..errors import ScenarioError
from ..transport import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_TIMEOUT_S,
    BaseTransport,
    CommandResult,
    run_subprocess,
    ssh_line,
)
from .scenario import Scenario, load_scenario
from .shell import SimShell
from .standin import so_bytes

DEFAULT_INSTALLED = "2026-11-02T09:00:00+00:00"
FIRST_COMMIT = 1763283600  # 2025-11-16T09:00Z


def _ts(value: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class SimHost:
    """Lays out one scenario state in a sandbox, runs commands in it, tears it down."""

    def __init__(self, scenario: Scenario, state: Literal["good", "bad"] = "bad", root: str | None = None) -> None:
        self.scenario = scenario
        self.which = state
        self.state = scenario.state(state)
        self.base = Path(root or tempfile.mkdtemp(prefix="debugagent-sim-"))
        self.sandbox = self.base / "fs"
        self.control = self.base / "control"
        self.bin = self.base / "bin"
        self._lock = threading.Lock()
        self.roots = self._roots()
        self.shell = SimShell(str(self.sandbox), str(self.bin), self.roots, self.state["user"])
        self.labels: dict[str, str] = {}
        self._layout()

    # ------------------------------------------------------------------ layout
    def _roots(self) -> list[str]:
        h = self.state
        roots = {"/proc", "/sys", "/etc/debugagent", "/usr/lib/x86_64-linux-gnu"}
        for p in [h["python"], (h.get("repo") or {}).get("path"), h["server"].get("cwd")]:
            if p:
                roots.add("/" + p.strip("/").split("/")[0])
        return sorted(roots)

    def path(self, p: str) -> Path:
        return self.sandbox / p.lstrip("/")

    def _layout(self) -> None:
        for prog, pkg in (("git", "git"), ("bash", "bash")):
            if shutil.which(prog) is None:
                raise ScenarioError(f"`{prog}` is not installed here; simulated hosts need it", file=self.scenario.source,
                                    fix=f"apt-get install {pkg}")
        for d in (self.sandbox, self.control / "load", self.bin, self.path("/proc"), self.path("/etc/debugagent")):
            d.mkdir(parents=True, exist_ok=True)
        h = self.state
        if h.get("repo"):
            self._git()
        self._python()
        self._sys()
        self._write_control()
        self._shims()
        self.shell.save(self.base)
        self.start_server()

    def _git(self) -> None:
        repo = self.state["repo"]
        d = self.path(repo["path"])
        (d / "python" / "sglang").mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, GIT_AUTHOR_NAME="dev", GIT_AUTHOR_EMAIL="dev@example.com",
                   GIT_COMMITTER_NAME="dev", GIT_COMMITTER_EMAIL="dev@example.com", GIT_CONFIG_GLOBAL="/dev/null",
                   GIT_CONFIG_NOSYSTEM="1")

        def git(*args: str, when: float | None = None) -> str:
            e = dict(env)
            if when is not None:
                stamp = f"@{int(when)} +0000"
                e.update(GIT_AUTHOR_DATE=stamp, GIT_COMMITTER_DATE=stamp)
            r = subprocess.run(["git", "-C", str(d), *args], env=e, capture_output=True, text=True, check=True)
            return r.stdout.strip()

        git("init", "-q", "-b", "main")
        pkg = self.state["packages"].get("sglang") or {}
        init = "" if not pkg.get("has_version_attr", True) else f'__version__ = "{pkg.get("version", "0.0.0")}"\n'
        (d / "python" / "sglang" / "__init__.py").write_text('"""SGLang."""\n' + init)
        (d / "python" / "sglang" / "launch_server.py").write_text(STANDIN_SERVER)
        (d / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.0.0"\n')
        for sub in ("sgl-kernel", "scripts", "test", "docs", "benchmark"):
            (d / sub).mkdir(exist_ok=True)
            (d / sub / "README.md").write_text(f"# {sub}\n")
        times: list[float] = []
        for i, c in enumerate(repo["commits"]):
            when = _ts(c["date"]) if c.get("date") else FIRST_COMMIT + 3600 * 7 * i
            times.append(when)
            slug = re.sub(r"[^a-z0-9]+", "_", c["subject"].lower()).strip("_")[:40] or f"change_{i}"
            f = d / "python" / "sglang" / "srt" / f"{slug}.py"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(f'"""{c["subject"]}."""\n\nCHANGE = {i}\n')
            git("add", "-A")
            git("commit", "-q", "-m", c["subject"], when=when)
            self.labels[c["sha"]] = git("rev-parse", "HEAD")
        head = repo["head"]
        last = repo["commits"][-1]["sha"]
        moved = _ts(repo["moved_at"]) if repo.get("moved_at") else times[-1] + 1800
        if head != last:
            git("reset", "-q", "--hard", self.labels[head], when=moved)
        else:
            moved_from = next((f.good for f in self.scenario.factors if f.path == "repo.head"), None)
            if moved_from and self.which == "bad":
                # HEAD moved from the good commit to the bad one, as a pull would move it.
                git("reset", "-q", "--hard", self.labels[moved_from], when=moved - 60)
                git("merge", "-q", "--ff-only", self.labels[head], when=moved)

    def _python(self) -> None:
        h = self.state
        py = self.path(h["python"])
        env_root = py.parent.parent
        venv.EnvBuilder(symlinks=True, with_pip=False, clear=True).create(env_root)
        if not py.exists():
            py.symlink_to(Path(sys.executable).name if (py.parent / Path(sys.executable).name).exists() else "python3")
        site = env_root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        for dist, spec in h["packages"].items():
            self._package(site, dist, spec)
        self._server_module(site)

    def _server_module(self, site: Path) -> None:
        """Make sure ``python -m X.Y`` of the server's command line finds a module."""
        argv = self.state["server"]["cmd"].split()
        if "-m" not in argv or argv.index("-m") + 1 >= len(argv):
            return
        parts = argv[argv.index("-m") + 1].split(".")
        base = site
        pth = next(site.glob(f"__editable__.{parts[0]}-*.pth"), None)
        if pth is not None:
            base = Path(pth.read_text().strip())
        d = base
        for p in parts[:-1]:
            d = d / p
            d.mkdir(exist_ok=True)
            init = d / "__init__.py"
            if not init.exists():
                init.write_text("")
        mod = d / f"{parts[-1]}.py"
        if not mod.exists():
            mod.write_text(STANDIN_SERVER)

    def _package(self, site: Path, dist: str, spec: dict[str, Any]) -> None:
        module = spec.get("module") or dist.replace("-", "_")
        norm = re.sub(r"[-_.]+", "_", dist)
        version = spec["version"]
        info = site / f"{norm}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        when = _ts(spec.get("installed_at") or DEFAULT_INSTALLED)
        files: list[str] = []
        editable = spec.get("editable")
        if dist == "sglang" and self.state.get("repo") and not editable:
            editable = self.state["repo"]["path"] + "/python"
        if editable:
            pth = site / f"__editable__.{norm}-{version}.pth"
            pth.write_text(str(self.path(editable)) + "\n")
            files.append(pth.name)
            (info / "direct_url.json").write_text(json.dumps({"url": f"file://{self.path(editable)}", "dir_info": {"editable": True}}))
            files.append(f"{info.name}/direct_url.json")
        else:
            mod = site / module
            mod.mkdir(exist_ok=True)
            init = f'__version__ = "{version}"\n' if spec.get("has_version_attr", True) else ""
            (mod / "__init__.py").write_text(f'"""{dist}."""\n' + init)
            so = mod / "_C.abi3.so"
            so.write_bytes(so_bytes(dist, version, spec.get("build")))
            files += [f"{module}/__init__.py", f"{module}/_C.abi3.so"]
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

    def _sys(self) -> None:
        cpu = self.state["cpu"]
        for i in range(cpu["cores"]):
            d = self.path(f"/sys/devices/system/cpu/cpu{i}/cpufreq")
            d.mkdir(parents=True, exist_ok=True)
            (d / "scaling_governor").write_text(cpu["governor"] + "\n")
            (d / "scaling_available_governors").write_text("performance powersave schedutil ondemand\n")
        (self.path("/proc") / "loadavg").write_text("0.42 0.37 0.31 1/812 41235\n")
        drv = self.state["driver"]
        (self.path("/proc/driver/nvidia")).mkdir(parents=True, exist_ok=True)
        (self.path("/proc/driver/nvidia") / "version").write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {drv['version']}  Release Build  (dvs-builder@U16-I3-B03-4-3)\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n")
        lib = self.path("/usr/lib/x86_64-linux-gnu")
        lib.mkdir(parents=True, exist_ok=True)
        so = lib / f"libcuda.so.{drv['version']}"
        so.write_bytes(b"\x7fELF" + drv["version"].encode() * 8)
        when = _ts(drv.get("installed_at") or "2026-10-01T08:00:00+00:00")
        os.utime(so, (when, when))
        (lib / "libcuda.so.1").symlink_to(so.name)
        profile = {"bench": self.scenario.bench.cmd, "metric": self.scenario.bench.metric,
                   "unit": self.scenario.bench.unit}
        (self.path("/etc/debugagent") / "host.json").write_text(json.dumps(profile) + "\n")

    def _write_control(self) -> None:
        sc = self.scenario
        data = {
            "sandbox": str(self.sandbox),
            "host": self.state,
            "labels": self.labels,
            "commit_order": [self.labels.get(c.sha, c.sha) for c in sc.host.repo.commits] if sc.host.repo else [],
            "factors": [f.model_dump(mode="json") for f in sc.factors],
            "bench": sc.bench.model_dump(mode="json"),
            "name": sc.name,
            "server_entry": self._entry(),
        }
        (self.control / "host.json").write_text(json.dumps(data, indent=1))
        (self.control / "counter").write_text("0")

    def _entry(self) -> str:
        argv = self.state["server"]["cmd"].split()
        return argv[argv.index("-m") + 1] if "-m" in argv and argv.index("-m") + 1 < len(argv) else argv[-1]

    def _shims(self) -> None:
        standin = Path(__file__).resolve().parent / "standin.py"
        for name, sub in (("nvidia-smi", "nvidia-smi"), ("hostname", "hostname"), ("nproc", "nproc"),
                          (self.scenario.bench.cmd.split()[0], "bench")):
            shim = self.bin / name
            shim.write_text(
                "#!/bin/sh\n"
                f"exec {sys.executable} -S {standin} {sub} {self.control} \"$@\"\n"
            )
            shim.chmod(0o755)

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

    def start_server(self) -> None:
        h = self.state
        argv = self.server_argv()
        argv = [self.rewrite(a) for a in argv]
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
               "LANG": "C.UTF-8", **h["server"]["env"]}
        cwd = h["server"].get("cwd") or (h.get("repo") or {}).get("path") or "/root"
        self.path(cwd).mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(argv, env=env, cwd=str(self.path(cwd)), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        # reap it when it is stopped, as init would on a real host (a zombie still answers `kill -0`)
        threading.Thread(target=proc.wait, daemon=True).start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            self.sync_proc()
            if self.server_pids():
                return
            time.sleep(0.02)
        raise ScenarioError("the simulated server did not start", file=self.scenario.source, field="host.server.cmd",
                            fix="use `PYTHON -m MODULE` with PYTHON = host.python")

    def _own_pids(self) -> list[int]:
        return self.shell.own_pids()

    def server_pids(self) -> list[int]:
        return [int(p.name) for p in self.path("/proc").iterdir() if p.name.isdigit()]

    def sync_proc(self) -> None:
        self.shell.sync_proc()

    # ------------------------------------------------------------------ commands
    def rewrite(self, command: str) -> str:
        return self.shell.rewrite(command)

    def unrewrite(self, text: str) -> str:
        return self.shell.unrewrite(text)

    def env(self) -> dict[str, str]:
        return self.shell.env()

    def exec(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT,
             host: str = "sim") -> CommandResult:
        self.sync_proc()
        cwd = self.env()["HOME"]
        Path(cwd).mkdir(parents=True, exist_ok=True)
        r = run_subprocess(["bash", "-c", self.rewrite(command)], host=host, command=command, timeout=timeout,
                           max_output=max_output, env=self.env(), cwd=cwd)
        self.sync_proc()
        return r.model_copy(update={"stdout": self.unrewrite(r.stdout), "stderr": self.unrewrite(r.stderr)})

    def close(self) -> None:
        for pid in self._own_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # worktrees the agent made outside the sandbox point into it; they go with it
        shutil.rmtree(self.base, ignore_errors=True)


STANDIN_SERVER = '''"""Launch the SGLang server.

This build holds its GPUs and serves nothing: it keeps running until it is stopped.
"""

import os
import sys
import time


def main() -> None:
    here = os.path.abspath(__file__)
    while os.path.exists(here):
        time.sleep(1.0)
    sys.exit(0)


if __name__ == "__main__":
    main()
'''


class SimTransport(BaseTransport):
    """``--host sim:NAME`` / ``sim:PATH.yaml`` / ``sim:NAME@good``: a simulated host."""

    max_parallel = 8

    def __init__(self, spec: str) -> None:
        ref = spec[4:] if spec.startswith("sim:") else spec
        which: Literal["good", "bad"] = "bad"
        if ref.endswith("@good"):
            ref, which = ref[:-5], "good"
        elif ref.endswith("@bad"):
            ref = ref[:-4]
        self.scenario = load_scenario(ref)
        self.sim = SimHost(self.scenario, which)
        self.host = f"sim:{self.scenario.name}" + ("@good" if which == "good" else "")
        self.user = self.sim.state["user"]
        self.hostname = self.sim.state["hostname"]

    def run(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT) -> CommandResult:
        return self.sim.exec(command, timeout=timeout, max_output=max_output, host=self.host)

    def display(self, command: str) -> str:
        return ssh_line(f"{self.user}@{self.hostname}", command)

    def close(self) -> None:
        self.sim.close()
