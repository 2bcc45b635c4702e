"""Bad input never ends in a traceback: exit 2 naming the flag, file or field, with a fix."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from debugagent.agent.playbook import evaluate, parse_playbook
from debugagent.tools.errors import DebugAgentError, PlaybookError
from debugagent.tools.host import ServerDetails, parse_server_details
from debugagent.tools.mutate import RestartServer, parse_restart
from debugagent.tools.registry import Runner
from debugagent.tools.transport import LocalTransport

ROOT = Path(__file__).resolve().parents[1]
KEPT = ROOT / "transcripts" / "power-capped" / "events.jsonl"


def cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "debugagent.agent.cli", *args], capture_output=True, text=True, timeout=timeout)


def refused(r: subprocess.CompletedProcess, *names: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    for n in names:
        assert n in r.stderr, (n, r.stderr)
    assert "fix:" in r.stderr or "Usage:" in r.stderr


RUN = ("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--baseline", "decode 89 tok/s")


@pytest.mark.parametrize("extra,names", [
    (("--bench-regex", "("), ("--bench-regex", "regular expression")),
    (("--bench-regex", "verify=[0-9.]+"), ("--bench-regex", "no group")),
    (("--server-pattern", "["), ("--server-pattern",)),
])
def test_bad_regex_flags_exit_2(extra, names, tmp_path):
    """A regex flag that does not compile (or has no group for the value) is refused before any host is touched."""
    refused(cli(*RUN, *extra, "--out", str(tmp_path / "r")), *names)


@pytest.mark.parametrize("value", ["decode 0 tok/s", "decode 0.0 tok/s"])
def test_zero_baseline_exit_2(value, tmp_path):
    """A baseline of zero (every share is relative to it) is refused, naming --baseline."""
    refused(cli("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--baseline", value,
                "--out", str(tmp_path / "r")), "--baseline", "positive")


def test_snapshot_into_a_missing_folder_exit_2(tmp_path):
    """`snapshot -o` into a folder that does not exist: exit 2 naming -o, before the host is read."""
    refused(cli("snapshot", "--host", "sim:power-capped", "-o", str(tmp_path / "no" / "such" / "s.json")), "-o", "does not exist")
    refused(cli("snapshot", "--host", "sim:power-capped", "-o", str(tmp_path)), "-o", "is a folder")


PLAYBOOK = """version: 1
name: t
hypotheses:
  - id: a
    title: A
    rules:
      - when: "{when}"
        verdict: suspect
        because: "x"
        experiment: {{kind: power_limit, gpu: {gpu}, watts: {watts}}}
"""


@pytest.mark.parametrize("gpu,watts,field", [("0", '"abc"', "watts"), ('"first"', "500", "gpu")])
def test_playbook_validate_checks_experiment_fields_by_type(gpu, watts, field, tmp_path):
    """`playbook validate` refuses `watts: "abc"` (or a GPU that is no index), naming the field."""
    p = tmp_path / "p.yaml"
    p.write_text(PLAYBOOK.format(when="true", gpu=gpu, watts=watts))
    refused(cli("playbook", "validate", str(p)), "p.yaml", "experiment", f"`{field}:")


def test_playbook_validate_accepts_templates_and_numbers(tmp_path):
    """A template or a plain number is a valid power limit."""
    p = tmp_path / "p.yaml"
    p.write_text(PLAYBOOK.format(when="true", gpu="0", watts='"{{ gpus[0].power_limit_max }}"'))
    assert cli("playbook", "validate", str(p)).returncode == 0
    p.write_text(PLAYBOOK.format(when="true", gpu="0", watts="650.5"))
    assert cli("playbook", "validate", str(p)).returncode == 0


@pytest.mark.parametrize("when", ["range(10**9)|list|length > 0", "('x' * 10**9)|length > 0", "2 ** (10 ** 9) > 0",
                                  "(range(99999)|list|join)|length > 0 and 1 / 0"])
def test_playbook_expressions_have_limits(when):
    """Expressions that would build huge values or fail on the facts end in a PlaybookError naming the rule, fast."""
    pb = parse_playbook(PLAYBOOK.format(when=when, gpu="0", watts="500"), "t.yaml")
    t0 = time.monotonic()
    with pytest.raises(PlaybookError) as e:
        evaluate(pb.hypotheses[0], {}, "t.yaml")
    assert "a.rules[0]" in str(e.value) and time.monotonic() - t0 < 10


def _corrupt(events: list[dict]) -> dict[str, str]:
    def dumps(es):
        return "\n".join(json.dumps(e) for e in es) + "\n"

    def header(**kw):
        h = dict(events[0])
        for k, v in kw.items():
            if v is None:
                h.pop(k, None)
            else:
                h[k] = v
        return dumps([h] + events[1:])

    def results(fn):
        out = []
        for e in events:
            e = dict(e)
            if e["event"] == "tool_result":
                fn(e)
            out.append(e)
        return dumps(out)
    text = dumps(events)
    return {
        "empty": "", "truncated": text[: len(text) // 2], "binary": "\x00\xff\xfe junk", "array": "[1, 2]\n",
        "no header": dumps(events[1:]), "unknown event": dumps(events[:2] + [{"event": "bogus"}] + events[2:]),
        "header without symptom": header(symptom=None), "header symptom int": header(symptom=5),
        "header bad symptom": header(symptom="slow"), "header bad playbook": header(playbook="nope"),
        "header bad snapshot": header(baseline_snapshot_data={"x": 1}), "header inputs text": header(inputs="x"),
        "header without run_id": header(run_id=None),
        "exit code text": results(lambda e: e.__setitem__("exit_code", "x")),
        "stdout null": results(lambda e: e.__setitem__("stdout", None)),
        "stdout int": results(lambda e: e.__setitem__("stdout", 5)),
        "command int": results(lambda e: e.__setitem__("command", 5)),
        "duration text": results(lambda e: e.__setitem__("duration_ms", "slow")),
        "result without stderr": results(lambda e: e.pop("stderr")),
        "nested garbage": dumps(events[:1] + [{"event": "tool_result", "command": {"a": [1]}}] + events[1:]),
        "half a line": text + '{"event": "tool_res',
    }


def test_damaged_recordings_exit_2_naming_the_line(tmp_path):
    """21 ways to damage a recording: each `replay` exits 2 with file:line and a fix, never a traceback."""
    events = [json.loads(x) for x in KEPT.read_text().split("\n") if x]
    cases = _corrupt(events)
    assert len(cases) == 21
    from debugagent.agent.replay import replay_run
    for n, (name, text) in enumerate(cases.items()):
        d = tmp_path / name.replace(" ", "-")
        d.mkdir()
        (d / "events.jsonl").write_text(text)
        if n < 2:   # the whole command line, twice; in this process for the rest (the same code, 3 s less each)
            r = cli("replay", str(d))
            assert r.returncode == 2 and "Traceback" not in r.stderr, (name, r.stderr[-1500:])
            continue
        with pytest.raises(DebugAgentError) as e:   # anything else is a traceback
            replay_run(str(d), out=str(tmp_path / "out" / d.name))
        assert e.value.exit_code == 2, (name, e.value)
        assert "events.jsonl" in str(e.value) or "--symptom" in str(e.value) or "playbook" in str(e.value), name


@pytest.mark.parametrize("content", ["", "{", "[]", '{"snapshot_version": "x", "host": 5}', "\x00\x01"])
def test_damaged_baseline_snapshot_exit_2(content, tmp_path):
    """A damaged --baseline-snapshot file: exit 2 naming it."""
    p = tmp_path / "snap.json"
    p.write_text(content)
    refused(cli("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--baseline-snapshot", str(p),
                "--out", str(tmp_path / "r")), "snap.json")


def _interrupted_run(tmp_path: Path) -> Path:
    """A real run folder (a run interrupted by SIGINT after its first benchmark)."""
    import signal
    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "debugagent.agent.cli", *RUN, "--out", str(run), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and '"tool": "bench"' not in ((run / "events.jsonl").read_text()
                                                                     if (run / "events.jsonl").exists() else ""):
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=60)
    assert p.returncode == 130
    return run


def test_damaged_run_folder_files_exit_2(tmp_path):
    """Damaged checkpoints, run.json or journal: `resume` and `undo` exit 2 naming the file."""
    run = _interrupted_run(tmp_path)
    ck = run / "checkpoints.sqlite"
    good = ck.read_bytes()
    ck.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    refused(cli("resume", str(run)), "checkpoints.sqlite", "debugagent undo")
    ck.write_bytes(good)
    with sqlite3.connect(ck) as c:
        c.execute("UPDATE checkpoints SET checkpoint = X'C1C1C1'")
    refused(cli("resume", str(run)), "checkpoints.sqlite")
    journal = run / "journal.json"
    journal.write_text("{ not json")
    refused(cli("undo", str(run)), "journal.json")
    (run / "run.json").write_text('{"host": 5, "nonsense": true}')
    refused(cli("resume", str(run)), "run.json")
    refused(cli("undo", str(run)), "run.json")


def test_empty_and_multiline_arguments_survive_a_restart(tmp_path):
    """A server started with an empty argument, a newline inside an argument and inside an environment value:
    server_details reads them exactly (NUL-separated), and a restart with that command line starts the same argv
    and environment."""
    t = LocalTransport()
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "--chat-template", "", "--x", "a\nb", "back\\slash"]
    env = {"PATH": "/usr/bin:/bin", "MULTI": "one\nFAKE=two", "EMPTY": ""}
    proc = subprocess.Popen(argv, env=env, cwd=str(tmp_path), start_new_session=True)
    new_pid = None
    try:
        time.sleep(0.3)
        r = Runner(t)
        o = r.call("server_details", ServerDetails(pid=proc.pid))
        assert o.ok, o.error
        info = o.output
        assert info.argv == argv
        assert info.env == env and "FAKE" not in info.env
        assert info.flags["chat-template"] == ""
        env_file = tmp_path / "saved.env"
        res = t.run(RestartServer(pid=proc.pid, argv=info.argv, cwd=info.cwd, env_file=str(env_file), save_env=True,
                                  log=str(tmp_path / "log")).command(), timeout=60)
        assert res.ok, res.stdout + res.stderr
        new_pid = parse_restart(res.stdout).pid
        again = parse_server_details(new_pid, t.run(ServerDetails(pid=new_pid).command()).stdout)
        assert again.argv == argv and again.env == env
    finally:
        for pid in (proc.pid, new_pid):
            if pid:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
        proc.wait()


def test_a_baseline_snapshot_of_another_metric_is_refused(tmp_path):
    """A snapshot whose benchmark measured another metric (ttft in s) is no baseline for --symptom decode: its
    runs would be compared with decode's, and pooled into its noise. Exit 2 naming both metrics, before connecting."""
    from debugagent.tools.sim import SimTransport
    from debugagent.tools.snapshot import collect, dump
    with SimTransport("sim:power-capped@good") as t:
        snap = collect(Runner(t), bench_runs=2)
    assert snap.bench.get("samples") and snap.bench["metric"] == "decode"
    data = json.loads(dump(snap))
    data["bench"]["metric"] = "ttft"
    p = tmp_path / "ttft-snap.json"
    p.write_text(json.dumps(data))
    refused(cli("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--baseline-snapshot", str(p),
                "--out", str(tmp_path / "r")), "ttft-snap.json", "`ttft`", "`decode`")
    assert not (tmp_path / "r").exists()
