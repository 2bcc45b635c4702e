"""A fleet over real sshd: simulated hosts served by `sim serve` (each its own sealed host), one odd host
per fleet. `debugagent fleet snapshot` reads them from an Ansible inventory, a host that cannot be
reached and one whose host key is unknown are each reported on their own line while the rest are read,
and `debugagent fleet diff` names the odd host and its field, and the benchmark outlier."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
from debugagent.tools.sim.serve import SSHD, start

from debugagent_testing import event_lines

pytestmark = [pytest.mark.ssh, pytest.mark.skipif(not Path(SSHD).is_file(), reason="needs Debian's openssh-server")]
ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "debugagent.agent.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def fleet(stack: ExitStack, tmp_path: Path, specs: dict[str, str], *, unknown_key: str | None = None,
          unreachable: str | None = None) -> tuple[Path, Path]:
    """Serve each host, and write an INI inventory (a group, host vars) and one known_hosts for them."""
    lines, keys = ["[gpus]"], []
    for name, spec in specs.items():
        s = stack.enter_context(start(spec))
        lines.append(f"{name} ansible_host=127.0.0.1 ansible_port={s.port} ansible_ssh_private_key_file={s.identity}")
        if name != unknown_key:
            keys.append(s.host_key_line)
        user = s.user
    if unreachable:
        lines.append(f"{unreachable} ansible_host=127.0.0.1 ansible_port={closed_port()}")
    lines += ["", "[gpus:vars]", f"ansible_user={user}"]
    inv = tmp_path / "inventory.ini"
    inv.write_text("\n".join(lines) + "\n")
    kh = tmp_path / "known_hosts"
    kh.write_text("\n".join(keys) + "\n")
    return inv, kh


def test_fleet_snapshot_and_diff_name_the_odd_host(tmp_path):
    specs = {"gpu-01": "power-capped@good", "gpu-02": "power-capped@good", "gpu-03": "power-capped",
             "gpu-04": "power-capped@good", "gpu-05": "power-capped@good"}
    with ExitStack() as stack:
        inv, kh = fleet(stack, tmp_path, specs, unknown_key="gpu-05", unreachable="gpu-06")
        out = tmp_path / "fleet"
        r = cli("fleet", "snapshot", "-i", str(inv), "-o", str(out), "--forks", "3", "--known-hosts", str(kh),
                "--connect-timeout", "5", "--bench-runs", "2")
    assert r.returncode == 4, r.stderr
    assert "Traceback" not in r.stderr
    assert "4 of 6 hosts read" in r.stderr
    assert "gpu-05: could not be read" in r.stderr and "unknown host key" in r.stderr
    assert "gpu-06: could not be read" in r.stderr and "refused" in r.stderr
    rec = json.loads((out / "fleet.json").read_text())
    assert {h["name"]: bool(h["file"]) for h in rec["hosts"]} == {"gpu-01": True, "gpu-02": True, "gpu-03": True,
                                                                   "gpu-04": True, "gpu-05": False, "gpu-06": False}
    assert {h["name"]: h["exit_code"] for h in rec["hosts"]}["gpu-05"] == 4
    assert (out / "gpu-03.json").stat().st_mode & 0o077 == 0

    d = cli("fleet", "diff", str(out), "--json", "--html", str(tmp_path / "fleet.html"))
    assert d.returncode == 1, d.stderr
    o = json.loads(d.stdout)
    split = {s["path"]: s for s in o["splits"]}
    assert split["gpus.0.power_limit"]["odd"] == {"gpu-03": 450.0}
    assert split["gpus.0.power_limit"]["majority"] == 700.0 and split["gpus.0.power_limit"]["majority_hosts"] == 3
    assert split["gpus.0.power_limit"]["hypothesis"] == "gpu_clocks"
    assert {h for s in o["splits"] for h in s["odd"]} == {"gpu-03"}
    assert o["bench"]["outliers"] == ["gpu-03"] and o["bench"]["metric"] == "decode"
    assert set(o["unread"]) == {"gpu-05", "gpu-06"}
    text = cli("fleet", "diff", str(out))
    assert text.returncode == 1
    assert "gpus.0.power_limit: 700 on 3 of 4; odd: gpu-03 450" in text.stdout
    assert "odd hosts: gpu-03" in text.stdout
    html = (tmp_path / "fleet.html").read_text()
    assert "gpu-03" in html and 'class="odd"' in html


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "path", "hypothesis"), [
    ("governor-powersave", "cpu.governor", "host_cpu"),
    ("driver-downgraded", "driver.version", "driver_cuda"),
])
def test_fleet_diff_finds_each_kind_of_odd_host(tmp_path, scenario, path, hypothesis):
    specs = {f"node-{i}": f"{scenario}@good" for i in range(1, 4)} | {"node-4": scenario}
    with ExitStack() as stack:
        inv, kh = fleet(stack, tmp_path, specs)
        out = tmp_path / "fleet"
        r = cli("fleet", "snapshot", "-i", str(inv), "-o", str(out), "--known-hosts", str(kh), "--bench-runs", "0")
    assert r.returncode == 0, r.stderr
    d = cli("fleet", "diff", str(out), "--json")
    assert d.returncode == 1
    o = json.loads(d.stdout)
    split = {s["path"]: s for s in o["splits"]}
    assert list(split[path]["odd"]) == ["node-4"], split
    assert split[path]["hypothesis"] == hypothesis


def test_a_fleet_that_agrees_exits_0(tmp_path):
    with ExitStack() as stack:
        inv, kh = fleet(stack, tmp_path, {"a": "power-capped@good", "b": "power-capped@good"})
        out = tmp_path / "fleet"
        assert cli("fleet", "snapshot", "-i", str(inv), "-o", str(out), "--known-hosts", str(kh),
                   "--bench-runs", "0").returncode == 0
    d = cli("fleet", "diff", str(out))
    assert d.returncode == 0, d.stdout + d.stderr
    assert "the hosts agree on every field compared" in d.stdout


def test_fleet_bad_input_is_exit_2_naming_it(tmp_path):
    bad = tmp_path / "inv.ini"
    bad.write_text("[gpus]\ngpu-1 ansible_port\n")
    r = cli("fleet", "snapshot", "-i", str(bad), "-o", str(tmp_path / "o"))
    assert r.returncode == 2 and f"{bad}:2" in r.stderr and "fix:" in r.stderr
    r = cli("fleet", "snapshot", "-i", "gpu-1,gpu-2,", "--limit", "db*", "-o", str(tmp_path / "o"))
    assert r.returncode == 2 and "matches no host" in r.stderr
    r = cli("fleet", "diff", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "no such folder" in r.stderr
    (tmp_path / "one").mkdir()
    r = cli("fleet", "diff", str(tmp_path / "one"))
    assert r.returncode == 2 and "at least 2" in r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium")
def test_fleet_html_holds_host_text_as_text(tmp_path):
    """A host name with markup is shown as text in the page, never run."""
    from debugagent.agent.fleet import FleetDiff, Split
    from debugagent.agent.fleet_render import render_html
    evil = '<img src=x onerror="document.title=\'pwned\'">'
    fd = FleetDiff(hosts=["ok", evil], reference="ok",
                   splits=[Split(path="server.args.x", hypothesis="serving_config", majority="a", majority_hosts=1,
                                 hosts=2, odd={evil: "<script>document.title='pwned'</script>"})])
    page = tmp_path / "f.html"
    page.write_text(render_html(fd))
    flags = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180).stdout
    assert "pwned" not in dom.split("<title>")[1].split("</title>")[0]
    assert "&lt;img src=x" in dom and "<img" not in dom


def test_run_with_a_peer_as_baseline_confirms_the_cause_on_the_slow_host(tmp_path):
    """`run --peer GOOD` on the fleet's package-rebuilt case: the healthy peer is read now (nothing changed on it), its
    benchmark runs alternate with the slow host's in the reproduce step (peer, host, peer, host, …) and are the
    baseline. No wheel of the peer's build is on the slow host: the experiment reads the peer's installed files of
    flashinfer (its RECORD), packs them into a wheel here, sends it to the host into a folder of the run's own, installs
    it in the overlay and confirms the rebuilt package; the peer is only read, the host's folders are removed by the
    undo. The run replays from its recording, the peer's calls included."""
    peer_name = "sim:eagle3-flashinfer-rebuilt@good"
    r = cli("run", "--host", "sim:eagle3-flashinfer-rebuilt", "--peer", peer_name, "--symptom", "verify 30ms",
            "--json", "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    assert o["root_cause"]["hypothesis"] == "compiled_dependency", o["summary"]
    assert f"the peer's build of flashinfer-python 0.5.3, read from {peer_name}" in o["root_cause"]["summary"]
    assert "pip install --force-reinstall --no-deps /tmp/flashinfer_python-0.5.3-" in o["root_cause"]["fix"]
    events = event_lines(tmp_path / "run" / "events.jsonl")
    peer = events[0]["baseline_snapshot_data"]
    assert peer["host"] == peer_name
    # the benchmark runs of the reproduce step, in the order they were made: the check's run (the host's first),
    # then peer and host alternating; the peer's values are the healthy twin's, the host's the rebuilt one's
    calls = {e["call_id"]: e for e in events if e["event"] == "tool_call"}
    runs = [(calls[e["call_id"]]["purpose"], e["output"]["value"]) for e in events
            if e["event"] == "tool_result" and calls[e["call_id"]]["tool"] == "bench" and calls[e["call_id"]]["hypothesis"] is None
            and calls[e["call_id"]]["purpose"] in ("peer", "reproduce")]
    kinds = [k for k, _ in runs]
    assert len(kinds) >= 4 and kinds == ["peer", "reproduce"] * (len(kinds) // 2), kinds
    assert all(v < 25 for k, v in runs if k == "peer") and all(v > 25 for k, v in runs if k == "reproduce")
    # no experiment starts before the reproduce step (and the peer's runs) is over; in the experiment the peer is
    # only read: one read of its package's files, never a change
    first_exp = min(i for i, e in enumerate(events) if e["event"] == "tool_call" and e.get("hypothesis"))
    peer_calls = [(i, e) for i, e in enumerate(events) if e["event"] == "tool_call" and e["purpose"] == "peer"]
    assert max(i for i, e in peer_calls if e["tool"] == "bench") < first_exp
    assert [e["tool"] for i, e in peer_calls if i > first_exp] == ["dist_files"]
    sent = [e for e in events if e["event"] == "tool_call" and e["tool"] == "write_chunk"]
    assert sent and all(e["purpose"] == "experiment" for e in sent)
    folder = sent[0]["input"]["path"].rsplit("/", 1)[0]
    assert any(e["event"] == "tool_call" and e["tool"] == "remove_tree" and e["input"]["path"] == folder
               and e["purpose"] == "undo" for e in events)
    wheels = list((tmp_path / "run" / "peer-wheels").glob("flashinfer_python-0.5.3-*.whl"))
    assert len(wheels) == 1
    import zipfile
    with zipfile.ZipFile(wheels[0]) as z:
        names = z.namelist()
        assert names[-1] == "flashinfer_python-0.5.3.dist-info/RECORD" and z.testzip() is None
        assert any(n.endswith(".so") for n in names)
    reg = o["regression"]
    assert reg["peer"]["interleaved"] is True and reg["peer"]["host"] == peer_name
    assert reg["peer"]["samples"] == [v for k, v in runs if k == "peer"]
    assert "interleaved" in reg["baseline_source"]
    md = (tmp_path / "run" / "transcript.md").read_text()
    assert "Interleaved runs (peer, host alternating)" in md
    assert f"the peer's build of flashinfer-python 0.5.3, read from {peer_name}" in md
    rp = cli("replay", str(tmp_path / "run"))
    assert rp.returncode == 0, rp.stdout + rp.stderr


def test_peer_bad_input(tmp_path):
    r = cli("run", "--host", "sim:power-capped", "--peer", "sim:power-capped", "--symptom", "decode 74 tok/s")
    assert r.returncode == 2 and "is the host itself" in r.stderr
    r = cli("run", "--host", "sim:power-capped", "--peer", "sim:power-capped@good", "--baseline", "decode 89 tok/s",
            "--symptom", "decode 74 tok/s")
    assert r.returncode == 2 and "both given" in r.stderr
    r = cli("run", "--host", "sim:power-capped", "--peer", "sim:", "--symptom", "decode 74 tok/s")
    assert r.returncode == 2


def test_a_host_whose_benchmark_fails_is_named(tmp_path):
    """Hosts read but whose benchmark gives no number: each named on its own line and in fleet.json."""
    with ExitStack() as stack:
        inv, kh = fleet(stack, tmp_path, {"a": "power-capped@good", "b": "power-capped@good"})
        out = tmp_path / "fleet"
        r = cli("fleet", "snapshot", "-i", str(inv), "-o", str(out), "--known-hosts", str(kh), "--bench",
                "echo no number here", "--metric", "decode", "--bench-runs", "1")
    assert r.returncode == 0, r.stderr
    assert "a: read (a.json), but its benchmark gave no numbers" in r.stderr
    assert "b: read (b.json), but its benchmark gave no numbers" in r.stderr
    rec = json.loads((out / "fleet.json").read_text())
    assert all(h["bench_failed"] for h in rec["hosts"])


@pytest.mark.skipif(not (Path(sys.executable).parent / "ansible").is_file() and not shutil.which("ansible"),
                    reason="needs ansible-core (pip install ansible-core)")
def test_fleet_snapshot_through_ansible(tmp_path):
    """`fleet snapshot --via ansible`: the same snapshots, their commands sent by a real `ansible -m raw` over the
    same inventory (its own ssh, host keys checked against the fleet's known_hosts); `fleet diff` reads them and
    names the odd host. A host Ansible cannot reach is named with Ansible's message; the rest are read."""
    import os
    specs = {"gpu-01": "power-capped@good", "gpu-02": "power-capped@good", "gpu-03": "power-capped"}
    with ExitStack() as stack:
        inv, kh = fleet(stack, tmp_path, specs, unreachable="gpu-04")
        out = tmp_path / "fleet"
        env_path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
        r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "fleet", "snapshot", "--via", "ansible",
                            "-i", str(inv), "-o", str(out), "--known-hosts", str(kh), "--connect-timeout", "5",
                            "--bench-runs", "0"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                           env={**os.environ, "PATH": env_path})
    assert r.returncode == 4, r.stderr
    assert "Traceback" not in r.stderr
    assert "3 of 4 hosts read" in r.stderr and "through ansible -m raw" in r.stderr
    assert "gpu-04: could not be read: ansible:" in r.stderr
    rec = json.loads((out / "fleet.json").read_text())
    assert {h["name"]: bool(h["file"]) for h in rec["hosts"]} == {"gpu-01": True, "gpu-02": True, "gpu-03": True,
                                                                   "gpu-04": False}
    snap = json.loads((out / "gpu-03.json").read_text())
    assert snap["gpus"][0]["power_limit"] == 450.0 and snap["gpus"][0]["sm_clock"]   # read under the benchmark's load
    d = cli("fleet", "diff", str(out), "--json")
    assert d.returncode == 1, d.stderr
    o = json.loads(d.stdout)
    split = {s["path"]: s for s in o["splits"]}
    assert split["gpus.0.power_limit"]["odd"] == {"gpu-03": 450.0}
    assert {h for s in o["splits"] for h in s["odd"]} == {"gpu-03"}
