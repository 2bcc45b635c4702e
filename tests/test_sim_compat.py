"""The scenario format keeps its word: every file written for an earlier release (tests/scenarios/compat/, taken
from the git history: each built-in as the commit that added it wrote it, scenarios written inline in tests, the
format's documented example) still validates and starts; a file the simulator cannot host is refused by
validation, in well under 2 s, naming the line, the field and the fix, before anything is laid out."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from debugagent.tools.errors import ScenarioError
from debugagent.tools.sim.scenario import FORMAT_VERSION, builtin_dir, parse_scenario

ROOT = Path(__file__).resolve().parents[1]
CORPUS = sorted((ROOT / "tests" / "scenarios" / "compat").glob("*.yaml"))


def test_the_corpus_spans_the_formats_history():
    assert len(CORPUS) >= 15
    commits = {p.name.split("-")[3] for p in CORPUS}
    assert len(commits) >= 6, commits   # files from six or more releases of the format
    for p in CORPUS:
        assert p.read_text().startswith("# format history: "), p.name


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_every_earlier_file_still_validates(path):
    sc = parse_scenario(path.read_text(), str(path))
    assert sc.version <= FORMAT_VERSION and sc.factors is not None


def body(path: Path) -> str:
    return path.read_text().split("\n", 1)[1]


def test_every_earlier_file_still_starts():
    """Each file's host is laid out, sealed where bwrap runs, its server started; its benchmark answers. A file
    whose text is a built-in scenario's today is started by the built-ins' own tests (every built-in is started,
    tests/test_sim_host.py), so only the others start here; a built-in edited later drops out of that set."""
    from debugagent.tools.sim.sandbox import SimHost
    from debugagent.tools.transport import q
    today = {p.read_text() for p in builtin_dir().glob("*.yaml")}
    others = [p for p in CORPUS if body(p) not in today]
    assert others   # the inline and documented scenarios at least
    failed = []
    for path in others:
        sc = parse_scenario(path.read_text(), str(path))
        try:
            host = SimHost(sc)
        except ScenarioError as exc:
            failed.append(f"{path.name}: {exc}")
            continue
        try:
            prof = host.exec("cat /etc/debugagent/host.json 2>/dev/null; " + sc.bench.command(), timeout=120)
            if f"{sc.bench.metric}=" not in prof.stdout:
                failed.append(f"{path.name}: the benchmark printed {prof.stdout[-300:]!r} {prof.stderr[-300:]!r}")
            ps = host.exec(f"ps -eo args | grep -F -- {q(sc.host.server.cmd.split()[0])} | grep -v grep")
            if not ps.stdout.strip():
                failed.append(f"{path.name}: no server process")
        finally:
            host.close()
    assert not failed, "\n".join(failed)


def refused(text: str, field: str, *words: str) -> str:
    t0 = time.perf_counter()
    with pytest.raises(ScenarioError) as e:
        parse_scenario(text, "held.yaml")
    took = time.perf_counter() - t0
    msg = str(e.value)
    assert took < 2.0, took
    assert "held.yaml" in msg and field in msg and "fix:" in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def base() -> str:
    return (builtin_dir() / "launch-blocking.yaml").read_text()


def line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def test_a_later_version_is_refused_naming_its_line():
    text = base().replace("version: 1", "version: 2", 1)
    refused(text, f"line {line_of(text, 'version: 2')}: version", "newer", "upgrade debugagent")


def test_a_server_that_runs_no_code_is_refused():
    text = base().replace("-m sglang.launch_server", "-c 'import time; time.sleep(1e9)'", 1)
    refused(text, f"line {line_of(text, 'cmd:')}: host.server.cmd", "runs no code", "-m MODULE")


def test_a_server_on_another_interpreter_is_refused():
    text = base()
    cmd = next(line for line in text.splitlines() if "cmd:" in line)
    text = text.replace(cmd, "    cmd: /opt/other/bin/python3 -m sglang.launch_server", 1)
    refused(text, f"line {line_of(text, 'cmd:')}: host.server.cmd", "/opt/other/bin/python3", "host.python")


def test_a_repository_in_a_system_folder_is_refused():
    text = (builtin_dir() / "code-regression-bisect.yaml").read_text()
    old = next(line for line in text.splitlines() if line.strip().startswith("path: /"))
    text = text.replace(old, old.split("path:")[0] + "path: /etc/sglang", 1)
    refused(text, f"line {line_of(text, 'path: /etc/sglang')}: host.repo.path", "belongs to the system", "/opt")


def test_a_script_in_a_system_folder_is_refused_through_the_cli(tmp_path):
    text = base()
    cmd = next(line for line in text.splitlines() if "cmd:" in line)
    python = cmd.split("cmd:")[1].split()[0]
    text = text.replace(cmd, f"    cmd: {python} /usr/share/serve/serve.py", 1)
    f = tmp_path / "held.yaml"
    f.write_text(text)
    for args in (["run", "--host", f"sim:{f}", "--symptom", "itl 17ms", "--baseline", "itl 11ms", "--read-only"],):
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", *args], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
        took = time.monotonic() - t0
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert f"line {line_of(text, 'cmd:')}: host.server.cmd" in r.stderr and "/usr/share/serve/serve.py" in r.stderr
        assert "Traceback" not in r.stderr + r.stdout
        assert took < 60   # a process start and a parse, never a host's start (in-process: the 2 s above)
