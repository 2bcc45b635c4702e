"""Replay: a transport that answers from a recording and never falls through to a host.

Matching is by the exact command (after redaction, as the recording was redacted), in
recorded order for repeated identical commands (benchmark samples replay in the order
they were recorded). A command the recording lacks raises ``ReplayMiss`` naming the
step, the command asked for, and what was recorded next.

The server restart's script gained parts since the kept recordings were made (the C locale and byte-wise
command-line matching, the saved command line, the undo's "already running as found" scan, the start time it
prints), and ``server_control`` gained who the server runs as: ``legacy_command`` maps today's commands to the
ones recorded before, so old and new recordings key alike.
"""

from __future__ import annotations

import re
import shlex
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import RecordingError, ReplayMiss
from .redact import redact_text
from .transport import DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT_S, BaseTransport, CommandResult, q

RESULT_FIELDS = ("command", "stdout", "stderr", "exit_code")

_RESTART = "trap : HUP INT TERM; "
_OLD_SAME = "same() { [ \"$(tr '\\0' '\\037' < /proc/$1/cmdline 2>/dev/null)\" = \"$2\" ]; }; "
_LEGACY = [
    (re.compile(r" && cat /proc/(\d+)/cmdline > \S+\.argv\) \|\| exit 1; "), ") || exit 1; "),
    (re.compile(r"rm -f \S+\.argv; "), ""),
    (re.compile(r"if \[ \$P = 0 \] && \[ \"\$\(ticks \d+\)\" = \d+ \] && same .*?; then P=\d+; fi; ", re.S), ""),
    (re.compile(r"W=; if \[ -s .*?echo \"running pid=\$F\"; exit 0; fi; ", re.S), ""),
    (re.compile(r"if \[ -n \"\$W\" \]; then set -- \"\$\{WA\[@\]\}\"; else set -- (.*?); fi; "
                r"(cd .*? && \{ setsid nohup env -i \"\$\{N\[@\]\}\") \"\$@\"", re.S), r"\2 \1"),
    (re.compile(r" start=\$\(ticks \$new\)"), ""),
]


_PORTS = re.compile(r"for pt in [0-9 ]+; do h=.*?: ports; ", re.S)
# a read of /proc/PID/FILE silenced before its redirect (bash applies `<` first: a gone process's "No such file" went
# to stderr), as recorded before: the redirect first
_PROC_READ = re.compile(r"2>/dev/null < ((?:/proc/|\$[pd]/)[^\s;|)]+)")


def _old_reads(text: str) -> str:
    return _PROC_READ.sub(r"< \1 2>/dev/null", text)


def legacy_command(command: str) -> str:
    """A command as recordings made before it changed hold it: the restart script before its byte-wise matching,
    ``server_control`` before it read who the server runs as, the server's interpreter (``python_packages``,
    ``import_roots``) before it ran as the server's user, git reads before they took no optional lock, worktrees
    before they ran no hook, a read of ``/proc`` silenced after its redirect; any other command as it is."""
    from .host import AS_OWNER_END, GIT_READ
    from .mutate import CONTROL_IDENTITY, NO_HOOKS
    command = _old_reads(command)
    if command.startswith(GIT_READ) and command[len(GIT_READ):].startswith(("cd ", "git -C ")):   # no optional lock
        return command[len(GIT_READ):]
    if command.startswith(f"git {NO_HOOKS}-C "):   # a worktree added or moved without the repository's hooks
        return "git " + command[len(f"git {NO_HOOKS}"):]
    if command.startswith("p=/proc/") and CONTROL_IDENTITY in command:
        return command.replace(CONTROL_IDENTITY, "", 1)
    if command.startswith("[ -r /proc/") and AS_OWNER_END in command:   # the server's interpreter, as its user
        return command.split(AS_OWNER_END, 1)[1].replace("$R ", "", 1).removeprefix(" ")
    if not command.startswith("bash -c ") or "export LC_ALL=C; keyof()" not in command:
        return command
    try:
        inner = shlex.split(command)[2]
    except (ValueError, IndexError):
        return command
    from .mutate import SAME
    head = _RESTART + "export LC_ALL=C; " + _old_reads(SAME)
    if not inner.startswith(head):
        return command
    body = inner[len(head):]
    from .mutate import KIDS, REAP, TREE
    # before the whole process tree was stopped and its ports checked free
    body = _PORTS.sub("", body.removeprefix(_old_reads(TREE)).replace(KIDS, "", 1).replace(REAP, "", 1))
    for pattern, repl in _LEGACY:
        body = pattern.sub(repl, body)
    return f"bash -c {q(_RESTART + _OLD_SAME + body)}"


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class RecordedHeader(_Loose):
    """What a replay needs from ``run_started``."""

    run_id: str
    host: str = "?"
    symptom: str
    baseline: str | None = None
    playbook: str | None = None
    inputs: dict[str, Any] = Field(default_factory=dict)
    baseline_snapshot_data: dict[str, Any] | None = None


class RecordedResult(_Loose):
    """What a replay needs from each ``tool_result``."""

    command: str
    stdout: str
    stderr: str
    exit_code: int
    duration_ms: float = 0.0
    truncated: bool = False
    timed_out: bool = False


def check_events(events: list[dict[str, Any]], file: str) -> None:
    """Every field a replay reads has its type, or ``RecordingError`` naming the line and the field."""
    for n, ev in enumerate(events, 1):
        model = RecordedHeader if n == 1 else RecordedResult if ev.get("event") == "tool_result" else None
        if model is None:
            continue
        try:
            model.model_validate(ev)
        except ValidationError as exc:
            e = exc.errors()[0]
            field = ".".join(str(x) for x in e["loc"])
            raise RecordingError(f"{ev.get('event')}: field `{field}`: {e['msg']}", file=file, line=n,
                                 fix="the recording is edited or damaged; record the run again") from None


class ReplayTransport(BaseTransport):
    max_parallel = 1  # replay in a deterministic order
    live = False      # there is no host: nothing is kept on one

    def __init__(self, events: Sequence[Any], file: str = "events.jsonl") -> None:
        """``events``: a recording as ``agent.transcript.read_events`` returns it (models that answer
        ``ev["field"]`` and ``ev.get``), or as plain dicts."""
        self.host = "replay:" + str(events[0].get("host", "?"))
        self._queues: dict[str, deque[dict[str, Any]]] = {}
        self._order: list[dict[str, Any]] = []
        self._display: dict[str, str] = {}
        for n, ev in enumerate(events, 1):
            if ev["event"] == "tool_call":
                self._display.setdefault(redact_text(ev.get("command", "")), ev.get("display", ""))
            if ev["event"] != "tool_result":
                continue
            missing = [f for f in RESULT_FIELDS if f not in ev]
            if missing:
                raise RecordingError(f"tool_result lacks {', '.join(missing)}", file=file, line=n,
                                     fix="the recording is edited or truncated; record the run again")
            # keyed as asked (redacted by today's rules): a recording made before a rule existed still matches
            self._queues.setdefault(redact_text(legacy_command(ev["command"])), deque()).append(ev)
            self._order.append(ev)
        self._used: set[int] = set()
        # an optional probe added since the recording was made is left out of its replay (tools.probes.plan)
        self.recorded_tools = frozenset(str(ev.get("tool")) for ev in self._order if ev.get("tool")) or None
        self.step = 0
        self._lock = threading.Lock()

    def run(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT) -> CommandResult:
        key = redact_text(legacy_command(command))
        with self._lock:
            self.step += 1
            q = self._queues.get(key)
            if not q:
                nxt = next((e for e in self._order if id(e) not in self._used), None)
                raise ReplayMiss(
                    f"replay step {self.step}: the agent asked for a command the recording does not hold:\n"
                    f"  asked:         {command[:300]}\n"
                    f"  recorded next: {(nxt or {}).get('command', '(nothing: the recording is exhausted)')[:300]}",
                    step=self.step, asked=command, recorded_next=(nxt or {}).get("command"),
                    fix="the playbook or the agent changed what it asks; record the run again against a host "
                        "(debugagent run … --out DIR) if the change is intended")
            ev = q.popleft()
            self._used.add(id(ev))
        return CommandResult(command=command, host=self.host, stdout=ev["stdout"], stderr=ev["stderr"],
                             exit_code=int(ev["exit_code"]), duration_ms=float(ev.get("duration_ms", 0.0)),
                             truncated=bool(ev.get("truncated", False)), timed_out=bool(ev.get("timed_out", False)))

    def display(self, command: str) -> str:
        return self._display.get(redact_text(command)) or command

    @property
    def unused(self) -> int:
        return len(self._order) - len(self._used)
