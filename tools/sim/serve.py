"""``debugagent sim serve``: a simulated host behind a real OpenSSH server on 127.0.0.1.

Everything lives in a temporary folder: host key, client key, ``authorized_keys``,
``known_hosts`` and ``sshd_config``; nothing under ``/etc`` is touched and no system
service is started. Every login runs ``remote.py`` (``ForceCommand``), so a command sent
over SSH lands in the scenario's host.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import UsageError
from ..transport import q
from .sandbox import SimHost
from .scenario import load_scenario

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    sim: SimHost
    proc: subprocess.Popen[bytes]
    port: int
    user: str
    folder: Path
    identity: Path
    known_hosts: Path
    host_key_line: str

    @property
    def target(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.proc)
        self.sim.close()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *a: object) -> None:
        self.stop()


@dataclass
class Sshd:
    proc: subprocess.Popen[bytes]
    port: int
    folder: Path
    identity: Path
    known_hosts: Path
    host_key_line: str

    def stop(self) -> None:
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


def start_sshd(d: Path, port: int = 0, *, force_command: str | None = None, max_sessions: int = 64,
               skip_bashrc: bool = True, extra_config: tuple[str, ...] = ()) -> Sshd:
    """A private sshd on 127.0.0.1 with its own keys in ``d``; returns when it listens."""
    if not Path(SSHD).is_file():
        raise UsageError(f"{SSHD} not found: `sim serve` needs Debian's OpenSSH server",
                         fix="apt-get install openssh-server (nothing is configured or started system-wide)")
    keygen = shutil.which("ssh-keygen")
    if not keygen:
        raise UsageError("ssh-keygen not found", fix="apt-get install openssh-client")
    d.mkdir(parents=True, exist_ok=True)
    for name in ("host_ed25519", "client_ed25519"):
        if not (d / name).exists():
            subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", "debugagent-sim", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "client_ed25519.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    port = port or free_port()
    lines = [f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {d / 'host_ed25519'}", f"PidFile {d / 'sshd.pid'}",
             f"AuthorizedKeysFile {d / 'authorized_keys'}", "PubkeyAuthentication yes", "PasswordAuthentication no",
             "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no",
             f"MaxSessions {max_sessions}", "MaxStartups 64:30:128", "PrintMotd no", "LogLevel INFO"]
    if skip_bashrc:
        lines.append("SetEnv SHLVL=1")
    if force_command:
        lines.append(f"ForceCommand {force_command}")
    lines += extra_config
    (d / "sshd_config").write_text("\n".join(lines) + "\n")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    check = subprocess.run([SSHD, "-t", "-f", str(d / "sshd_config")], capture_output=True, text=True)
    if check.returncode != 0:
        raise UsageError(f"sshd rejected its configuration: {check.stderr.strip()}")
    log = open(d / "sshd.log", "w")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if f"Server listening on 127.0.0.1 port {port}" in (d / "sshd.log").read_text():
            break
        if proc.poll() is not None:
            raise UsageError(f"sshd exited at start: {(d / 'sshd.log').read_text().strip()[-300:]}")
        time.sleep(0.02)
    pub = (d / "host_ed25519.pub").read_text().split()
    line = f"[127.0.0.1]:{port} {pub[0]} {pub[1]}"
    (d / "known_hosts").write_text(line + "\n")
    return Sshd(proc=proc, port=port, folder=d, identity=d / "client_ed25519", known_hosts=d / "known_hosts",
                host_key_line=line)


def remote_command(sim: SimHost) -> str:
    """sshd's ForceCommand for ``sim``. A sealed host: a line of the login shell that replaces itself with ``nsenter …
    bash -c "$SSH_ORIGINAL_COMMAND"`` (``bash -i`` where no command is given) into the host's namespace, as
    ``SimShell.argv`` makes it (the host's pid 1 is known once it is sealed): no interpreter starts for a channel.
    A host that is not sealed: ``remote.py`` under ``python -S`` (no site-packages: the standard library only), with
    ``tools/`` on ``PYTHONPATH`` so that it finds ``session``, which rewrites each command onto the sandbox folder."""
    if sim.sealed and sim.init_pid:
        enter = " ".join(q(a) for a in sim.shell.argv("", sealed=True, init_pid=sim.init_pid, args=[]))
        return (f'if [ -n "${{SSH_ORIGINAL_COMMAND+x}}" ]; then exec {enter} -c "$SSH_ORIGINAL_COMMAND"; '
                f"else exec {enter} -i; fi")
    here = Path(__file__).resolve().parent
    return (f"PYTHONPATH={q(here.parent)} {q(sys.executable)} -S {q(here / 'remote.py')} {q(sim.base)} "
            f"{q(sim.state['hostname'])}")


def start(spec: str, port: int = 0, *, folder: Path | None = None, max_sessions: int = 64) -> Served:
    """Lay out the simulated host and start a private sshd for it; returns when it listens."""
    if not Path(SSHD).is_file():
        start_sshd(Path(tempfile.mkdtemp()))  # raises the UsageError that says how to install it
    ref = spec[4:] if spec.startswith("sim:") else spec
    which: Literal["good", "bad"] = "bad"
    if ref.endswith("@good"):
        ref, which = ref[:-5], "good"
    sim = SimHost(load_scenario(ref), which)
    try:
        sshd = start_sshd(folder or (sim.base / "sshd"), port, force_command=remote_command(sim), max_sessions=max_sessions)
    except BaseException:
        sim.close()
        raise
    return Served(sim=sim, proc=sshd.proc, port=sshd.port, user=getpass.getuser(), folder=sshd.folder,
                  identity=sshd.identity, known_hosts=sshd.known_hosts, host_key_line=sshd.host_key_line)


def serve(spec: str, port: int = 0) -> int:
    served = start(spec, port)
    sc = served.sim.scenario
    print(f"serving {sc.name} ({served.sim.which} state) over SSH on 127.0.0.1:{served.port}; Ctrl-C stops it", flush=True)
    print(f"\n  debugagent run --host {served.target} --identity-file {served.identity} --accept-new-host-key "
          f"--known-hosts {served.folder}/client_known_hosts --allow-mutations --symptom '{sc.symptom}' "
          f"--baseline '{sc.baseline}'", flush=True)
    print(f"\n  ssh -i {served.identity} -p {served.port} -o UserKnownHostsFile={served.known_hosts} {served.user}@127.0.0.1",
          flush=True)
    stop = {"now": False}

    def handler(signum: int, frame: object) -> None:
        stop["now"] = True
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    try:
        while not stop["now"] and served.proc.poll() is None:
            time.sleep(0.2)
    finally:
        served.stop()
    return 0
