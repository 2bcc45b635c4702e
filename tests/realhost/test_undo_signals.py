"""A signal while the run is undoing its own experiment, on a real host: ``debugagent run --host local`` is sent
SIGTERM, SIGINT or SIGHUP while an undo step is under way (the journal says it started, not that it is done),
with a server that binds its port with SO_REUSEPORT (a second one would start beside it) and one that does not.
The run must end with the host as found (exit 130, "as found" said only after the check), or exit 6 with a
second ``undo`` that finishes it; a further ``undo`` has nothing left.

CI runs a representative pair; ``DEBUGAGENT_UNDO_MATRIX=full`` (``bench/undo``) runs every signal at every undo
step, with and without SO_REUSEPORT, and ``bench/undo`` prints the total.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import Host, tmp_leftovers
from .test_experiments import found_state, same_but_pid

pytestmark = pytest.mark.slow

SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT, "SIGHUP": signal.SIGHUP}
STEPS = ("restart_server", "remove_file")
FULL = [(s, st, reuse) for s in SIGNALS for st in STEPS for reuse in (True, False)]
CI = [("SIGTERM", "restart_server", True), ("SIGINT", "restart_server", False)]
CASES = FULL if os.environ.get("DEBUGAGENT_UNDO_MATRIX") == "full" else CI

# the test server, binding with SO_REUSEPORT when asked, and slow to stop (0.8 s after SIGTERM, as a server
# draining its requests): the undo's restart is under way long enough for a signal to land in it
REUSE = '''
import signal as _signal, socket as _socket
_signal.signal(_signal.SIGTERM, lambda *a: (time.sleep(0.8), os._exit(0)))
class HTTPServer(HTTPServer):
    def server_bind(self):
        if REUSE_PORT:
            self.socket.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEPORT, 1)
        super().server_bind()
'''


def write_server(h: Host, reuse: bool) -> None:
    serve = h.cwd / "infer" / "serve.py"
    text = serve.read_text()
    head, tail = text.split("\n\nclass H(", 1)
    serve.write_text(f"{head}\nREUSE_PORT = {reuse}\n{REUSE}\n\nclass H({tail}")


def journal_steps(out: Path) -> list[dict]:
    try:
        return json.loads((out / "journal.json").read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return []


def in_flight(out: Path, tool: str) -> bool:
    """The undo's step of ``tool`` is under way: started and not done in the journal, or (a journal without
    ``started``) its call is in the events and its result is not."""
    if any(s["tool"] == tool and s.get("started") and not s["done"] for s in journal_steps(out)):
        return True
    try:
        lines = (out / "events.jsonl").read_bytes().splitlines()[-3:]
    except OSError:
        return False
    for line in reversed(lines):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        return e.get("event") == "tool_call" and e.get("tool") == tool and str(e.get("why", "")).startswith("undo:")
    return False


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "debugagent.agent.cli", *args]


def signal_during_undo(h: Host, tmp_path: Path, sig: str, step: str, reuse: bool) -> dict:
    """One case; returns what happened (for the bench): the exit codes, whether the signal landed in the step."""
    h.cwd = h.dir / "srv"
    h.write_code(h.cwd)
    write_server(h, reuse)
    h.start()
    base = h.baseline()
    h.env = {"CUDA_LAUNCH_BLOCKING": "1"}
    h.restart()
    bad = h.baseline(3)
    before = found_state(h)
    out = tmp_path / "run"
    argv = cli("run", "--host", "local", "--server-pattern", h.pattern, "--bench", h.bench_cmd(), "--allow-mutations",
               "--json", "--out", str(out), "--ready-timeout", "60", "--reproduce-runs", "3", "--max-runs", "3",
               "--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {base:.2f} ms")
    started = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=h.dir,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 240
    while not in_flight(out, step):
        if p.poll() is not None:
            raise AssertionError(f"the run ended (exit {p.returncode}) before the undo's {step}: {p.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for the undo's {step}"
        time.sleep(0.005)
    landed = in_flight(out, step)
    p.send_signal(SIGNALS[sig])
    _, err = p.communicate(timeout=300)
    case = {"signal": sig, "step": step, "reuse": reuse, "exit": p.returncode, "landed_in_step": landed}
    assert p.returncode in (130, 6), err[-3000:]
    if p.returncode == 130:
        assert f"interrupted ({sig}); the host is as it was found (checked after the undo)" in err, err[-2000:]
    else:   # the host was not as found: the second undo finishes it
        r = subprocess.run(cli("undo", str(out)), capture_output=True, text=True, timeout=300)
        case["second_undo"] = r.returncode
        assert r.returncode == 0, r.stderr
    again = subprocess.run(cli("undo", str(out)), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "nothing to undo" in again.stderr, again.stderr
    h.wait_ready()
    after = found_state(h)    # exactly one server (server_pid asserts it), its argv, environment and folder as found
    assert same_but_pid(before, after), (before, after)
    steps = journal_steps(out)
    assert steps and all(s["done"] and s["started"] for s in steps), steps
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert tmp_leftovers(run_id) == []
    case["wall_s"] = round(time.monotonic() - started, 1)
    print(f"\n[undo-signal] {json.dumps(case)}")
    return case


@pytest.mark.parametrize(("sig", "step", "reuse"), CASES,
                         ids=[f"{s}-{st}-{'reuseport' if r else 'plain'}" for s, st, r in CASES])
def test_a_signal_during_the_undo_ends_with_the_host_as_found(realhost, tmp_path, sig, step, reuse):
    """SIGTERM/SIGINT/SIGHUP while the run's own undo step is under way: the step finishes, the undo goes on,
    the host is checked, and it is as found (one server, its command line, environment and folder); a later
    `undo` has nothing left."""
    signal_during_undo(realhost("undosig"), tmp_path, sig, step, reuse)
