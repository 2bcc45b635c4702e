"""Who a server runs as: read from /proc of real processes, set by the restart only where it differs from the
restarting shell (the command is then today's, byte for byte), checked "as found" after the undo."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid

import pytest
from debugagent.agent.lab import asfound
from debugagent.tools import mutate
from debugagent.tools.registry import Runner
from debugagent.tools.replay import legacy_command
from debugagent.tools.transport import LocalTransport
from pydantic import ValidationError

NOBODY = 65534
# server_control's command as the kept recordings hold it (before it read who the server runs as)
RECORDED_CONTROL = (
    "p=/proc/7; [ -r $p/cmdline ] || { echo 'no such process'; exit 1; }; "
    "echo '== cgroup'; cat $p/cgroup 2>/dev/null; echo '== self_cgroup'; cat /proc/self/cgroup 2>/dev/null; "
    "echo '== parent'; pp=$(awk '{print $4}' $p/stat 2>/dev/null); echo \"$pp\"; cat /proc/$pp/comm 2>/dev/null; "
    "tr '\\0' ' ' < /proc/$pp/cmdline 2>/dev/null; echo; "
    "echo '== container_env'; tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -E '^container=' ; "
    "echo '== stdout'; readlink $p/fd/1 2>/dev/null; echo '== end'"
)


def as_nobody() -> list[str]:
    return ["prlimit", "--nofile=4096:4096", "--", "nice", "-n", "5", "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
            "--init-groups", "--", "sh", "-c", 'umask 027; exec "$@"', "sh"]


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("prlimit")
                                or not os.path.exists("/usr/bin/python3"),
                                reason="starts a process as nobody: needs root, setpriv, prlimit and /usr/bin/python3")


@pytest.fixture
def sleeper():
    """Start ``python3 -c 'sleep' TAG`` (as the prefix says); every one is killed afterwards."""
    procs: list[subprocess.Popen] = []

    def start(prefix: list[str], tag: str) -> int:
        p = subprocess.Popen([*prefix, "/usr/bin/python3",
                              "-c", "import time; time.sleep(60)", tag], cwd="/", stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(p)
        deadline = time.monotonic() + 10
        while not open(f"/proc/{p.pid}/cmdline", "rb").read().startswith(b"/usr/bin/python3\0-c"):   # the chain exec'd
            assert time.monotonic() < deadline
            time.sleep(0.02)
        return p.pid

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


@needs_root
def test_server_control_reads_who_a_real_process_runs_as_beside_the_shell(sleeper):
    tag = f"ident-{uuid.uuid4().hex[:8]}"
    pid = sleeper(as_nobody(), tag)
    o = Runner(LocalTransport()).call("server_control", {"pid": pid})
    assert o.ok, o.error
    ctl = o.output
    assert ctl.identity is not None and ctl.shell_identity is not None
    assert (ctl.identity.uid, ctl.identity.gid, ctl.identity.groups) == (NOBODY, NOBODY, [NOBODY])
    assert ctl.identity.umask == "0027" and ctl.identity.nice == 5 and ctl.identity.limits["nofile"] == ["4096", "4096"]
    assert ctl.shell_identity.uid == 0 and ctl.shell_identity.nice == os.nice(0)
    run_as = ctl.run_as()
    assert run_as is not None and run_as.uid == NOBODY and run_as.umask == "0027" and run_as.nice == 5
    assert run_as.limits["nofile"] == ["4096", "4096"]
    assert set(run_as.limits) == {k for k, v in ctl.identity.limits.items() if ctl.shell_identity.limits[k] != v}
    # the restart sets each of them, the pid staying the server's: umask in a subshell, then prlimit, nice, setpriv
    cmd = mutate.RestartServer(pid=pid, argv=["x"], cwd="/", env_file="/tmp/debugagent-t.env", run_as=run_as).command()
    for part in ("umask 0027; exec prlimit", "--nofile=4096:4096", "nice -n $((5 - $(nic $$)))",
                 f"setpriv --reuid={NOBODY} --regid={NOBODY} --groups={NOBODY} -- setsid nohup env -i"):
        assert part in cmd, part


def test_a_server_found_as_the_shell_is_restarted_by_todays_command_byte_for_byte():
    """Root serving as root (every simulated host, every kept recording): nothing to set, the script is unchanged."""
    me = mutate.parse_identity(subprocess.run(["bash", "-c", mutate.identity_lines("/proc/$$")], capture_output=True,
                                              text=True).stdout.splitlines())
    assert me is not None and me.uid == os.geteuid() and me.limits
    assert mutate.RunAs.of(me, me.model_copy()) is None and mutate.RunAs.of(me, None) is None
    inp = {"pid": 12, "argv": ["python3", "-m", "srv"], "cwd": "/srv", "env_file": "/tmp/debugagent-r-12.env",
           "save_env": True, "pid_file": "/tmp/debugagent-r-12.pid"}
    assert mutate.RestartServer(**inp).command() == mutate.RestartServer(**inp, run_as=None).command()
    assert "setpriv" not in mutate.RestartServer(**inp).command()
    # server_control reads who the server runs as; a recording made before that still keys alike
    assert legacy_command(mutate.ServerControl(pid=7).command()) == RECORDED_CONTROL


def test_a_journalled_identity_that_is_not_one_is_refused():
    """The undo's restart reads run_as from the journal: only numbers, an octal umask and prlimit's names pass."""
    for bad in ({"umask": "022; rm -rf /"}, {"limits": {"nofile; id": ["1", "1"]}}, {"limits": {"nofile": ["1 -- id", "1"]}},
                {"nice": 40}, {"uid": -1}, {"groups": ["0,1"]}, {"shell": "x"}):
        with pytest.raises(ValidationError):
            mutate.RunAs.model_validate(bad)


@needs_root
def test_a_server_restored_as_another_user_is_not_as_found_and_the_difference_is_named(sleeper):
    """The as-found check compares who each server process runs as: one found as nobody (nice 5, umask 027, NOFILE
    4096) that came back as root is a difference naming uid, nice, umask and nofile, and the fix names them."""
    tag = f"ident-{uuid.uuid4().hex[:8]}"
    run = lambda c: LocalTransport().run(c)  # noqa: E731
    digest = lambda b: b.hex()[:32]  # noqa: E731
    pattern = asfound.ere_literal(tag)
    pid = sleeper(as_nobody(), tag)
    before = asfound.read(run, "server", {"pattern": pattern}, digest)
    assert before is not None and before["servers"][0]["identity"]["uid"] == NOBODY
    os.kill(pid, 9)
    sleeper(["sh", "-c", 'exec "$@"', "sh"], tag)   # as the root session would start it without run_as
    after = asfound.read(run, "server", {"pattern": pattern}, digest)
    assert after is not None
    diffs = asfound.compare("server", before, after)
    assert len(diffs) == 1, [d.line() for d in diffs]
    text = diffs[0].text
    assert "it runs as uid 0" in text and f"found uid {NOBODY}" in text
    for part in ("nice 0", "nice 5", "umask 0022", "umask 0027", "nofile 4096:4096"):
        assert part in text, (part, text)
    assert f"as uid {NOBODY}" in diffs[0].fix
    # the same identity again: as found
    again = asfound.read(run, "server", {"pattern": pattern}, digest)
    assert asfound.compare("server", after, again) == []


def test_root_with_or_without_its_own_gid_as_a_supplementary_group_is_the_same_identity():
    """sshd gives root's shell group 0, a server a program started as root often has none: nothing to set."""
    shell = mutate.Identity(uid=0, gid=0, groups=[0], umask="0022", nice=0, limits={"nofile": ["1024", "4096"]})
    server = shell.model_copy(update={"groups": []})
    assert mutate.RunAs.of(server, shell) is None and server.differs(shell) == set()
    other = server.model_copy(update={"groups": [44]})
    assert mutate.RunAs.of(other, shell) == mutate.RunAs(uid=0, gid=0, groups=[44]) and other.differs(shell) == {"groups"}


def test_a_session_that_cannot_start_the_server_as_found_says_what_it_cannot_set():
    """Not root: another user, a lower nice or a higher hard limit cannot be set (the restart is refused before any
    change); a umask, a higher nice and a lower limit can."""
    shell = mutate.Identity(uid=1000, gid=1000, groups=[1000], umask="0022", nice=0, limits={"nofile": ["1024", "4096"]})
    server = mutate.Identity(uid=NOBODY, gid=NOBODY, groups=[NOBODY], umask="0027", nice=-5,
                             limits={"nofile": ["8192", "8192"]})
    run_as = mutate.RunAs.of(server, shell)
    assert run_as is not None
    assert run_as.needs_root(shell) == [f"uid {NOBODY}", f"gid {NOBODY}, groups {NOBODY}", "nice -5",
                                        "nofile hard limit 8192"]
    mild = mutate.RunAs.of(shell.model_copy(update={"umask": "0027", "nice": 5, "limits": {"nofile": ["512", "512"]}}),
                           shell)
    assert mild is not None and mild.needs_root(shell) == [] and mild.fields() == {"umask", "nice", "limit:nofile"}
    assert mild.needs_root(shell.model_copy(update={"uid": 0})) == []
