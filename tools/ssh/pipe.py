"""The channel side of a command: paramiko's buffers kept as chunks and waking a reader per line
(``ChunkPipe``), one event for both streams (``watch``), and a long-lived shell session on its
own channel (``Shell``, framed by tools/session.py)."""

from __future__ import annotations

import threading
import time

import paramiko
from paramiko.buffered_pipe import BufferedPipe, PipeTimeout


class ShellEnded(EOFError):
    """A shell session ended while a command ran in it (the connection itself may be fine)."""


class ShellUnusable(Exception):
    """A shell session was gone before a command was sent to it: sending it elsewhere is safe."""


class ChunkPipe(BufferedPipe):
    """paramiko's channel buffer keeping the bytes it is fed as they came (no array copies):
    a read of everything buffered costs at most one join. Same interface and locking as the
    base class, whose lock, condition, event and closed flag it uses.

    Its event (what a reader sleeps on) is set only when a chunk ends a line (every end mark
    does, tools/session.py) or ``wake_bytes`` are waiting, and at EOF: a reader wakes a few
    times per MB instead of once per 32 KiB packet, which on a busy host is CPU the remote
    command gets back. ``wake_bytes`` stays well under the window so the stream never stalls.
    """

    # the base class's state, set by its __init__ (paramiko's stubs leave private fields out)
    _lock: threading.Lock
    _cv: threading.Condition
    _event: threading.Event | None
    _closed: bool

    def __init__(self, wake_bytes: int = 0) -> None:
        super().__init__()
        self._chunks: list[bytes] = []
        self._size = 0
        self.wake_bytes = wake_bytes

    def set_event(self, event: threading.Event) -> None:
        with self._lock:
            self._event = event
            if self._closed or self._size:
                event.set()
            else:
                event.clear()

    def feed(self, data: bytes) -> None:
        with self._lock:
            self._chunks.append(bytes(data))
            self._size += len(data)
            if self._event is not None and (self._size >= self.wake_bytes or data.endswith(b"\n")):
                self._event.set()
            self._cv.notify_all()

    def read_ready(self) -> bool:
        with self._lock:
            return self._size > 0

    def _take(self, nbytes: int) -> bytes:
        if self._size <= nbytes:
            chunks, self._chunks, self._size = self._chunks, [], 0
            if self._event is not None and not self._closed:
                self._event.clear()
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        out: list[bytes] = []
        got = 0
        while got < nbytes:
            c = self._chunks[0]
            if got + len(c) <= nbytes:
                out.append(self._chunks.pop(0))
                got += len(c)
            else:
                out.append(c[: nbytes - got])
                self._chunks[0] = c[nbytes - got:]
                got = nbytes
        self._size -= got
        return b"".join(out)

    def read(self, nbytes: int, timeout: float | None = None) -> bytes:
        with self._lock:
            if not self._size:
                if self._closed:
                    return b""
                if timeout == 0.0:
                    raise PipeTimeout()
                end = None if timeout is None else time.monotonic() + timeout
                while not self._size and not self._closed:
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        raise PipeTimeout()
                    self._cv.wait(left)
                if not self._size:
                    return b""
            return self._take(nbytes)

    def empty(self) -> bytes:
        with self._lock:
            return self._take(self._size)

    def __len__(self) -> int:
        with self._lock:
            return self._size


def watch(chan: paramiko.Channel) -> threading.Event:
    """One Event set by either stream's buffer (see ChunkPipe) and at EOF: cheaper than fileno()'s pipes."""
    ev = threading.Event()
    chan.in_buffer.set_event(ev)
    chan.in_stderr_buffer.set_event(ev)
    return ev


class Shell:
    """One long-lived ``bash`` on its own channel (tools/session.py); one command at a time."""

    def __init__(self, chan: paramiko.Channel, transport: paramiko.Transport) -> None:
        self.chan = chan
        self.transport = transport
        self.pid: int | None = None
        self.retire = False
        self.ready = watch(chan)

    def usable(self, transport: paramiko.Transport | None) -> bool:
        c = self.chan
        return (transport is self.transport and not (c.closed or c.eof_received or c.exit_status_ready())
                and not c.recv_ready() and not c.recv_stderr_ready())

    def close(self) -> None:
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001 - closing a dead channel
            pass
