"""`debugagent bundle RUN`: every part from the run folder alone, on every kept recording; redacted like every artifact."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from debugagent.agent.bundle import PARTS, build, write_bundle
from debugagent.tools.errors import UsageError

from debugagent_testing import event_lines

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = sorted(p.parent for p in (ROOT / "transcripts").glob("*/events.jsonl"))
NAMES = ["README.md", *(name for name, _ in PARTS)]


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "debugagent.agent.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


@pytest.mark.parametrize("run", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_every_kept_recording_bundles_every_part(run: Path):
    """Each part is there and says something; a part the run did not read says so; the README lists every part."""
    top, members, summary = build(str(run))
    assert top.startswith("debugagent-bundle-") and list(members) == NAMES
    assert all(members[n].strip() for n in NAMES)
    readme = members["README.md"].decode()
    assert all(f"`{name}`" in readme for name, _ in PARTS)
    for name, part in summary["parts"].items():
        if not part["read"]:
            text = members[name].decode().lower()
            assert "not " in text or text.startswith("no "), name   # "not read", "no baseline snapshot was given", …
    assert summary["parts"]["launch.txt"]["read"] and summary["parts"]["benchmarks.md"]["read"]


def test_bundle_of_the_snapshot_recording_through_the_cli(tmp_path: Path):
    """The command writes one .tar.gz (0600) holding every part; with a baseline snapshot the versions that changed,
    the good state's versions and both benchmark results are in it; nothing contacts a host (the run folder only)."""
    out = tmp_path / "b.tar.gz"
    r = cli("bundle", str(ROOT / "transcripts" / "torch-upgraded-snapshot"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out) and stat.S_IMODE(out.stat().st_mode) == 0o600
    with tarfile.open(out) as tar:
        names = [m.name.split("/", 1)[1] for m in tar.getmembers()]
        text = {n.split("/", 1)[1]: tar.extractfile(n).read().decode() for n in tar.getnames()}  # type: ignore[union-attr]
    assert names == NAMES
    assert "torch: 2.9.1+cu130" in text["env-before.txt"]
    assert "- torch: 2.9.1+cu130" in text["diff.md"] and "→ 2.10.0+cu130" in text["diff.md"]
    from debugagent.agent.runfacts import gather
    from debugagent.agent.transcript import read_events
    f = gather(read_events(ROOT / "transcripts" / "torch-upgraded-snapshot" / "events.jsonl"))
    good, now = (f.baseline_snapshot or {})["bench"]["samples"], f.reproduce   # both results, as recorded
    assert len(good) >= 3 and len(now) >= 2
    assert ", ".join(f"{v:g}" for v in good) in text["benchmarks.md"]
    assert ", ".join(f"{v:g}" for v in now) in text["benchmarks.md"]
    assert "sglang.launch_server" in text["launch.txt"]
    # the samples taken with the GPUs busy (how many fell under load is the recording's own), each at full clocks
    busy = re.search(r"(\d+) with the GPUs busy", text["clocks.md"])
    assert busy and int(busy[1]) >= 3
    assert f"| 0 | {busy[1]} | 1980 / 1980 / 1980 (of 1980)" in text["clocks.md"]
    assert "The kernel log was read: no NVIDIA Xid line." in text["xid.txt"]   # the simulated kernel log has none


def test_report_bundle_is_the_bundle_command(tmp_path: Path):
    """`debugagent report --bundle RUN` (the issue's spelling) writes what `debugagent bundle RUN` writes, member for
    member; -o without --bundle is exit 2 naming the flag."""
    run = str(ROOT / "transcripts" / "gpu-contention")
    a, b = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    from debugagent.agent.cli import app
    from typer.testing import CliRunner
    ra, rb = (CliRunner().invoke(app, args) for args in (["report", "--bundle", run, "-o", str(a)], ["bundle", run, "-o", str(b)]))
    assert ra.exit_code == rb.exit_code == 0, ra.output + rb.output
    assert ra.output.strip() == str(a) and stat.S_IMODE(a.stat().st_mode) == 0o600

    def members(path: Path) -> dict[str, bytes]:
        with tarfile.open(path) as tar:
            return {n.split("/", 1)[1]: tar.extractfile(n).read() for n in tar.getnames()}  # type: ignore[union-attr]
    assert list(members(a)) == NAMES and members(a) == members(b)
    r = cli("report", run, "--no-open", "-o", str(tmp_path / "c.tar.gz"))   # exit 2 as the real CLI maps it
    assert r.returncode == 2 and "--bundle" in r.stderr and not (tmp_path / "c.tar.gz").exists()


def test_bundle_bad_input_is_a_usage_error(tmp_path: Path):
    """A folder that is no run is refused naming it (exit 2, as every UsageError); an -o in a missing folder is
    refused before anything is written."""
    with pytest.raises(UsageError, match="no events.jsonl"):
        write_bundle(str(tmp_path / "empty"))
    with pytest.raises(UsageError, match="does not exist"):
        write_bundle(str(ROOT / "transcripts" / "gpu-contention"), str(tmp_path / "missing" / "b.tar.gz"))
    assert not (tmp_path / "missing").exists() and not (ROOT / "transcripts" / "gpu-contention" / "bundle.tar.gz").exists()


def test_a_secret_left_raw_in_a_run_folder_is_redacted_in_the_bundle(tmp_path: Path):
    """The bundle redacts again: secrets planted raw into a recording's server command line, environment and the
    engine's report (as an older redactor would have left them) appear in no member."""
    from tests.test_secrets import SERVER_ARGS, SERVER_ENV
    src = (ROOT / "transcripts" / "vllm-console-worker" / "events.jsonl").read_text().splitlines()
    args = [a for flag, (value, _) in SERVER_ARGS.items() for a in (f"--{flag}", value)]
    env = {k: v for k, (v, _) in SERVER_ENV.items()}
    secrets = {k: hidden for k, (_, hidden) in {**SERVER_ARGS, **SERVER_ENV}.items()}
    out = []
    for line in src:
        e = json.loads(line)
        if e.get("event") == "tool_result" and e.get("tool") == "server_details" and e.get("output"):
            e["output"]["argv"] += args
            e["output"]["env"].update(env)
        out.append(json.dumps(e))
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.jsonl").write_text("\n".join(out) + "\n")
    raw = (run / "events.jsonl").read_text()
    assert all(v in raw for v in secrets.values())   # planted
    _, members, _ = build(str(run))
    blob = b"".join(members.values())
    assert [k for k, v in secrets.items() if v.encode() in blob] == []
    assert b"--api-key [REDACTED]" in members["launch.txt"] and b"gpu-memory-utilization" in members["launch.txt"]


def test_the_corpus_secrets_in_an_engine_report_are_redacted_in_the_bundle(tmp_path: Path):
    """The redaction corpus's planted outputs (96 secrets of real shapes), recorded raw as the engine's own report
    (`server_env`'s stdout, which env-now.txt copies): none is in any member, and the report's text is."""
    from tests.redaction_corpus import planted_docs
    docs = planted_docs()
    text = "\n".join(d.text for d in docs)
    lines = event_lines(ROOT / "transcripts" / "vllm-console-worker" / "events.jsonl")
    call = next(e for e in lines if e.get("event") == "tool_call" and e.get("tool") == "gpu_q")
    result = next(e for e in lines if e.get("event") == "tool_result" and e.get("call_id") == call["call_id"])
    cid = max(e.get("call_id") or 0 for e in lines) + 1
    cmd = "timeout 100 /opt/venv/bin/python3 -m vllm.collect_env"
    extra = [{**call, "call_id": cid, "tool": "server_env", "command": cmd, "display": cmd, "input": {}},
             {**result, "call_id": cid, "tool": "server_env", "command": cmd, "stdout": text, "output": None}]
    at = lines.index(result) + 1
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.jsonl").write_text("\n".join(json.dumps(e) for e in lines[:at] + extra + lines[at:]) + "\n")
    _, members, _ = build(str(run))
    assert members["env-now.txt"].startswith(f"# $ {cmd}".encode())
    blob = b"".join(members.values())
    assert [s for d in docs for s in d.secrets if s.encode() in blob] == []
    assert docs[0].text.splitlines()[0][:20].encode() in members["env-now.txt"]
