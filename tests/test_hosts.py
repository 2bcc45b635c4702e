"""`--host` through the table of transports (agent/hosts.py): each value goes to its scheme, a bad one is exit 2
with the fix before anything connects, and a new scheme is one `register` call."""

from __future__ import annotations

import subprocess
import sys

import pytest
from debugagent.agent.cli import HOST_HELP
from debugagent.agent.hosts import (
    SCHEMES,
    HostScheme,
    check_host,
    host_help,
    open_transport,
    registered,
    scheme_of,
)
from debugagent.agent.run import RunConfig, investigate
from debugagent.tools.errors import UsageError
from debugagent.tools.transport import LocalTransport


@pytest.mark.parametrize("host,scheme,rest", [
    ("local", "local", ""), ("sim:power-capped", "sim", "power-capped"), ("sim:x@good", "sim", "x@good"),
    ("root@10.0.0.1:2222", "ssh", "root@10.0.0.1:2222"), ("gpu-box", "ssh", "gpu-box"), ("sim", "ssh", "sim"),
    ("ssh:sim:2222", "ssh", "sim:2222"), ("root@[::1]:22", "ssh", "root@[::1]:22"), ("fe80::1", "ssh", "fe80::1"),
    ("docker:vllm", "docker", "vllm"), ("podman:sglang", "podman", "sglang"), ("k8s:ns/pod/c", "k8s", "ns/pod/c"),
    ("nsenter:42", "nsenter", "42"), ("ssh:docker:2222", "ssh", "docker:2222"),
])
def test_each_host_goes_to_its_scheme(host, scheme, rest):
    """A known scheme before the colon picks its transport, a bare `local` is local, anything else is SSH (and
    `ssh:` in front says so where a host's name reads as a scheme)."""
    s, r = scheme_of(host)
    assert (s.name, r) == (scheme, rest)


@pytest.mark.parametrize("host,says", [
    ("root@127.0.0.1:99999", "out of range"), ("root@[::1", "without its `]`"), ("root@[::1]x", "after `]`"),
    ("root@[::1]:", "not a number"), ("root@host:ssh", "not a number"), ("root@", "no host"),
    ("-oProxyCommand=x", "cannot start with `-`"), ("", "empty"), ("  ", "empty"), ("sim:", "no scenario"),
    ("sim:@good", "no scenario"), ("root@127.0.0.1:0", "out of range"),
])
def test_a_host_that_can_never_work_is_exit_2_with_the_fix(host, says):
    with pytest.raises(UsageError) as e:
        check_host(host)
    assert says in e.value.message and e.value.fix and e.value.exit_code == 2


@pytest.mark.parametrize("host", ["root@127.0.0.1:99999", "root@[::1"])
def test_bad_host_strings_exit_2_from_the_command_line(host, tmp_path):
    """Before anything connects, and before the run folder is made (these used to be exit 4, connection refused)."""
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "run", "--host", host, "--symptom", "verify 30ms",
                        "--baseline", "verify 20ms", "--out", str(tmp_path / "r")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--host" in r.stderr and "fix:" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "r").exists()


def test_the_host_help_names_every_scheme():
    assert HOST_HELP["host"] == host_help()
    assert host_help() == ("user@host[:port], an ~/.ssh/config alias, `local`, sim:NAME[@good] / sim:PATH.yaml, docker:NAME, "
                           "podman:NAME, k8s:NAMESPACE/POD[/CONTAINER], or nsenter:PID")
    for s in SCHEMES.values():
        assert s.form in host_help()


def test_a_new_transport_is_one_register_call(tmp_path):
    """A throwaway scheme `twin:NAME` (a simulated host under another name), registered and nothing else: its
    values are checked by it, opened by it, named in the --host help, and a whole run goes through it."""
    opened = []

    def open_twin(rest, ssh):
        from debugagent.tools.sim import SimTransport
        opened.append(rest)
        return SimTransport(f"sim:{rest}")

    def check_twin(rest):
        if not rest:
            raise UsageError("--host twin: no name", fix="give twin:NAME")

    with registered(HostScheme("twin", "twin:NAME", open_twin, check_twin)):
        assert "twin:NAME" in host_help()
        with pytest.raises(UsageError, match="no name"):
            check_host("twin:")
        out = investigate(RunConfig(host="twin:power-capped", symptom="decode 74 tok/s", baseline="decode 89 tok/s",
                                    as_json=True, out=str(tmp_path / "run")))
        assert out["root_cause"]["hypothesis"] == "gpu_clocks" and out["exit_code"] == 0
        assert opened == ["power-capped"]
    assert "twin" not in SCHEMES and "twin" not in host_help()
    with pytest.raises(UsageError, match="not a number"):   # gone: `twin:power-capped` is SSH again
        check_host("twin:power-capped")


def test_registered_puts_back_what_it_replaced():
    before = SCHEMES["local"]
    with registered(HostScheme("local", "`local`", lambda rest, o: LocalTransport(), bare=True)) as s:
        assert SCHEMES["local"] is s
    assert SCHEMES["local"] is before
    with open_transport("local") as t:
        assert t.run("echo hi").stdout == "hi\n"
