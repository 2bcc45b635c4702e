"""Reads of /proc/PID/… in the shell a command sends: a process that is gone by the time it is read says nothing on
stderr (bash applies `<` before a `2>/dev/null` written after it, so the silencing comes first)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from debugagent.agent.lab.asfound import server_command
from debugagent.tools import mutate
from debugagent.tools.replay import legacy_command

ROOT = Path(__file__).resolve().parents[1]
LATE = re.compile(r"< (?:/proc/|\$[pd]/)[^\s;|)\"]+ 2>/dev/null")


def gone_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_no_read_of_proc_is_silenced_after_its_redirect():
    """No command the tools send reads /proc with its `2>/dev/null` after the `<` (the replay's record of the
    old form, which maps today's commands to it, is the one place it is written)."""
    late = [f"{p.relative_to(ROOT)}: {m}" for d in ("agent", "tools") for p in (ROOT / d).rglob("*.py")
            if p.name != "replay.py" for m in LATE.findall(p.read_text())]
    assert late == []


def test_the_restart_scripts_functions_say_nothing_of_a_gone_process():
    """keyof, same, ticks, kids, alive, reap and nic on a pid that is gone: each answers "not there", stderr empty."""
    pid = gone_pid()
    script = (mutate.SAME + mutate.TREE + mutate.NICE + f"keyof {pid} || echo no-key; same {pid} x || echo not-same; "
              f"ticks {pid} || echo no-ticks; alive {pid}:1; nic {pid} || echo no-nice; reap {pid}:1; echo kids=$(kids {pid})")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.stderr == "" and r.returncode == 0, r.stderr
    assert r.stdout.split() == ["no-key", "not-same", "no-ticks", "no-nice", "kids="]


def test_the_as_found_read_says_nothing_of_processes_it_does_not_match():
    """The as-found read walks every process in /proc; with processes starting and ending beside it, nothing
    reaches stderr."""
    churn = subprocess.Popen(["bash", "-c", "for i in $(seq 1 400); do /bin/true; done"])
    try:
        r = subprocess.run(["bash", "-c", server_command("no-process-is-named-this-[x]")], capture_output=True,
                           text=True, timeout=60)
    finally:
        churn.wait()
    assert r.stderr == "" and "== end" in r.stdout, r.stderr


def test_recordings_made_with_the_redirect_first_still_key_alike():
    """A kept recording holds `read -r s < /proc/$1/stat 2>/dev/null`; today's command keys to it."""
    new = mutate.NICE
    assert "2>/dev/null < /proc/$1/stat" in new
    assert legacy_command(new) == new.replace("2>/dev/null < /proc/$1/stat", "< /proc/$1/stat 2>/dev/null")
    assert legacy_command("cksum 2>/dev/null < /tmp/x; y") == "cksum 2>/dev/null < /tmp/x; y"   # not a read of /proc
