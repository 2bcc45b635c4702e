"""A simulated host that runs the server's container (``host.container.connect: host``): debugagent, on the host,
finds the server in the container by its cgroup, reads the container through the runtime's CLI (answered by the
host's simulated runtime) and tests a variable by recreating the container without it (``--allow-container-recreate``),
the undo putting the very container back. The host's snapshots make the same scenario again
(``sim from-snapshots`` carries the container), whose run concludes the same. The reports' container hosts, sealed and
not, are diagnosed by ``bench/scenarios --reports --seal both`` (docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from debugagent.agent.run import RunOptions, investigate
from debugagent.tools.errors import ScenarioError
from debugagent.tools.registry import Runner
from debugagent.tools.sim import SimTransport, parse_scenario
from debugagent.tools.sim.fromsnap import scenario_from_snapshots
from debugagent.tools.snapshot import collect, dump

REPORT = Path(__file__).parent / "scenarios" / "reports" / "docker-host-vllm-attention-backend-env.yaml"


def test_a_container_host_round_trips_and_is_diagnosed_by_recreating_the_container(tmp_path):
    snaps = {}
    for which in ("good", "bad"):
        with SimTransport(f"sim:{REPORT}" + ("@good" if which == "good" else "")) as t:
            snaps[which] = collect(Runner(t), bench_runs=2)
            if which == "bad":   # the runtime's CLI on the host answers for the container the server runs in
                ps = t.run("docker ps --format '{{.Names}} {{.Image}}'")
                assert ps.exit_code == 0 and ps.stdout == "vllm vllm/vllm-openai:v0.10.2\n", ps
                pid = t.run("docker inspect -f '{{.State.Pid}}' vllm").stdout.strip()
                assert t.run(f"cat /proc/{pid}/cgroup").stdout.startswith("0::/system.slice/docker-")
                assert t.run("docker inspect nope").exit_code == 1
    good_path = tmp_path / "good.json"
    sc, _notes = scenario_from_snapshots(snaps["good"], snaps["bad"], name="rt", expect="env_var")
    cont = sc["host"]["container"]
    assert cont["runtime"] == "docker" and cont["connect"] == "host" and len(cont["id"]) == 64, cont
    assert [f["path"] for f in sc["factors"]] == ["server.env.VLLM_ATTENTION_BACKEND"]
    out = tmp_path / "rt.yaml"
    out.write_text(yaml.safe_dump(sc, sort_keys=False))
    parse_scenario(out.read_text(), str(out))
    # the run as the real one was made: against a snapshot of the made scenario's good state
    with SimTransport(f"sim:{out}@good") as t:
        good_path.write_text(dump(collect(Runner(t), bench_runs=3)))
    res = investigate(RunOptions(host=f"sim:{out}", symptom=sc["symptom"], baseline_snapshot=str(good_path),
                                 allow_container_recreate=True, as_json=True, out=str(tmp_path / "run")))
    rc = res["root_cause"]
    assert res["exit_code"] == 0 and rc and rc["hypothesis"] == "env_var" and rc["how"] == "experiment", res["summary"]
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    tools = [e.get("tool") for e in events if e["event"] == "tool_result" and e.get("exit_code") == 0]
    assert "container_recreate" in tools and "container_restore" in tools, tools
    text = (tmp_path / "run" / "transcript.md").read_text()
    assert f"recreating the docker container {cont['name']}" in text   # the fix names the container


def test_a_container_host_the_simulator_cannot_host_is_refused_naming_the_line():
    base = REPORT.read_text()
    for old, new, key, fix in (
        ("    name: vllm\n", "", "container:", "host.container.name"),
        ("    connect: host\n", "    connect: host\n    pid1: true\n", "pid1:", "remove pid1"),
        ("    mounts: [/root/.cache/huggingface:/root/.cache/huggingface]",
         "    mounts: [cache:/root/.cache]", "mounts:", "absolute paths"),
        ("    connect: host\n", "", "mounts:", "connect: host"),
    ):
        text = base.replace(old, new)
        assert text != base
        lines = text.splitlines()
        at = next(i for i, ln in enumerate(lines, 1) if i > lines.index("host:") and ln.strip().startswith(key))
        line = f"line {at}"
        with pytest.raises(ScenarioError) as e:
            parse_scenario(text, "bad.yaml")
        msg = str(e.value)
        assert "bad.yaml" in msg and line in msg and fix in msg, msg


def test_from_snapshots_carries_each_supervisor_and_container_shape():
    """How the server ran (a snapshot's ``server.shape``) becomes ``host.supervisor`` / ``host.container``; what the
    simulator cannot run is left out with a note, and the variables a supervisor or runtime gives are not kept."""
    from debugagent.tools.host import ServerInfo
    from debugagent.tools.shape import Container, ServerShape, Supervisor
    from debugagent.tools.sim.fromsnap import _shape

    def shaped(pid=42, **kw):
        notes: list[str] = []
        out, added = _shape(ServerInfo(pid=pid, argv=["python3"], shape=ServerShape(**kw)), notes)
        return out, added, notes

    cid = "ab" * 32
    assert shaped(supervisor=Supervisor(kind="systemd", unit="vllm.service"))[:2] == (
        {"supervisor": {"kind": "systemd", "program": "vllm"}}, {"INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID"})
    out, added, _ = shaped(supervisor=Supervisor(kind="supervisord", program="sglang", config="/etc/sv/sv.conf"))
    assert out == {"supervisor": {"kind": "supervisord", "program": "sglang", "config": "/etc/sv/sv.conf"}}
    assert "SUPERVISOR_PROCESS_NAME" in added
    out, added, _ = shaped(pid=1, container=Container(runtime="podman", shared=True))
    assert out == {"container": {"runtime": "podman", "pid1": True}} and added == {"container"}
    out, _, notes = shaped(container=Container(runtime="docker", id=cid),
                           supervisor=Supervisor(kind="supervisord", program="x"))
    assert out == {"container": {"runtime": "docker", "id": cid, "connect": "host", "name": cid[:12]}}
    assert any("left out its supervisor" in n for n in notes)
    out, _, notes = shaped(container=Container(runtime="kubernetes", pod_uid="p"))
    assert out == {} and any("kubernetes" in n for n in notes)
