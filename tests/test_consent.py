"""Consent to change a host, as a person at a terminal and a script each meet it: the prompt is visible (the live
view pauses), says what changes, how it is undone and how long it takes, and the answer is obeyed; `--yes` is
`--allow-mutations`; a real host with no terminal and no flag is refused up front."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from debugagent.tools.sim.serve import start

from debugagent_testing import event_lines

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Run it? [y/N]"


def cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "debugagent.agent.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_yes_is_allow_mutations():
    from debugagent.agent.cli import command
    top = command()
    ctx = top.make_context("debugagent", ["run"], resilient_parsing=True)
    run = top.get_command(ctx, "run")
    base = ["--host", "h", "--symptom", "verify 30ms"]
    for flag in ("--yes", "-y", "--allow-mutations"):
        assert run.make_context("run", [*base, flag], parent=ctx).params["allow_mutations"] is True
    assert run.make_context("run", base, parent=ctx).params["allow_mutations"] is False


def test_a_real_host_without_a_terminal_or_a_flag_is_refused_up_front(tmp_path):
    """No TTY, no --allow-mutations/--yes, no --read-only: exit 2 naming the choices, before anything connects (the
    port is closed: a connection attempt would be exit 4)."""
    r = cli("run", "--host", "root@127.0.0.1:1", "--symptom", "verify 30ms", "--baseline", "verify 20ms",
            "--out", str(tmp_path / "run"))
    assert r.returncode == 2, r.stderr
    for words in ("--allow-mutations", "--yes", "--read-only", "no terminal"):
        assert words in r.stderr, words
    assert not (tmp_path / "run").exists()
    both = cli("run", "--host", "root@127.0.0.1:1", "--symptom", "verify 30ms", "--yes", "--read-only")
    assert both.returncode == 2 and "both given" in both.stderr
    # with --read-only it goes on to connect (and fails to: nothing listens there)
    ro = cli("run", "--host", "root@127.0.0.1:1", "--symptom", "verify 30ms", "--baseline", "verify 20ms",
             "--read-only", "--connect-timeout", "3", "--out", str(tmp_path / "ro"))
    assert ro.returncode == 4, ro.stderr


def test_read_only_runs_no_experiment_even_on_a_simulated_host(tmp_path):
    r = cli("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--baseline", "decode 89 tok/s",
            "--read-only", "--json", "--out", str(tmp_path / "run"))
    assert r.returncode == 3, r.stderr[-2000:]
    events = event_lines(tmp_path / "run" / "events.jsonl")
    assert not [e for e in events if e["event"] == "experiment"]
    assert any("not run" in n for n in json.loads(r.stdout)["notes"])


def pane(tmux: list[str], history: bool = False) -> str:
    return subprocess.run([*tmux, "capture-pane", "-p", "-t", "v", *(("-S", "-500") if history else ())],
                          capture_output=True, text=True).stdout


@pytest.mark.skipif(not shutil.which("tmux"), reason="needs Debian's tmux (run-tests installs it)")
@pytest.mark.parametrize("answer", ["y", "n"])
def test_the_prompt_is_visible_in_a_terminal_and_obeyed(answer, tmp_path):
    """A simulated host behind a real sshd (so not a sandbox: consent is asked), run in tmux without a flag: the
    prompt stays on the screen with what changes, how it is undone and how long it takes; `y` runs the experiment
    (the power cap found: exit 0), `n` notes it as not run (exit 3)."""
    sock = f"debugagent-consent-{os.getpid()}-{tmp_path.name}"
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    exe = Path(sys.executable).with_name("debugagent")
    folder = tmp_path / "run"
    with start("power-capped") as s:
        cmd = (f"cd {shlex.quote(str(ROOT))} && {shlex.quote(str(exe))} run --host {shlex.quote(s.target)} "
               f"--identity-file {shlex.quote(str(s.identity))} --known-hosts {shlex.quote(str(s.known_hosts))} "
               f"--symptom 'decode 74 tok/s' --baseline 'decode 89 tok/s' --out {shlex.quote(str(folder))}; "
               "echo __EXIT__$?; sleep 120")
        subprocess.run([*tmux, "new-session", "-d", "-s", "v", "-x", "120", "-y", "50", cmd], check=True,
                       env={**os.environ, "TERM": "xterm-256color"})
        try:
            answered, at_prompt, later, t0 = 0, "", "", time.monotonic()
            while time.monotonic() - t0 < 180:
                time.sleep(0.5)
                screen = pane(tmux)
                if "__EXIT__" in screen:
                    break
                asked = pane(tmux, history=True).count(PROMPT)
                if asked > answered:
                    if not at_prompt:
                        at_prompt = screen
                        time.sleep(1.5)   # the live view refreshes 4 times a second: it must not draw over it
                        later = pane(tmux)
                    subprocess.run([*tmux, "send-keys", "-t", "v", answer, "Enter"], check=True)
                    answered = asked
            final = pane(tmux, history=True)
        finally:
            subprocess.run([*tmux, "kill-server"], capture_output=True)
            Path(f"{os.environ.get('TMUX_TMPDIR', '/tmp')}/tmux-{os.getuid()}/{sock}").unlink(missing_ok=True)
    assert at_prompt, final[-3000:]
    question = at_prompt[at_prompt.index("Experiment: "):]
    assert "(to test gpu_clocks)" in question and PROMPT in question
    assert "changes: sets a GPU's power limit" in question and "undone:" in question and "takes:" in question
    assert PROMPT in later and "changes:" in later   # still on the screen, not redrawn over
    assert "Experiment: " in final and ("yes: running it" if answer == "y" else "no: not run") in final
    events = event_lines(folder / "events.jsonl")
    ran = [e for e in events if e["event"] == "experiment" and e.get("hypothesis") == "gpu_clocks"]
    if answer == "y":
        assert "__EXIT__0" in final and ran
    else:
        assert "__EXIT__3" in final and not ran
        assert any(e["event"] == "reasoning" and e.get("kind") == "not_run" for e in events) or "not run" in final
