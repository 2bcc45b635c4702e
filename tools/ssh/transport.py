"""``SSHTransport``: one paramiko connection per host, commands in pooled shell sessions or on their
own channels, the connection re-made when lost (see the package's docstring for what and why)."""

from __future__ import annotations

import socket
import threading
import time
from functools import partial
from pathlib import Path

import paramiko
from paramiko import ssh_exception as px

from .. import interrupts, known_hosts
from ..errors import AuthError, ConnectError, TransportError, UsageError
from ..known_hosts import Files
from ..session import SESSION_COMMAND, Capped, EndMark, frame, new_nonce
from ..transport import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_TIMEOUT_S,
    TIMEOUT_EXIT,
    BaseTransport,
    CommandResult,
    decode,
    ssh_line,
)
from .config import resolve
from .exceptions import translate
from .hostkeys import Policy, fast_transport
from .pipe import ChunkPipe, Shell, ShellEnded, ShellUnusable, watch


def pause(seconds: float) -> None:
    """``time.sleep`` that a signal's kept exception stops (``interrupts.check`` every 50 ms)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        interrupts.check()
        time.sleep(min(0.05, left))


class SSHTransport(BaseTransport):
    """Runs commands on one host over one paramiko connection (re-made when lost)."""

    max_parallel = 8
    supports_retry = True
    window_size = 2 << 20       # paramiko default; larger windows and packets measured no faster here
    max_packet_size = 32 << 10
    renew_after = 256 << 20
    idle_check_s = 30.0
    silence_probe_s = 15.0   # a command silent this long: is the peer still there?
    probe_timeout_s = 10.0

    def __init__(self, host: str, port: int, user: str, *, identities: list[str],
                 known_hosts: Path | Files, accept_new: bool,
                 connect_timeout: float = 10.0, proxyjump: str | None = None, label: str | None = None,
                 explicit_identity: bool = False, host_key_alias: str | None = None, check_host_ip: bool = False,
                 hash_known_hosts: bool = False, known_hosts_override: str | None = None) -> None:
        self.hostname, self.port, self.user = host, port, user
        self.identities = identities
        self.explicit_identity = explicit_identity
        self.known_hosts = known_hosts if isinstance(known_hosts, Files) else Files((known_hosts,))
        self.known_hosts_override = known_hosts_override   # --known-hosts, handed on to a ProxyJump host
        self.host_key_alias, self.check_host_ip, self.hash_known_hosts = host_key_alias, check_host_ip, hash_known_hosts
        self.accept_new = accept_new
        self.connect_timeout = connect_timeout
        self.proxyjump = proxyjump
        self.host = label or f"{user}@{host}" + (f":{port}" if port != 22 else "")
        self._client: paramiko.SSHClient | None = None
        self._jump: SSHTransport | None = None
        self._lock = threading.RLock()   # _maintain holds it while its liveness probe runs a command
        self._slots = threading.BoundedSemaphore(self.max_channels)
        self._active = 0
        self._received = 0
        self._last_used = 0.0
        self._idle: list[Shell] = []
        self.sessions: bool | None = None   # shell sessions: None until tried, False where the host has no bash
        self.reconnects = 0
        self.unreachable = False   # the last reconnection's every attempt failed
        self.connect()

    max_channels = 8

    @classmethod
    def from_spec(cls, spec: str, *, identity_file: str | None = None, known_hosts: str | None = None,
                  accept_new: bool = False, connect_timeout: float = 10.0) -> SSHTransport:
        r = resolve(spec, identity_file)
        # the files ssh reads (ssh -G's UserKnownHostsFile and GlobalKnownHostsFile); --known-hosts stands for
        # the user's files, as `ssh -o UserKnownHostsFile=FILE` does
        user_files = [known_hosts] if known_hosts else r["known_hosts"]
        kh = Files(tuple(Path(p) for p in user_files), tuple(Path(p) for p in r["global_known_hosts"]))
        return cls(r["host"], r["port"], r["user"], identities=r["identities"], known_hosts=kh, accept_new=accept_new,
                   connect_timeout=connect_timeout, proxyjump=r["proxyjump"], label=spec,
                   explicit_identity=r["explicit_identity"], host_key_alias=r["host_key_alias"],
                   check_host_ip=r["check_host_ip"], hash_known_hosts=r["hash_known_hosts"],
                   known_hosts_override=known_hosts)

    # ------------------------------------------------------------ connection
    def _socket(self) -> socket.socket | paramiko.Channel:
        if self.proxyjump:
            self._jump = SSHTransport.from_spec(self.proxyjump, known_hosts=self.known_hosts_override, accept_new=self.accept_new,
                                                connect_timeout=self.connect_timeout)
            assert self._jump._client is not None
            t = self._jump._client.get_transport()
            assert t is not None   # connect() leaves a transport or raises
            return t.open_channel("direct-tcpip", (self.hostname, self.port), ("127.0.0.1", 0), timeout=self.connect_timeout)
        sock = socket.create_connection((self.hostname, self.port), timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def connect(self) -> None:
        try:
            sock = self._socket()
            client = paramiko.SSHClient()
            # known_hosts is read by tools/known_hosts.py, never by client.load_host_keys: paramiko has
            # no file name of its own, so nothing of paramiko's ever rewrites the file
            policy = Policy(self.known_hosts, self.accept_new, self.hostname, self.port, alias=self.host_key_alias,
                            check_ip=self.check_host_ip and not self.proxyjump, hash_names=self.hash_known_hosts)
            if isinstance(sock, socket.socket):
                policy.ip = sock.getpeername()[0]
            client.set_missing_host_key_policy(policy)
            entries = self.known_hosts.entries()
            name = policy.name
            types = known_hosts.known_types(entries, name)
            certs = known_hosts.has_authority(entries, name)
            pkeys: list[paramiko.PKey] = []
            for path in self.identities:
                try:
                    pkeys.append(paramiko.PKey.from_path(path))
                except Exception as exc:  # noqa: BLE001 - reported with the file named
                    raise AuthError(f"{self.host}: cannot read the key {path}: {exc}", host=self.host,
                                    fix="give an unencrypted key with --identity-file, or load it into ssh-agent") from exc
            client.connect(self.hostname, self.port, username=self.user, sock=sock, timeout=self.connect_timeout,
                           banner_timeout=self.connect_timeout, auth_timeout=self.connect_timeout,
                           pkey=pkeys[0] if pkeys else None, allow_agent=not self.explicit_identity,
                           look_for_keys=not pkeys,
                           transport_factory=partial(fast_transport, known_types=types, certs=certs))
        except UsageError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the one boundary where paramiko's errors become ours
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise translate(exc, self.host) from exc
        t = client.get_transport()
        assert t is not None
        t.set_keepalive(15)
        t.packetizer.REKEY_BYTES = pow(2, 40)
        t.packetizer.REKEY_PACKETS = pow(2, 40)
        t.packetizer.REKEY_BYTES_OVERFLOW_MAX = pow(2, 40)
        t.packetizer.REKEY_PACKETS_OVERFLOW_MAX = pow(2, 40)
        self._client = client
        self._received = 0
        self._last_used = time.monotonic()

    def _alive(self) -> bool:
        t = self._client.get_transport() if self._client else None
        return bool(t and t.is_active())

    reconnect_attempts = 4

    def _reconnect(self, why: str) -> None:
        """Re-make a lost connection: ``reconnect_attempts`` tries with backoff; once a host has stayed
        unreachable through them, each later call tries once (one ``connect_timeout``), so a run whose peer
        hung for good ends in bounded time instead of paying the whole backoff again for every command."""
        delay = 0.5
        last: TransportError | None = None
        attempts = 1 if self.unreachable else self.reconnect_attempts
        for attempt in range(1, attempts + 1):
            self._drop()
            try:
                self.connect()
                self.reconnects += 1
                self.unreachable = False
                self.on_event("reconnected", f"connection to {self.host} lost ({why}); reconnected on attempt {attempt}")
                return
            except TransportError as exc:
                last = exc
                if attempt < attempts:
                    pause(delay)
                    delay *= 2
        if not self.unreachable:
            self.on_event("unreachable", f"{self.host} stayed unreachable after {attempts} attempts: {last}")
        self.unreachable = True
        raise last or ConnectError(f"{self.host}: unreachable", host=self.host)

    def _drop(self) -> None:
        idle, self._idle = self._idle, []
        for shell in idle:
            shell.close()
        try:
            if self._client:
                self._client.close()
        except Exception:  # noqa: BLE001 - closing a dead connection
            pass
        self._client = None

    def _maintain(self) -> None:
        """Between commands: renew after many bytes, probe liveness after idling."""
        with self._lock:
            if self._active:
                return
            if self._received > self.renew_after:
                self._drop()
                self.connect()
                return
            if not self._alive():
                self._reconnect("the transport is closed")
                return
            if time.monotonic() - self._last_used > self.idle_check_s:
                try:
                    r = self._exec("true", timeout=5.0, max_output=1024, kill_on_timeout=False)
                    if r.exit_code != 0:
                        raise OSError("liveness probe failed")
                except (OSError, EOFError, paramiko.SSHException):
                    self._reconnect("no answer to a liveness probe")

    # ------------------------------------------------------------ commands
    PID_MARK = b"\x1fdebugagent-pid="

    def wrap(self, command: str) -> str:
        """For a one-off ``exec`` channel: the login shell prints its pid (the session's process
        group) on stderr, then runs the command; on a timeout ``kill -- -PID`` ends it and its children."""
        return f"printf '\\037debugagent-pid=%s\\n' $$ >&2; {command}"

    def _kill_remote(self, pid: int) -> None:
        try:
            g = f"$(ps -o pgid= -p {int(pid)} | tr -d ' ')"
            self._exec_raw(f"g={g}; [ -n \"$g\" ] && {{ kill -TERM -- -$g; sleep 1; kill -KILL -- -$g; }} 2>/dev/null; true",
                           10.0, 4096)
        except Exception:  # noqa: BLE001 - best effort on a connection that may be going away
            pass

    def run(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT,
            retry: bool = True) -> CommandResult:
        with interrupts.shielded():   # a signal stops a command only where paramiko holds no lock
            return self._run(command, timeout=timeout, max_output=max_output, retry=retry)

    def _run(self, command: str, *, timeout: float, max_output: int, retry: bool) -> CommandResult:
        self._maintain()
        attempts = 3 if retry else 1
        for attempt in range(attempts + 1):
            try:
                return self._exec(command, timeout=timeout, max_output=max_output)
            except ShellUnusable:
                # the command never reached a shell (it was gone before the frame was sent): safe to send again
                if attempt == attempts:
                    raise ConnectError(f"{self.host}: no usable shell session", host=self.host) from None
            except (OSError, EOFError, paramiko.SSHException) as exc:
                if isinstance(exc, TimeoutError) and self._alive():
                    raise
                if attempt >= attempts - 1:
                    raise translate(exc, self.host) from exc
                with self._lock:
                    if not self._alive() or (isinstance(exc, EOFError | px.ChannelException)
                                             and not isinstance(exc, ShellEnded)):
                        self._reconnect(f"{type(exc).__name__}: {exc}")
        raise ConnectError(f"{self.host}: unreachable", host=self.host)

    def _exec(self, command: str, *, timeout: float, max_output: int, kill_on_timeout: bool = True) -> CommandResult:
        start = time.monotonic()
        out, err, code, truncated, timed_out, pid = self._exec_raw(command, timeout, max_output)
        if timed_out and pid and kill_on_timeout:
            self._kill_remote(pid)
        stderr = decode(err)
        if timed_out:
            code = TIMEOUT_EXIT
            stderr += f"\n[debugagent: command cut at its timeout of {timeout:g} s]"
        return CommandResult(command=command, host=self.host, stdout=decode(out), stderr=stderr, exit_code=code,
                             duration_ms=round((time.monotonic() - start) * 1000, 3), truncated=truncated,
                             timed_out=timed_out)

    def _transport(self) -> paramiko.Transport:
        if self._client is None:
            self._reconnect("no connection")
        assert self._client is not None
        t = self._client.get_transport()
        if t is None or not t.is_active():
            raise EOFError("the SSH transport is closed")
        return t

    def _open(self, t: paramiko.Transport, command: str) -> paramiko.Channel:
        chan = t.open_session(window_size=self.window_size, max_packet_size=self.max_packet_size,
                              timeout=self.connect_timeout)
        chan.in_buffer, chan.in_stderr_buffer = ChunkPipe(self.window_size // 4), ChunkPipe(self.window_size // 4)
        # asks the login shell to skip ~/.bashrc (~100 ms with `pyenv init` there); sshd honours
        # it only where AcceptEnv allows SHLVL; no reply is awaited, so it costs nothing otherwise
        chan.set_environment_variable("SHLVL", "1")
        chan.exec_command(command)
        return chan

    def _exec_raw(self, command: str, timeout: float,
                  max_output: int) -> tuple[bytes, bytes, int, bool, bool, int | None]:
        """Runs one command: in a pooled shell session, or on its own ``exec`` channel where the
        host has no bash. Returns stdout, stderr, exit code, truncated, timed out, remote pid to kill."""
        t = self._transport()
        with self._slots:
            with self._lock:
                self._active += 1
            try:
                if self.sessions is not False:
                    shell = self._shell(t)
                    if shell is not None:
                        return self._exec_in(shell, command, timeout, max_output)
                return self._exec_channel(t, command, timeout, max_output)
            finally:
                with self._lock:
                    self._active -= 1
                    self._last_used = time.monotonic()

    # ------------------------------------------------------------ shell sessions
    def _shell(self, t: paramiko.Transport) -> Shell | None:
        """An idle shell of this connection, or a new one; None where the host cannot run one."""
        with self._lock:
            while self._idle:
                shell = self._idle.pop()
                if shell.usable(t):
                    return shell
                shell.close()
        shell = Shell(self._open(t, SESSION_COMMAND), t)
        try:
            # whatever the login shell's rc files print lands here, before the pid, and goes no further
            out, _, code, _, timed_out = self._frame(shell, 'printf \'\\n%s\' "$$"', time.monotonic() + self.connect_timeout,
                                                     1 << 20)
            pid = out.rpartition(b"\n")[2]
            shell.pid = int(pid) if code == 0 and not timed_out and pid.isdigit() else None
        except ShellEnded:
            shell.pid = None
        except BaseException:   # a signal's interrupt (interrupts.check) while it starts: its channel is not left open
            shell.close()
            raise
        if shell.pid is None:
            shell.close()
            if self.sessions is None and t.is_active():
                self.sessions = False
                self.on_event("sessions", f"{self.host}: no bash session ({SESSION_COMMAND!r} failed); "
                                          "each command gets its own channel")
            return None
        self.sessions = True
        return shell

    def _exec_in(self, shell: Shell, command: str, timeout: float,
                 max_output: int) -> tuple[bytes, bytes, int, bool, bool, int | None]:
        start = time.monotonic()
        clean = False
        try:
            out, err, code, truncated, timed_out = self._frame(shell, command, start + timeout, max_output)
            clean = not timed_out and not shell.retire
        finally:
            if clean:
                with self._lock:
                    if shell.usable(self._client.get_transport() if self._client else None):
                        self._idle.append(shell)
                    else:
                        shell.close()
            else:  # cut, interrupted, lost, or a job left behind that may still write: never reused
                shell.close()
        return out, err, code, truncated, timed_out, shell.pid

    def _frame(self, shell: Shell, command: str, deadline: float, cap: int) -> tuple[bytes, bytes, int, bool, bool]:
        """Sends one frame (see tools/session.py) and reads both streams to their end marks."""
        chan = shell.chan
        nonce = new_nonce()
        try:
            chan.sendall(frame(command, nonce))
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ShellUnusable(str(exc)) from exc
        marks = (EndMark(nonce, cap, with_status=True), EndMark(nonce, cap, with_status=False))
        timed_out = self._pump(chan, shell.ready, marks, deadline, until_marks=True)
        (out, t_out), (err, t_err) = marks[0].output(), marks[1].output()
        shell.retire = marks[1].background
        if timed_out:
            return out, err, -1, t_out or t_err, True
        assert marks[0].status is not None   # _pump returned on both end marks, the first carries the status
        return out, err, marks[0].status, t_out or t_err, False

    def _pump(self, chan: paramiko.Channel, ready_ev: threading.Event, sinks: tuple[Capped, Capped], deadline: float,
              until_marks: bool) -> bool:
        """Feeds stdout and stderr together into ``sinks`` until both end marks (``until_marks``)
        or EOF, or the deadline; True when the deadline came first."""
        heard = time.monotonic()
        while True:
            ready_ev.clear()
            ended = chan.eof_received or chan.closed   # read before draining: data comes before EOF
            for sink, ready, recv in ((sinks[0], chan.recv_ready, chan.recv),
                                      (sinks[1], chan.recv_stderr_ready, chan.recv_stderr)):
                while ready():
                    data = recv(1 << 30)
                    self._received += len(data)
                    sink.feed(data)
                    heard = time.monotonic()
            if time.monotonic() - heard > self.silence_probe_s:
                self._probe_peer(chan)
                heard = time.monotonic()
            if until_marks and all(getattr(s, "done", False) for s in sinks):
                return False
            if ended:
                if until_marks:
                    raise ShellEnded(f"the shell session on {self.host} ended before the command finished")
                return False
            if time.monotonic() > deadline:
                return True
            interrupts.check()   # a signal that came meanwhile stops the command here, between two reads
            ready_ev.wait(min(0.05, max(0.0, deadline - time.monotonic())))

    def _probe_peer(self, chan: paramiko.Channel) -> None:
        """A command silent for a while: ask the peer for a keepalive reply (OpenSSH answers even while
        the command runs); no answer within ``probe_timeout_s`` means a hung peer (a stopped sshd, a
        frozen host): the connection is closed and the command fails now, not at its own timeout."""
        t = chan.get_transport()
        answered = threading.Event()

        def ask() -> None:
            try:
                t.global_request("keepalive@openssh.com", wait=True)
            except Exception:  # noqa: BLE001 - a closed transport answers nothing; the wait below decides
                pass
            finally:
                answered.set()
        threading.Thread(target=ask, daemon=True, name="debugagent-keepalive").start()
        deadline = time.monotonic() + self.probe_timeout_s
        while not answered.wait(min(0.05, max(0.0, deadline - time.monotonic()))) and time.monotonic() < deadline:
            interrupts.check()
        if answered.is_set() and t.is_active():
            return
        silent = self.silence_probe_s + self.probe_timeout_s
        self.on_event("hung", f"{self.host} sent nothing for {self.silence_probe_s:g} s and did not answer a keepalive "
                              f"within {self.probe_timeout_s:g} s: the peer is hung; the connection is closed "
                              f"(noticed after {silent:g} s)")
        t.close()
        raise EOFError(f"{self.host}: the peer is hung (no keepalive answer)")

    # ------------------------------------------------------------ one-off exec channels
    def _exec_channel(self, t: paramiko.Transport, command: str, timeout: float,
                      max_output: int) -> tuple[bytes, bytes, int, bool, bool, int | None]:
        start = time.monotonic()
        chan = None
        try:
            chan = self._open(t, self.wrap(command))
            chan.shutdown_write()
            sinks = (Capped(max_output), Capped(max_output))
            timed_out = self._pump(chan, watch(chan), sinks, start + timeout, until_marks=False)
            (out, t_out), (err, t_err) = sinks[0].output(), sinks[1].output()
            truncated = t_out or t_err
            code = -1
            if not timed_out:
                if not chan.status_event.wait(max(1.0, start + timeout - time.monotonic())):
                    timed_out = True
                else:
                    code = chan.recv_exit_status()
        finally:
            if chan is not None:
                chan.close()
        pid = None
        if err.startswith(self.PID_MARK):
            line, _, err = err.partition(b"\n")
            pid = int(line[len(self.PID_MARK):] or 0) or None
        return out, err, code, truncated, timed_out, pid

    def display(self, command: str) -> str:
        target = f"{self.user}@{self.hostname}"
        if self.port != 22:
            return ssh_line(f"-p {self.port} {target}", command)
        return ssh_line(target, command)

    def close(self) -> None:
        with interrupts.shielded():
            self._drop()
            if self._jump:
                self._jump.close()
