"""Fail fast with the fix: a benchmark that does not print the metric, SSH without a key, help texts."""

from __future__ import annotations

import getpass
import subprocess
import sys
from pathlib import Path

import pytest
from debugagent.agent.cli import command
from debugagent.agent.preflight import metric_problem, reported
from debugagent.agent.run import RunOptions, investigate
from debugagent.agent.symptom import parse_symptom
from debugagent.tools.errors import UsageError
from debugagent.tools.sim.serve import SSHD, start_sshd


def test_reported_pairs():
    """The NAME=VALUE UNIT pairs a benchmark printed, last value of each."""
    text = "[bench] warmup 3 iters\nverify=28.5 ms\naccept_len: 2.0\nverify=29.1 ms\n"
    assert reported(text) == [("verify", 29.1, "ms"), ("accept_len", 2.0, None)]


def test_other_metric_names_what_it_printed():
    """`latency` asked, `verify` printed: the error names verify in ms and the flags that would work."""
    err = metric_problem("verify=28.5 ms\n", 0, "gpu-bench", parse_symptom("latency 30ms"), parse_symptom("latency 20ms"))
    assert err is not None and err.exit_code == 2
    assert "does not print `latency`; it reports `verify` in ms" in err.message
    assert err.fix == "use --symptom 'verify 30ms' --baseline 'verify 20ms'"


def test_same_metric_other_kind_of_unit():
    """A time printed where the symptom is a rate is refused too, with the symptom in the benchmark's unit."""
    err = metric_problem("decode=12.5 ms\n", 0, "b", parse_symptom("decode 82 tok/s"), None)
    assert err is not None and "reports `decode` in ms, but --symptom is in tok/s" in err.message


def test_matching_output_passes():
    """The named metric in a fitting unit (seconds for a ms symptom) is accepted."""
    assert metric_problem("verify=0.03 s\n", 0, "b", parse_symptom("verify 30ms"), None) is None


def test_run_stops_before_probing(tmp_path):
    """On a simulated host a wrong metric stops the run at discovery: exit 2, one benchmark run, nothing measured."""
    with pytest.raises(UsageError) as e:
        investigate(RunOptions(host="sim:eagle3-flashinfer-rebuilt", symptom="latency 30ms", baseline="latency 20ms",
                               as_json=True, out=str(tmp_path / "run")))
    assert e.value.exit_code == 2 and "use --symptom 'verify 30ms' --baseline 'verify 20ms'" in e.value.fix
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert events.count('"tool": "bench"') == 2 and "gpu_sample_under_load" not in events   # one call, one result


@pytest.mark.ssh
@pytest.mark.skipif(not Path(SSHD).is_file(), reason="needs Debian's openssh-server")
def test_ssh_without_a_key_names_identity_file_and_agent(tmp_path):
    """No key given, none in ssh-agent or ~/.ssh: exit 4, and the fix names -i/--identity-file and ssh-agent."""
    s = start_sshd(tmp_path / "sshd")
    try:
        r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "snapshot", "--host", f"{getpass.getuser()}@127.0.0.1:{s.port}",
                            "--known-hosts", str(s.known_hosts), "-o", str(tmp_path / "s.json")],
                           capture_output=True, text=True, timeout=60)
    finally:
        s.stop()
    assert r.returncode == 4, r.stderr
    assert "-i/--identity-file" in r.stderr and "ssh-agent" in r.stderr
    assert "check the address and port" not in r.stderr


def test_every_option_has_help_and_a_metavar():
    """Every option and argument of every command has help text; none shows a `<str>`-style type."""
    def walk(c, path):
        yield path, c
        for name, sub in getattr(c, "commands", {}).items():
            yield from walk(sub, path + [name])
    from typer._click import Context
    for path, cmd in walk(command(), []):
        ctx = Context(cmd, info_name=" ".join(path) or "debugagent")
        for p in cmd.params:
            if p.name == "help":
                continue
            assert getattr(p, "help", None), f"{' '.join(path)} {p.name}: no help text"
            rec = p.get_help_record(ctx)
            assert rec and "<" not in rec[0], f"{' '.join(path)}: {rec}"
