"""Shadow copies of the server: started beside it (same command line but the port, same folder, environment and
identity, on other GPUs), measured, and stopped; the server itself is never signalled.

``start_copy`` starts one copy (its undo, ``stop_copy``, journalled first); ``stop_copy`` stops it by its pid file,
or by the pid and start time the journal recorded, each checked against its command line, and removes its files.
``listening_ports`` and ``gpu_memory`` are the read-only checks made before the first copy starts. Every argument
reaches the shell through ``shlex.quote``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import ParseError
from .mutate import NICE, SAME, RunAs, cmdline_match
from .transport import q, split_sections


class StartCopy(BaseModel):
    """Start a copy of the server ``env_pid``: ``argv`` in ``cwd``, its environment read from ``/proc/ENV_PID/environ``
    on the host (saved to ``env_file``, mode 600: secrets never leave the host) minus ``unset``, plus ``set``, with
    ``CUDA_VISIBLE_DEVICES=gpus`` and ``path_first`` first on ``PYTHONPATH``; detached (``setsid nohup``), its output
    in ``log``, its pid in ``pid_file`` the moment it exists; ``run_as`` as a restart keeps it. ``fix_argv`` is the
    server's own command line with the change: what making the change permanent restarts (the fix), never run here."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["reference", "changed"]
    env_pid: int
    argv: list[str]
    fix_argv: list[str] = Field(default_factory=list)
    cwd: str
    gpus: str
    env_file: str
    pid_file: str
    log: str
    set: dict[str, str] = Field(default_factory=dict)
    unset: list[str] = Field(default_factory=list)
    path_first: list[str] = Field(default_factory=list)
    run_as: RunAs | None = None

    def command(self) -> str:
        pid = int(self.env_pid)
        env, pf, log = q(self.env_file), q(self.pid_file), q(self.log)
        drop = " ".join(q(n) for n in [*self.unset, *sorted(self.set), "CUDA_VISIBLE_DEVICES",
                                       *(["PYTHONPATH"] if self.path_first else [])])
        add = " ".join(q(f"{k}={v}") for k, v in [*sorted(self.set.items()), ("CUDA_VISIBLE_DEVICES", self.gpus)])
        run_as = self.run_as if self.run_as is not None and self.run_as.fields() else None
        parts = ["trap : HUP INT TERM; export LC_ALL=C; " + SAME, NICE if run_as is not None and run_as.nice is not None
                 else "",
                 f"[ {pid} -gt 0 ] && [ -r /proc/{pid}/environ ] || {{ echo 'the server (pid {pid}) is gone'; exit 1; }}; ",
                 f"(umask 077; cat /proc/{pid}/environ > {env}) && [ -s {env} ] || "
                 f"{{ echo 'the environment of pid {pid} could not be read'; rm -f {env}; exit 1; }}; ",
                 f"mapfile -d '' E < {env}; N=(); OLDPP=; for kv in \"${{E[@]}}\"; do keep=1; "
                 f"[ \"${{kv%%=*}}\" = PYTHONPATH ] && OLDPP=${{kv#*=}}; "
                 f"for u in {drop}; do [ \"${{kv%%=*}}\" = \"$u\" ] && keep=0; done; [ $keep = 1 ] && N+=(\"$kv\"); done; "
                 f"N+=({add}); "]
        if self.path_first:
            parts.append(f"N+=(\"PYTHONPATH={':'.join(self.path_first)}${{OLDPP:+:$OLDPP}}\"); ")
        launch = f"setsid nohup env -i \"${{N[@]}}\" {' '.join(q(a) for a in self.argv)}"
        if run_as is not None:
            launch = run_as.wrap(launch)
        parts.append(
            f"(umask 077; : > {log}) || exit 1; echo \"log={self.log} size=0\"; "
            f"cd {q(self.cwd)} && {{ {launch} >> {log} 2>&1 < /dev/null & }}; new=$!; "
            # at once: an undo after a crash finds (and stops) what was started
            f"(umask 077; echo $new > {pf}.$$ && mv -f {pf}.$$ {pf}); "
            f"sleep 0.3; if kill -0 $new 2>/dev/null; then echo \"started pid=$new start=$(ticks $new)\"; "
            f"else echo 'the copy exited at start:'; tail -5 {log}; exit 1; fi")
        return f"bash -c {q(''.join(parts))}"


class StopCopy(BaseModel):
    """Stop a copy ``start_copy`` started and remove its files. The process is the pid in ``pid_file``, else the one
    the journal names (``stop_pid`` started at ``stop_start``), else a process whose command line is exactly
    ``expect_argv`` (the copy's own, with its own port) in ``cwd``; each only if its command line is ``expect_argv``
    (and, where known, its start time ``stop_start``): a reused pid is never signalled. Its process group (the copy
    leads one: ``setsid``) gets SIGTERM, then SIGKILL after ``wait_s``. Idempotent: a copy already gone and files
    already removed are fine. ``found_argv``: the server's command line (what the check after the undo reads)."""

    model_config = ConfigDict(extra="forbid")
    pid_file: str
    env_file: str
    log: str
    expect_argv: list[str]
    cwd: str
    found_argv: list[str] = Field(default_factory=list)
    stop_pid: int = 0
    stop_start: int = 0
    wait_s: float = 10.0

    def command(self) -> str:
        pf, want = q(self.pid_file), cmdline_match(self.expect_argv)
        sp, ss = int(self.stop_pid), int(self.stop_start)
        start_ok = f"[ \"$(ticks $P)\" = {ss} ]" if ss else "true"
        return "bash -c " + q(
            "trap : HUP INT TERM; export LC_ALL=C; " + SAME
            + f"P=$(cat {pf} 2>/dev/null); P=${{P//[^0-9]/}}; P=${{P:-0}}; [ $P = 0 ] && P={sp}; "
            f"if [ $P -gt 0 ] && ! {{ same $P {want} && {start_ok}; }}; then P=0; fi; "
            f"if [ $P = 0 ]; then for d in /proc/[0-9]*; do f=${{d#/proc/}}; [ \"$f\" = $$ ] && continue; "
            f"same $f {want} || continue; [ \"$(readlink $d/cwd 2>/dev/null)\" = {q(self.cwd)} ] && {{ P=$f; break; }}; "
            "done; fi; "
            "if [ $P -gt 0 ]; then kill -TERM -- -$P 2>/dev/null; kill -TERM $P 2>/dev/null; "
            f"for i in $(seq 1 {int(self.wait_s * 10)}); do kill -0 $P 2>/dev/null || break; sleep 0.1; done; "
            "kill -KILL -- -$P 2>/dev/null; kill -0 $P 2>/dev/null && kill -KILL $P; echo \"stopped pid=$P\"; "
            "else echo 'no copy running'; fi; "
            f"rm -f {pf} {q(self.env_file)} {q(self.log)}; echo removed")


class ListeningPorts(BaseModel):
    """The TCP ports something listens on (``/proc/net/tcp`` and ``tcp6``, state 0A), in hex as the kernel writes them."""

    model_config = ConfigDict(extra="forbid")

    def command(self) -> str:
        return ("cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == \"0A\" { n = split($2, a, \":\"); "
                "print a[n] }' | sort -u")


class Ports(BaseModel):
    ports: list[int]


def parse_ports(text: str) -> Ports:
    out = set()
    for ln in text.split():
        if re.fullmatch(r"[0-9A-Fa-f]{1,4}", ln):
            out.add(int(ln, 16))
    return Ports(ports=sorted(out))


class GpuMemory(BaseModel):
    """Each GPU's index, UUID, total and used memory, and each compute process's memory by GPU (MiB)."""

    model_config = ConfigDict(extra="forbid")

    def command(self) -> str:
        return ("command -v nvidia-smi >/dev/null 2>&1 || { echo 'no nvidia-smi'; exit 0; }; echo '== gpus'; "
                "nvidia-smi --query-gpu=index,uuid,memory.total,memory.used --format=csv,noheader,nounits 2>&1; "
                "echo '== apps'; nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits "
                "2>&1; echo '== end'")


class GpuRow(BaseModel):
    index: str
    uuid: str
    total_mib: float
    used_mib: float


class AppRow(BaseModel):
    gpu_uuid: str
    pid: int
    used_mib: float


class GpuMemoryOut(BaseModel):
    readable: bool
    why: str = ""
    gpus: list[GpuRow] = Field(default_factory=list)
    apps: list[AppRow] = Field(default_factory=list)


def _num(s: str) -> float | None:
    try:
        return float(s.strip().split()[0])
    except (ValueError, IndexError):
        return None


def parse_gpu_memory(text: str) -> GpuMemoryOut:
    if "== gpus" not in text:
        return GpuMemoryOut(readable=False, why="there is no nvidia-smi on the host")
    sections = split_sections(text, "gpu_memory")
    gpus, apps = [], []
    for ln in sections.get("gpus", []):
        parts = [p.strip() for p in ln.split(",")]
        if ln.strip():
            total, used = (_num(parts[2]), _num(parts[3])) if len(parts) == 4 else (None, None)
            if total is None or used is None:
                return GpuMemoryOut(readable=False, why=f"nvidia-smi did not list the GPUs ({ln.strip()[:120]})")
            gpus.append(GpuRow(index=parts[0], uuid=parts[1], total_mib=total, used_mib=used))
    for ln in sections.get("apps", []):
        parts = [p.strip() for p in ln.split(",")]
        if ln.strip() and "No running" not in ln:
            used = _num(parts[2]) if len(parts) == 3 else None
            if len(parts) != 3 or not parts[1].isdigit():
                raise ParseError("expected gpu_uuid, pid, used_memory", tool="gpu_memory", excerpt=ln)
            apps.append(AppRow(gpu_uuid=parts[0], pid=int(parts[1]), used_mib=used or 0.0))
    if not gpus:
        return GpuMemoryOut(readable=False, why="nvidia-smi lists no GPU")
    return GpuMemoryOut(readable=True, gpus=gpus, apps=apps)
