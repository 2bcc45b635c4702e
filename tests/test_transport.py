"""Transports: results are values, timeouts cut the command, bytes never crash."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest
from debugagent.tools.errors import UnknownCommand
from debugagent.tools.replay import ReplayTransport
from debugagent.tools.transport import BaseTransport, FakeTransport, LocalTransport, Transport

AGENT = Path(__file__).resolve().parents[1] / "agent"


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
    """The fake answers from its handler and raises UnknownCommand, naming it, for what it does not know."""
    def handler(cmd: str):
        if cmd == "hostname":
            return "box\n"
        raise KeyError(cmd)
    t = FakeTransport(handler)
    assert t.run("hostname").stdout == "box\n"
    with pytest.raises(UnknownCommand) as e:
        t.run("rm -rf /")
    assert e.value.command == "rm -rf /" and "'rm -rf /'" in str(e.value) and e.value.host == "fake"
    assert t.calls == ["hostname", "rm -rf /"]


def test_fake_transport_answers_from_a_mapping():
    """A mapping of command to answer drives the fake; a command it lacks is refused, never answered."""
    t = FakeTransport({"hostname": "box\n", "false": ("", "no\n", 1)}, host="box")
    assert t.run("hostname").stdout == "box\n" and t.run("false").exit_code == 1
    with pytest.raises(UnknownCommand, match="uptime"):
        t.run("uptime")


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

    from debugagent.tools.host import FindServers, parse_find_servers
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


def test_every_transport_declares_the_protocol():
    """Local, fake and replay transports carry every capability the agent reads, with honest defaults."""
    replay = ReplayTransport([{"event": "run_started", "host": "sim:x"}])
    for t in (LocalTransport(), FakeTransport({}), replay):
        assert isinstance(t, Transport)
        assert (t.reconnects, t.instance, t.sandbox) == (0, "", False)
    assert LocalTransport().live and not replay.live and not LocalTransport().supports_retry
    heard = []
    t = LocalTransport()
    t.on_event("reconnected", "nobody listens")   # the default sink takes the event and drops it
    t.on_event = lambda kind, text: heard.append(kind)
    t.on_event("hung", "x")
    assert heard == ["hung"] and BaseTransport().on_event("k", "t") is None


def _probes_on_a_transport(source: str, name: str) -> list[str]:
    """``getattr``/``hasattr`` calls in ``source`` whose object is spelled with "transport"."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and node.args and "transport" in ast.unparse(node.args[0]).lower():
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_agent_reads_transport_capabilities_only_from_the_protocol():
    """No getattr/hasattr on a transport in agent/: every capability it uses is declared on the protocol."""
    sample = "n = getattr(r.transport, 'reconnects', 0)\nif hasattr(transport, 'on_event'):\n    pass\ngetattr(self, 'x')\n"
    assert len(_probes_on_a_transport(sample, "sample.py")) == 2   # the check sees what it looks for
    found = [hit for f in sorted(AGENT.glob("*.py")) for hit in _probes_on_a_transport(f.read_text(), f.name)]
    assert found == []
