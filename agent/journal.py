"""The undo journal and the per-host lock: nothing an experiment changes is ever forgotten.

Each undo step is written (and fsynced) *before* the change it undoes, on the machine
running debugagent (``journal.json`` in the run folder) and as a small file on the host
(``~/.cache/debugagent/journal-<run_id>.json``, written through the transport with every
argument quoted). A step is marked done only after its tool call succeeded; a step that
failed, or whose connection dropped, stays pending with its error. ``debugagent undo
RUN``, ``resume`` and the next ``run`` on that host read the journal and finish it.

The two copies are merged by step id: a step is done when either copy says so (the local
copy is written first), and its input comes from the host copy when there is one (the host
already holds what the restart needs; the local copy may be redacted).

A journal names the host it was written for (``HostId``: a hash of its machine id, its boot id, host name, the mount
namespace and container of its shell), read before the first step. The host's folder may show another host's journals
(a shared NFS home, a container that binds the machine's root, a sandbox that sees its /tmp): a run acts only on its
own host's (``sort_journals``), and ``undo`` through another host is refused (``Journal.check_host``).

Each step is signed (HMAC-SHA256 over the run id, its id, tool and input) with a key kept outside every run
folder (``undo.key`` in debugagent's state folder, mode 600): ``debugagent undo`` runs only the steps it can
verify it wrote. A step records ``started`` (durably, both sides) before its tool runs, and ``done`` after; the
found state of what each change touches (``before``: the server processes, the checkout, the GPU knobs, the run's
``/tmp`` names; digests where a value may be secret) is read once before the first change of its kind and compared
after the undo (``agent/lab/asfound.py``); ``verified`` says the last comparison found the host as it was.

The lock (``/run/lock/debugagent-host.lock`` on the host, ``/tmp`` where ``/run/lock`` is missing: one for every
account; created with ``noclobber`` so two runs cannot both create it, mode 644 so every account's run sees it)
holds the run id, the pid, start time, account and machine of the debugagent process, and the time; a second run
refuses while it is held.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import stat
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from debugagent.agent.signals import held
from debugagent.tools.errors import DebugAgentError, RunFolderError, UsageError, write_problem
from debugagent.tools.redact import redact
from debugagent.tools.shape import container_of
from debugagent.tools.transport import CommandResult, Transport, q, split_sections
from pydantic import BaseModel, Field, ValidationError

HOST_DIR = '"${XDG_CACHE_HOME:-$HOME/.cache}"/debugagent'
# where the home folder cannot be written (a container with a read-only root filesystem, where only /tmp is), a
# folder of this account's own under $TMPDIR: made with mode 700, never one that is a link or another account's
HOST_TMP_DIR = '"${TMPDIR:-/tmp}"/debugagent-$(id -u)'
# sets $d to the first of the two that can be written (made if need be)
HOST_DIR_PICK = (f'd={HOST_DIR}; if ! {{ mkdir -p "$d" 2>/dev/null && [ -w "$d" ]; }}; then d={HOST_TMP_DIR}; '
                 'mkdir -m 700 -p "$d" 2>/dev/null; if [ -L "$d" ] || [ ! -O "$d" ]; then '
                 'echo "$d: not a folder of this account" >&2; exit 1; fi; fi; ')
LOCK = "debugagent-host.lock"
# one lock for every account of the host: /run/lock (/tmp where it is missing); DEBUGAGENT_LOCK_DIR, in the host
# shell's environment, names another folder (the tests: one per test)
LOCK_FILE = ('if [ -n "${DEBUGAGENT_LOCK_DIR:-}" ]; then d=$DEBUGAGENT_LOCK_DIR; mkdir -p "$d" || exit 1; '
             'elif [ -d /run/lock ]; then d=/run/lock; else d=/tmp; fi; f="$d"/' + LOCK + '; ')
JOURNAL_VERSION = 1
HOST_TIMEOUT_S = 30.0
RECORD_SEP = "\x1edebugagent-journal "


class HostLocked(DebugAgentError):
    """Raised when another run holds the host's lock."""

    exit_code = 2


class Step(BaseModel):
    """One undo step: the tool that puts the host back, and what it says it does."""

    id: int
    tool: str
    input: dict[str, Any]
    text: str
    done: bool = False
    started: bool = False      # its tool was sent at least once (it may have finished, or not: every step is re-runnable)
    error: str | None = None
    recorded_at: str = ""
    mac: str = ""              # HMAC of (run id, id, tool, input) with the state folder's undo key


# who the host is, read through the transport (read-only): the OS install's machine id (/etc/machine-id), the kernel's boot id, the
# host name, the shell's mount namespace, and the container it runs in (its own cgroups and the marks in its root, read
# as ``server_shape`` reads the server's: tools/shape.container_of)
HOST_ID_COMMAND = (
    "echo '== machine_id'; cat /etc/machine-id 2>/dev/null || cat /var/lib/dbus/machine-id 2>/dev/null; "
    "echo '== boot_id'; cat /proc/sys/kernel/random/boot_id 2>/dev/null; echo '== hostname'; uname -n; "
    "echo '== mnt_ns'; readlink /proc/self/ns/mnt 2>/dev/null; echo '== cgroup'; cat /proc/self/cgroup 2>/dev/null; "
    "echo '== marks'; for f in /.dockerenv /run/.containerenv; do [ -e $f ] && echo $f; done; echo '== end'")


class HostId(BaseModel):
    """Who a host is, as its own shell sees it ("" where a field could not be read)."""

    machine_id: str = ""
    boot_id: str = ""
    hostname: str = ""
    mnt_ns: str = ""       # the shell's mount namespace (what a container, or a sandbox, sees as its files)
    container: str = ""    # "RUNTIME ID" of the container the shell runs in ("" for none, or none seen)

    @property
    def known(self) -> bool:
        return bool(self.machine_id or self.hostname or self.boot_id)

    def describe(self) -> str:
        extra = [f"machine {self.machine_id[:8]}" if self.machine_id else "",
                 f"container {self.container}" if self.container else "",
                 f"mount namespace {self.mnt_ns}" if self.mnt_ns else ""]
        extra = [e for e in extra if e]
        return (self.hostname or "?") + (f" ({', '.join(extra)})" if extra else "")

    def other_than(self, here: HostId) -> str | None:
        """Why a journal written on ``self`` is not one of ``here`` (None: the same host, as far as both tell).

        The machine id and the host name must match where both were read, and the container (none is one) where both
        were read at all; the mount namespace too within one boot (namespaces are made anew at each boot, when only
        the others can tell): a container or a sandbox that sees this host's files (a read-only bind of its root, a
        shared /tmp) is another host."""
        for f, what in (("machine_id", "machine-id"), ("hostname", "host name")):
            theirs, mine = getattr(self, f), getattr(here, f)
            if theirs and mine and theirs != mine:
                return f"its {what} is {theirs}, this host's {mine}"
        if self.known and here.known and self.container != here.container:
            return f"its container is {self.container or 'none'}, this host's {here.container or 'none'}"
        if self.boot_id and self.boot_id == here.boot_id and self.mnt_ns and here.mnt_ns and self.mnt_ns != here.mnt_ns:
            return f"it was written in the mount namespace {self.mnt_ns}, this host's shell is in {here.mnt_ns}"
        return None


def parse_host_id(text: str) -> HostId:
    """The output of ``HOST_ID_COMMAND``. The machine id is kept as an id of debugagent's own derived from it (a
    hash, as systemd asks of what it calls a confidential id): equal ids give equal hashes, and it is not shown."""
    s = split_sections(text, "host_id")

    def first(name: str) -> str:
        return next((ln.strip() for ln in s.get(name, []) if ln.strip()), "")

    c = container_of([ln.strip() for ln in s.get("cgroup", []) if ln.strip()],
                     [ln.strip() for ln in s.get("marks", []) if ln.strip()])
    mid = first("machine_id")
    return HostId(machine_id=hashlib.sha256(b"debugagent host id\0" + mid.encode()).hexdigest()[:16] if mid else "", boot_id=first("boot_id"), hostname=first("hostname"),
                  mnt_ns=first("mnt_ns"), container=f"{c.runtime} {c.pod_uid or c.id or '?'}" if c else "")


class JournalData(BaseModel):
    version: int = JOURNAL_VERSION
    run_id: str
    host: str
    pid: int = 0
    machine: str = ""     # the machine debugagent ran on (its pid's), not the host
    host_id: HostId | None = None   # the host the steps were written for (None: a journal of an older debugagent)
    instance: str = ""    # a simulated host's sandbox: its changes die with it
    steps: list[Step] = Field(default_factory=list)
    before: dict[str, Any] = Field(default_factory=dict)   # area -> its reading before the first change there
    verified: bool = False                                 # the last check after the undo found the host as found


class LockInfo(BaseModel):
    run_id: str
    pid: int
    machine: str
    since: str
    boot: str = ""      # the machine's boot id and the process's start time (clock ticks after boot): with the pid
    start: int = 0      # they name one process, so a reused pid is not taken for the holder (older locks: "", 0)
    uid: int = -1       # the account the debugagent process runs as (older locks: -1, "")
    user: str = ""

    def describe(self) -> str:
        who = f", user {self.user or '?'} (uid {self.uid})" if self.uid >= 0 else ""
        return f"run {self.run_id} (pid {self.pid} on {self.machine}, since {self.since}{who})"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def durable_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file, fsync, rename, fsync of the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def parse_journal(text: str, source: str) -> JournalData:
    """A journal file's text -> its model, or a ``UsageError`` naming the file."""
    try:
        return JournalData.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        raise UsageError(f"{source}: not a debugagent undo journal ({str(exc).splitlines()[0]})",
                         fix="the file is damaged; what is left to undo must be checked by hand "
                             "(the run's transcript lists every undo step it recorded)") from exc


# ---------------------------------------------------------------- the undo key and step signatures
KEY_FILE = "undo.key"


def state_dir() -> Path:
    """debugagent's state folder: ``$XDG_STATE_HOME/debugagent`` (``~/.local/state`` when unset)."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "debugagent"


def undo_key() -> bytes:
    """The key that signs undo steps, made once (32 random bytes, mode 600) in the state folder: never in a run
    folder, never on the host. A key others can read or write is refused (exit 2): it would sign their steps."""
    path = state_dir() / KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        try:
            os.write(fd, os.urandom(32))
            os.fsync(fd)
        finally:
            os.close(fd)
    st = path.stat()
    if stat.S_IMODE(st.st_mode) & 0o077 or st.st_uid != os.getuid():
        raise UsageError(f"{path}: the undo key is not private (mode {stat.S_IMODE(st.st_mode):o}, owner uid "
                         f"{st.st_uid}); a key others can read signs undo steps they write",
                         fix=f"chmod 600 {path} (as its owner), or remove it: steps it signed are then refused")
    key = path.read_bytes()
    if len(key) < 32:
        raise UsageError(f"{path}: the undo key is damaged ({len(key)} bytes)",
                         fix=f"remove {path}: a new one is made; pending steps it signed are then refused")
    return key


def step_mac(key: bytes, run_id: str, step: Step) -> str:
    body = json.dumps([run_id, step.id, step.tool, step.input], sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True)
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def digest(key: bytes, data: bytes) -> str:
    """A value kept only as its keyed digest (an environment variable's value, a command line): equal bytes give
    equal digests, and a digest says nothing of a value without the key."""
    return hmac.new(key, b"value\0" + data, hashlib.sha256).hexdigest()[:32]


# ---------------------------------------------------------------- host commands (pure)
def host_journal_path(run_id: str) -> str:
    return f"{HOST_DIR}/{q('journal-' + run_id + '.json')}"


def write_host_file_command(name: str, text: str) -> str:
    """Atomic, synced write of a small file in the host's debugagent folder (mode 600): the cache folder of the
    home, or where that cannot be written, this account's folder under $TMPDIR."""
    f = f'"$d"/{q(name)}'
    return (f"umask 077; {HOST_DIR_PICK}printf %s {q(text)} > {f}.tmp && sync {f}.tmp 2>/dev/null; "
            f"mv -f {f}.tmp {f} && echo written")


def remove_host_file_command(name: str) -> str:
    """The file removed from both folders; the one under $TMPDIR too once it is empty (nothing left in /tmp)."""
    return (f"rm -f {HOST_DIR}/{q(name)} {HOST_TMP_DIR}/{q(name)} && {{ rmdir {HOST_TMP_DIR} 2>/dev/null; true; }} "
            "&& echo removed")


def list_host_journals_command() -> str:
    return (f"for f in {HOST_DIR}/journal-*.json {HOST_TMP_DIR}/journal-*.json; do [ -f \"$f\" ] || continue; "
            f"printf '\\036debugagent-journal %s\\n' \"${{f##*/}}\"; cat \"$f\"; echo; done; true")


def parse_host_journals(text: str) -> dict[str, str]:
    """The listing of :func:`list_host_journals_command` -> {file name: its text}."""
    out: dict[str, str] = {}
    for part in text.split(RECORD_SEP)[1:]:
        name, _, body = part.partition("\n")
        out[name.strip()] = body.strip()
    return out


def lock_command(info: LockInfo, force: bool, stale: str | None = None) -> str:
    """Take the lock: create it (noclobber), or take it back when this run holds it; ``force`` removes any
    holder's first, ``stale`` only the holder whose lock file reads exactly that."""
    f = '"$f"'
    body = q(info.model_dump_json())
    take = f"( set -o noclobber; printf %s {body} > {f} ) 2>/dev/null"
    pre = f"rm -f {f}; " if force else ""
    if stale is not None and not force:
        pre = f'[ "$(cat {f} 2>/dev/null)" = {q(stale)} ] && rm -f {f}; '
    # a lock of this very run id is answered "held" too: only debugagent can tell whether its holder (the run
    # itself, still live, or a process that is gone) may be taken over (HostLock.acquire). Readable by every
    # account (mode 644), so another account's run sees it; a symbolic link there is no lock of debugagent's
    return (f"{LOCK_FILE}umask 022; if [ -L {f} ]; then echo held; echo \"a symbolic link, not a lock: $f\"; exit 0; fi; "
            f"{pre}if {take}; then echo acquired; else echo held; cat {f}; fi")


def unlock_command(run_id: str) -> str:
    f = '"$f"'
    return (f"{LOCK_FILE}if [ ! -L {f} ] && grep -qF {q(json.dumps(run_id))} {f} 2>/dev/null; then rm -f {f}; fi; "
            "echo unlocked")


def parse_lock_reply(text: str) -> tuple[bool, LockInfo | None, str]:
    """(acquired, the holder when held, the holder's raw text)."""
    lines = text.strip().split("\n", 1)
    if lines[0].strip() == "acquired":
        return True, None, ""
    raw = lines[1].strip() if len(lines) > 1 else ""
    try:
        return False, LockInfo.model_validate_json(raw), raw
    except ValueError:
        return False, None, raw


# ---------------------------------------------------------------- the host side
class HostFiles:
    """The journal's and the lock's files on the host, reached through the transport (not the
    transcript: they are bookkeeping, and a replay must not depend on them)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._id: HostId | None = None

    def identity(self) -> HostId:
        """Who the host is (read once; an empty ``HostId`` where it could not be read: nothing to check with)."""
        if self._id is None:
            try:
                r = self._run(HOST_ID_COMMAND)
            except (OSError, DebugAgentError):   # a lost connection (read again next time), a fake host
                return HostId()
            self._id = parse_host_id(r.stdout) if r.ok and "== end" in r.stdout else HostId()
        return self._id

    def _run(self, command: str) -> CommandResult:
        # every command here is idempotent (an atomic overwrite, a removal, a lock this run may hold already),
        # so the transport may send it again after a reconnect. It runs held: a signal waits for its answer, or
        # the undo's removal of the journal (or the lock) could reach the host first and the late write outlive it
        with held():
            return self.transport.run(command, timeout=HOST_TIMEOUT_S)

    def write(self, name: str, text: str) -> None:
        r = self._run(write_host_file_command(name, text))
        if not r.ok or "written" not in r.stdout:
            raise OSError(f"could not write {name} on {self.transport.host}: exit {r.exit_code}: {r.tail(2)}")

    def remove(self, name: str) -> None:
        self._run(remove_host_file_command(name))

    def journals(self) -> dict[str, str]:
        r = self._run(list_host_journals_command())
        return parse_host_journals(r.stdout) if r.ok else {}

    def lock(self, info: LockInfo, force: bool = False, stale: str | None = None) -> tuple[bool, LockInfo | None, str]:
        r = self._run(lock_command(info, force, stale))
        if not r.ok:
            raise OSError(f"could not take the lock on {self.transport.host}: exit {r.exit_code}: {r.tail(2)}")
        return parse_lock_reply(r.stdout)

    def unlock(self, run_id: str) -> None:
        self._run(unlock_command(run_id))


def host_instance(transport: Transport) -> str:
    """What dies with the transport: a simulated host's sandbox folder ("" for a real host)."""
    return transport.instance


def host_side(transport: Transport) -> HostFiles | None:
    """Where the host copy lives; None for a replay (there is no host)."""
    return HostFiles(transport) if transport.live else None


# ---------------------------------------------------------------- the journal
class Journal:
    """The undo steps of one run, newest last; durable on both sides before each change."""

    def __init__(self, path: Path, run_id: str, host: str, remote: HostFiles | None = None,
                 data: JournalData | None = None) -> None:
        self.path = path
        self.remote = remote
        self.data = data or JournalData(run_id=run_id, host=host, pid=os.getpid(), machine=socket.gethostname())
        self.host_name = f"journal-{self.data.run_id}.json"
        self.gone: list[str] = []
        self.local_error: str | None = None   # why the run folder's copy could not be written, if it could not
        self.foreign_copy = ""                # the line that says why the host's copy of this run was left alone
        self._key: bytes | None = None

    @property
    def key(self) -> bytes:
        if self._key is None:
            self._key = undo_key()
        return self._key

    @staticmethod
    def key_path() -> Path:
        return state_dir() / KEY_FILE

    def signed(self, step: Step) -> bool:
        return bool(step.mac) and hmac.compare_digest(step.mac, step_mac(self.key, self.data.run_id, step))

    @classmethod
    def open(cls, path: Path, run_id: str, host: str, remote: HostFiles | None = None, instance: str = "") -> Journal:
        """The run's journal: the file in the run folder if there is one (a resumed run), else a new one.

        Steps journalled on a simulated host that no longer exists (another sandbox) are
        marked done: what they would undo is gone with it, and running them on this
        sandbox would change it.
        """
        data = parse_journal(path.read_text(), str(path)) if path.is_file() else None
        j = cls(path, run_id, host, remote, data)
        j.gone = []
        if data and data.instance and data.instance != instance:
            for s in j.steps:
                s.done, s.error = True, "not run: the simulated host it would restore no longer exists"
                j.gone.append(s.text)
        j.data.pid, j.data.machine, j.data.instance = os.getpid(), socket.gethostname(), instance
        return j

    # --- what is left
    @property
    def steps(self) -> list[Step]:
        """The pending steps, oldest first (``pending()`` gives them in the order they undo)."""
        return [s for s in self.data.steps if not s.done]

    def pending(self) -> list[Step]:
        return list(reversed(self.steps))

    @property
    def settled(self) -> bool:
        """Nothing left to do: every step is done, and the host was checked as found (or nothing was read to
        check it against)."""
        return not self.steps and (self.data.verified or not self.data.before)

    def check_host(self, where: str) -> None:
        """Refuse (exit 2) to act on this journal through a host other than the one it was written on. ``where``:
        the command to run there (``debugagent undo FOLDER``)."""
        if self.remote is None or self.data.host_id is None or self.settled or self.gone:   # gone: a sandbox that ended
            return
        here = self.remote.identity()
        why = self.data.host_id.other_than(here)
        if why is not None:
            raise UsageError(f"the journal of run {self.data.run_id} was written on host {self.data.host_id.describe()}; "
                             f"{self.remote.transport.host} is {here.describe()} ({why}): its steps restore that "
                             "host, and are not run here",
                             fix=f"run `{where}` where --host {self.data.host} reaches "
                                 f"{self.data.host_id.hostname or 'that host'} (from the machine "
                                 f"{self.data.machine or '?'} the run was started on, if it is `local`)")

    def describe_left(self) -> str:
        return "; ".join(f"{s.text}" + (" (started, not done)" if s.started and not s.error else "")
                         + (f" (last error: {s.error})" if s.error else "") for s in self.pending())

    # --- changes
    def record(self, tool: str, inp: dict[str, Any], text: str) -> Step:
        """Journal an undo step on both sides; raises (before the change is made) if it cannot."""
        step = Step(id=len(self.data.steps) + 1, tool=tool, input=inp, text=text, recorded_at=now())
        step.mac = step_mac(self.key, self.data.run_id, step)
        if self.remote is not None and self.data.host_id is None and (here := self.remote.identity()).known:
            self.data.host_id = here   # the host these steps restore: read before the first
        self.data.steps.append(step)
        self.data.verified = False
        self.save(host=True)
        return step

    def update(self, step: Step, **changes: Any) -> None:
        """A pending step learns more (the undo restart learns the pid the experiment started). Held: a signal
        between the new input and its signature would leave a step the undo refuses as edited."""
        with held():
            inp = {**step.input, **changes}
            mac = step_mac(self.key, self.data.run_id, step.model_copy(update={"input": inp}))
            step.input, step.mac = inp, mac
            self.save(host=True)

    def note_before(self, area: str, reading: dict[str, Any]) -> None:
        """The found state of ``area``, read before its first change (a later reading of it is not kept)."""
        if area not in self.data.before:
            self.data.before[area] = reading
            self.save()   # the step journalled next writes both copies

    def mark_started(self, step: Step) -> None:
        """Durably, before the step's tool runs: a later undo knows it may have acted, and re-runs it (every step
        finds the host as it is, from any point)."""
        step.started = True
        self.save(host=True, allow_host_failure=True)

    def mark_verified(self, ok: bool) -> None:
        self.data.verified = ok
        self.save()

    def mark_done(self, step: Step) -> None:
        step.done, step.error = True, None
        self.save(host=True, allow_host_failure=True)

    def mark_failed(self, step: Step, error: str) -> None:
        step.error = error
        self.save(host=True, allow_host_failure=True)

    def save(self, host: bool = False, allow_host_failure: bool = False) -> None:
        text = self.data.model_dump_json(indent=1)
        self._write_local()
        if not (host and self.remote):
            return
        try:
            if self.steps:
                self.remote.write(self.host_name, text)
            else:
                self.remote.remove(self.host_name)
        except (OSError, DebugAgentError):
            if not allow_host_failure:
                raise

    # --- the host copy
    def merge_host_copy(self) -> bool:
        """Fold the host's copy in (inputs from the host, done if either says so); True if one was found."""
        if not self.remote:
            return False
        found = self.remote.journals().get(self.host_name)
        if not found:
            return False
        theirs = parse_journal(found, f"{self.data.host}:{self.host_name}")
        if theirs.host_id is not None and (why := theirs.host_id.other_than(self.remote.identity())) is not None:
            self.foreign_copy = (f"a journal of run {theirs.run_id} written on host {theirs.host_id.describe()} is left "
                                 f"alone: not this host ({why})")
            return False
        mine = {s.id: s for s in self.data.steps}
        for s in theirs.steps:
            m = mine.get(s.id)
            if m is None:
                self.data.steps.append(s)
            else:
                m.input, m.mac = s.input, s.mac
                m.done = m.done or s.done
                m.started = m.started or s.started
        for area, reading in theirs.before.items():   # the host's copy keeps what the local one redacts
            self.data.before[area] = reading
        self.data.steps.sort(key=lambda s: s.id)
        self._write_local()
        return True

    def _write_local(self) -> None:
        """The run folder's copy, redacted like every file a run writes (the host's copy keeps the values). A run
        folder that cannot be written (a full disk) does not stop an undo: the host's copy and this one in memory
        hold every step; ``local_error`` says why the file is behind."""
        try:
            durable_write(self.path, json.dumps(redact(self.data.model_dump(mode="json")), indent=1))
        except OSError as exc:
            why = write_problem(exc)
            if why is None:
                raise
            if self.remote is None:   # no other copy: nothing may change on the host without this one
                raise RunFolderError(self.path.parent, why) from None
            self.local_error = why


def others_on_host(remote: HostFiles, run_id: str) -> list[JournalData]:
    """Unfinished journals other runs left on this host (a crash, a kill -9); none written on another host."""
    return sort_journals(remote, run_id)[0]


def sort_journals(remote: HostFiles, run_id: str) -> tuple[list[JournalData], list[str]]:
    """(the unfinished journals other runs left on this host, a line for each one found here that is not acted on
    or cannot be checked). The host's folder may show another host's journals (a shared NFS home, a container with a
    read-only bind of the machine's root, a sandbox that sees its /tmp): one written for another host is left where
    it is; one of an older debugagent, which names no host, is restored as before, with a line saying so, unless
    it was written by a ``--host local`` run on a machine of another name."""
    out: list[JournalData] = []
    notes: list[str] = []
    here: HostId | None = None
    for name, text in remote.journals().items():
        if name == f"journal-{run_id}.json":
            continue
        try:
            data = parse_journal(text, name)
        except UsageError:
            continue
        if not any(not s.done for s in data.steps):
            continue
        here = here or remote.identity()
        if data.host_id is not None:
            why = data.host_id.other_than(here)
            if why is not None:
                notes.append(f"a journal of run {data.run_id} written on host {data.host_id.describe()} is left "
                             f"alone: not this host ({why}); `debugagent undo` of that run, where it ran, restores it")
                continue
        elif data.host == "local" and data.machine and here.hostname and data.machine != here.hostname:
            notes.append(f"a journal of run {data.run_id} written by a `--host local` run on {data.machine} is left "
                         f"alone: not this host ({here.hostname})")
            continue
        else:
            notes.append(f"the journal of run {data.run_id} names no host (written by an older debugagent): its host "
                         "cannot be checked; it is restored here, as the host's cache folder holds it")
        out.append(data)
    return out, notes


# ---------------------------------------------------------------- the lock
class HostLock:
    """The per-host lock of one run; ``release`` only removes a lock this run holds."""

    def __init__(self, remote: HostFiles | None, run_id: str) -> None:
        self.remote = remote
        self.run_id = run_id
        self.held = False
        self.took_over = ""   # the line that says whose stale lock this run took over

    def acquire(self, force: bool = False, wait_s: float = 0.0) -> None:
        if self.remote is None:
            return
        info = LockInfo(run_id=self.run_id, pid=os.getpid(), machine=socket.gethostname(), since=now(),
                        boot=_boot_id(), start=_start_ticks(os.getpid()), uid=os.getuid(), user=_user())
        deadline = time.monotonic() + wait_s
        tried_stale = False
        empty_seen = 0
        while True:
            ok, holder, raw = self.remote.lock(info, force=force)
            if ok:
                self.held = True
                return
            if holder is None and not raw.strip() and not tried_stale:
                # an empty lock file: a run that could not write its lock (a full disk on the host). A lock is
                # written at once after it is made, so one still empty a second later is no one's: taken over
                empty_seen += 1
                if empty_seen == 1:
                    time.sleep(1.0)
                    continue
                tried_stale = True
                ok, _, _ = self.remote.lock(info, stale="")
                if ok:
                    self.held = True
                    self.took_over = ("took over an empty lock file on the host (a run that could not write it, "
                                      "a full disk?): it names no run, and it stayed empty")
                    return
                continue
            own = holder is not None and holder.run_id == self.run_id
            if own and holder is not None and holder.pid == os.getpid() and holder.machine == socket.gethostname():
                owner_gone_or_me = True          # this process holds it already
            else:
                owner_gone_or_me = holder is not None and owner_gone(holder)
            if holder and not tried_stale and owner_gone_or_me:
                tried_stale = True
                # the holder is provably gone (this machine, its process dead or its pid reused, or a reboot
                # since): take its lock over, only if it is still that holder's (compare, then remove). What
                # its run left on the host is in its journal there, which this run settles before it changes
                # anything
                ok, _, _ = self.remote.lock(info, stale=raw)
                if ok:
                    self.held = True
                    if not own:
                        self.took_over = (f"took over the lock of {holder.describe()}: that process is no longer "
                                          f"running on {holder.machine}")
                    return
                continue
            if time.monotonic() >= deadline:
                break
            time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))
        who = holder.describe() if holder else f"an unreadable lock ({raw[:80]!r})"
        if holder is not None and holder.run_id == self.run_id:
            raise HostLocked(f"run {self.run_id} is still running (pid {holder.pid} on {holder.machine}, since "
                             f"{holder.since}): restoring {self.remote.transport.host} under it would leave two "
                             f"servers and its verdicts measured on a host it did not change",
                             fix=f"stop that run first (Ctrl-C, or kill -TERM {holder.pid}: it undoes its own changes), "
                                 "then `debugagent undo` it if anything is left; --force-unlock only if it is gone")
        raise HostLocked(f"{self.remote.transport.host} is in use by {who}; two runs on one host would record each "
                         f"other's changes as the host's own state.",
                         fix="wait for that run to finish, or pass --force-unlock if it is gone (a stale lock)")

    def release(self) -> None:
        if self.remote is None or not self.held:
            return
        try:
            self.remote.unlock(self.run_id)
        except (OSError, DebugAgentError):
            pass  # unreachable host: the lock stays, `--force-unlock` or the same run's `undo` takes it over
        self.held = False


def _user() -> str:
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return ""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int:
    """The process's start time in clock ticks after boot (``/proc/PID/stat`` field 22); 0 where unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def owner_gone(holder: LockInfo) -> bool:
    """True only when the lock's holder is provably not running: it was a process of this machine, and this
    machine has rebooted since, or no process has its pid, or the process with its pid started at another time.
    A holder on another machine, or one whose process cannot be told apart, is not gone (--force-unlock)."""
    if holder.machine != socket.gethostname() or holder.pid <= 0:
        return False
    boot = _boot_id()
    if holder.boot and boot and holder.boot != boot:
        return True
    if not _pid_alive(holder.pid):
        return True
    return bool(holder.start) and _start_ticks(holder.pid) not in (0, holder.start)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
