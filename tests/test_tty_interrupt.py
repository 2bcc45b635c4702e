"""Ctrl-C at a terminal, as a person presses it: in tmux, during the probe, during an experiment and during an
experiment's undo. Each time: exit 130, no traceback on the screen, the last line says what became of the host and
how to continue (`debugagent resume`), and the header stops promising time once interrupted. The three runs go at
once, at 80 and 120 columns, where the header must still say how long is left before the interruption."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][0-9A-Za-z]|[=>78])")
PROBES = {"python_packages", "git_state", "gpu_query", "gpu_q", "driver_files", "gpu_sample_under_load"}


def events(folder: Path) -> list[dict]:
    try:
        text = (folder / "events.jsonl").read_text()
    except OSError:
        return []
    return [json.loads(ln) for ln in text.split("\n")[:-1] if ln]   # the last line may be half written


def in_probe(evs: list[dict]) -> bool:
    return any(e["event"] == "tool_call" and e.get("tool") in PROBES and not e.get("hypothesis") for e in evs)


def in_experiment(evs: list[dict]) -> bool:
    return any(e["event"] == "tool_call" and e.get("tool") == "bench" and e.get("purpose") == "experiment" for e in evs)


def in_undo(evs: list[dict]) -> bool:
    return any(e["event"] == "experiment" and e.get("phase") == "undo" for e in evs)


@dataclass
class Term:
    """One run in its own tmux session, interrupted once ``when`` holds for its events."""

    name: str
    width: int
    when: object
    folder: Path
    log: Path
    sent_at: int | None = None   # how many events the run had written when Ctrl-C was sent
    screens: list[str] = field(default_factory=list)
    done: bool = False


@pytest.mark.skipif(not shutil.which("tmux"), reason="needs Debian's tmux (run-tests installs it)")
def test_ctrl_c_in_each_phase_on_a_terminal(tmp_path):
    sock = f"debugagent-int-{os.getpid()}-{tmp_path.name}"
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    exe = Path(sys.executable).with_name("debugagent")
    terms = [Term("probe", 80, in_probe, tmp_path / "probe", tmp_path / "probe.log"),
             Term("experiment", 120, in_experiment, tmp_path / "experiment", tmp_path / "experiment.log"),
             Term("undo", 80, in_undo, tmp_path / "undo", tmp_path / "undo.log")]

    def pane(t: Term, *extra: str) -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", t.name, *extra], capture_output=True, text=True).stdout

    try:
        for t in terms:
            cmd = (f"cd {shlex.quote(str(ROOT))} && {shlex.quote(str(exe))} run --host sim:launch-blocking "
                   f"--symptom 'verify 30ms' --baseline 'verify 20ms' --out {shlex.quote(str(t.folder))}; "
                   "echo __EXIT__$?; sleep 300")
            subprocess.run([*tmux, "new-session", "-d", "-s", t.name, "-x", str(t.width), "-y", "40", cmd], check=True,
                           env={**os.environ, "TERM": "xterm-256color"})
            # every byte the run writes, frames drawn over included (a traceback drawn over is still seen)
            subprocess.run([*tmux, "pipe-pane", "-t", t.name, f"cat >> {shlex.quote(str(t.log))}"], check=True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 300 and not all(t.done for t in terms):
            time.sleep(0.05)
            for t in terms:
                if t.done:
                    continue
                if t.sent_at is None:
                    evs = events(t.folder)
                    if t.when(evs):   # type: ignore[operator]
                        subprocess.run([*tmux, "send-keys", "-t", t.name, "C-c"], check=True)
                        t.sent_at = len(evs)
                        continue
                screen = pane(t)
                if t.sent_at is None:
                    t.screens.append(screen)
                t.done = "__EXIT__" in screen
        finals = {t.name: pane(t, "-J", "-S", "-400") for t in terms}
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        Path(f"{os.environ.get('TMUX_TMPDIR', '/tmp')}/tmux-{os.getuid()}/{sock}").unlink(missing_ok=True)

    for t in terms:
        final = finals[t.name]
        assert t.sent_at is not None, (t.name, final[-3000:])
        assert "__EXIT__130" in final, (t.name, final[-3000:])
        raw = ANSI.sub("", t.log.read_text(errors="replace"))
        assert "Traceback" not in raw and "Error:" not in raw, (t.name, raw[-3000:])
        said = "nothing on the host was changed" if t.name == "probe" else "the host is as it was found (checked after the undo)"
        line = f"interrupted (SIGINT); {said}. Continue with: debugagent resume {t.folder}"
        assert line in final, (t.name, final[-3000:])
        # before Ctrl-C the header is one line that says how long is left, at 80 columns too (the probe's Ctrl-C
        # comes before the first estimate)
        heads = [ln for s in t.screens for ln in s.splitlines() if ln.startswith("debugagent ") and " run: " not in ln]
        assert t.name == "probe" or any(re.search(r" · about \d+ s left", h) and len(h) <= t.width for h in heads), (t.name, heads[-5:])
        # once interrupted, no time is promised: every frame after the first "interrupted" header
        after = raw[raw.index("debugagent interrupted"):]
        assert not re.search(r"about \d+ s left", after), (t.name, after[-2000:])
        evs = events(t.folder)
        assert evs[-1]["event"] == "interrupted", (t.name, evs[-1])
        if t.name == "undo":   # the undo under way when Ctrl-C came went on to its end, and the host was checked
            assert not [e for e in evs if e["event"] == "error" and e.get("kind") == "undo"], t.name
            journal = json.loads((t.folder / "journal.json").read_text())
            assert journal.get("verified"), journal
