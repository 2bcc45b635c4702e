"""Hosts as users run them, for real: a console-script server with a worker process installed from a wheel into a
venv's site-packages, and a server run by a real supervisord (the ``supervisor`` package, on a unix socket in the
test's folder). Each is found as what it is, diagnosed, and left exactly as found."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from .conftest import proc_state, tmp_leftovers
from .shapes import (
    ConsoleHost,
    add_the_regression,
    install_console_server,
    start_supervisord,
    tree_state,
    wait_one_tree,
)
from .test_experiments import report, same_but_pid, tools_called

pytestmark = pytest.mark.slow


def test_console_script_with_a_worker_from_site_packages(tmp_path):
    """`inferd` (a console script from a wheel in a venv's site-packages) and its forked worker: discovery says
    so; the flag and the variable are each measured by restarting the whole tree (a worker left behind would hold
    the port), and the tree is as found afterwards."""
    from .conftest import make_venv
    d = tmp_path / "console"
    d.mkdir()
    h = ConsoleHost(dir=d, python=str(make_venv(d / "venv", pip=True)))
    try:
        install_console_server(h)
        h.cwd = d
        h.start()
        base = h.baseline()
        h.flags = ["--disable-cuda-graph"]
        h.env = {"CUDA_LAUNCH_BLOCKING": "1"}
        h.restart()
        wait_one_tree(h)
        bad = h.baseline(3)
        before = tree_state(h)
        assert before["workers"] == 1

        o = h.run("--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {base:.2f} ms", out=tmp_path / "run")
        report(o, "console script")

        server = o["server"]
        shape = server["shape"]
        assert shape["launcher"] == "console_script" and shape["command"] == "inferd" and shape["module"] == "inferd.cli"
        assert shape["layout"] == "venv" and shape["engine"]["how"] == "site-packages"
        assert shape["engine"]["distribution"] == "inferd" and shape["engine"]["version"] == "1.0"
        assert len(server["workers"]) == 1
        md = (tmp_path / "run" / "transcript.md").read_text()
        assert "launched as the console script `inferd` (module `inferd.cli`)" in md and "site-packages (installed" in md

        causes = {c["hypothesis"]: c for c in o["root_causes"]}
        assert o["exit"] == 0, o["summary"]
        assert set(causes) == {"serving_config", "env_var"}, o["summary"]
        assert all(c["how"] == "experiment" and 0.25 < c["explains"] < 0.95 for c in causes.values())
        restarts = tools_called(o, "restart_server")
        assert restarts and all(i.get("ports") == [h.port] for i in restarts)
        h.wait_ready()
        wait_one_tree(h)
        after = tree_state(h)
        assert same_but_pid(before, after) and "--disable-cuda-graph" in after["argv"]
        assert tmp_leftovers(o["run_id"]) == []
    finally:
        h.stop()


def test_supervisord_program_flag_and_env_through_supervisorctl(realhost, tmp_path):
    """A server that supervisord runs (real supervisord, real supervisorctl): --disable-cuda-graph and
    CUDA_LAUNCH_BLOCKING=1, set in its program section, are each measured by changing that section and
    `supervisorctl update`; the config is put back byte for byte and the program runs as found."""
    h = realhost("supd")
    h.cwd = h.dir / "srv"
    h.write_code(h.cwd)
    base_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(h.dir), "LANG": "C.UTF-8"}
    sup = start_supervisord(h, h.argv(), base_env)
    try:
        base = h.baseline()
        add_the_regression(h, sup)
        old = h.server_pid
        bad = h.baseline(3)
        assert bad > base + 25, (base, bad)
        before, conf_before = {"pid": old(), **proc_state(old())}, sup.state()
        assert conf_before["status"] == "RUNNING" and before["env"]["CUDA_LAUNCH_BLOCKING"] == "1"

        o = h.run("--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {base:.2f} ms", out=tmp_path / "run")
        report(o, "supervisord")

        shape = o["server"]["shape"]
        assert shape["supervisor"]["kind"] == "supervisord" and shape["supervisor"]["program"] == "infer"
        assert shape["supervisor"]["config"] == str(sup.conf) and shape["engine"]["how"] == "cwd"
        causes = {c["hypothesis"]: c for c in o["root_causes"]}
        assert o["exit"] == 0, o["summary"]
        assert set(causes) == {"serving_config", "env_var"}, o["summary"]
        assert all(c["how"] == "experiment" and 0.25 < c["explains"] < 0.95 for c in causes.values())
        applied = tools_called(o, "supervisor_apply")
        assert applied and not tools_called(o, "restart_server") and not tools_called(o, "restart_hook")
        assert all(a["file"] == str(sup.program) for a in applied)
        assert any("--disable-cuda-graph" not in a["values"].get("command", "--disable-cuda-graph") for a in applied)
        assert any("CUDA_LAUNCH_BLOCKING" not in a["values"].get("environment", "CUDA_LAUNCH_BLOCKING") for a in applied)
        # the journal named the restore before the config was touched
        kinds = [(e["event"], e.get("tool")) for e in o["events"] if e.get("tool") in ("supervisor_apply", "supervisor_restore")]
        assert kinds.index(("experiment", "supervisor_restore")) < kinds.index(("tool_call", "supervisor_apply"))
        md = (tmp_path / "run" / "transcript.md").read_text()
        fixes = md.split("## What to do now", 1)[-1].split("\n## ", 1)[0]
        assert f"{sup.ctl_path} -c {sup.conf} reread && {sup.ctl_path} -c {sup.conf} update infer" in fixes, fixes
        assert f"in {sup.program}, set in [program:infer]" in fixes and "kill " not in fixes, fixes
        h.wait_ready()
        after = proc_state(h.server_pid())
        assert same_but_pid(before, {"pid": 0, **after}) and "--disable-cuda-graph" in after["argv"]
        assert sup.state() == conf_before   # bytes, mode and mtime of the config, and RUNNING
        assert sup.proc.poll() is None
        assert tmp_leftovers(o["run_id"]) == []
    finally:
        sup.proc.terminate()
        try:
            sup.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sup.proc.kill()
        shutil.rmtree(h.dir / "conf.d", ignore_errors=True)
