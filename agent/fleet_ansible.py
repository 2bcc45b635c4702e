"""``fleet snapshot --via ansible``: the same per-host snapshot, its commands run by Ansible itself.

Past one machine's reach (thousands of hosts, a bastion, Ansible's own connection settings), the commands
of each host's snapshot are sent by ``ansible -m raw``: no module, no Python needed on the host, only its
shell (and ``base64``), over Ansible's own SSH connection, forks and inventory. A snapshot's commands depend
on what the earlier ones found (the server's Python and checkout, the benchmark), so it goes in rounds:

1. ``collect`` (the very code ``debugagent snapshot`` runs) is played for each host, locally, against the
   outputs read so far (``Asked``): a command not read yet answers "not run yet", and is noted;
2. the commands noted are written as one shell script per host (each command in ``bash -c``, under
   ``timeout``, its exit code, time and base64'd output framed on one line), and one
   ``ansible all -i INVENTORY --limit HOSTS -m raw -a 'echo {{ …script of inventory_hostname, base64'd… }} | base64 -d
   | bash' --tree DIR`` runs
   them on every host at once (``-f FORKS`` at a time);
3. each host's output (``DIR/HOST``, Ansible's tree callback) is added to what is read; again from 1.

A host whose pass asks nothing new is done: its snapshot is built from its commands' real outputs and
written as ``fleet snapshot`` writes it (``DIR/NAME.json``, ``fleet.json``), so ``fleet diff`` reads it.
A pass taken on "not run yet" answers may ask for a command the final pass does not need (read-only, like
every probe). A host Ansible cannot reach (or whose host key it refuses) is named with Ansible's message.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from debugagent.tools.errors import UsageError
from debugagent.tools.inventory import InventoryHost
from debugagent.tools.redact import redact_text
from debugagent.tools.transport import DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT_S, BaseTransport, CommandResult

from .fleet import FLEET_FILE, FleetRecord, HostResult, file_names

MAX_ROUNDS = 10
MARK = "@@debugagent"
NOT_RUN = "not run yet (fleet snapshot --via ansible: asked in the next round)"


class Asked(BaseTransport):
    """A host's commands as read so far: ``run`` answers a command from its outputs (the Nth time it is asked,
    its Nth output), else notes it in ``wanted`` and answers exit 127."""

    max_parallel = 1   # a pass asks in a fixed order

    def __init__(self, host: str, known: dict[str, list[CommandResult]]) -> None:
        self.host = host
        self.known = known
        self.counts: dict[str, int] = {}
        self.wanted: list[tuple[str, int, float]] = []
        self._lock = threading.Lock()

    def run(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT) -> CommandResult:
        with self._lock:
            k = self.counts.get(command, 0)
            self.counts[command] = k + 1
            got = self.known.get(command, [])
            if k < len(got):
                return got[k]
            self.wanted.append((command, k, timeout))
        return CommandResult(command=command, host=self.host, stderr=NOT_RUN, exit_code=127)

    def close(self) -> None:
        pass


def round_script(wanted: list[tuple[str, int, float]]) -> str:
    """One host's commands of a round, run one after another; each prints one line:
    ``MARK INDEX EXIT MS STDOUT_B64 STDERR_B64``."""
    lines = ['__t=$(command -v timeout || true); __d=$(mktemp -d) || exit 1']
    for i, (cmd, _, timeout) in enumerate(wanted):
        run = f"bash -c {shlex.quote(cmd)}"
        lines.append(f'__s=$(date +%s%N); ${{__t:+$__t -k 5 {int(timeout) + 1}}} {run} >"$__d/o" 2>"$__d/e" </dev/null; '
                     f'__c=$?; __f=$(date +%s%N); printf "\\n{MARK} {i} %s %s " "$__c" "$(( (__f - __s) / 1000000 ))"; '
                     f'base64 -w0 <"$__d/o"; printf " "; base64 -w0 <"$__d/e"; printf "\\n"')
    lines.append('rm -rf "$__d"; true')
    return "\n".join(lines) + "\n"


def parse_output(host: str, stdout: str, wanted: list[tuple[str, int, float]]) -> dict[int, CommandResult]:
    """The framed lines of a round's output (a terminal's ``\\r`` dropped), by the command's index."""
    out: dict[int, CommandResult] = {}
    for line in stdout.replace("\r", "").split("\n"):
        parts = line.split(" ")
        if len(parts) < 4 or parts[0] != MARK:
            continue
        try:
            i, code, ms = int(parts[1]), int(parts[2]), float(parts[3])
            so = base64.b64decode(parts[4] if len(parts) > 4 else "").decode("utf-8", "replace")
            se = base64.b64decode(parts[5] if len(parts) > 5 else "").decode("utf-8", "replace")
        except (ValueError, IndexError):
            continue
        if 0 <= i < len(wanted):
            cmd = wanted[i][0]
            out[i] = CommandResult(command=cmd, host=host, stdout=so, stderr=se, exit_code=code, duration_ms=ms,
                                   timed_out=code in (124, 137) and wanted[i][2] > 0)
    return out


def ansible_binary() -> str:
    found = shutil.which("ansible")
    if not found:
        raise UsageError("--via ansible: no `ansible` command on PATH",
                         fix="install Ansible (pip install ansible-core), or leave --via out to use debugagent's own SSH")
    return found


def run_round(ansible: str, inventory: str, scripts: dict[str, str], work: Path, *, forks: int,
              ssh_args: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """One ``ansible -m raw`` over the hosts of ``scripts`` (host -> its script); each host's result as
    Ansible's tree callback wrote it."""
    texts = sorted(set(scripts.values()))
    index = {t: n for n, t in enumerate(texts)}
    work.mkdir(parents=True, exist_ok=True)
    tree = work / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    varsfile = work / "scripts.json"
    # base64: a script holds `{#`, `{{` (bash's ${#a[@]}), which Ansible would read as a template
    varsfile.write_text(json.dumps({"debugagent_scripts": [base64.b64encode(t.encode()).decode() for t in texts],
                                    "debugagent_script_of": {h: index[t] for h, t in scripts.items()}}))
    limit = work / "hosts.txt"
    limit.write_text("".join(f"{h}\n" for h in scripts))
    cmd = [ansible, "all", "-i", inventory, "--limit", f"@{limit}", "-m", "raw", "-f", str(max(1, forks)),
           "-e", f"@{varsfile}", "-e", "ansible_ssh_use_tty=false", "--tree", str(tree),
           "-a", "echo {{ debugagent_scripts[debugagent_script_of[inventory_hostname]] }} | base64 -d | bash"]
    if ssh_args:
        cmd.append("--ssh-common-args=" + " ".join(shlex.quote(a) for a in ssh_args))   # `=`: the value starts with -
    env = {**os.environ, "ANSIBLE_HOME": str(work / "home"), "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0", "ANSIBLE_DEPRECATION_WARNINGS": "0",
           # ssh's control sockets: a short private folder (a socket's path must fit in 108 bytes; the output
           # folder may be deeper), removed after
           "ANSIBLE_SSH_CONTROL_PATH_DIR": (cpdir := tempfile.mkdtemp(prefix="da-cp-", dir="/tmp"))}
    said = "timed out"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
        lines = [line.strip() for line in (p.stderr + p.stdout).splitlines() if line.strip()]
        said = next((x for x in lines if "error" in x.lower()), lines[-1] if lines else f"exit {p.returncode}")
    except subprocess.TimeoutExpired:
        pass   # the hosts with no tree file are said as such
    finally:
        shutil.rmtree(cpdir, ignore_errors=True)
    results: dict[str, dict[str, Any]] = {}
    for h in scripts:
        f = tree / h
        try:
            results[h] = json.loads(f.read_text())
        except (OSError, ValueError):
            results[h] = {"unreachable": True, "msg": f"Ansible wrote no result for this host ({said[:300]})"}
    return results


def snapshot_fleet_ansible(hosts: list[InventoryHost], out_dir: Path, *, inventory: str, forks: int,
                           limit: str | None = None, collect_args: dict[str, Any] | None = None,
                           known_hosts: str | None = None, connect_timeout: float | None = None,
                           on_done: Callable[[HostResult], None] | None = None) -> FleetRecord:
    """Every host's snapshot through Ansible, in rounds (module docstring); written as ``snapshot_fleet`` writes."""
    from debugagent.tools.redact import write_private
    from debugagent.tools.registry import Runner
    from debugagent.tools.snapshot import collect, dump

    ansible = ansible_binary()
    names = file_names(hosts)
    ssh_args = ["-o", "BatchMode=yes"]
    if known_hosts:
        ssh_args += ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    if connect_timeout:
        ssh_args += ["-o", f"ConnectTimeout={int(connect_timeout)}"]
    t0 = time.monotonic()
    known: dict[str, dict[str, list[CommandResult]]] = {h.name: {} for h in hosts}
    results: dict[str, HostResult] = {}
    by_name = {h.name: h for h in hosts}

    def finish(res: HostResult) -> None:
        res.seconds = round(time.monotonic() - t0, 2)
        results[res.name] = res
        if on_done is not None:
            on_done(res)

    with tempfile.TemporaryDirectory(prefix="debugagent-ansible-") as tmp:
        for rnd in range(MAX_ROUNDS + 1):
            scripts: dict[str, str] = {}
            wanted_of: dict[str, list[tuple[str, int, float]]] = {}
            for name in [h.name for h in hosts if h.name not in results]:
                h = by_name[name]
                t = Asked(h.target, known[name])
                snap = collect(Runner(t), **(collect_args or {}))
                if not t.wanted:
                    path = out_dir / names[name]
                    write_private(path, dump(snap) + "\n")
                    finish(HostResult(name=name, target=h.target, file=path.name,
                                      notes=[redact_text(e) for e in snap.errors],
                                      bench_failed=bool(snap.bench) and snap.bench.get("runs", 0) > 0
                                      and not snap.bench.get("samples")))
                elif rnd == MAX_ROUNDS:
                    finish(HostResult(name=name, target=h.target, exit_code=4,
                                      error=f"its snapshot still asked for commands after {MAX_ROUNDS} rounds",
                                      fix="take this host's snapshot with `debugagent snapshot --host`"))
                else:
                    wanted_of[name] = t.wanted
                    scripts[name] = round_script(t.wanted)
            if not scripts:
                break
            answers = run_round(ansible, inventory, scripts, Path(tmp) / f"round-{rnd + 1}", forks=forks,
                                ssh_args=ssh_args, timeout=max(w[2] for ws in wanted_of.values() for w in ws) * 4 + 300)
            for name, res in answers.items():
                h = by_name[name]
                if res.get("unreachable") or MARK not in str(res.get("stdout", "")):
                    msg = str(res.get("msg") or res.get("stderr") or "failed").strip().splitlines()
                    finish(HostResult(name=name, target=h.target, exit_code=4,
                                      error=redact_text("ansible: " + (msg[-1] if msg else "failed")),
                                      fix="check the host's entry in the inventory and that `ansible HOST -m ping` reaches it"))
                    continue
                got = parse_output(h.target, str(res.get("stdout") or ""), wanted_of[name])
                for i, (cmd, k, _) in enumerate(wanted_of[name]):
                    lst = known[name].setdefault(cmd, [])
                    r = got.get(i) or CommandResult(command=cmd, host=h.target, exit_code=255,
                                                    stderr="no output came back through Ansible")
                    if k == len(lst):
                        lst.append(r)
    rec = FleetRecord(inventory=inventory, limit=limit, taken_at=datetime.now(UTC).isoformat(timespec="seconds"),
                      seconds=round(time.monotonic() - t0, 2), forks=forks,
                      hosts=[results[h.name] for h in hosts])
    write_private(out_dir / FLEET_FILE, rec.model_dump_json(indent=1) + "\n")
    return rec
