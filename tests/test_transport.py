"""Transports: results are values, timeouts cut the command, bytes never crash."""

from __future__ import annotations

import time

from tools.transport import FakeTransport, LocalTransport


def test_nonzero_exit_is_data():
    """A failing command returns its exit code; nothing is raised."""
    r = LocalTransport().run("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr.strip(), r.exit_code, r.ok) == ("out\n", "err", 3, False)


def test_timeout_cuts_the_command_and_its_children():
    """A hanging command is cut at its timeout, reported as such, and its children die."""
    t = time.monotonic()
    r = LocalTransport().run("sleep 30 & sleep 30; echo never", timeout=0.5)
    assert time.monotonic() - t < 5
    assert r.timed_out and r.exit_code == 124
    assert "cut at its timeout" in r.stderr


def test_non_utf8_output_is_replaced():
    """Bytes that are not UTF-8 become U+FFFD."""
    r = LocalTransport().run("printf 'a\\377b'")
    assert r.stdout == "a\ufffdb"


def test_output_cap_marks_truncated():
    """Output past the cap is left out from the middle (the start and the metric line at the end stay),
    and the result says so."""
    r = LocalTransport().run("echo START; head -c 100000 /dev/zero; echo; echo verify=3.1 ms", max_output=1000)
    assert r.truncated and r.stdout.startswith("START\n") and r.stdout.endswith("\nverify=3.1 ms\n")
    assert "bytes of output left out here" in r.stdout and len(r.stdout) < 1100


def test_both_streams_are_read_together():
    """A command filling stderr while stdout waits does not deadlock."""
    r = LocalTransport().run("head -c 3000000 /dev/zero >&2; echo done", timeout=20)
    assert r.stdout == "done\n" and len(r.stderr) == 3000000


def test_fake_transport_refuses_unknown_commands():
    """The fake answers from its handler and refuses what it does not know."""
    def handler(cmd: str):
        if cmd == "hostname":
            return "box\n"
        raise KeyError(cmd)
    t = FakeTransport(handler)
    assert t.run("hostname").stdout == "box\n"
    assert t.run("rm -rf /").exit_code == 127
    assert t.calls == ["hostname", "rm -rf /"]


def test_run_many_keeps_order_and_runs_concurrently():
    """Independent commands run at once and come back in order."""
    t = time.monotonic()
    rs = LocalTransport().run_many([f"sleep 0.3; echo {i}" for i in range(4)])
    assert [r.stdout.strip() for r in rs] == ["0", "1", "2", "3"]
    assert time.monotonic() - t < 1.0


def test_find_servers_finds_a_process_and_never_itself():
    """On this machine's real /proc: the pattern finds a matching process, and neither the probe's
    own shell nor a helper process is reported (patterns may contain spaces)."""
    import subprocess

    from tools.host import FindServers, parse_find_servers
    marker = "30.4242"
    p = subprocess.Popen(["sleep", marker])
    try:
        r = LocalTransport().run(FindServers(pattern=f"sleep {marker}").command())
        found = parse_find_servers(r.stdout)
        assert [x.pid for x in found] == [p.pid]
        assert found[0].argv == ["sleep", marker]
        assert r.stderr == ""
    finally:
        p.kill()
        p.wait()
