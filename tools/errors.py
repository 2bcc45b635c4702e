"""The project's errors, one hierarchy, each raised in one known place.

::

    DebugAgentError                  (exit 1 unless a subclass says otherwise)
    ├── UsageError                   bad input: flags, symptom, file       -> exit 2
    │   ├── FileError                a user's YAML file, naming file and field
    │   │   ├── ScenarioError        a scenario file breaks format v1      -> exit 2
    │   │   └── PlaybookError        a playbook breaks its schema          -> exit 2
    │   └── RecordingError           a recording is tampered or truncated  -> exit 2
    ├── TransportError               the host cannot be used               -> exit 4
    │   ├── ConnectError             TCP / DNS / refused / unreachable
    │   ├── AuthError                no key was accepted
    │   └── HostKeyError             unknown or changed host key
    ├── ReplayMiss                   a replay was asked a command it never recorded -> exit 5
    ├── UnknownCommand               a fake transport was asked a command it has no answer for
    ├── RestoreError                 the host could not be fully restored  -> exit 6
    ├── RunFolderError               the run folder cannot be written (full, read-only) -> exit 2
    └── ParseError                   a command's output did not have the expected shape

Every class carries the fields a caller needs (host, command, file, field), and its
message names the thing, shows the evidence and gives a fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class DebugAgentError(Exception):
    """Base of every error debugagent raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(message if not fix else f"{message}\n  fix: {fix}")


class UsageError(DebugAgentError):
    """Raised for bad user input: a flag, a symptom, a file that cannot be used."""

    exit_code = 2


class RunFolderError(DebugAgentError):
    """The run folder cannot be written (the disk is full, the folder read-only): the run stops, the host is
    restored from the journal in memory and on the host, and nothing is written elsewhere."""

    exit_code = 2

    def __init__(self, folder: object, why: str) -> None:
        super().__init__(f"the run folder {folder} cannot be written ({why}); the run stopped",
                         fix="free space there or make it writable, or give --out a folder on another disk; "
                             "what the run changed on the host is undone first (`debugagent undo RUN` finishes it if not)")


WRITE_ERRNOS = frozenset({5, 13, 27, 28, 30, 122})   # EIO, EACCES, EFBIG, ENOSPC, EROFS, EDQUOT


def write_problem(exc: BaseException) -> str | None:
    """Why a local write failed, when ``exc`` says the disk or the folder refused it (an ``OSError`` of a full or
    read-only disk, sqlite's "disk I/O error" or "database or disk is full"); None for anything else."""
    import sqlite3
    if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
        return exc.strerror or str(exc)
    if isinstance(exc, sqlite3.OperationalError) and any(
            w in str(exc) for w in ("disk I/O", "disk is full", "readonly database", "unable to open")):
        return f"sqlite: {exc}"
    return None


class FileError(UsageError):
    """A user's YAML file that cannot be used; the message names the file (as a ``kind``) and the field."""

    kind = "file"

    def __init__(self, message: str, *, file: str = "", field: str = "", fix: str | None = None) -> None:
        self.file = file
        self.field = field
        where = f"{self.kind} `{file}`" + (f", {field}" if field else "")
        super().__init__(f"{where}: {message}", fix=fix)


class ScenarioError(FileError):
    """Raised when a scenario file is missing, malformed or breaks format v1."""

    kind = "scenario"


class PlaybookError(FileError):
    """Raised when a playbook file breaks its schema (unknown key, bad edge, bad rule)."""

    kind = "playbook"


class RecordingError(UsageError):
    """Raised when a recorded run (events.jsonl) cannot be read: tampered, truncated."""

    def __init__(self, message: str, *, file: str = "", line: int = 0, fix: str | None = None) -> None:
        self.file = file
        self.line = line
        super().__init__(f"{file}:{line}: {message}", fix=fix)


class TransportError(DebugAgentError):
    """Raised when the host cannot be reached or used at all."""

    exit_code = 4

    def __init__(self, message: str, *, host: str = "", fix: str | None = None) -> None:
        self.host = host
        super().__init__(message, fix=fix)


class ConnectError(TransportError):
    """Raised when no connection could be made (DNS, refused, unreachable, timeout)."""


class AuthError(TransportError):
    """Raised when the host refused every key offered."""


class HostKeyError(TransportError):
    """Raised when the host key is unknown (and not accepted) or has changed."""


class ReplayMiss(DebugAgentError):
    """Raised when a replay is asked for a command its recording does not hold."""

    exit_code = 5

    def __init__(self, message: str, *, step: int, asked: str, recorded_next: str | None, fix: str | None = None) -> None:
        self.step = step
        self.asked = asked
        self.recorded_next = recorded_next
        super().__init__(message, fix=fix)


class RestoreError(DebugAgentError):
    """Raised when undo steps are left pending: the host is not as it was found (``debugagent undo`` retries)."""

    exit_code = 6

    def __init__(self, message: str, *, left: list[str] | None = None, fix: str | None = None) -> None:
        self.left = left or []
        super().__init__(message, fix=fix)


class UnknownCommand(DebugAgentError):
    """Raised by ``FakeTransport`` for a command its handler has no answer for: it never runs anything."""

    def __init__(self, command: str, *, host: str) -> None:
        self.host = host
        self.command = command
        super().__init__(f"fake host {host}: no answer for the command {command!r}",
                         fix="declare the answer this test needs in the handler (or the mapping) given to FakeTransport")


class ParseError(DebugAgentError):
    """Raised by a parser when a command's output does not have the expected shape."""

    def __init__(self, message: str, *, tool: str = "", excerpt: str = "") -> None:
        self.tool = tool
        self.excerpt = excerpt
        super().__init__(f"{tool}: {message}" + (f" (near: {excerpt[:80]!r})" if excerpt else ""))


def parser(tool: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a pure parser so that any shape error surfaces as ``ParseError``, never a traceback."""
    import functools

    def deco(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except ParseError:
                raise
            except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
                raise ParseError(f"unexpected output: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                                 tool=tool) from exc
        return wrapped
    return deco
