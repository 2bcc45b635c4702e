"""A container recreated with one change (tools/recreate.py): the `run` command built from real `podman inspect`
JSON (tests/vectors/containers) keeps every field that matters, and applies only the change; with podman installed,
the command is given to podman itself (`create`, in a store of this test's own) and the new container's inspect
compared field by field with the one it was built from; the Kubernetes plan changes the workload only through the
commands it prints."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from debugagent.tools.errors import ParseError
from debugagent.tools.recreate import ContainerSpec, k8s_plan, recreate_plan

VECTORS = Path(__file__).parent / "vectors" / "containers"
SGLANG = VECTORS / "podman-4.3.1-sglang-host-network.json"
VLLM = VECTORS / "podman-4.3.1-vllm-bridge.json"


def spec(path: Path) -> ContainerSpec:
    return ContainerSpec.of_inspect(path.read_text(), runtime="podman")


def opts(argv: list[str]) -> dict[str, list[str]]:
    """`run`'s options as option -> values (in order), up to the image."""
    out: dict[str, list[str]] = {}
    i = 3
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] in ("-d", "--privileged", "--init"):
            out.setdefault(argv[i], []).append("")
            i += 1
            continue
        out.setdefault(argv[i], []).append(argv[i + 1])
        i += 2
    out["IMAGE+CMD"] = argv[i:]
    return out


def test_every_field_of_a_gpu_server_on_the_host_network_is_kept():
    s = spec(SGLANG)
    a = s.run_argv()
    o = opts(a)
    assert a[:3] == ["podman", "run", "-d"] and o["--name"] == ["gpu-server"]
    assert o["IMAGE+CMD"] == ["localhost/infer-test:1", "--model-path", "/models/llama", "--port", "30000",
                              "--disable-cuda-graph"]
    assert o["--entrypoint"] == ['["python3", "-m", "sglang.launch_server"]']
    assert s.argv == ["python3", "-m", "sglang.launch_server", "--model-path", "/models/llama", "--port", "30000",
                      "--disable-cuda-graph"]
    assert "CUDA_LAUNCH_BLOCKING=1" in o["-e"] and "HF_HOME=/models/hf" in o["-e"] and "LANG=C.UTF-8" in o["-e"]
    assert "container=podman" not in o["-e"]
    assert o["--user"] == ["1000:1000"] and o["--workdir"] == ["/srv"] and o["--label"] == ["team=inference"]
    assert o["--mount"] == ["type=bind,src=/tmp/containers-vol,dst=/models,readonly"]
    assert o["--tmpfs"] == ["/scratch:rw,rprivate,nosuid,nodev,tmpcopyup"]
    assert o["--network"] == ["host"] and "-p" not in o and "--hostname" not in o
    assert o["--device"] == ["/dev/null:/dev/nvidia0"]   # podman records no CgroupPermissions for it
    assert o["--ipc"] == ["host"] and "--shm-size" not in o      # podman's IpcMode says shareable; its CreateCommand, host
    assert "memlock=-1:-1" in o["--ulimit"] and "stack=67108864:67108864" in o["--ulimit"]
    assert o["--restart"] == ["unless-stopped"]


def test_every_field_of_a_server_on_a_bridge_with_published_ports_is_kept():
    o = opts(spec(VLLM).run_argv())
    assert o["--entrypoint"] == ['["vllm", "serve"]'] and o["IMAGE+CMD"] == ["localhost/infer-test:1",
                                                                          "meta-llama/Llama-3.1-8B", "--port", "8000"]
    assert o["-p"] == ["127.0.0.1:8000:8000/tcp"] and o["--network"] == ["bridge"]
    assert o["--shm-size"] == [str(10 * 1024 ** 3)] and "nofile=65536:65536" in o["--ulimit"]
    assert o["--restart"] == ["on-failure:3"] and o["--mount"] == [
        "type=bind,src=/tmp/containers-vol,dst=/root/.cache/huggingface"]
    assert "VLLM_ATTENTION_BACKEND=FLASHINFER" in o["-e"] and "--user" not in o



def test_nested_mounts_are_written_parent_first_whatever_order_the_inspect_lists_them_in():
    """podman 4.3 lists a container's mounts in no fixed order (five identical `create`s gave two): the `run`
    command mounts a folder before a mount inside it, and is the same command for every order of the inspect."""
    import itertools
    found = json.loads(VLLM.read_text())[0]
    extra = [{"Type": "bind", "Source": f"/srv/{d.strip('/').replace('/', '-')}", "Destination": d, "RW": True}
             for d in ("/models/llama/tokenizer", "/models", "/models/llama", "/data", "/models-old")]
    found["HostConfig"]["Tmpfs"] = {"/scratch/a": "size=1g", "/scratch": ""}
    argvs = set()
    for order in itertools.permutations([*found["Mounts"], *extra]):
        argvs.add(tuple(ContainerSpec.of_inspect([{**found, "Mounts": list(order)}], runtime="podman").run_argv()))
    assert len(argvs) == 1
    o = opts(list(argvs.pop()))
    assert [m.split("dst=")[1].split(",")[0] for m in o["--mount"]] == [
        "/data", "/models", "/models/llama", "/models/llama/tokenizer", "/models-old", "/root/.cache/huggingface"]
    assert o["--tmpfs"] == ["/scratch", "/scratch/a:size=1g"]


def test_only_the_change_is_applied():
    s = spec(SGLANG)
    argv = [a for a in s.argv if a != "--disable-cuda-graph"]
    c = s.changed(argv=argv, unset_env=["CUDA_LAUNCH_BLOCKING"], set_env={"NCCL_DEBUG": "INFO"})
    before, after = opts(s.run_argv()), opts(c.run_argv())
    assert after["IMAGE+CMD"] == before["IMAGE+CMD"][:-1] and after["--entrypoint"] == before["--entrypoint"]
    assert set(after["-e"]) == set(before["-e"]) - {"CUDA_LAUNCH_BLOCKING=1"} | {"NCCL_DEBUG=INFO"}
    assert {k: v for k, v in after.items() if k not in ("-e", "IMAGE+CMD")} == \
        {k: v for k, v in before.items() if k not in ("-e", "IMAGE+CMD")}
    moved = s.changed(argv=["python3", "-m", "other.server", "--port", "30000"])   # a new entrypoint: argv whole
    assert moved.argv == ["python3", "-m", "other.server", "--port", "30000"]


def test_docker_takes_one_word_of_entrypoint_and_the_rest_leads_the_command():
    s = spec(VLLM).model_copy(update={"runtime": "docker"})
    a = s.run_argv()
    o = opts(a)
    assert o["--entrypoint"] == ["vllm"] and o["IMAGE+CMD"][1:] == ["serve", "meta-llama/Llama-3.1-8B", "--port", "8000"]


def test_the_plan_puts_the_very_container_back():
    s = spec(VLLM)
    do, undo = recreate_plan(s, s.changed(set_env={"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}), "vllm-bridge.debugagent-found")
    assert do[:2] == ["podman stop vllm-bridge", "podman rename vllm-bridge vllm-bridge.debugagent-found"]
    assert "VLLM_ATTENTION_BACKEND=FLASH_ATTN" in shlex.split(do[2]) and shlex.split(do[2])[:5] == [
        "podman", "run", "-d", "--name", "vllm-bridge"]
    assert undo == ["podman rm -f vllm-bridge", "podman rename vllm-bridge.debugagent-found vllm-bridge",
                    "podman start vllm-bridge"]


def test_kubernetes_is_changed_only_by_the_printed_commands():
    do, undo = k8s_plan("serving", "vllm-7d9f8b6c5-x2kqp", "engine", ["vllm", "serve", "m", "--port", "8000"],
                        {"VLLM_USE_V1": "0"}, ["CUDA_LAUNCH_BLOCKING"])
    text = "\n".join(do)
    assert "patch deployment/vllm" in text and '"command":["vllm","serve","m","--port","8000"]' in text
    assert "set env deployment/vllm -c engine VLLM_USE_V1=0 CUDA_LAUNCH_BLOCKING-" in text
    assert do[-1] == "kubectl -n serving rollout status deployment/vllm"
    assert undo[0] == "kubectl -n serving rollout undo deployment/vllm"


@pytest.mark.parametrize("text", ["[]", "{}", "not json", "[{\"Config\": {}, \"HostConfig\": {}}]"])
def test_what_is_no_container_inspect_is_a_parse_error(text):
    with pytest.raises(ParseError):
        ContainerSpec.of_inspect(text)


FIELDS = ("Path", "Args", "Config.Entrypoint", "Config.Cmd", "Config.User", "Config.WorkingDir", "Config.Labels",
          "Config.Image", "HostConfig.Binds", "HostConfig.NetworkMode", "HostConfig.PortBindings", "HostConfig.Devices",
          "HostConfig.ShmSize", "HostConfig.Ulimits", "HostConfig.Tmpfs", "HostConfig.RestartPolicy", "Mounts")


def field(d: dict, path: str):
    for k in path.split("."):
        d = d.get(k) if isinstance(d, dict) else None
    if path == "Mounts" and isinstance(d, list):   # podman 4.3 lists them in no fixed order: by destination
        d = sorted(d, key=lambda m: m.get("Destination") or "")
    return d


@pytest.mark.skipif(not shutil.which("podman"), reason="needs podman's CLI (creating a container needs no runtime)")
@pytest.mark.parametrize("vector", [SGLANG, VLLM], ids=["host-network", "bridge"])
def test_podman_creates_from_the_command_the_container_it_was_built_from(vector, tmp_path):
    """The `run` command (as `create`: nothing starts) given to podman, in a store of this test's own with the
    vector's image imported: the new container's inspect equals the recorded one in every field that matters, and
    in its environment but for the variables podman adds."""
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    store = tmp_path / "storage.conf"
    store.write_text(f'[storage]\ndriver = "vfs"\nrunroot = "{tmp_path / "run"}"\ngraphroot = "{tmp_path / "graph"}"\n')
    env = {"CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(store), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (tmp_path / "vol").mkdir()
    tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout
    subprocess.run(["podman", "import", "--change", 'ENTRYPOINT ["python3", "-m", "sglang.launch_server"]', "--change",
                    "ENV LANG=C.UTF-8", "--change", "WORKDIR /srv", "-", "localhost/infer-test:1"], input=tar, env=env,
                   capture_output=True, check=True, timeout=120)
    found = json.loads(vector.read_text().replace("/tmp/containers-vol", str(tmp_path / "vol")))[0]
    argv = ContainerSpec.of_inspect([found], runtime="podman").run_argv()
    assert argv[1:3] == ["run", "-d"]
    r = subprocess.run([argv[0], "create", *argv[3:]], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    again = json.loads(subprocess.run(["podman", "inspect", found["Name"]], env=env, capture_output=True, text=True,
                                      check=True, timeout=60).stdout)[0]
    for f in FIELDS:
        assert field(again, f) == field(found, f), f
    assert set(again["Config"]["Env"]) == set(found["Config"]["Env"])
    assert ("--ipc" in again["Config"]["CreateCommand"]) == ("--ipc" in found["Config"]["CreateCommand"])



@pytest.mark.skipif(not shutil.which("podman"), reason="needs podman's CLI (creating a container needs no runtime)")
def test_podman_takes_back_nested_mounts_parent_first(tmp_path):
    """Real podman: a container created with a mount inside another, the child named first; the command built from
    its inspect names the parent first, and podman creates from it a container with the same mounts."""
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    store = tmp_path / "storage.conf"
    store.write_text(f'[storage]\ndriver = "vfs"\nrunroot = "{tmp_path / "run"}"\ngraphroot = "{tmp_path / "graph"}"\n')
    env = {"CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(store), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    (tmp_path / "rootfs" / "etc").mkdir(parents=True)
    for d in ("models", "tok", "cache"):
        (tmp_path / d).mkdir()
    tar = subprocess.run(["tar", "-C", str(tmp_path / "rootfs"), "-c", "."], capture_output=True, check=True).stdout
    subprocess.run(["podman", "import", "-", "localhost/box:1"], input=tar, env=env, capture_output=True, check=True,
                   timeout=120)

    def podman(*args: str) -> str:
        r = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    podman("create", "--name", "srv", "--mount", f"type=bind,src={tmp_path / 'tok'},dst=/models/llama/tokenizer,readonly",
           "--mount", f"type=bind,src={tmp_path / 'cache'},dst=/root/.cache", "--mount",
           f"type=bind,src={tmp_path / 'models'},dst=/models", "localhost/box:1", "serve")
    found = json.loads(podman("inspect", "srv"))[0]
    argv = ContainerSpec.of_inspect([found], runtime="podman").run_argv()
    mounts = opts(argv)["--mount"]
    assert [m.split("dst=")[1].split(",")[0] for m in mounts] == ["/models", "/models/llama/tokenizer", "/root/.cache"]
    assert argv[3:5] == ["--name", "srv"]
    podman("create", "--name", "srv2", *argv[5:])
    again = json.loads(podman("inspect", "srv2"))[0]
    assert field(again, "Mounts") == field(found, "Mounts")


# ---------------------------------------------------------------- --allow-container-recreate: journal, undo, as found
def container_host(calls: list[str], journal, inspect: str):
    """A fake host whose server is pid 1 of the podman container vllm-bridge (the vector's inspect)."""
    def host(command: str):
        calls.append(command)
        if command.startswith("p=/proc/"):   # server_control
            return "== cgroup\n0::/\n== self_cgroup\n0::/\n== parent\n0\n\n\n== container_env\ncontainer=podman\n== stdout\n== end\n"
        if command.endswith("podman inspect --type container vllm-bridge"):
            return inspect
        if "podman rename vllm-bridge vllm-bridge.debugagent-found" in command and "podman run -d" in command:
            assert [s.tool for s in journal.pending()] == ["container_restore"], "recreated before its undo was journalled"
            return "started pid=1\n"
        if "podman rm -f vllm-bridge" in command and "podman start vllm-bridge" in command:
            return "started pid=1\n"
        raise KeyError(command)
    return host


@pytest.mark.parametrize("allowed", [True, False])
def test_a_recreate_is_journalled_before_it_acts_and_its_undo_puts_the_container_back(tmp_path, allowed):
    """With --allow-container-recreate the container is recreated from its own inspect with only the change, its
    undo journalled first; the undo removes the copy and renames the very container back (or makes it again from the
    journalled inspect). Without it the experiment is refused with the commands, and nothing is journalled or run."""
    from debugagent.agent.journal import Journal
    from debugagent.agent.lab import Lab, Measure
    from debugagent.agent.lab.errors import ExperimentError
    from debugagent.agent.lab.server import ServerRun
    from debugagent.tools.container import Target
    from debugagent.tools.host import ServerInfo
    from debugagent.tools.registry import Runner
    from debugagent.tools.transport import FakeTransport

    calls: list[str] = []
    j = Journal(tmp_path / "journal.json", "r1", "fake")
    lab = Lab(lambda h: Runner(t), lambda ev, **kw: None, j, Measure("bench", "latency", None), "r1", True)
    lab.server.setup.allow_container_recreate = allowed
    t = FakeTransport(container_host(calls, j, VLLM.read_text()))
    t.target = Target("podman", name="vllm-bridge")   # type: ignore[attr-defined]
    srv = ServerInfo(pid=1, argv=["vllm", "serve", "meta-llama/Llama-3.1-8B", "--port", "8000"], cwd="/")
    run = ServerRun(argv=srv.argv, cwd="/", set={"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"})
    if not allowed:
        with pytest.raises(ExperimentError) as e:
            lab.server.start(Runner(t), srv, run, "VLLM_ATTENTION_BACKEND=FLASH_ATTN")
        assert "`podman stop vllm-bridge`" in str(e.value) and "--allow-container-recreate" in str(e.value)
        assert j.pending() == [] and not any("podman stop" in c for c in calls)
        return
    assert lab.server.start(Runner(t), srv, run, "VLLM_ATTENTION_BACKEND=FLASH_ATTN") == 1
    (step,) = j.pending()
    found = spec(VLLM)
    assert step.tool == "container_restore" and step.input["found_id"] == found.id
    assert step.input["found_run"] == found.run_argv() and step.input["argv"] == srv.argv
    new = shlex.split(next(c for c in calls if "podman run -d" in c).split("|| exit 1; ")[2])
    assert new == found.changed(set_env={"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}).run_argv()
    assert "VLLM_ATTENTION_BACKEND=FLASH_ATTN" in new and "VLLM_ATTENTION_BACKEND=FLASHINFER" not in new
    assert lab.undo.check(step) is None
    assert lab.undo.run(Runner(t)) == [] and not j.pending()
    assert "podman rm -f vllm-bridge" in calls[-1]


def test_a_restore_step_that_runs_another_container_is_exit_2():
    from debugagent.tools.recreate import ContainerRestore
    from pydantic import ValidationError
    with pytest.raises(ValidationError):
        ContainerRestore(runtime="podman", name="srv", found_id="a" * 64, found_run=["podman", "run", "-d", "--name", "other", "img"])


# a podman with no runtime to start containers: `run -d` creates the container, `start` starts nothing; everything else
# (inspect, stop, rename, rm) is the real podman, in this test's own store
NO_RUNTIME_PODMAN = """#!/bin/sh
if [ "$1" = run ] && [ "$2" = -d ]; then shift 2; exec /usr/bin/podman create "$@"; fi
if [ "$1" = start ]; then echo "$2"; exit 0; fi
exec /usr/bin/podman "$@"
"""


@pytest.mark.skipif(not shutil.which("podman"), reason="needs podman's CLI (creating a container needs no runtime)")
def test_the_recreate_and_its_undo_on_real_podman_from_every_point(tmp_path):
    """The recreate's and the undo's own commands, run by bash against real podman (its names, ids, renames; `run`
    creates and `start` starts nothing, as no runtime runs here): the copy replaces the container, the undo puts the
    very container back (same id) and is a no-op run again; from a recreate stopped after its rename it does the same;
    with the container found removed by hand it makes it again from the journalled inspect, and the as-found check
    says it is another container, the same in every other field. A container that is not the one found is never
    stopped."""
    from debugagent.agent.lab import asfound
    from debugagent.tools.recreate import ContainerRecreate, ContainerRestore
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    store = tmp_path / "storage.conf"
    store.write_text(f'[storage]\ndriver = "vfs"\nrunroot = "{tmp_path / "run"}"\ngraphroot = "{tmp_path / "graph"}"\n')
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "podman").write_text(NO_RUNTIME_PODMAN)
    (tmp_path / "bin" / "podman").chmod(0o755)
    env = {"CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(store),
           "PATH": f"{tmp_path / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"}
    (tmp_path / "rootfs" / "etc").mkdir(parents=True)
    tar = subprocess.run(["tar", "-C", str(tmp_path / "rootfs"), "-c", "."], capture_output=True, check=True).stdout
    subprocess.run(["podman", "import", "-", "localhost/box:1"], input=tar, env=env, capture_output=True, check=True,
                   timeout=120)

    def sh(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=120)

    def inspect(name: str) -> dict | None:
        r = sh(f"podman inspect --type container {name}")
        return json.loads(r.stdout)[0] if r.returncode == 0 else None

    assert sh("podman create --name srv -e LANG=C.UTF-8 -e TOKEN=s3cret --label team=inference --workdir /srv "
              "--entrypoint /usr/bin/python3 localhost/box:1 -m infer.serve --port 8000 --disable-cuda-graph").returncode == 0
    found = ContainerSpec.of_inspect([inspect("srv")], runtime="podman")
    changed = found.changed(argv=found.argv[:-1])
    recreate = ContainerRecreate(runtime="podman", name="srv", found_id=found.id, run=changed.run_argv())
    restore = ContainerRestore(runtime="podman", name="srv", found_id=found.id, found_run=found.run_argv())
    key = b"k" * 32
    digest = lambda b: __import__("hmac").new(key, b, "sha256").hexdigest()   # noqa: E731
    before = asfound.parse_container(json.dumps([inspect("srv")]), "podman", digest)
    assert before is not None and before["id"] == found.id and "TOKEN" in before["env_names"]
    assert "s3cret" not in json.dumps(before)   # values only as keyed digests

    r = sh(recreate.command())
    assert r.returncode == 0 and "started pid=1" in r.stdout, r.stderr
    now, aside = inspect("srv"), inspect("srv.debugagent-found")
    assert now and aside and now["Id"] != found.id and aside["Id"] == found.id
    assert "--disable-cuda-graph" not in now["Args"]
    diffs = asfound.compare("container:podman:srv", before, asfound.parse_container(json.dumps([now]), "podman", digest))
    assert len(diffs) == 1 and "another container" in diffs[0].text and "cmd" in diffs[0].text
    r = sh(recreate.command())   # NAME is no longer the container found: refused, nothing changed
    assert r.returncode == 1 and "is not the container found" in r.stdout and inspect("srv")["Id"] == now["Id"]

    for _ in range(2):   # the undo, and the undo run again
        r = sh(restore.command())
        assert r.returncode == 0 and "started pid=1" in r.stdout, r.stderr
        assert inspect("srv")["Id"] == found.id and inspect("srv.debugagent-found") is None
    after = asfound.parse_container(json.dumps([inspect("srv")]), "podman", digest)
    assert asfound.compare("container:podman:srv", before, after) == []

    # stopped after its rename, before the new container was made: the undo renames it back
    assert sh("podman rename srv srv.debugagent-found").returncode == 0
    assert sh(restore.command()).returncode == 0 and inspect("srv")["Id"] == found.id

    # the container found removed by hand while its copy ran: made again from the journalled inspect
    assert sh(recreate.command()).returncode == 0 and sh("podman rm -f srv.debugagent-found").returncode == 0
    r = sh(restore.command())
    assert r.returncode == 0 and "made again from its inspect" in r.stdout, r.stderr
    again = inspect("srv")
    assert again and again["Id"] != found.id and again["Args"] == inspect_args(found)
    diffs = asfound.compare("container:podman:srv", before, asfound.parse_container(json.dumps([again]), "podman", digest))
    assert [d.text for d in diffs] == [f"the podman container srv: it is another container (id {again['Id'][:12]}, "
                                       f"found {found.id[:12]})"]


def inspect_args(s: ContainerSpec) -> list[str]:
    return s.argv[1:]


def test_a_kubernetes_workload_stays_printed_only_with_allow_container_recreate(tmp_path):
    """--allow-container-recreate recreates docker and podman containers only: for a pod the experiment is refused with
    the Deployment's patch, `kubectl rollout status` and `rollout undo`, nothing journalled and nothing run."""
    from debugagent.agent.journal import Journal
    from debugagent.agent.lab import Lab, Measure
    from debugagent.agent.lab.errors import ExperimentError
    from debugagent.agent.lab.server import ServerRun
    from debugagent.tools.container import Target
    from debugagent.tools.host import ServerInfo
    from debugagent.tools.registry import Runner
    from debugagent.tools.transport import FakeTransport

    j = Journal(tmp_path / "journal.json", "r1", "fake")
    t = FakeTransport(lambda c: "== cgroup\n0::/\n== self_cgroup\n0::/\n== parent\n0\n\n\n== container_env\n== stdout\n== end\n"
                      if c.startswith("p=/proc/") else (_ for _ in ()).throw(KeyError(c)))
    t.target = Target("k8s", name="vllm-7d9f8b6c5-x2kqp", namespace="serving", container="engine")   # type: ignore[attr-defined]
    lab = Lab(lambda h: Runner(t), lambda ev, **kw: None, j, Measure("bench", "latency", None), "r1", True)
    lab.server.setup.allow_container_recreate = True
    srv = ServerInfo(pid=1, argv=["vllm", "serve", "m", "--port", "8000", "--enforce-eager"], cwd="/")
    with pytest.raises(ExperimentError) as e:
        lab.server.start(Runner(t), srv, ServerRun(argv=srv.argv[:-1], cwd="/"), "without --enforce-eager")
    text = str(e.value)
    assert "never changed by debugagent" in text
    patch = next(c for c in text.split("`") if " patch deployment/vllm " in c)
    assert json.loads(shlex.split(patch)[-1])["spec"]["template"]["spec"]["containers"][0]["command"] == srv.argv[:-1]
    assert "`kubectl -n serving rollout status deployment/vllm`" in text
    assert "`kubectl -n serving rollout undo deployment/vllm`" in text
    assert j.pending() == [] and len(t.calls) == 1   # server_control only
