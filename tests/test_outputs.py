"""What a person reads of a run: transcript.md in the seeds' voice and the offline report.html."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import statistics
import subprocess
import zlib
from pathlib import Path

import pytest
from debugagent.agent.markdown import tighten
from debugagent.agent.run import RunOptions, investigate
from debugagent.tools.probes.text import clip_words, code, plural, render_unit_sep

from debugagent_testing import event_lines

# the README's quick start (tests/test_readme.py holds the README and the kept recording to it)
QUICK_BENCH = ("/root/ml-env/bin/python3 -m sglang.bench_serving --dataset-name random --random-output-len 256 "
               "--num-prompts 256 --max-concurrency 32 --output-file /tmp/bench.jsonl")
HYPS = ["code_change", "gpu_clocks", "pcie_link", "serving_config", "compiled_dependency", "driver_cuda", "env_var",
        "gpu_contention", "host_cpu"]


@pytest.fixture(scope="module")
def quick_state(tmp_path_factory):
    """The state folder of the quick start's run (the simulator's per-user salt of build bytes lives there)."""
    return tmp_path_factory.mktemp("quick-state")


@pytest.fixture(scope="module")
def quick(tmp_path_factory, quick_state):
    """The README's quick start, run once for this module: (folder, transcript.md text, events)."""
    folder = tmp_path_factory.mktemp("quick") / "run"
    with pytest.MonkeyPatch.context() as mp:   # module scope: the per-test isolation does not apply yet
        mp.setenv("XDG_STATE_HOME", str(quick_state))
        mp.setenv("HOME", str(tmp_path_factory.mktemp("quick-home")))
        investigate(RunOptions(host="sim:eagle3-flashinfer-rebuilt", bench=QUICK_BENCH, symptom="output_throughput 1000 tok/s",
                               baseline="output_throughput 1500 tok/s", as_json=True, out=str(folder)))
    events = event_lines(folder / "events.jsonl")
    return folder, (folder / "transcript.md").read_text(), events


def outside_details(md: str) -> str:
    """The transcript less its collapsed blocks, each with the blank line that must end its HTML block."""
    return re.sub(r"<details>.*?</details>\n(?=\n|\Z)", "", md, flags=re.S)


# ---------------------------------------------------------------- transcript.md
def test_quick_start_reads_short(quick):
    """The quick start's transcript has under 180 lines outside its collapsed blocks (150 before the tenth
    hypothesis, changed_default, and the section of what was changed and undone; 160 before the experiment that
    removes the speculative flags no list names, so that serving_config's verdict covers them; 190 since it runs
    SGLang's bench_serving, whose command, printing its result file, is collapsed under each group of runs)."""
    _, md, _ = quick
    assert len(outside_details(md).splitlines()) < 190


def test_each_hypothesis_is_a_section_holding_its_experiment(quick):
    """Every hypothesis has its own section; an experiment's commands sit under its own hypothesis."""
    _, md, _ = quick
    heads = [md.index(f"### {h}:") for h in HYPS]
    assert heads == sorted(heads)
    worktree = md.index("-C /root/sglang worktree add --detach")   # git without the repository's hooks
    assert heads[0] < worktree < heads[1]
    restart = md.index("--speculative-attention-mode decode")
    assert heads[3] < restart < heads[4]


def test_wording(quick):
    """None of the wording the issue names: placeholders, (s)-plurals, templates, phase names."""
    _, md, _ = quick
    for bad in ("<list distributions", "commit(s)", "(baseline None)", "Does the evidence point", "undo_recorded",
                "1 GPUs", "Nothing is blamed", "\x1f", "&lt;/details>"):
        assert bad not in md, bad


def test_benchmark_runs_are_one_table_with_mean_and_sd(quick):
    """The reproduction's runs, the check's run first, are one table whose mean ± sd is the events' own numbers
    and the reproduce step's own figure."""
    _, md, events = quick
    calls = {e["call_id"]: e["why"] for e in events if e["event"] == "tool_call"}
    results = [e for e in events if e["event"] == "tool_result" and e.get("tool") == "bench"]
    check = [e for e in results if calls[e["call_id"]].startswith("check once that the benchmark prints")]
    reproduce = [e for e in results if calls[e["call_id"]].startswith("reproduce")]
    assert len(check) == 1
    vals = [e["output"]["value"] for e in check + reproduce]
    assert 3 <= len(vals) <= 12   # sequential: at least 3 runs, more only while the answer is not clear
    msg = re.search(r"\[msg (\d+)\] .* — check once that the benchmark prints", md).group(1)
    assert (f"| run | 1 (msg {msg}) | " + " | ".join(str(i) for i in range(2, len(vals) + 1)) + " | mean ± sd |") in md
    assert f"{statistics.fmean(vals):.2f} ± {statistics.stdev(vals):.2f}" in md
    assert f"over {len(vals)} runs against a baseline of 1500" in md
    # reproduction and three experiments, each one message
    assert len(re.findall(r"\[bash\] `cd [^`]* …` ×\d", md)) == 4


def test_arithmetic_timeline_and_fix(quick):
    """The regression's arithmetic, a timeline that puts the reinstall after the checkout move, the fix at the end."""
    _, md, events = quick
    assert "per item that is 1000/1500 = 0.67 ms before" in md
    assert "The benchmark's numbers: `output_throughput` read from SGLang bench_serving's result (JSONL)." in md
    head = next(e["output"]["head"] for e in events if e["event"] == "tool_result" and e["tool"] == "git_state")
    timeline = md[md.index("## Timeline of changes"):md.index("## Hypotheses")]
    assert timeline.index(f"HEAD → {head[:7]}") < timeline.index("flashinfer-python 0.5.3 installed")
    # no wheelhouse on that host: compiled_dependency stays the top suspect, nothing to undo yet, and it says what decides it
    conclusion = md[md.index("## Conclusion"):md.index("## What to do now")]
    assert "No root cause was confirmed" in conclusion
    assert "suspect **compiled_dependency**" in conclusion and "another build of flashinfer-python 0.5.3" in conclusion
    fix = md[md.index("## What to do now"):]
    assert "no cause was confirmed" in fix and "--force-reinstall" not in fix
    assert len(md[md.index("## Conclusion"):].splitlines()) < 40   # the table and the fix fit on the last screen


def pasted(md: str) -> list[str]:
    """Every command a reader can paste: ssh code spans and heredoc blocks, with the ssh part taken off."""
    out = []
    for span in re.findall(r"\[bash\] (`+) ?(ssh root@gpu-node-3 .+?) ?\1", md):
        words = shlex.split(span[1])
        assert words[:2] == ["ssh", "root@gpu-node-3"] and len(words) == 3, span[1]
        out.append(words[2])
    for body in re.findall(r"```bash\nssh root@gpu-node-3 \"\$\(cat <<'(EOF_*)'\n(.*?)\n\1\n\)\"\n```", md, flags=re.S):
        out.append(body[1])
    return out


def test_every_command_is_pasteable_as_run(quick):
    """Unquoting what the transcript shows gives back exactly each command that was sent."""
    _, md, events = quick
    sent = {e["command"] for e in events if e["event"] == "tool_call"}
    shown = set(pasted(md))
    assert shown <= sent
    assert sent <= shown


def test_pasted_heredoc_gives_the_same_output(quick, quick_state, sim_host, monkeypatch):
    """The long package probe, pasted as its heredoc, reaches the host as the same command and prints what the run recorded."""
    _, md, events = quick
    monkeypatch.setenv("XDG_STATE_HOME", str(quick_state))   # the same user's salt: the same build bytes as in the run
    rec = next(e for e in events if e["event"] == "tool_result" and e["tool"] == "python_packages")
    start = md.index("versions and compiled-file hashes (sent as this heredoc:)")   # the package probe's own block
    block = re.compile(r"```bash\nssh root@gpu-node-3 (\"\$\(cat <<'EOF'\n.*?\nEOF\n\)\")\n```", re.S).search(md, start).group(1)
    # what the local shell makes of the pasted argument is the command the host runs
    command = subprocess.run(["bash", "-c", f"printf %s {block}"], capture_output=True, text=True, check=True).stdout
    host = sim_host("sim:eagle3-flashinfer-rebuilt")
    got = host.run(command)
    assert got.exit_code == 0
    assert json.loads(got.stdout)["packages"] == json.loads(rec["stdout"])["packages"]


def test_code_span_survives_backticks():
    """A command holding backticks still makes one code span."""
    assert code("echo `date`") == "`` echo `date` ``"
    assert code("ls libcuda.so.*.*") == "`ls libcuda.so.*.*`"


def test_unit_separated_git_output_is_a_table():
    """git log fields joined by \\x1f become a table with named columns."""
    cmd = "git log -n 2 --format='%H%x1f%h%x1f%cI%x1f%s'"
    out = "== log\n" + "a" * 40 + "\x1faaaaaaa\x1f2026-11-28T18:45:00+00:00\x1fImprove CI\n== end\n"
    lines = render_unit_sep(out, cmd)
    assert "| short | date | subject |" in lines
    assert "| aaaaaaa | 2026-11-28T18:45:00+00:00 | Improve CI |" in lines


def test_tighten_leaves_fenced_blocks_alone():
    """Blank lines inside a fenced block or <details> are kept; between messages they become hard breaks."""
    lines = ["[msg 1] a", "", "[msg 2] b", "", "```", "x", "", "y", "```", "", "| t |", "| --- |", "after"]
    out = tighten(lines)
    assert out[:2] == ["[msg 1] a\\", "[msg 2] b"]
    assert out[out.index("```") + 1:out.index("```") + 4] == ["x", "", "y"]
    assert out[-2:] == ["", "after"]


def test_clip_words_and_plural():
    """Evidence is cut at a word boundary; counts read 1 GPU, 2 GPUs."""
    assert clip_words("PYTORCH_NO_CUDA_MEMORY_CACHING and more", 33) == "PYTORCH_NO_CUDA_MEMORY_CACHING …"
    assert clip_words("alpha beta gamma", 12) == "alpha beta …"
    assert plural(1, "GPU") == "1 GPU" and plural(2, "GPU") == "2 GPUs"


# ---------------------------------------------------------------- report.html
def test_report_is_offline_and_small(quick):
    """report.html is written at the end of the run, fetches nothing and stays under 1 MB."""
    folder, _, _ = quick
    page = (folder / "report.html").read_text()
    assert (folder / "report.html").stat().st_size < 1_000_000
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)
    assert page.count("<svg") == 3 and "compiled_dependency" in page   # a chart per measured experiment


def png_is_blank(path: Path) -> bool:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    idat, i = b"", 8
    while i < len(data):
        n = int.from_bytes(data[i:i + 4], "big")
        if data[i + 4:i + 8] == b"IDAT":
            idat += data[i + 8:i + 8 + n]
        i += 12 + n
    return len(set(zlib.decompress(idat))) < 16


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium (run-tests installs it)")
def test_report_renders_in_headless_chromium(quick, tmp_path):
    """Headless Chromium draws the report (a screenshot that is not blank) and its DOM holds the root cause and the plot."""
    folder, _, _ = quick
    url = (folder / "report.html").resolve().as_uri()
    flags = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1100,1600", url], capture_output=True, timeout=180)
    assert shot.is_file() and not png_is_blank(shot)
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=180).stdout
    # no wheelhouse on that host: no confirmed cause (said once), compiled_dependency is the top suspect
    assert "No confirmed root cause" in dom and "Top suspect: compiled_dependency" in dom and "flashinfer-python 0.5.3" in dom
    assert "<svg" in dom and "<circle" in dom


@pytest.mark.ssh
@pytest.mark.skipif(not Path("/usr/sbin/sshd").is_file() or not shutil.which("ssh"), reason="needs Debian's openssh-server")
def test_pasted_commands_work_over_ssh_on_sim_serve(tmp_path):
    """Run over SSH against `sim serve`, then each probe pasted from transcript.md into OpenSSH's client gives the recorded output."""
    from debugagent.agent.hosts import SSHOptions
    from debugagent.tools.sim.serve import start
    with start("eagle3-flashinfer-rebuilt") as s:
        investigate(RunOptions(host=s.target, symptom="verify 30ms", baseline="verify 20ms", as_json=True,
                               out=str(tmp_path / "run"), ssh=SSHOptions(identity_file=str(s.identity),
                                                                        known_hosts=str(s.known_hosts))))
        md = (tmp_path / "run" / "transcript.md").read_text()
        events = event_lines(tmp_path / "run" / "events.jsonl")
        steady = ("host_info", "gpu_query", "driver_files", "git_state", "python_packages")
        recorded = {e["command"]: e["stdout"] for e in events if e["event"] == "tool_result" and e["tool"] in steady}
        spans = [m[1] for m in re.findall(r"\[bash\] (`+) ?(ssh -p \d+ \S+ .+?) ?\1", md)]
        blocks = re.findall(r"```bash\n(ssh -p \d+ \S+ \"\$\(cat <<'EOF'\n.*?\nEOF\n\)\")\n```", md, flags=re.S)
        assert spans and blocks
        client = f"ssh -i {shlex.quote(str(s.identity))} -o UserKnownHostsFile={shlex.quote(str(s.known_hosts))} -o BatchMode=yes"
        checked = set()
        for text in spans + blocks:
            command = shlex.split(text)[-1] if "\n" not in text else text.split("\n", 1)[1].rsplit("\nEOF", 1)[0]
            if command not in recorded:
                continue
            got = subprocess.run(["bash", "-c", client + text[3:]], capture_output=True, text=True, timeout=120)
            assert got.returncode == 0, got.stderr
            assert stable(got.stdout) == stable(recorded[command]), command[:80]
            checked.add(command)
    assert len(checked) == len(recorded) == 5


def stable(text: str) -> str:
    """A probe's output without what changes between two reads of the same host: /proc/loadavg (host_info)."""
    lines = text.split("\n")
    return "\n".join("(load average)" if i and lines[i - 1] == "== loadavg" else ln for i, ln in enumerate(lines))


def test_stable_drops_only_the_load_average():
    """Two host_info outputs that differ in their load average read the same; any other difference still shows."""
    a = "== hostname\ngpu-node-3\n== loadavg\n2.79 1.78 2.54 4/203 20\n== governor\n64 performance\n== end\n"
    b = a.replace("2.79 1.78 2.54 4/203 20", "0.10 0.20 0.30 1/190 31")
    assert stable(a) == stable(b) and "gpu-node-3" in stable(a)
    assert stable(a) != stable(a.replace("64 performance", "64 powersave"))


def fixes_of(name: str) -> list:
    from debugagent.agent.fixes import fixes_for
    from debugagent.agent.runfacts import gather
    from debugagent.agent.transcript import read_events
    return fixes_for(gather(read_events(Path(__file__).resolve().parents[1] / "transcripts" / name / "events.jsonl")))


def test_fix_for_two_restart_causes_is_one_restart():
    """A flag and a variable, both confirmed: one restart command that changes both."""
    (fx,) = fixes_of("two-causes")
    (cmd,) = fx.commands
    assert "env -u NCCL_PROTO" in cmd and "--disable-cuda-graph" not in cmd and "sglang.launch_server" in cmd


def test_fix_for_a_package_is_the_build_that_recovered_it():
    """A rebuilt package confirmed by the package experiment: the fix reinstalls the very wheel that recovered it."""
    (fx,) = fixes_of("flashinfer-wheelhouse")
    (cmd,) = fx.commands
    assert "pip install --force-reinstall --no-deps /root/wheelhouse/flashinfer_python-0.5.3-" in cmd


def test_no_fix_for_an_unconfirmed_package():
    """torch upgraded, but no baseline build on the host to test it: no fix is claimed, only the suspect."""
    assert fixes_of("torch-upgraded-snapshot") == []


def test_fix_for_a_variable_unsets_it():
    """CUDA_LAUNCH_BLOCKING confirmed: the server's own command line restarted without it."""
    (fx,) = fixes_of("launch-blocking")
    assert fx.commands[0].startswith('ssh root@gpu-node-3 "cd /root && env -u CUDA_LAUNCH_BLOCKING /root/ml-env/bin/python3 -m')


def test_report_command_prints_the_path(quick, tmp_path):
    """`debugagent report RUN --no-open` prints the report's path; a folder that is no run is exit 2 with a fix."""
    import sys
    folder, _, _ = quick
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "report", str(folder), "--no-open"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == str((folder / "report.html").resolve())
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "report", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a debugagent run folder" in r.stderr and "fix:" in r.stderr


def test_report_command_writes_every_missing_format(tmp_path):
    """A run folder with events.jsonl and no report.html: `debugagent report` writes each registered format it
    lacks (a format registered later too) and leaves the files it has as they are."""
    from debugagent.agent import outputs
    from debugagent.agent.cli import app
    from debugagent.agent.report import render_html
    from debugagent.agent.transcript import read_events
    from typer.testing import CliRunner
    src = Path(__file__).resolve().parent.parent / "transcripts" / "two-causes" / "events.jsonl"
    (tmp_path / "events.jsonl").write_bytes(src.read_bytes())
    (tmp_path / "transcript.md").write_text("kept\n")
    outputs.register("test-words", "words.txt", lambda events: f"{len(events)} events\n")
    try:
        r = CliRunner().invoke(app, ["report", str(tmp_path), "--no-open"])
    finally:
        del outputs.FORMATS["test-words"]
    assert r.exit_code == 0 and r.stdout.strip() == str((tmp_path / "report.html").resolve())
    events = read_events(tmp_path / "events.jsonl")
    assert (tmp_path / "report.html").read_text() == render_html(events)
    assert (tmp_path / "words.txt").read_text() == f"{len(events)} events\n"
    assert (tmp_path / "transcript.md").read_text() == "kept\n"


def test_report_escapes_what_the_run_recorded(tmp_path):
    """report.html goes through an autoescaping template: markup in a recorded value is shown, never run."""
    from debugagent.agent.report import render_html
    from debugagent.agent.transcript import read_events

    from debugagent_testing import TranscriptBuilder
    b = TranscriptBuilder("verify 30ms", "verify 20ms", host="<script>alert(1)</script>")
    b.events.append({"event": "hypothesis_opened", "hypothesis": "env_var", "title": "a <b>bold</b> & odd title"})
    b.events.append({"event": "verdict", "hypothesis": "env_var", "status": "suspect", "because": "x < y"})
    page = render_html(read_events(b.write(tmp_path / "rec") / "events.jsonl"))
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "a &lt;b&gt;bold&lt;/b&gt; &amp; odd title" in page and "x &lt; y" in page
