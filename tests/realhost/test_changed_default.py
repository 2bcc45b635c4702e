"""A changed default on a real host: the lab server upgraded to an engine version that chooses another attention
backend by default, with the same flags; the server says so on /server_info and in its start-up log."""

from __future__ import annotations

import pytest
from debugagent.tools.registry import Runner
from debugagent.tools.snapshot import collect, dump
from debugagent.tools.transport import LocalTransport

from .test_experiments import found_state, report, same_but_pid, tmp_leftovers

pytestmark = pytest.mark.slow


def test_a_changed_default_is_confirmed_by_pinning_the_old_value(realhost, tmp_path, monkeypatch):
    """0.5.5 chose flashinfer, 0.5.6 chooses fa3 (15 ms more a request here): restarting with
    --attention-backend flashinfer recovers it, from the numbers alone and against a baseline snapshot; the server
    is left as found."""
    h = realhost("dflt")
    h.cwd = h.dir / "srv"
    h.write_code(h.cwd, default_backend="flashinfer", backend_ms={"fa3": 15.0}, version="0.5.5")
    h.start()
    monkeypatch.chdir(h.dir)
    snap = collect(Runner(LocalTransport()), bench=h.bench_cmd(), python=h.python, server_pattern=h.pattern,
                   bench_runs=3, metric="latency")
    assert snap.server_view is not None and snap.server_view.effective.attention_backend == "flashinfer"
    assert snap.server_view.endpoints["/server_info"] == 200 and snap.server_view.metrics == "off"
    (h.dir / "good.json").write_text(dump(snap))
    base = h.baseline()
    h.write_code(h.cwd, default_backend="fa3", backend_ms={"fa3": 15.0}, version="0.5.6")   # the upgrade
    h.restart()
    bad = h.baseline(3)
    before = found_state(h)
    for how, args in (("numbers", ["--baseline", f"latency {base:.2f} ms"]),
                      ("snapshot", ["--baseline-snapshot", str(h.dir / "good.json")])):
        o = h.run("--symptom", f"latency {bad:.2f} ms", *args, out=tmp_path / how)
        report(o, f"changed default ({how})")
        assert o["exit"] == 0, o["summary"]
        cause = o["root_cause"]
        assert cause["hypothesis"] == "changed_default" and cause["how"] == "experiment", o["summary"]
        assert 0.6 < cause["explains"] < 1.8   # measured on a loaded machine: the share, not a fixed answer
        assert "--attention-backend flashinfer" in cause["summary"]
        verdict = next(e["because"] for e in o["events"] if e["event"] == "verdict" and e["hypothesis"] == "changed_default"
                       and e.get("status") == "suspect")
        assert ("where the baseline ran flashinfer" in verdict) is (how == "snapshot"), verdict
        h.wait_ready()
        assert same_but_pid(before, found_state(h))
        assert tmp_leftovers(o["run_id"]) == []
