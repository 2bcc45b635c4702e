"""A broken or hostile host's output on a real process: a benchmark that prints 100 MB of junk (terminal
sequences, NUL bytes, invalid UTF-8, U+2028) before its metric line, a server whose argv and environment hold
invalid UTF-8 and control characters. The run keeps bounded memory, still reads the metric (the output is cut in
the middle with a note, never at the end), writes valid JSON lines, and never lets a raw control reach its outputs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Host, tmp_leftovers

pytestmark = pytest.mark.slow

# printed once, on the benchmark's first run: 100 MB in lines of junk, then the client's own metric line
JUNK = r'''import os, sys
flag = sys.argv[1]
if not os.path.exists(flag):
    open(flag, "w").close()
    line = b"\x1b[2J\x1b]52;c;ZXZpbA==\x07 \x00nul \xff\xfe bad \xe2\x80\xa8 sep " + b"x" * 200 + b"\n"
    out = sys.stdout.buffer
    for _ in range(100 * 1024 * 1024 // len(line)):
        out.write(line)
    out.flush()
'''
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\u2028\u2029]")


def test_100_mb_of_junk_and_invalid_bytes_keep_memory_bounded_and_outputs_clean(realhost, tmp_path):
    h: Host = realhost("junk")
    repo = h.dir / "repo"
    repo.mkdir()
    h.write_code(repo)
    h.cwd = repo
    # a server argv and environment holding bytes that are not UTF-8, a terminal sequence and a line separator
    h.flags = ["--tag", "bad\udcff\udcfe\x1b[31mred\u2028x"]
    h.env = {"BROKEN_VALUE": "v\udcff\x1b]0;title\x07"}
    h.start()
    base = h.baseline(3)
    (h.dir / "junk.py").write_text(JUNK)
    bench = f"{sys.executable} {h.dir / 'junk.py'} {h.dir / 'printed'} && {h.bench_cmd()}"
    out = tmp_path / "run"
    cli = Path(sys.executable).parent / "debugagent"
    script = ("import resource, subprocess, sys\n"
              "r = subprocess.run(sys.argv[1:], capture_output=True)\n"
              "sys.stdout.buffer.write(r.stdout); sys.stderr.buffer.write(r.stderr)\n"
              "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=open(sys.argv[0] + '.rss', 'w'))\n"
              "sys.exit(r.returncode)\n")
    wrapper = tmp_path / "measure.py"
    wrapper.write_text(script)
    r = subprocess.run([sys.executable, str(wrapper), str(cli), "run", "--host", "local", "--server-pattern", h.pattern,
                        "--bench", bench, "--read-only", "--json", "--out", str(out), "--reproduce-runs", "3",
                        "--symptom", f"latency {base:.2f} ms", "--baseline", f"latency {base:.2f} ms"],
                       capture_output=True, timeout=600, cwd=h.dir, env=os.environ.copy())
    assert (h.dir / "printed").exists(), "the benchmark never printed its junk"
    assert r.stdout.strip().startswith(b"{"), f"exit {r.returncode}; stderr: {r.stderr[-3000:]!r}"
    o = json.loads(r.stdout)
    assert r.returncode == 3, (r.returncode, o.get("summary"))
    # the metric line came after 100 MB: it was still read, on every run, the first one included
    runs = o["regression"]["runs"]
    assert runs >= 3, o["regression"]
    rss_kib = int(Path(str(wrapper) + ".rss").read_text())
    print(f"\n[junk] peak RSS of the run and its children: {rss_kib // 1024} MiB; {o['commands']} commands")
    assert rss_kib < 600 * 1024, f"a child of the run peaked at {rss_kib // 1024} MiB"
    events = out / "events.jsonl"
    assert events.stat().st_size < 32 * 1024 * 1024, events.stat().st_size
    # every line is valid JSON in valid UTF-8 (JSON lines end at "\n" only: U+2028 may sit inside a value)
    parsed = [json.loads(x) for x in events.read_bytes().decode("utf-8").split("\n") if x.strip()]
    cut = [e for e in parsed if e["event"] == "tool_result" and e.get("truncated") and "bytes of output left out here" in e["stdout"]]
    assert cut, "the 100 MB output was kept whole or cut without a note"
    # no raw control, NUL or line separator in anything a person reads
    for name in ("transcript.md", "report.html"):
        text = (out / name).read_text(encoding="utf-8")
        assert not CONTROL.search(text), (name, CONTROL.search(text))
    for stream in (r.stdout, r.stderr):
        assert not CONTROL.search(stream.decode("utf-8")), CONTROL.search(stream.decode("utf-8"))
    # the server's bytes are shown escaped where the transcript names its command line
    md = (out / "transcript.md").read_text(encoding="utf-8")
    assert "\\xff" in md or "\ufffd" in md, "the server's invalid byte vanished from the transcript"
    assert tmp_leftovers(o.get("run_id") or json.loads((out / "run.json").read_text())["run_id"]) == []
