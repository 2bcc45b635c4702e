"""The pure decisions behind the real-host experiments, and the read-only checks on a real process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from debugagent.agent.lab import (
    ExperimentError,
    PackageTarget,
    build_matches,
    map_path,
    package_targets,
    plan_code_run,
)
from debugagent.tools.host import ServerInfo
from debugagent.tools.mutate import ImportMap, ImportRoot, parse_server_control
from debugagent.tools.registry import Runner
from debugagent.tools.transport import LocalTransport

SELF = "0::/user.slice/user-0.slice/session-4.scope\n"


def control(cgroup: str, parent: str = "12\nbash\n-bash\n", env: str = "", pid: int = 4242):
    return parse_server_control(pid, f"== cgroup\n{cgroup}== self_cgroup\n{SELF}== parent\n{parent}== container_env\n{env}"
                                     "== stdout\n/var/log/sglang.log\n== end\n")


def test_systemd_unit_is_named_from_the_cgroup():
    """A server in system.slice/NAME.service is a systemd unit, named."""
    c = control("0::/system.slice/sglang.service\n")
    assert c.kind == "systemd" and c.unit == "sglang.service" and c.stdout == "/var/log/sglang.log"


def test_container_cgroup_and_supervisor_parent_are_recognised():
    """docker/kubepods cgroups are containers; a supervisord parent is a supervisor; a login shell's child is plain."""
    assert control("0::/system.slice/docker-3f2a9c.scope\n").kind == "container"
    assert control("12:memory:/kubepods/burstable/pod1/abc\n0::/kubepods/burstable/pod1/abc\n").kind == "container"
    assert control(SELF, parent="99\nsupervisord\n/usr/bin/python3 /usr/bin/supervisord\n").kind == "supervisor"
    assert control(SELF).kind == "plain"
    assert control("0::/\n", pid=1).kind == "container"


def test_a_cgroup_the_probing_shell_shares_says_nothing():
    """Per-process controllers (a memory cgroup per process here) and the shell's own cgroup are not evidence."""
    assert control("4:memory:/process_api/abc\n" + SELF).kind == "plain"


def srv(cwd: str, argv: list[str] | None = None) -> ServerInfo:
    return ServerInfo(pid=7, argv=argv or ["/venv/bin/python", "-m", "infer.serve", "--config", "/repo/conf.yaml"], cwd=cwd,
                      entry="infer.serve")


def test_code_plan_maps_import_roots_cwd_and_file_arguments_into_the_worktree():
    """An editable finder root and the cwd inside the checkout go to the worktree; the interpreter stays."""
    imports = ImportMap(repo="/repo", cwd="/repo", cwd_in_repo="", modules=[
        ImportRoot(module="infer", root="/repo/python", rel="python", how="an editable install's finder")])
    p = plan_code_run(srv("/repo"), imports, "/repo", "/tmp/wt", None, [])
    assert p.mode == "server" and p.run is not None
    assert p.run.path_first == ["/tmp/wt/python"] and p.run.cwd == "/tmp/wt"
    assert p.run.argv == ["/venv/bin/python", "-m", "infer.serve", "--config", "/tmp/wt/conf.yaml"]
    assert "editable install's finder" in p.why


def test_code_plan_runs_the_benchmark_in_the_worktree_without_a_server_or_code_from_the_checkout():
    """No server, or one that imports nothing from the checkout: the benchmark is the code."""
    assert plan_code_run(None, None, "/repo", "/tmp/wt", None, []).mode == "bench"
    outside = ImportMap(repo="/repo", cwd="/srv", modules=[ImportRoot(module="infer", root="/venv/lib/site", how="a .pth path")])
    p = plan_code_run(srv("/srv", ["/venv/bin/python", "-m", "infer.serve"]), outside, "/repo", "/tmp/wt", None, [])
    assert p.mode == "bench" and "imports nothing from /repo" in p.why


def test_code_root_outside_the_checkout_is_refused():
    """--code-root must lie inside the checkout; the message names the flag."""
    with pytest.raises(ExperimentError, match="--code-root /elsewhere"):
        plan_code_run(srv("/srv"), None, "/repo", "/tmp/wt", "/elsewhere", [])
    assert map_path("/repo2/x", "/repo", "/tmp/wt") is None and map_path("/repo/x", "/repo/", "/tmp/wt") == "/tmp/wt/x"


def test_package_targets_from_the_baseline_diff_and_build_matching():
    """A changed build asks for the baseline's hash; a later-installed package asks for any other build."""
    from debugagent.agent.facts import LabFacts
    from debugagent.tools.host import Package
    from debugagent.tools.snapshot import Change
    pk = {"fastmod": Package(name="fastmod", version="1.0", build_hash="bbbb")}
    facts = LabFacts(packages=pk, changes=[Change(path="packages.fastmod.build", a="aaaa", b="bbbb")])
    [t] = package_targets(facts, {"kind": "package_restore"})
    assert (t.name, t.version, t.build, t.current_build) == ("fastmod", "1.0", "aaaa", "bbbb")
    assert build_matches(t, "1.0", "aaaa") and not build_matches(t, "1.0", "bbbb") and not build_matches(t, "1.1", "aaaa")
    later = PackageTarget(name="fastmod", version="1.0", current_version="1.0", current_build="bbbb")
    assert build_matches(later, "1.0", "cccc") and not build_matches(later, "1.0", "bbbb")
    assert package_targets(LabFacts(packages=pk), {"kind": "package_restore", "package": "fastmod"})[0].build is None


def test_readiness_by_url_and_log_line_on_a_real_process(tmp_path):
    """server_ready: a health URL that answers, a log line after an offset, a process that is gone."""
    log = tmp_path / "server.log"
    log.write_text("old start: Uvicorn running\n")
    code = ("import http.server, sys; s = http.server.HTTPServer(('127.0.0.1', 0), http.server.SimpleHTTPRequestHandler); "
            "print('PORT', s.server_address[1], flush=True); print('Uvicorn running', flush=True); s.serve_forever()")
    with open(log, "a") as out:
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=out, cwd=tmp_path)
    try:
        port = int(p.stdout.readline().split()[1])
        r = Runner(LocalTransport())
        assert r.call("server_ready", {"pid": p.pid, "url": f"http://127.0.0.1:{port}/"}).output.state == "ready"
        assert r.call("server_ready", {"pid": p.pid, "url": f"http://127.0.0.1:{port}/missing"}).output.state == "waiting"
        size = os.path.getsize(log)
        assert r.call("server_ready", {"pid": p.pid, "log": str(log), "line": "Uvicorn running", "offset": 0}).output.state == "ready"
        assert r.call("server_ready", {"pid": p.pid, "log": str(log), "line": "Uvicorn running",
                                       "offset": size}).output.state == "waiting"
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
    assert Runner(LocalTransport()).call("server_ready", {"pid": p.pid}).output.state == "dead"


def test_import_roots_reads_a_pth_path_and_pythonpath_of_a_real_process(tmp_path):
    """A venv whose .pth points into the checkout, and PYTHONPATH into it: both found, both moved into the worktree."""
    from .conftest import make_venv

    repo = tmp_path / "repo"
    for pkg, where in (("infer", repo / "python"), ("extra", repo / "lib")):
        (where / pkg).mkdir(parents=True)
        (where / pkg / "__init__.py").write_text("")
    py = make_venv(tmp_path / "venv", pip=False)
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    (site / "__editable__.infer.pth").write_text(str(repo / "python") + "\n")
    elsewhere = tmp_path / "srv"
    elsewhere.mkdir()
    p = subprocess.Popen([str(py), "-c", "import time; time.sleep(60)"], cwd=elsewhere,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo / "lib")})
    try:
        o = Runner(LocalTransport()).call("import_roots", {"pid": p.pid, "python": str(py), "cwd": str(elsewhere),
                                                           "repo": str(repo), "modules": ["infer", "extra", "json"]})
        assert o.ok, o.error
        got = {m.module: (m.how, m.rel) for m in o.output.modules}
        assert got["infer"] == ("a .pth path", "python") and got["extra"] == ("PYTHONPATH", "lib")
        assert got["json"][1] is None and o.output.cwd_in_repo is None
        server = ServerInfo(pid=p.pid, argv=[str(py), "-m", "infer.serve"], cwd=str(elsewhere), entry="infer.serve")
        plan = plan_code_run(server, o.output, str(repo), "/tmp/wt", None, [])
        assert plan.mode == "server" and plan.run.path_first == ["/tmp/wt/python", "/tmp/wt/lib"]
        assert plan.run.cwd == str(elsewhere)  # the cwd is outside the checkout: it stays
    finally:
        p.kill()
        p.wait()
