"""The command line's conventions, as a person or a script meets them: `--version`, `-o/--out`, one JSON error
object under `--json`, the symptom's hints, and the last line naming report.html."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from debugagent.agent.config import RunConfig
from debugagent.agent.stats import more_runs_advice
from debugagent.agent.symptom import parse_symptom
from debugagent.tools.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "debugagent.agent.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def parsed(*argv: str) -> dict:
    """The values click gives a subcommand for ``argv`` (raises on an unknown option)."""
    from debugagent.agent.cli import command
    top = command()
    ctx = top.make_context("debugagent", [argv[0]], resilient_parsing=True)
    return top.get_command(ctx, argv[0]).make_context(argv[0], list(argv[1:]), parent=ctx).params


def test_version_is_the_package_metadata():
    r = cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"debugagent {version('debugagent')}"


def test_out_and_o_on_run_and_snapshot(tmp_path):
    """`-o` and `--out` both name where `run` and `snapshot` write; `snapshot --output` still works."""
    run = ("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s")
    assert parsed(*run, "-o", "D")["out"] == parsed(*run, "--out", "D")["out"] == "D"
    snap = ("snapshot", "--host", "sim:power-capped")
    assert parsed(*snap, "-o", "F")["output"] == parsed(*snap, "--out", "F")["output"] \
        == parsed(*snap, "--output", "F")["output"] == "F"


@pytest.mark.parametrize("args,code,kind,words", [
    (("run", "--host", "sim:power-capped", "--symptom", "fast", "--json"), 2, "usage", "METRIC VALUE UNIT"),
    (("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--jsno", "--json"), 2, "usage", "--jsno"),
    (("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--reproduce-runs", "1", "--json"), 2,
     "usage", "--reproduce-runs"),
    (("diff", "missing-a.json", "missing-b.json", "--json"), 2, "usage", "missing-a.json"),
    (("run", "--host", "root@127.0.0.1:1", "--symptom", "decode 74 tok/s", "--baseline", "decode 89 tok/s", "--json",
      "--connect-timeout", "3", "--read-only"), 4, "host", "127.0.0.1"),
])
def test_an_input_error_under_json_is_one_json_object_on_stdout(args, code, kind, words, tmp_path):
    """Under --json a script reads the error from stdout: one object, the same exit code, the human lines on stderr."""
    r = cli(*args, *(("--out", str(tmp_path / "run")) if args[0] == "run" else ()))
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr[-1500:])
    body = json.loads(r.stdout)
    assert set(body) == {"error"}
    assert body["error"]["kind"] == kind and body["error"]["exit"] == code
    assert words in body["error"]["message"], body
    assert "error" in r.stderr.lower() and "Traceback" not in r.stderr


def test_without_json_errors_stay_off_stdout():
    r = cli("run", "--host", "sim:power-capped", "--symptom", "fast")
    assert r.returncode == 2 and r.stdout == "" and "METRIC VALUE UNIT" in r.stderr


@pytest.mark.parametrize("text,hint", [
    ("1200 tok/s", "1200 tok/s"),
    ("3.1 it/s", "3.1 it/s"),
    ("TFLOPS 410", "410 TFLOPS"),
    ("410 TFLOPS", "410 TFLOPS"),
])
def test_a_symptom_without_its_metric_name_gets_a_hint(text, hint):
    with pytest.raises(UsageError) as e:
        parse_symptom(text)
    assert "no metric name" in e.value.message
    assert "did you mean" in (e.value.fix or "") and re.search(rf"`\w+ {re.escape(hint)}`", e.value.fix or ""), e.value.fix
    assert hint in (e.value.fix or "")


def test_text_that_is_no_symptom_keeps_the_examples():
    with pytest.raises(UsageError) as e:
        parse_symptom("it got slow")
    assert "did you mean" not in (e.value.fix or "") and "verify 30ms" in (e.value.fix or "")


def test_the_reproduce_runs_advice_is_accepted_and_documented():
    """The reproduce step may advise `run with --reproduce-runs 59`: the flag takes it (no upper limit), and the
    docs say so rather than suggesting 12 is the most."""
    flag, n = more_runs_advice(59).split()[-2:]
    assert flag == "--reproduce-runs"
    assert RunConfig.from_flags({"host": "sim:x", "symptom": "verify 30ms", "reproduce_runs": int(n)}).reproduce_runs == 59
    for doc in (ROOT / "README.md", ROOT / "docs" / "cli.md"):
        row = next(ln for ln in doc.read_text().splitlines() if "`--reproduce-runs N`" in ln)
        assert "no upper limit" in row, doc.name


def test_the_last_line_names_report_html(tmp_path):
    folder = tmp_path / "run"
    r = cli("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--baseline", "decode 89 tok/s",
            "-o", str(folder))
    assert r.returncode == 0, r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert f"{folder}/report.html" in last
    assert (folder / "report.html").is_file()


def test_diff_exits_as_diff_1(tmp_path):
    """`debugagent diff` exits 0 when the snapshots are the same, 1 when they differ, 2 on bad input; --json too."""
    from debugagent.tools.snapshot import Snapshot, dump
    a, b, bad = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "bad.json"
    a.write_text(dump(Snapshot(host="h", cpu={"governor": "performance"})))
    b.write_text(dump(Snapshot(host="h", cpu={"governor": "powersave"})))
    bad.write_text("{not json")
    for extra in ((), ("--json",)):
        same = cli("diff", str(a), str(a), *extra)
        assert same.returncode == 0, same.stderr
        differ = cli("diff", str(a), str(b), *extra)
        assert differ.returncode == 1, differ.stderr
        assert "cpu.governor" in differ.stdout and "Traceback" not in differ.stderr
        assert cli("diff", str(a), str(bad), *extra).returncode == 2
    assert json.loads(cli("diff", str(a), str(a), "--json").stdout) == {}
