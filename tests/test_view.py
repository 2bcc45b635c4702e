"""The live view: what a person watching a terminal sees while a run goes on."""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from debugagent.agent.view import View
from rich.console import Console

from debugagent_testing import TranscriptBuilder

ROOT = Path(__file__).resolve().parents[1]


def frame(view: View) -> str:
    con = Console(file=io.StringIO(), width=140, force_terminal=False, color_system=None)
    con.print(view.render())
    return con.file.getvalue()


def recorded(tmp_path: Path) -> list[dict]:
    b = TranscriptBuilder("verify 30ms", "verify 20ms")
    b.events[0]["inputs"] = {"reproduce_runs": 3, "max_runs": 4}
    for i, v in enumerate([30.1, 29.9, 30.4], 1):
        b.events.append({"event": "tool_call", "call_id": 100 + i, "tool": "bench", "why": f"reproduce, run {i} of 3",
                         "display": "ssh h \"gpu-bench\"", "hypothesis": None})
        b.events.append({"event": "tool_result", "call_id": 100 + i, "tool": "bench", "exit_code": 0, "duration_ms": 250.0,
                         "output": {"value": v, "unit": "ms"}, "hypothesis": None})
    b.events.append({"event": "verdict", "hypothesis": "code_change", "status": "ruled_out", "how": "evidence", "because": "x"})
    b.events.append({"event": "verdict", "hypothesis": "env_var", "status": "suspect", "how": None, "because": "y"})
    return b.events


def test_resumed_view_shows_finished_hypotheses(tmp_path):
    """Fed the recorded events of an interrupted run, the view shows their verdicts and measurements, not "pending"."""
    view = View(["code_change", "env_var", "host_cpu"], quiet=True)
    view.load(recorded(tmp_path))
    text = frame(view)
    assert re.search(r"code_change\s+ruled out", text) and re.search(r"env_var\s+suspect", text)
    assert re.search(r"host_cpu\s+pending", text)
    assert "reproduce: 30.13 ± 0.25 ms over 3 runs" in text


def test_experiment_share_recovered_so_far():
    """During an experiment each run updates the share of the regression recovered so far."""
    view = View(["env_var"], quiet=True)
    view.load(recorded(Path(".")))
    view.feed("experiment", {"hypothesis": "env_var", "phase": "start", "text": "restart without X"})
    view.feed("tool_call", {"tool": "bench", "why": "the benchmark without X", "display": "ssh h gpu-bench", "hypothesis": "env_var"})
    view.feed("tool_result", {"tool": "bench", "exit_code": 0, "duration_ms": 250.0, "output": {"value": 20.0}})
    text = frame(view)
    assert "env_var: 20.00 ms over 1 run; recovered 100% so far" in text
    assert "about " in text and "s left" in text     # 0.25 s a run × the runs still planned


def test_plain_lines_when_not_a_terminal():
    """Not on a terminal, the view prints one plain line per phase, measurement and verdict."""
    out = io.StringIO()
    view = View(["code_change"], quiet=False, console=Console(file=out, force_terminal=False, width=200))
    assert view.live is None
    for ev in recorded(Path(".")):
        view.feed(ev["event"], ev)
    text = out.getvalue()
    assert "[phase] reproduce: run 1 of 3" in text and "[measure] reproduce: 30.10 ms over 1 run" in text
    assert "[verdict] code_change: ruled out (by evidence)" in text


@pytest.mark.skipif(not shutil.which("tmux"), reason="needs Debian's tmux (run-tests installs it)")
def test_live_view_in_tmux(tmp_path):
    """Captured every second in a real terminal: phase, elapsed time and a measured number early; the root cause at the end, no stale lines."""
    sock = f"debugagent-test-{os.getpid()}-{tmp_path.name}"
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    exe = Path(sys.executable).with_name("debugagent")
    cmd = (f"cd {shlex.quote(str(ROOT))} && {shlex.quote(str(exe))} run --host sim:eagle3-flashinfer-rebuilt "
           f"--symptom 'verify 30ms' --baseline 'verify 20ms' --out {shlex.quote(str(tmp_path / 'run'))}; "
           "echo __EXIT__$?; sleep 120")
    env = {**os.environ, "TERM": "xterm-256color"}
    subprocess.run([*tmux, "new-session", "-d", "-s", "v", "-x", "150", "-y", "60", cmd], check=True, env=env)
    caps: list[tuple[float, str]] = []
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 240:
            time.sleep(1)
            pane = subprocess.run([*tmux, "capture-pane", "-p", "-t", "v"], capture_output=True, text=True).stdout
            caps.append((time.monotonic() - t0, pane))
            if "__EXIT__" in pane:
                break
        joined = subprocess.run([*tmux, "capture-pane", "-p", "-J", "-S", "-200", "-t", "v"], capture_output=True,
                                text=True).stdout   # wrapped lines joined: the lines as printed
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        Path(f"{os.environ.get('TMUX_TMPDIR', '/tmp')}/tmux-{os.getuid()}/{sock}").unlink(missing_ok=True)
    # no wheelhouse on that host: nothing confirms the cause, so exit 3 with compiled_dependency the top suspect
    assert caps and "__EXIT__3" in caps[-1][1], caps[-1][1] if caps else "no capture"
    first = next((t, p) for t, p in caps if p.strip())
    assert first[0] < 25, "nothing on screen for the first seconds"
    seen_phase = next(t for t, p in caps if re.search(r"debugagent (connecting|discover|probe|reproduce)", p))
    seen_elapsed = next(t for t, p in caps if re.search(r"· \d+ s elapsed", p))
    seen_number = next(t for t, p in caps if re.search(r": \d+\.\d+( ± \d+\.\d+)? ms over \d+ run", p))
    assert max(seen_phase, seen_elapsed) <= seen_number < caps[-1][0]   # a measurement shows while the run goes on
    last = caps[-1][1]
    final = last[last.index("debugagent done"):last.index("__EXIT__")]
    assert "Top suspect: compiled_dependency" in final and "Root cause:" not in final
    # the answer once, whole: the headline of the run's own conclusion, at most ~160 characters, not a copy cut at
    # the terminal's width above it
    from debugagent.agent.answer import HEADLINE_MAX, headline
    from debugagent.agent.transcript import read_events
    concl = next(e for e in read_events(tmp_path / "run" / "events.jsonl") if e.event == "conclusion")
    said = headline(concl.model_dump(mode="json", by_alias=True))
    assert len(said) <= HEADLINE_MAX and said in joined.splitlines(), joined[-3000:]
    assert joined.count("Top suspect: compiled_dependency") == 1, joined[-3000:]
    table = final[:final.index("No confirmed root cause")]
    assert re.search(r"compiled_dependency\s+suspect", table)   # the table's rows are final: no stale "pending"
    assert not re.search(r"\bpending\b", table) and "$ ssh" not in final


def lines_at(view: View, width: int) -> list[str]:
    con = Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)
    view.console = con
    con.print(view.render())
    return con.file.getvalue().splitlines()


def in_experiment() -> View:
    view = View(["code_change", "env_var", "compiled_dependency"], quiet=True)
    view.load(recorded(Path(".")))
    view.feed("experiment", {"hypothesis": "compiled_dependency", "phase": "start",
                             "text": "restart the server with another build of flashinfer-python 0.5.3 in an overlay"})
    return view


@pytest.mark.parametrize("width", [80, 120])
def test_the_header_keeps_the_estimate_at_80_and_120_columns(width):
    """A long phase at 80 and 120 columns: the header is one line that still says how long is left (the phase and
    the estimate's detail are cut first)."""
    view = in_experiment()
    head = lines_at(view, width)[0]
    assert len(head) <= width and re.search(r"about \d+ s left", head), head
    assert head.startswith("debugagent experiment on compiled_dependency"), head


def test_the_step_shows_what_it_does_before_its_first_run_and_the_command_as_typed():
    """Before an experiment's first benchmark run, its line says what runs (a pip download), not "waiting for the
    first run"; the command line is the command on the host, not the ssh line nor a wrapper script."""
    view = in_experiment()
    dl = ("/root/ml-env/bin/python3 -m pip download --no-deps --only-binary=:all: flashinfer-python==0.5.3 "
          "-d /tmp/debugagent-dl")
    view.feed("tool_call", {"tool": "pip_download", "hypothesis": "compiled_dependency", "command": dl,
                            "display": f"ssh root@gpu-node-3 {shlex.quote(dl)}",
                            "why": "download another build of flashinfer-python 0.5.3 with pip"})
    text = "\n".join(lines_at(view, 140))
    assert "compiled_dependency: download another build of flashinfer-python 0.5.3 with pip" in text, text
    assert "waiting for the first run" not in text and "$ /root/ml-env/bin/python3 -m pip download" in text, text
    view.feed("tool_result", {"tool": "pip_download", "exit_code": 0, "duration_ms": 8600.0})
    wrapper = "bash -c 'trap : HUP INT TERM; export LC_ALL=C; exec python3 -m sglang.launch_server --tp 8'"
    view.feed("tool_call", {"tool": "restart_server", "hypothesis": "compiled_dependency", "command": wrapper,
                            "display": f"ssh root@gpu-node-3 {shlex.quote(wrapper)}", "why": "restart with the overlay",
                            "input": {"argv": ["/root/ml-env/bin/python3", "-m", "sglang.launch_server", "--tp", "8"]}})
    text = "\n".join(lines_at(view, 140))
    assert "$ restart: /root/ml-env/bin/python3 -m sglang.launch_server --tp 8" in text, text
    assert "ssh root@" not in text and "trap" not in text, text
    view.feed("tool_result", {"tool": "restart_server", "exit_code": 0})
    view.feed("tool_call", {"tool": "bench", "hypothesis": "compiled_dependency", "why": "measure",
                            "display": "ssh root@gpu-node-3 \"cd /root && gpu-bench --n 8\"",
                            "input": {"cmd": "gpu-bench --n 8", "cwd": "/root"}})
    text = "\n".join(lines_at(view, 140))
    assert "compiled_dependency: waiting for the first run" in text and "$ gpu-bench --n 8" in text, text


def test_once_interrupted_the_header_promises_no_time():
    """A signal during a run: the header says it at once, and never "about N s left" again, the undo's phases
    included."""
    view = in_experiment()
    assert "s left" in lines_at(view, 150)[0]
    view.stopping(2, False)
    assert lines_at(view, 150)[0].startswith("debugagent interrupted (SIGINT): undoing"), lines_at(view, 150)[0]
    view.feed("experiment", {"hypothesis": "compiled_dependency", "phase": "undo", "text": "restart as found"})
    head = lines_at(view, 150)[0]
    assert "interrupted (SIGINT): experiment on compiled_dependency: undoing" in head and "left" not in head, head
    view.feed("interrupted", {"text": "interrupted (SIGINT); every change was undone"})
    assert "left" not in lines_at(view, 150)[0]
