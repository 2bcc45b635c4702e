"""One transport protocol: run a shell command on a host, get a ``CommandResult`` value.

A non-zero exit status is data, never an exception: the tool that sent the command
decides what it means. Transports: ``LocalTransport`` (this machine), ``SimTransport``
(``tools.sim``), ``SSHTransport`` (``tools.ssh``), ``ReplayTransport`` (``tools.replay``),
and ``FakeTransport`` driven by a function. A ``--host`` value reaches its transport through
the table of schemes in ``agent/hosts.py`` (``sim:``, ``local``, SSH; one ``register`` call adds one).

Everything the agent asks of a transport is declared on the protocol, with the defaults
of ``BaseTransport``: whether a command may be sent again after a lost connection
(``supports_retry``), how often the connection was re-made (``reconnects``), where it
reports what happened to the connection (``on_event``), whether the host is a sandbox
that allows changes without consent (``sandbox``) and what dies with it (``instance``),
and whether there is a host at all (``live``: False for a replay).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel, ConfigDict

from .errors import ParseError, UnknownCommand
from .session import Capped  # standard library only, shared with the SSH transport

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_OUTPUT = 4 * 1024 * 1024
TIMEOUT_EXIT = 124


class CommandResult(BaseModel):
    """What one command did on one host: plain, frozen data."""

    model_config = ConfigDict(frozen=True)

    command: str
    host: str
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    duration_ms: float = 0.0
    truncated: bool = False
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def tail(self, n: int = 5) -> str:
        """The last ``n`` lines that say something, of stdout then stderr (a blank line never takes the place of
        the line that says why a command failed)."""
        text = self.stdout + ("\n" + self.stderr if self.stderr else "")
        return "\n".join([ln for ln in text.splitlines() if ln.strip()][-n:])


EventSink = Callable[[str, str], None]


def ignore_event(kind: str, text: str) -> None:
    """The default ``on_event``: nobody listens."""


@runtime_checkable
class Transport(Protocol):
    """Runs shell commands on one host.

    ``supports_retry``: ``run`` takes ``retry=False`` for a command that must not be sent twice
    (a mutation), and by default sends a read-only command again after re-making a lost connection.
    ``reconnects``: how many times the connection was re-made (an experiment that sees it change
    restores the host first). ``on_event(kind, text)``: settable; hears about the connection
    (``reconnected``, ``unreachable``, ``hung``, ``sessions``). ``sandbox``: the host is a simulated
    one, where experiments need no consent. ``instance``: what dies with the transport (a sandbox's
    folder; "" for a real host). ``live``: commands reach a host (False when answered from a recording).
    """

    host: str
    supports_retry: bool
    reconnects: int
    sandbox: bool
    instance: str
    live: bool

    @property
    def on_event(self) -> EventSink: ...

    @on_event.setter
    def on_event(self, sink: EventSink) -> None: ...

    def run(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT) -> CommandResult: ...

    def close(self) -> None: ...

    def display(self, command: str) -> str:
        """The line a person could paste to run ``command`` by hand."""
        ...


class BaseTransport:
    """Shared behaviour: the protocol's defaults, context manager, concurrent ``run_many``, display line."""

    host: str = "?"
    max_parallel: int = 8
    supports_retry: bool = False
    reconnects: int = 0
    sandbox: bool = False
    instance: str = ""
    live: bool = True
    # the tools a recording holds calls of (a replay); None: a host, which answers every tool
    recorded_tools: frozenset[str] | None = None

    @property
    def on_event(self) -> EventSink:
        """Who hears about the connection (``ignore_event`` until someone sets it)."""
        return self.__dict__.get("_on_event", ignore_event)

    @on_event.setter
    def on_event(self, sink: EventSink) -> None:
        self.__dict__["_on_event"] = sink

    def run(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT) -> CommandResult:
        raise NotImplementedError

    def run_many(self, commands: Iterable[str], *, timeout: float = DEFAULT_TIMEOUT_S) -> list[CommandResult]:
        """Run independent commands concurrently; results come back in the given order."""
        cmds = list(commands)
        if len(cmds) <= 1:
            return [self.run(c, timeout=timeout) for c in cmds]
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(cmds))) as pool:
            return list(pool.map(lambda c: self.run(c, timeout=timeout), cmds))

    def display(self, command: str) -> str:
        return command

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def split_lines(text: str) -> list[str]:
    """Lines of host output, split on ``\\n`` only (``str.splitlines`` also splits on U+2028, U+2029,
    U+0085 and the \\x1c-\\x1e separators, which may sit inside a value); a final ``\\r`` is dropped."""
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return [p[:-1] if p.endswith("\r") else p for p in parts]


def split_sections(text: str, tool: str, required: Iterable[str] = (), lines: list[str] | None = None) -> dict[str, list[str]]:
    """A probe's output in ``== NAME`` sections: each name to its lines (the lines before the first header are
    dropped; a header seen again starts its section anew). Lines are ``split_lines``' (a U+2028 inside a value stays
    in its line) unless ``lines`` gives them; a section of ``required`` missing is a ``ParseError`` naming it."""
    sections: dict[str, list[str]] = {}
    cur = None
    for ln in split_lines(text) if lines is None else lines:
        if ln.startswith("== "):
            cur = ln[3:].strip()
            sections[cur] = []
        elif cur is not None:
            sections[cur].append(ln)
    missing = [r for r in required if r not in sections]
    if missing:
        raise ParseError(f"output lacks section(s) {', '.join(missing)}", tool=tool, excerpt=text[:80])
    return sections


def decode(data: bytes) -> str:
    """Bytes to text; bytes that are not UTF-8 become U+FFFD, never an exception."""
    return data.decode("utf-8", errors="replace")


def run_subprocess(
    argv: list[str],
    *,
    host: str,
    command: str,
    timeout: float,
    max_output: int,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> CommandResult:
    """Run ``argv`` in its own process group; on timeout kill the whole group."""
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    sinks = (Capped(max_output), Capped(max_output))

    def pump(stream, sink: Capped, idx: int) -> None:
        while True:
            chunk = stream.read(65536)
            if not chunk:
                break
            sink.feed(chunk)

    threads = [
        threading.Thread(target=pump, args=(proc.stdout, sinks[0], 0), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, sinks[1], 1), daemon=True),
    ]
    for t in threads:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    for t in threads:
        t.join(timeout=5)
    code = TIMEOUT_EXIT if timed_out else proc.returncode
    (out, cut_out), (err, cut_err) = sinks[0].output(), sinks[1].output()
    stderr = decode(err)
    if timed_out:
        stderr += f"\n[debugagent: command cut at its timeout of {timeout:g} s]"
    return CommandResult(
        command=command,
        host=host,
        stdout=decode(out),
        stderr=stderr,
        exit_code=code,
        duration_ms=round((time.monotonic() - start) * 1000, 3),
        truncated=cut_out or cut_err,
        timed_out=timed_out,
    )


class LocalTransport(BaseTransport):
    """Runs commands on this machine with ``bash -c`` (``--host local``)."""

    def __init__(self) -> None:
        self.host = "local"

    def run(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT) -> CommandResult:
        return run_subprocess(["bash", "-c", command], host=self.host, command=command, timeout=timeout, max_output=max_output)

    def display(self, command: str) -> str:
        return command


Answer: TypeAlias = "CommandResult | tuple[str, str, int] | str"
Handler = Callable[[str], Answer]


class FakeTransport(BaseTransport):
    """A transport driven by a plain function (or a mapping), for tests and playbook authors.

    The handler gets the command and returns a ``CommandResult``, a ``(stdout, stderr,
    exit_code)`` tuple or a string (stdout, exit 0); a mapping maps each command to such an
    answer. A command with no answer (the handler raises ``KeyError``, the mapping lacks it)
    raises ``UnknownCommand`` naming it: the fake never runs anything, and never makes up a reply.
    """

    def __init__(self, handler: Handler | Mapping[str, Answer], host: str = "fake") -> None:
        self.handler: Handler = handler.__getitem__ if isinstance(handler, Mapping) else handler
        self.host = host
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def run(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT) -> CommandResult:
        with self._lock:
            self.calls.append(command)
        try:
            answer = self.handler(command)
        except KeyError:
            raise UnknownCommand(command, host=self.host) from None
        if isinstance(answer, CommandResult):
            return answer
        if isinstance(answer, str):
            return CommandResult(command=command, host=self.host, stdout=answer)
        stdout, stderr, code = answer
        return CommandResult(command=command, host=self.host, stdout=stdout, stderr=stderr, exit_code=code)


def q(arg: object) -> str:
    """Quote one argument for the shell. Every argument goes through here."""
    return shlex.quote(str(arg))


def ssh_line(target: str, command: str) -> str:
    """``ssh user@host "command"`` as a person would paste it (single-quoted when it must be)."""
    if not any(c in command for c in '"$`\\!'):
        return f'ssh {target} "{command}"'
    return f"ssh {target} {shlex.quote(command)}"
