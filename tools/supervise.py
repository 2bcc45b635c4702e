"""Restarting a supervised server the way its supervisor does: supervisord through its config and
``supervisorctl``, systemd through a drop-in.

supervisord: ``supervisor_program`` reads the config file holding ``[program:NAME]`` (the main config or one
its ``[include]`` names), exactly as bytes; ``edit_program`` (pure) changes that section's ``command=``,
``environment=`` or ``directory=``; ``supervisor_apply`` saves the file to a backup under ``/tmp``, writes the
edited bytes in place (only if the file still hashes as read), then ``supervisorctl reread`` and ``update GROUP``
(which restarts the changed program) and waits until it is RUNNING; ``supervisor_restore`` (the undo) writes the
backup's bytes back (and its mtime), ``reread`` / ``update`` again, waits for RUNNING and removes the backup.

systemd: ``systemd_dropin`` writes ``/etc/systemd/system/UNIT.d/debugagent-RUN.conf`` (``Environment=``,
``UnsetEnvironment=``, ``ExecStart=``), ``systemctl daemon-reload`` and ``systemctl restart UNIT``;
``systemd_dropin_remove`` (the undo) removes it (and the ``UNIT.d`` folder if it made it), ``daemon-reload`` and
restarts the unit.
"""

from __future__ import annotations

import hashlib
import re
import shlex

from pydantic import BaseModel, ConfigDict, Field

from .errors import ParseError, parser
from .transport import q

PROGRAM_RE = r"^[A-Za-z0-9_.@:+-]{1,128}$"
UNIT_RE = r"^[A-Za-z0-9_.@:\\-]{1,200}\.service$"


def _ctl(argv: list[str]) -> str:
    return " ".join(q(a) for a in argv)


# ---------------------------------------------------------------- supervisord
class SupervisorProgram(BaseModel):
    """Input of ``supervisor_program``: the file of ``config`` (or one its ``[include]`` names) holding
    ``[program:NAME]``, printed as its path, its sha256 and its bytes (base64)."""

    model_config = ConfigDict(extra="forbid")
    config: str
    program: str = Field(pattern=PROGRAM_RE)

    def command(self) -> str:
        c = q(self.config)
        sect = q(f"[program:{self.program}]")
        return (f"c={c}; [ -r \"$c\" ] || {{ echo \"cannot read the supervisord config $c\"; exit 1; }}; "
                "d=$(dirname \"$c\"); files=(\"$c\"); "
                "inc=$(awk '/^\\[include\\]/{f=1;next} /^\\[/{f=0} f && /^[ \\t]*files[ \\t]*=/{sub(/^[^=]*=/,\"\"); print}' \"$c\"); "
                "for g in $inc; do case \"$g\" in /*) ;; *) g=\"$d/$g\";; esac; for x in $g; do [ -f \"$x\" ] && files+=(\"$x\"); done; done; "
                f"for f in \"${{files[@]}}\"; do if grep -qxF {sect} \"$f\"; then echo \"== file $f\"; "
                "sha256sum < \"$f\" | cut -d' ' -f1; cat \"$f\"; printf '\\n== end\\n'; exit 0; fi; done; "
                f"echo \"no file of $c holds \"{sect}; exit 1")

    def display_command(self) -> str:
        return f"cat {self.config} (and its [include] files): the one holding [program:{self.program}]"


class ProgramFile(BaseModel):
    path: str
    sha256: str
    text: str


@parser("supervisor_program")
def parse_supervisor_program(text: str) -> ProgramFile:
    m = re.search(r"^== file (.+)\n([0-9a-f]{64})\n", text, re.M)
    if not m or not text.endswith("\n== end\n"):
        raise ParseError("no `== file` … `== end` section", tool="supervisor_program", excerpt=text[-160:])
    return ProgramFile(path=m.group(1), sha256=m.group(2), text=text[m.end():-len("\n== end\n")])


def parse_environment(value: str) -> dict[str, str]:
    """supervisord's ``environment=KEY="val",KEY2=val2`` as a dict (its own rule: shell-like words split on commas)."""
    lex = shlex.shlex(value, posix=True)
    lex.whitespace = ","
    lex.whitespace_split = True
    lex.commenters = ""
    out: dict[str, str] = {}
    for tok in lex:
        k, eq, v = tok.strip().partition("=")
        if eq and k:
            out[k] = v
    return out


def format_environment(env: dict[str, str]) -> str:
    """The inverse of ``parse_environment``: every value double-quoted, ``%`` doubled (supervisord expands ``%(…)s``)."""
    def one(v: str) -> str:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") + '"'
    return ",".join(f"{k}={one(v)}" for k, v in env.items())


class SectionError(ValueError):
    pass


def _section(lines: list[str], program: str) -> tuple[int, int]:
    head = f"[program:{program}]"
    start = next((i for i, ln in enumerate(lines) if ln.strip() == head), None)
    if start is None:
        raise SectionError(f"no {head} section")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    return start, end


def program_value(text: str, program: str, key: str) -> str | None:
    """``key=``'s value in ``[program:NAME]`` (one line), None when the section does not set it."""
    lines = text.splitlines()
    start, end = _section(lines, program)
    for ln in lines[start + 1:end]:
        k, eq, v = ln.partition("=")
        if eq and k.strip() == key:
            return v.strip()
    return None


def edit_program(text: str, program: str, values: dict[str, str]) -> str:
    """``text`` with ``[program:NAME]``'s ``key=value`` lines replaced (or added at the section's end) for each of
    ``values``; every other byte as it was."""
    lines = text.splitlines(keepends=True)
    start, end = _section([ln.rstrip("\r\n") for ln in lines], program)
    todo = dict(values)
    for i in range(start + 1, end):
        k, eq, _ = lines[i].partition("=")
        if eq and k.strip() in todo:
            nl = lines[i][len(lines[i].rstrip("\r\n")):] or "\n"
            lines[i] = f"{k.strip()}={todo.pop(k.strip())}{nl}"
    if todo:
        at = end
        while at > start + 1 and not lines[at - 1].strip():
            at -= 1
        if at > 0 and not lines[at - 1].endswith("\n"):
            lines[at - 1] += "\n"
        lines[at:at] = [f"{k}={v}\n" for k, v in todo.items()]
    return "".join(lines)


def _wait_running(ctl: str, spec: str) -> str:
    """Shell: wait (60 s) until ``supervisorctl status SPEC`` says RUNNING; ``$np`` is then its pid."""
    return (f"np=; for i in $(seq 1 600); do st=$({ctl} status {q(spec)} 2>&1); "
            "case \"$st\" in *RUNNING*pid\\ *) np=${st#*pid }; np=${np%%,*}; break;; esac; sleep 0.1; done; "
            "[ -n \"$np\" ] || { echo \"the program did not reach RUNNING: $st\"; exit 1; }; ")


class SupervisorApply(BaseModel):
    """Write ``content`` over the program's config ``file`` (which must still hash to ``sha256``, and hash to
    ``new_sha256`` once written, else the backup is put back) after saving it to ``backup``; ``supervisorctl
    reread`` and ``update GROUP``; wait until the program is RUNNING. A bisection step's restart
    (``restart_only``) just restarts the program under the config as it is."""

    model_config = ConfigDict(extra="forbid")
    file: str
    backup: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    content: str = ""
    new_sha256: str = ""
    values: dict[str, str] = Field(default_factory=dict)   # the section's lines the edit wrote (for the record and the fix)
    program: str = ""
    ctl: list[str]
    group: str = Field(pattern=PROGRAM_RE)
    spec: str = Field(pattern=PROGRAM_RE)
    restart_only: bool = False

    def command(self) -> str:
        ctl, f, b = _ctl(self.ctl), q(self.file), q(self.backup)
        if self.restart_only:
            return (f"{ctl} restart {q(self.spec)} >/dev/null 2>&1; " + _wait_running(ctl, self.spec)
                    + "echo \"started pid=$np\"")
        return (f"[ \"$(sha256sum < {f} | cut -d' ' -f1)\" = {q(self.sha256)} ] || {{ echo 'the config changed since it "
                f"was read: nothing written'; exit 1; }}; [ -e {b} ] || (umask 077; cp -p {f} {b}) || exit 1; "
                f"printf %s {q(self.content)} > {f} || exit 1; [ \"$(sha256sum < {f} | cut -d' ' -f1)\" = "
                f"{q(self.new_sha256)} ] || {{ cat {b} > {f}; touch -r {b} {f}; echo 'the edited config did not write "
                "as meant: put back'; exit 1; }; "
                f"{ctl} reread || exit 1; "
                f"{ctl} update {q(self.group)} || exit 1; "
                f"case \"$({ctl} status {q(self.spec)} 2>&1)\" in *RUNNING*|*STARTING*) ;; *) {ctl} start {q(self.spec)};; esac; "
                + _wait_running(ctl, self.spec) + "echo \"started pid=$np\"")

    def display_command(self) -> str:
        return (f"cp -p {self.file} {self.backup}; <write the edited [program] section to {self.file}>; "
                f"{' '.join(self.ctl)} reread && {' '.join(self.ctl)} update {self.group}")


class SupervisorRestore(BaseModel):
    """The undo of ``supervisor_apply``: the backup's bytes and mtime back over ``file`` (if the backup is still
    there), ``reread``, ``update GROUP``, wait until RUNNING, remove the backup. Re-runnable at any point."""

    model_config = ConfigDict(extra="forbid")
    file: str
    backup: str
    ctl: list[str]
    group: str = Field(pattern=PROGRAM_RE)
    spec: str = Field(pattern=PROGRAM_RE)
    argv: list[str] = Field(default_factory=list)   # the server as found (what the as-found check looks for)

    def command(self) -> str:
        ctl, f, b = _ctl(self.ctl), q(self.file), q(self.backup)
        return (f"if [ -e {b} ]; then cat {b} > {f} && touch -r {b} {f} || exit 1; fi; {ctl} reread >/dev/null || exit 1; "
                f"u=$({ctl} update {q(self.group)} 2>&1) || {{ echo \"$u\"; exit 1; }}; echo \"$u\"; "
                f"case \"$({ctl} status {q(self.spec)} 2>&1)\" in *RUNNING*|*STARTING*) ;; *) {ctl} start {q(self.spec)};; esac; "
                + _wait_running(ctl, self.spec) + f"rm -f {b}; "
                "if [ -n \"$u\" ]; then echo \"started pid=$np\"; else echo \"running pid=$np\"; fi")


# ---------------------------------------------------------------- systemd
def dropin_path(unit: str, run_id: str) -> str:
    return f"/etc/systemd/system/{unit}.d/debugagent-{run_id}.conf"


def systemd_quote(word: str) -> str:
    """One word of ``ExecStart=`` / ``Environment=`` as systemd reads it: double-quoted, ``\\``, ``"`` escaped,
    ``%`` doubled (a specifier), ``$`` doubled (no variable expansion)."""
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$") + '"'


def dropin_text(set_env: dict[str, str], unset_env: list[str], argv: list[str] | None, cwd: str | None = None) -> str:
    """The drop-in's ``[Service]`` section: later ``Environment=`` wins, ``UnsetEnvironment=`` removes,
    ``ExecStart=`` emptied then set (a service's command line is replaced so), ``WorkingDirectory=``."""
    lines = ["# written by debugagent for one experiment; its undo removes this file", "[Service]"]
    if cwd:
        lines.append(f"WorkingDirectory={cwd}")
    lines += [f"Environment={systemd_quote(f'{k}={v}')}" for k, v in sorted(set_env.items())]
    lines += [f"UnsetEnvironment={systemd_quote(u)}" for u in unset_env]
    if argv:
        lines += ["ExecStart=", "ExecStart=" + " ".join(systemd_quote(a) for a in argv)]
    return "\n".join(lines) + "\n"


class SystemdDropin(BaseModel):
    """Write the drop-in ``path`` (``/etc/systemd/system/UNIT.d/debugagent-RUN.conf``), ``daemon-reload``, restart."""

    model_config = ConfigDict(extra="forbid")
    unit: str = Field(pattern=UNIT_RE)
    path: str
    content: str

    def command(self) -> str:
        d = q(self.path.rsplit("/", 1)[0])
        return (f"command -v systemctl >/dev/null || {{ echo 'systemctl is not installed here'; exit 1; }}; "
                "[ -w /etc/systemd/system ] || { echo \"no permission to write /etc/systemd/system (this session runs as "
                "uid $(id -u)): nothing written\"; exit 1; }; "
                f"mkdir -p {d} && printf %s {q(self.content)} > {q(self.path)} || exit 1; systemctl daemon-reload || exit 1; "
                f"systemctl restart {q(self.unit)} || exit 1; "
                f"echo \"started pid=$(systemctl show -p MainPID --value {q(self.unit)})\"")


class SystemdAccess(BaseModel):
    """Read-only: whether this session could change the unit as ``systemd_dropin`` does: ``systemctl`` on PATH,
    ``/etc/systemd/system`` writable, and who this session runs as."""

    model_config = ConfigDict(extra="forbid")
    unit: str = Field(pattern=UNIT_RE)

    def command(self) -> str:
        return ("echo \"systemctl=$(command -v systemctl >/dev/null && echo yes || echo no)\"; "
                "echo \"writable=$([ -w /etc/systemd/system ] && echo yes || echo no)\"; echo \"uid=$(id -u)\"")


class Access(BaseModel):
    systemctl: bool
    writable: bool
    uid: int | None = None


def parse_systemd_access(text: str) -> Access:
    got: dict[str, str] = {m.group(1): m.group(2) for m in re.finditer(r"^(systemctl|writable|uid)=(\S*)$", text, re.M)}
    if "systemctl" not in got or "writable" not in got:
        raise ParseError("no `systemctl=` and `writable=` lines", tool="systemd_access", excerpt=text[-80:])
    uid = got.get("uid", "")
    return Access(systemctl=got["systemctl"] == "yes", writable=got["writable"] == "yes",
                  uid=int(uid) if uid.isdigit() else None)


class SystemdDropinRemove(BaseModel):
    """The undo of ``systemd_dropin``: remove the drop-in (and ``UNIT.d`` when it made it and it is empty now),
    ``daemon-reload``, restart the unit. Re-runnable: a drop-in already gone is not an error; one never written nor
    loaded by systemd (the experiment stopped before it wrote anything) leaves nothing to do."""

    model_config = ConfigDict(extra="forbid")
    unit: str = Field(pattern=UNIT_RE)
    path: str
    remove_dir: bool = False
    argv: list[str] = Field(default_factory=list)   # the server as found (what the as-found check looks for)

    def command(self) -> str:
        d = q(self.path.rsplit("/", 1)[0])
        rmdir = f"rmdir {d} 2>/dev/null; " if self.remove_dir else ""
        u, f = q(self.unit), q(self.path)
        # nothing to undo where the drop-in was never written nor loaded (no systemctl, no permission to write it)
        return (f"if [ ! -e {f} ] && ! systemctl show -p DropInPaths --value {u} 2>/dev/null | tr ' ' '\\n' | grep -qxF {f}; "
                f"then pid=$(systemctl show -p MainPID --value {u} 2>/dev/null); echo \"running pid=${{pid:-0}}\"; exit 0; fi; "
                f"rm -f {q(self.path)} || exit 1; {rmdir}systemctl daemon-reload || exit 1; "
                f"systemctl restart {q(self.unit)} || exit 1; "
                f"echo \"started pid=$(systemctl show -p MainPID --value {q(self.unit)})\"")


def sha256_of(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
