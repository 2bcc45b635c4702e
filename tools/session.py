"""The shell-session protocol: many commands through one long-lived ``bash`` on one SSH channel.

Standard library only: ``tools/sim/remote.py`` (behind ``debugagent sim serve``'s sshd)
speaks it too.

A session channel runs :data:`SESSION_COMMAND`. Each command is sent as one line, a *frame*::

    ( trap '[ -z "${!:-}" ] || printf "\\037<nonce>:bg\\n" >&2' EXIT; eval $'<command>' ) </dev/null; \
    printf '\\037<nonce>:%d\\n' $?; printf '\\037<nonce>\\n' >&2

The command runs in a subshell (nothing it sets, ``cd`` included, reaches the next one) with
stdin from ``/dev/null``; then the session prints an end mark on stdout (with the exit
status) and one on stderr. The nonce is random per command, so output can never fake an
end. ANSI-C quoting (``$'…'``) turns every control character into an escape, so a frame
is always exactly one line and always parses, whatever the command holds.

A command that leaves a job in the background may write into the session after its end
marks, into the next command's output. The subshell's exit trap says so (``$!`` is set
once it started one) with a third mark on stderr; the client then retires that session.
Best effort: a command that replaces the trap or ``exec``s goes unflagged.

Why: an ``exec`` request costs sshd a fork, a session set-up and a shell start (~2 ms of
~3 ms for ``true`` on loopback); a frame costs a subshell (~0.5 ms).
"""

from __future__ import annotations

import os
import re

SESSION_COMMAND = "exec bash --noprofile --norc"

_QUOTE = {i: f"\\x{i:02x}" for i in range(0x20)} | {0x7F: "\\x7f", ord("\\"): "\\\\", ord("'"): "\\'"}


def ansi_c_quote(text: str) -> str:
    """``$'…'`` quoting: one line whatever ``text`` holds (NUL cannot reach bash at all)."""
    return "$'" + text.translate(_QUOTE) + "'"


_UNQUOTE = re.compile(r"\\(x[0-9a-f]{2}|\\|')")


def ansi_c_unquote(body: str) -> str:
    """The inverse of :func:`ansi_c_quote` (the text between ``$'`` and ``'``)."""
    return _UNQUOTE.sub(lambda m: chr(int(m.group(1)[1:], 16)) if m.group(1)[0] == "x" else m.group(1), body)


def new_nonce() -> str:
    return os.urandom(8).hex()


def frame(command: str, nonce: str) -> bytes:
    return (f"( trap '[ -z \"${{!:-}}\" ] || printf \"\\037{nonce}:bg\\n\" >&2' EXIT; eval {ansi_c_quote(command)} ) "
            f"</dev/null; printf '\\037{nonce}:%d\\n' $?; printf '\\037{nonce}\\n' >&2\n").encode("utf-8", "surrogateescape")


_FRAME = re.compile(r"\( trap '\[ -z \"\$\{!:-\}\" \] \|\| printf \"\\037([0-9a-f]+):bg\\n\" >&2' EXIT; "
                    r"eval \$'((?:[^'\\]|\\.)*)' \) </dev/null; printf '\\037\1:%d\\n' \$\?; "
                    r"printf '\\037\1\\n' >&2\n\Z")


def parse_frame(line: str) -> tuple[str, str] | None:
    """(command, nonce) of a frame line, or None when the line is not one."""
    m = _FRAME.match(line)
    return (ansi_c_unquote(m.group(2)), m.group(1)) if m else None


class Capped:
    """One stream of a command's output, keeping its start *and* its end: at most ``cap`` bytes
    come out (the first half and the last half, with a line saying how much was left out between
    them), since a benchmark's metric line is usually its last. ``extra`` more bytes are kept at
    the end for what :meth:`output` leaves off (an end mark)."""

    CUT = b"\n[debugagent: %d bytes of output left out here]\n"

    def __init__(self, cap: int, extra: int = 0) -> None:
        self.cap = cap
        self.limit = cap + extra
        self.chunks: list[bytes] = []   # the start of the stream, up to ``limit`` bytes
        self.kept = 0
        self.end = bytearray()          # its last ``limit`` bytes (more, between trims)
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - self.kept
        if room > 0:
            part = data if len(data) <= room else data[:room]
            self.chunks.append(part)
            self.kept += len(part)
        # ``end`` is always a contiguous suffix of the stream, at least ``limit`` bytes long once
        # the stream is (the bytes fed before the cap was passed included)
        if len(data) >= self.limit:
            self.end = bytearray(data[-self.limit:])
        else:
            self.end += data
            if len(self.end) > 2 * self.limit:
                del self.end[: len(self.end) - self.limit]

    def output(self, size: int | None = None) -> tuple[bytes, bool]:
        """The stream's first ``size`` bytes (all by default): whole up to ``cap``; else their first
        and last halves around a line that says how much is missing. And whether it was cut."""
        size = self.total if size is None else size
        head = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks = [head] if head else []
        if size <= self.cap:
            return head[:size], False
        first = self.cap // 2
        last = self.cap - first
        if self.total <= self.limit:   # everything is in ``head``
            tail = head[size - last:size]
        else:
            stream_end = self.total - len(self.end)   # the stream offset of ``end``'s first byte
            tail = bytes(self.end[size - last - stream_end: size - stream_end])
        return head[:first] + self.CUT % (size - first - last) + tail, True


class EndMark(Capped):
    """One stream of a framed command, until its end mark (which :meth:`output` leaves out)."""

    TAIL = 64

    def __init__(self, nonce: str, cap: int, with_status: bool) -> None:
        super().__init__(cap, self.TAIL)
        self.mark = b"\x1f" + nonce.encode() + (b":" if with_status else b"\n")
        self.bg_mark = b"\x1f" + nonce.encode() + b":bg\n"
        self.with_status = with_status
        self.background = False   # the command left a job running (stderr's third mark, see the module doc)
        self.tail = b""
        self.done = False
        self.status: int | None = None
        self._mark_len = 0

    def feed(self, data: bytes) -> None:
        super().feed(data)
        self.tail = data[-self.TAIL:] if len(data) >= self.TAIL else (self.tail + data)[-self.TAIL:]
        if not self.tail.endswith(b"\n"):
            return
        i = self.tail.rfind(self.mark)
        if i < 0:
            return
        rest = self.tail[i + len(self.mark):]
        if self.with_status:
            if not rest[:-1].isdigit() or not rest.endswith(b"\n"):
                return
            self.status = int(rest[:-1])
        elif rest:
            return
        self.done = True
        self._mark_len = len(self.tail) - i

    def output(self, size: int | None = None) -> tuple[bytes, bool]:
        out, cut = super().output(self.total - self._mark_len if size is None else size)
        if not self.with_status and self.bg_mark in out:
            self.background = True
            out = out.replace(self.bg_mark, b"", 1)
        return out, cut
