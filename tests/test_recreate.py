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
