"""Mutating tools: used only by experiments, each one paired with the step that undoes it.

Every argument reaches the shell through ``shlex.quote``.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from .errors import ParseError
from .transport import q


class WorktreeAdd(BaseModel):
    """``git worktree add --detach PATH COMMIT``: a second checkout; the user's tree is untouched."""

    model_config = ConfigDict(extra="forbid")
    repo: str
    path: str
    commit: str

    def command(self) -> str:
        return f"git -C {q(self.repo)} worktree add --detach -f {q(self.path)} {q(self.commit)} 2>&1"


class WorktreeRemove(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repo: str
    path: str

    def command(self) -> str:
        return (f"git -C {q(self.repo)} worktree remove --force {q(self.path)} 2>&1; "
                f"git -C {q(self.repo)} worktree prune; rm -rf {q(self.path)}; echo removed")


class RestartServer(BaseModel):
    """Stop the server process ``pid`` and start ``argv`` in ``cwd`` with its environment.

    The environment is read on the host from ``env_file`` (NUL-separated, as
    ``/proc/PID/environ``), minus ``unset``, plus ``set``: secrets in it never leave the
    host. With ``save_env`` (the experiment's restart) the file is first written afresh
    from the running process, mode 600; the undo restart reads what was saved. The new process is detached
    (``setsid nohup``), its output goes to ``log``, and the command prints the new pid.
    Used both to apply an experiment and to undo it.
    """

    model_config = ConfigDict(extra="forbid")
    pid: int
    argv: list[str]
    cwd: str
    env_file: str
    unset: list[str] = Field(default_factory=list)
    set: dict[str, str] = Field(default_factory=dict)
    save_env: bool = False
    log: str = "/tmp/debugagent-server.log"
    wait_s: float = 10.0

    def command(self) -> str:
        pid = int(self.pid)
        argv = " ".join(q(a) for a in self.argv)
        drop = " ".join(q(n) for n in self.unset)
        add = " ".join(q(f"{k}={v}") for k, v in sorted(self.set.items()))
        save = (f"(umask 077; cat /proc/{pid}/environ > {q(self.env_file)}) || exit 1; " if self.save_env else
                f"[ -s {q(self.env_file)} ] || {{ if kill -0 {pid} 2>/dev/null; then "
                f"echo \"started pid={pid} (never stopped: nothing to restore)\"; exit 0; fi; "
                f"echo 'the saved environment is missing'; exit 1; }}; ")
        # the experiment's restart notes the pid it started beside the saved environment, at once, so an
        # undo after a crash (before debugagent learnt that pid) still stops it; the undo removes the note
        pid_note = q(self.env_file + ".pid")
        note_pid = f"echo $new > {pid_note};" if self.save_env else f"rm -f {pid_note};"
        stop_also = "" if self.save_env else f"[ -s {pid_note} ] && P=\"$P $(tr -cd '0-9' < {pid_note})\";"
        script = save + (
            f"mapfile -d '' E < {q(self.env_file)}; N=(); for kv in \"${{E[@]}}\"; do keep=1; "
            f"for u in {drop}; do [ \"${{kv%%=*}}\" = \"$u\" ] && keep=0; done; [ $keep = 1 ] && N+=(\"$kv\"); done; "
            f"N+=({add}); "
            f"P={pid}; {stop_also} for p in $P; do kill $p 2>/dev/null; for i in $(seq 1 {int(self.wait_s * 10)}); do kill -0 $p 2>/dev/null || break; sleep 0.1; done; "
            f"kill -0 $p 2>/dev/null && kill -9 $p; done; "
            f"cd {q(self.cwd)} && {{ setsid nohup env -i \"${{N[@]}}\" {argv} > {q(self.log)} 2>&1 < /dev/null & }}; "
            f"new=$!; {note_pid} sleep 0.3; if kill -0 $new 2>/dev/null; then echo \"started pid=$new\"; "
            f"else echo 'server exited at start:'; tail -5 {q(self.log)}; exit 1; fi"
        )
        return f"bash -c {q(script)}"  # mapfile and arrays: bash, whatever the login shell is


class Restarted(BaseModel):
    pid: int


def parse_restart(text: str) -> Restarted:
    m = re.search(r"started pid=(\d+)", text)
    if not m:
        raise ParseError("no `started pid=N` line", tool="restart_server", excerpt=text[-120:])
    return Restarted(pid=int(m.group(1)))


class SetPowerLimit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu: int
    watts: float

    def command(self) -> str:
        return f"nvidia-smi -i {int(self.gpu)} -pl {float(self.watts):.2f}"


class SetGovernor(BaseModel):
    model_config = ConfigDict(extra="forbid")
    governor: str

    def command(self) -> str:
        return (f"for f in /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor; do echo {q(self.governor)} > \"$f\" || exit 1; done; "
                f"echo governor={q(self.governor)}")


class WorktreeCheckout(BaseModel):
    """Move debugagent's own worktree (never the user's) to another commit, for bisection."""

    model_config = ConfigDict(extra="forbid")
    path: str
    commit: str

    def command(self) -> str:
        return f"git -C {q(self.path)} checkout -q --detach {q(self.commit)} && git -C {q(self.path)} rev-parse HEAD"


class RemoveFile(BaseModel):
    """Remove a file debugagent itself left on the host (a saved environment)."""

    model_config = ConfigDict(extra="forbid")
    path: str

    def command(self) -> str:
        return f"rm -f {q(self.path)}"
