"""Who a server runs as, on a real host: a server the test starts as ``nobody`` (nice 5, umask 027, NOFILE 4096)
is restarted by an experiment and by its undo as ``nobody`` again, with the same nice, umask and limits."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import BENCH, SERVE, Host, free_port

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"   # one every account can run (this venv's may lie under /root)

# the server notes who it runs as when it starts, in the file $IDLOG (writable by every account)
RECORD = '''import json as _j, os as _o, resource as _r, sys as _s
_m = _o.umask(0); _o.umask(_m)
with open(_o.environ["IDLOG"], "a") as _f:
    _f.write(_j.dumps({"pid": _o.getpid(), "uid": _o.geteuid(), "gid": _o.getegid(), "groups": sorted(_o.getgroups()),
                       "nice": _o.nice(0), "umask": _m, "nofile": list(_r.getrlimit(_r.RLIMIT_NOFILE)),
                       "argv": _s.argv[1:]}) + "\\n")
'''

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("prlimit")
                                or not os.path.exists(SYSTEM_PYTHON),
                                reason="starts a server as nobody: needs root, setpriv, prlimit and /usr/bin/python3")


def own_cgroup() -> tuple[str, Path] | None:
    """A cgroup of the test's own (``CONTROLLERS:PATH`` and its folder): cgroup v1's pids hierarchy, or v2's; None
    where this machine lets none be made."""
    for ctrl, mnt in (("pids", Path("/sys/fs/cgroup/pids")), ("", Path("/sys/fs/cgroup/unified")),
                      ("", Path("/sys/fs/cgroup"))):
        if not (mnt / "cgroup.procs").exists():
            continue
        d = mnt / f"debugagent-test-{os.getpid()}"
        try:
            d.mkdir(exist_ok=True)
        except OSError:
            continue
        return f"{ctrl}:/{d.name}", d
    return None


class NobodyHost(Host):
    """The test's server as ``nobody``, with nice 5, umask 027 and NOFILE 4096:4096 (none of them the test's own),
    in a cgroup of its own where one can be made."""

    cgroup: tuple[str, Path] | None = None

    def start(self) -> None:
        (self.dir / "bench.py").write_text(BENCH)
        join = f"echo $$ > {self.cgroup[1]}/cgroup.procs; " if self.cgroup else ""
        as_nobody = ["sh", "-c", join + 'exec "$@"', "sh",
                     "prlimit", "--nofile=4096:4096", "--", "nice", "-n", "5", "setpriv", f"--reuid={NOBODY}",
                     f"--regid={NOBODY}", "--init-groups", "--", "sh", "-c", 'umask 027; exec "$@"', "sh"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([*as_nobody, *self.argv()], cwd=self.cwd, env=self.server_env(), stdout=log,
                                         stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        self.wait_ready()


@pytest.fixture
def nobody_host():
    """A host folder every account can read (pytest's own tmp folder is root's alone), its server killed after."""
    d = Path(tempfile.mkdtemp(prefix="debugagent-test-ident-"))
    d.chmod(0o755)
    h = NobodyHost(dir=d, port=free_port(), python=SYSTEM_PYTHON)
    h.cwd = d / "srv"
    h.write_code(h.cwd)
    (h.cwd / "infer" / "serve.py").write_text(RECORD + SERVE)
    ids = d / "ids.log"
    ids.touch()
    ids.chmod(0o666)
    h.log.touch()
    h.log.chmod(0o666)
    h.env = {"IDLOG": str(ids)}
    h.cgroup = own_cgroup()
    yield h
    h.stop()
    shutil.rmtree(d, ignore_errors=True)
    if h.cgroup:
        for _ in range(50):   # a cgroup is removed once its last process has gone
            try:
                h.cgroup[1].rmdir()
                break
            except OSError:
                import time
                time.sleep(0.1)


def started(h: Host) -> list[dict]:
    return [json.loads(line) for line in (h.dir / "ids.log").read_text().splitlines()]


def who(pid: int) -> dict:
    """The identity of a live process, from /proc."""
    status = dict(ln.split(":", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in ln)
    stat = Path(f"/proc/{pid}/stat").read_text()
    nofile = next(ln.split()[3:5] for ln in Path(f"/proc/{pid}/limits").read_text().splitlines()
                  if ln.startswith("Max open files"))
    return {"uid": int(status["Uid"].split()[1]), "umask": int(status["Umask"].strip(), 8),
            "nice": int(stat[stat.rindex(")") + 2:].split()[16]), "nofile": [int(x) for x in nofile]}


@needs_root
@pytest.mark.slow
def test_a_restarted_and_a_restored_server_keep_the_found_uid_nice_umask_and_limits(nobody_host, tmp_path):
    """The flag experiment restarts the nobody server without --disable-cuda-graph, the undo restarts it as found:
    both run as nobody with nice 5, umask 027 and NOFILE 4096, not as the root session (uid 0, nice 0, umask 022,
    NOFILE 20000)."""
    h = nobody_host
    h.flags = ["--disable-cuda-graph"]   # costs 20 ms a request: the good state is the server without it
    h.start()
    found = {"uid": NOBODY, "umask": 0o027, "nice": 5, "nofile": [4096, 4096]}
    assert who(h.server_pid()) == found
    me = {"uid": os.geteuid(), "umask": os.umask(0o022), "nice": os.nice(0),
          "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE))}
    os.umask(me["umask"])
    assert all(me[k] != found[k] for k in found), "the test's own identity must differ from the server's in each field"
    bad = h.baseline(3)

    o = h.run("--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {bad - 20.0:.2f} ms",
              "--reproduce-runs", "3", out=tmp_path / "run")

    assert o["exit"] in (0, 3), o["summary"]   # never 6: the host is as found, who the server runs as included
    runs = started(h)
    assert len(runs) >= 3, runs   # as found, the experiment's restart, the undo's
    assert any("--disable-cuda-graph" not in r["argv"] for r in runs[1:]), "no experiment restarted the server"
    for r in runs:
        assert {k: r[k] for k in found} == found, r
        assert r["gid"] == NOBODY and r["groups"] == [NOBODY], r
    h.wait_ready()
    pid = h.server_pid()
    assert who(pid) == found and "--disable-cuda-graph" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    restarts = [e["input"] for e in o["events"] if e["event"] == "tool_call" and e["tool"] == "restart_server"]
    assert restarts and all(i["run_as"]["uid"] == NOBODY and i["run_as"]["nice"] == 5 and i["run_as"]["umask"] == "0027"
                            and i["run_as"]["limits"]["nofile"] == ["4096", "4096"] for i in restarts)
    if h.cgroup:   # the restarted and the restored server joined the cgroup the server was found in
        assert all(i["run_as"]["cgroup"] == [h.cgroup[0]] for i in restarts), restarts
        assert h.cgroup[0] in [ln.split(":", 1)[1] for ln in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
        assert all(str(r["pid"]) in (h.cgroup[1] / "cgroup.procs").read_text().split() for r in runs[-1:])
    assert not [n for n in os.listdir("/tmp") if o["run_id"] in n]


SITECUSTOMIZE = '''import json, os, sys
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "site.log"), "a") as f:
    f.write(json.dumps({"uid": os.geteuid(), "gid": os.getegid(), "argv": sys.argv}) + "\\n")
'''


@needs_root
def test_the_package_probe_runs_the_server_s_interpreter_with_its_path_as_the_server_s_user(nobody_host, tmp_path):
    """A sitecustomize.py on the nobody server's PYTHONPATH runs whenever its interpreter starts with that path: when
    `debugagent snapshot` lists the server's packages it runs as nobody, never as the root session."""
    h = nobody_host
    site = h.dir / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    os.chown(site, NOBODY, NOBODY)
    log = h.dir / "site.log"
    log.touch()
    log.chmod(0o666)
    h.env = {**h.env, "PYTHONPATH": str(site)}
    h.start()
    cli = Path(sys.executable).parent / "debugagent"
    out = tmp_path / "snap.json"
    r = subprocess.run([str(cli), "snapshot", "--host", "local", "--server-pattern", h.pattern, "-o", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=h.dir)
    assert r.returncode == 0, r.stderr[-2000:]
    snap = json.loads(out.read_text())
    assert snap["python"] == SYSTEM_PYTHON and snap["packages"]["packages"] is not None
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    probes = [x for x in runs if x["argv"][:1] == ["-c"]]   # the package probe: `python -c SCRIPT`
    assert probes, runs
    assert all(x["uid"] == NOBODY and x["gid"] == NOBODY for x in probes), probes
