"""A simulated host's container engine and its CLI (one file, several names): enough of docker's daemon, or of
podman with its conmon, for the containers an inference host runs, and the ``docker`` / ``podman`` commands that
drive it.

As the engine (``dockerd``, or ``podman-engine`` for podman, which has no daemon: the process that holds its
containers' state, as conmon and podman's database do) it reads its state (``STATE``: each container's record, the
images the host has), starts each container that was running (its entrypoint and command with its environment, in
its working folder, a session of its own), has the host show the container's cgroup in the process's
``/proc/PID/cgroup`` (docker: ``/system.slice/docker-ID.scope``; podman: ``/machine.slice/libpod-ID.scope``, as
their systemd cgroup managers name it), restarts it by its restart policy, and answers its CLI on ``SOCKET``.

As ``docker`` or ``podman`` it sends its arguments there and prints the answer: ``ps`` (``-a``, ``-q``,
``--no-trunc``, ``--format``, ``--filter name=``/``id=``), ``inspect`` (``--type container``, ``-f``/``--format``
with Go template fields, ``json``), ``run -d`` (the options ``docker run`` takes back from an inspect: ``--name``,
``-e``, ``--entrypoint``, ``--workdir``, ``--user``, ``--label``, ``--mount``, ``-v``, ``--tmpfs``, ``--network``,
``-p``, ``--gpus``, ``--device``, ``--ipc``, ``--shm-size``, ``--ulimit``, ``--restart``, ``--runtime``,
``--privileged``, ``--cap-add``/``--cap-drop``, ``--security-opt``, ``--init``, ``--pid``, ``--add-host``,
``--hostname``), ``stop``, ``start``, ``restart``, ``rm [-f]``, ``rename``, ``logs``, ``exec`` (the command run with
the container's environment and folder) and ``--version``. An image the host does not have cannot be pulled (the
host is offline). ``inspect`` prints what the runtime prints: docker's documented ``ContainerJSON``; podman's from a
real ``podman inspect`` of podman 4.3.1 (``podman-4.3.1-inspect.json``), its fields filled from the record.

What is not a container's here: its own root, pid, network or mount namespace (the process runs in the host's, as
with ``--network host --pid host`` over the image's files, which are the host's).
"""

import copy
import datetime
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

RUNTIME = "docker"
STATE = "/var/lib/docker/sim-engine.json"
SOCKET = "/run/docker.sock"
SERVICE = "/run/nvidia-gpu/service.sock"   # the host's GPU service: told which cgroup a container's process is in
TEMPLATE = "/usr/local/lib/sim-engine/podman-4.3.1-inspect.json"
VERSION = {"docker": "Docker version 27.3.1, build ce12230", "podman": "podman version 4.3.1"}
HOSTNAME = "localhost"
ZERO = "0001-01-01T00:00:00Z"


def now():
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------- the engine
class Engine:
    def __init__(self):
        with open(STATE) as f:
            st = json.load(f)
        self.images = st.get("images", {})
        self.containers = st.get("containers", [])
        self.procs = {}      # id -> Popen
        self.stopping = set()
        self.lock = threading.Lock()

    def save(self):
        tmp = STATE + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"images": self.images, "containers": self.containers}, f, indent=1)
        os.replace(tmp, STATE)

    def find(self, ref):
        for c in self.containers:
            if c["name"] == ref or c["id"] == ref:
                return c
        hits = [c for c in self.containers if len(ref) >= 3 and c["id"].startswith(ref)]
        return hits[0] if len(hits) == 1 else None

    def cgroup(self, c):
        return (f"/system.slice/docker-{c['id']}.scope" if RUNTIME == "docker"
                else f"/machine.slice/libpod-{c['id']}.scope")

    def logfile(self, c):
        d = os.path.join(os.path.dirname(STATE), "containers", c["id"])
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, "ctr.log" if RUNTIME == "podman" else f"{c['id']}-json.log")

    def start(self, c):
        p = self.procs.get(c["id"])
        if p is not None and p.poll() is None:
            return
        argv = [*c["entrypoint"], *c["cmd"]]
        env = dict(e.split("=", 1) for e in c["env"] if "=" in e)
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        env["HOSTNAME"] = c.get("hostname") or (HOSTNAME if c.get("network") == "host" else c["id"][:12])
        env.setdefault("HOME", "/root")
        if RUNTIME == "podman":
            env["container"] = "podman"
        log = open(self.logfile(c), "ab")
        gate_r, gate_w = os.pipe()
        # the process waits until its cgroup shows, then runs the container's command (the same pid)
        gate = ["/bin/sh", "-c", f'read _ <&{gate_r}; exec {gate_r}<&-; unset PWD OLDPWD; exec "$@"', "sh", *argv]
        try:
            p = subprocess.Popen(gate, cwd=c.get("workdir") or "/", env=env, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(gate_r,))
        except OSError as exc:
            os.close(gate_r)
            os.close(gate_w)
            log.close()
            c["state"].update(status="exited", running=False, pid=0, exit_code=127, error=str(exc), finished_at=now())
            self.save()
            return str(exc)
        os.close(gate_r)
        log.close()
        self.procs[c["id"]] = p
        self.stopping.discard(c["id"])
        c["state"].update(status="running", running=True, pid=p.pid, exit_code=0, error="", started_at=now())
        tell_cgroup(p.pid, self.cgroup(c))
        os.write(gate_w, b"x")
        os.close(gate_w)
        self.save()
        return ""

    def stop(self, c, timeout=10.0):
        p = self.procs.pop(c["id"], None)
        self.stopping.add(c["id"])
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
        if c["state"]["running"]:
            c["state"].update(status="exited", running=False, pid=0,
                              exit_code=p.returncode if p is not None and p.returncode and p.returncode > 0 else 0,
                              finished_at=now())
        self.save()

    def watch(self):
        for c in self.containers:
            p = self.procs.get(c["id"])
            if p is None or p.poll() is None or c["id"] in self.stopping:
                continue
            del self.procs[c["id"]]
            c["state"].update(status="exited", running=False, pid=0, exit_code=p.returncode, finished_at=now())
            policy = c.get("restart") or {}
            name = policy.get("Name") or "no"
            if name in ("always", "unless-stopped") or (name == "on-failure" and p.returncode):
                c["restart_count"] = c.get("restart_count", 0) + 1
                self.start(c)
            else:
                self.save()


def tell_cgroup(pid, path):
    """Ask the host's GPU service to show ``path`` as the process's cgroup (outside the host, where a cgroup is)."""
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(SERVICE)
        body = b"\0".join(x.encode() for x in ("cgroup", str(pid), path)) + b"\0"
        s.sendall(len(body).to_bytes(4, "big") + body)
        s.recv(4096)
        s.close()
    except OSError as exc:
        print(f"{RUNTIME}: cgroup of {pid}: {exc}", file=sys.stderr)


def engine_main():
    eng = Engine()
    with eng.lock:
        for c in eng.containers:
            if c["state"].get("running"):
                c["state"]["running"] = False
                eng.start(c)
    if os.path.exists(SOCKET):
        os.unlink(SOCKET)
    os.makedirs(os.path.dirname(SOCKET), exist_ok=True)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(SOCKET)
    srv.listen(16)

    def watcher():
        while True:
            time.sleep(0.2)
            with eng.lock:
                eng.watch()

    threading.Thread(target=watcher, daemon=True).start()
    while True:
        conn, _ = srv.accept()
        try:
            req = json.loads(conn.makefile().readline())
            with eng.lock:
                reply = handle(eng, req)
        except Exception as exc:  # noqa: BLE001 - a bad request is answered, never ends the engine
            reply = {"rc": 125, "err": f"Error: {exc}\n"}
        conn.sendall((json.dumps(reply) + "\n").encode())
        conn.close()


# ---------------------------------------------------------------- inspect
def _mounts(c):
    return [{"Type": m["type"], **({"Name": m["src"]} if m["type"] == "volume" else {}), "Source": m["src"],
             "Destination": m["dst"], "Driver": "local" if m["type"] == "volume" else "", "Mode": "",
             **({"Options": ["rbind"]} if RUNTIME == "podman" else {}), "RW": not m.get("ro"),
             "Propagation": "rprivate" if m["type"] == "bind" else ""} for m in c["mounts"]]


def _ulimits(c):
    out = []
    for u in c["ulimits"]:
        name, _, v = u.partition("=")
        soft, _, hard = v.partition(":")
        out.append({"Name": ("RLIMIT_" + name.upper()) if RUNTIME == "podman" else name, "Soft": int(soft),
                    "Hard": int(hard or soft)})
    return out


def _ports(c):
    out = {}
    for p in c["ports"]:
        parts = p.rsplit(":", 2)
        cport = parts[-1] if "/" in parts[-1] else parts[-1] + "/tcp"
        ip = parts[0].strip("[]") if len(parts) == 3 else ""
        hp = parts[-2] if len(parts) >= 2 else ""
        out.setdefault(cport, []).append({"HostIp": ip, "HostPort": hp})
    return out


def _gpus(c):
    g = c.get("gpus") or ""
    if not g:
        return []
    g = g.strip('"')
    if g.startswith("device="):
        return [{"Driver": "", "Count": 0, "DeviceIDs": g[7:].split(","), "Capabilities": [["gpu"]], "Options": {}}]
    return [{"Driver": "", "Count": -1 if g == "all" else int(g), "DeviceIDs": None, "Capabilities": [["gpu"]],
             "Options": {}}]


def _restart(c):
    r = c.get("restart") or {}
    return {"Name": r.get("Name") or ("no" if RUNTIME == "docker" else ""), "MaximumRetryCount": r.get("MaximumRetryCount", 0)}


def inspect(eng, c):
    st, img = c["state"], eng.images.get(c["image"], {})
    argv = [*c["entrypoint"], *c["cmd"]]
    net = c.get("network") or ("default" if RUNTIME == "docker" else "bridge")
    hostname = c.get("hostname") or (HOSTNAME if net == "host" else c["id"][:12])
    env = list(c["env"]) + (["container=podman"] if RUNTIME == "podman" and "container=podman" not in c["env"] else [])
    devices = []
    for d in c["devices"]:
        parts = d.split(":")
        devices.append({"PathOnHost": parts[0], "PathInContainer": parts[1] if len(parts) > 1 else parts[0],
                        "CgroupPermissions": parts[2] if len(parts) > 2 else "rwm"})
    if RUNTIME == "podman":
        d = copy.deepcopy(TEMPLATE_DATA)
        sd = f"/var/lib/containers/storage/overlay-containers/{c['id']}/userdata"
        d.update(Id=c["id"], Created=c["created"], Path=argv[0] if argv else "", Args=argv[1:], Image=img.get("id", ""),
                 ImageName=c["image"], Name=c["name"], RestartCount=c.get("restart_count", 0), StaticDir=sd,
                 OCIRuntime=c.get("runtime") or "runc", ConmonPidFile=f"/run/containers/storage/overlay-containers/{c['id']}/userdata/conmon.pid",
                 PidFile=f"/run/containers/storage/overlay-containers/{c['id']}/userdata/pidfile", Mounts=_mounts(c))
        d["ImageDigest"] = "sha256:" + img.get("digest", "")
        d["State"].update(Status=st["status"], Running=st["running"], Pid=st["pid"], ConmonPid=st["pid"] and st["pid"] - 1,
                          ExitCode=st.get("exit_code", 0), Error=st.get("error", ""),
                          StartedAt=st.get("started_at") or ZERO, FinishedAt=st.get("finished_at") or ZERO)
        cfg = d["Config"]
        cfg.update(Hostname=hostname, User=c.get("user", ""), Env=env, Cmd=c["cmd"] or None, Image=c["image"],
                   WorkingDir=c.get("workdir") or "/", Entrypoint=" ".join(c["entrypoint"]), Labels=c["labels"] or None,
                   CreateCommand=c.get("create_command") or [])
        hc = d["HostConfig"]
        hc.update(Binds=[f"{m['src']}:{m['dst']}" + (":ro" if m.get("ro") else "") + ",rprivate,rbind"
                         for m in c["mounts"] if m["type"] == "bind" and m.get("from_v")],
                  CgroupManager="systemd", NetworkMode=net, PortBindings=_ports(c), RestartPolicy=_restart(c),
                  CapAdd=c["cap_add"], CapDrop=c["cap_drop"], ExtraHosts=c["add_host"],
                  IpcMode="shareable" if c.get("ipc") in ("", "host", None) else c["ipc"], PidMode=c.get("pid") or "private",
                  Privileged=c.get("privileged", False), SecurityOpt=c["security_opt"], Tmpfs=c["tmpfs"],
                  ShmSize=c.get("shm_size") or 65536000, Runtime="oci", Devices=devices, Ulimits=_ulimits(c),
                  Init=c.get("init", False))
        hc["LogConfig"]["Path"] = f"{sd}/ctr.log"
        d["GraphDriver"]["Data"] = {k: v.replace("a2b0f9996ecf8a970af952707c2231e47991eb7e934b02cd9f80495bb9a8b974",
                                                   c["id"]) for k, v in d["GraphDriver"]["Data"].items()}
        return d
    # docker's ContainerJSON (Docker Engine API, "Inspect a container")
    root = f"/var/lib/docker/containers/{c['id']}"
    return {
        "Id": c["id"], "Created": c["created"], "Path": argv[0] if argv else "", "Args": argv[1:],
        "State": {"Status": st["status"], "Running": st["running"], "Paused": False, "Restarting": False,
                  "OOMKilled": False, "Dead": False, "Pid": st["pid"], "ExitCode": st.get("exit_code", 0),
                  "Error": st.get("error", ""), "StartedAt": st.get("started_at") or ZERO,
                  "FinishedAt": st.get("finished_at") or ZERO},
        "Image": "sha256:" + img.get("id", ""), "ResolvConfPath": f"{root}/resolv.conf",
        "HostnamePath": f"{root}/hostname", "HostsPath": f"{root}/hosts", "LogPath": f"{root}/{c['id']}-json.log",
        "Name": "/" + c["name"], "RestartCount": c.get("restart_count", 0), "Driver": "overlay2", "Platform": "linux",
        "MountLabel": "", "ProcessLabel": "", "AppArmorProfile": "", "ExecIDs": None,
        "HostConfig": {
            "Binds": [f"{m['src']}:{m['dst']}" + (":ro" if m.get("ro") else "") for m in c["mounts"]
                      if m["type"] == "bind" and m.get("from_v")] or None,
            "ContainerIDFile": "", "LogConfig": {"Type": "json-file", "Config": {}}, "NetworkMode": net,
            "PortBindings": _ports(c), "RestartPolicy": _restart(c), "AutoRemove": False, "VolumeDriver": "",
            "VolumesFrom": None, "CapAdd": c["cap_add"] or None, "CapDrop": c["cap_drop"] or None,
            "CgroupnsMode": "private", "Dns": [], "DnsOptions": [], "DnsSearch": [], "ExtraHosts": c["add_host"] or None,
            "GroupAdd": None, "IpcMode": c.get("ipc") or "private", "Cgroup": "", "Links": None, "OomScoreAdj": 0,
            "PidMode": c.get("pid") or "", "Privileged": c.get("privileged", False), "PublishAllPorts": False,
            "ReadonlyRootfs": False, "SecurityOpt": c["security_opt"] or None, "Tmpfs": c["tmpfs"] or None,
            "UTSMode": "", "UsernsMode": "", "ShmSize": c.get("shm_size") or 67108864,
            "Runtime": c.get("runtime") or "runc", "Isolation": "", "CpuShares": 0, "Memory": 0, "NanoCpus": 0,
            "CgroupParent": "", "Devices": devices, "DeviceRequests": _gpus(c) or None, "Ulimits": _ulimits(c) or None,
            "Init": c.get("init") or None},
        "GraphDriver": {"Data": {"MergedDir": f"/var/lib/docker/overlay2/{c['id']}/merged",
                                 "UpperDir": f"/var/lib/docker/overlay2/{c['id']}/diff",
                                 "WorkDir": f"/var/lib/docker/overlay2/{c['id']}/work"}, "Name": "overlay2"},
        "Mounts": _mounts(c),
        "Config": {"Hostname": hostname, "Domainname": "", "User": c.get("user", ""), "AttachStdin": False,
                   "AttachStdout": False, "AttachStderr": False, "ExposedPorts": {k: {} for k in _ports(c)} or None,
                   "Tty": False, "OpenStdin": False, "StdinOnce": False, "Env": env, "Cmd": c["cmd"] or None,
                   "Image": c["image"], "Volumes": None, "WorkingDir": c.get("workdir") or "",
                   "Entrypoint": c["entrypoint"] or None, "OnBuild": None, "Labels": c["labels"]},
        "NetworkSettings": {"Bridge": "", "SandboxID": "",
                            "Ports": {}, "Networks": {net if net != "default" else "bridge": {}}},
    }


def go_template(fmt, obj):
    """``-f``/``--format``: Go template fields (``{{.A.B}}``, ``{{json .A}}``, ``{{.}}``), as the CLI prints them."""
    def value(path):
        v = obj
        for part in [p for p in path.split(".") if p]:
            v = v.get(part) if isinstance(v, dict) else None
        return v

    def show(v, as_json):
        if as_json:
            return json.dumps(v)
        if v is None:
            return "<no value>"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + " ".join(show(x, False) for x in v) + "]"
        if isinstance(v, dict):
            return "map[" + " ".join(f"{k}:{show(x, False)}" for k, x in sorted(v.items())) + "]"
        return str(v)

    out = re.sub(r"\{\{\s*(json\s+)?\.([A-Za-z0-9_.]*)\s*\}\}", lambda m: show(value(m.group(2)), bool(m.group(1))), fmt)
    return out.replace("\\t", "\t").replace("\\n", "\n")


# ---------------------------------------------------------------- the CLI's verbs, answered by the engine
def _no_such(ref, verb):
    if RUNTIME == "podman":
        return {"rc": 125, "err": f"Error: no container with name or ID \"{ref}\" found: no such container\n"}
    return {"rc": 1, "err": f"Error response from daemon: No such container: {ref}\n"}


VALUE_OPTS = {"--name", "-e", "--env", "--entrypoint", "-w", "--workdir", "-u", "--user", "-h", "--hostname", "-l",
              "--label", "--mount", "--tmpfs", "--network", "--net", "-p", "--publish", "--gpus", "--device", "--ipc",
              "--shm-size", "--ulimit", "--restart", "--runtime", "--cap-add", "--cap-drop", "--security-opt", "--pid",
              "--add-host", "-v", "--volume"}
FLAG_OPTS = {"-d", "--detach", "--privileged", "--init", "-i", "--interactive", "-t", "--tty", "-it", "-dit", "--rm"}


def _size(v):
    m = re.fullmatch(r"(\d+)([bkmg]?)b?", v.lower())
    if not m:
        raise ValueError(f"invalid size: '{v}'")
    return int(m.group(1)) * {"": 1, "b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}[m.group(2)]


def run(eng, args):
    opts, i = [], 0
    while i < len(args) and args[i].startswith("-"):
        a = args[i]
        key, eq, val = a.partition("=")
        if key in VALUE_OPTS:
            if not eq:
                i += 1
                if i >= len(args):
                    return {"rc": 125, "err": f"flag needs an argument: {a}\n"}
                val = args[i]
            opts.append((key, val))
        elif a in FLAG_OPTS:
            opts.append((a, ""))
        else:
            return {"rc": 125, "err": f"unknown flag: {key}\nSee '{RUNTIME} run --help'.\n"}
        i += 1
    if i >= len(args):
        return {"rc": 125, "err": f"\"{RUNTIME} run\" requires at least 1 argument.\n"}
    image, rest = args[i], args[i + 1:]
    if image not in eng.images:
        if RUNTIME == "podman":
            return {"rc": 125, "err": f"Trying to pull {image}...\nError: initializing source docker://{image}: pinging "
                    "container registry: dial tcp: lookup: no such host\n"}
        return {"rc": 125, "err": f"Unable to find image '{image}' locally\n{RUNTIME}: Error response from daemon: "
                "Get \"https://registry-1.docker.io/v2/\": dial tcp: lookup registry-1.docker.io: no such host.\n"}
    img = eng.images[image]
    c = {"id": secrets.token_hex(32), "name": "", "image": image, "created": now(), "entrypoint": list(img.get("entrypoint") or []),
         "cmd": list(rest) or list(img.get("cmd") or []), "env": list(img.get("env") or []), "workdir": img.get("workdir", ""),
         "user": "", "labels": {}, "mounts": [], "tmpfs": {}, "ports": [], "network": "", "gpus": "", "devices": [],
         "ipc": "", "shm_size": 0, "ulimits": [], "restart": {}, "runtime": "", "privileged": False, "cap_add": [],
         "cap_drop": [], "security_opt": [], "init": False, "pid": "", "add_host": [], "hostname": "",
         "create_command": [RUNTIME, "run", *args], "state": {"status": "created", "running": False, "pid": 0}}
    detach = False
    for k, v in opts:
        if k == "--name":
            c["name"] = v
        elif k in ("-e", "--env"):
            if "=" not in v:
                v = f"{v}={os.environ.get(v, '')}"
            c["env"] = [e for e in c["env"] if e.split("=", 1)[0] != v.split("=", 1)[0]] + [v]
        elif k == "--entrypoint":
            ep = json.loads(v) if v.startswith("[") else [v] if v else []
            c["entrypoint"], c["cmd"] = ep, list(rest)
        elif k in ("-w", "--workdir"):
            c["workdir"] = v
        elif k in ("-u", "--user"):
            c["user"] = v
        elif k in ("-h", "--hostname"):
            c["hostname"] = v
        elif k in ("-l", "--label"):
            lk, _, lv = v.partition("=")
            c["labels"][lk] = lv
        elif k == "--mount":
            kv = dict(p.split("=", 1) if "=" in p else (p, "true") for p in v.split(","))
            c["mounts"].append({"type": kv.get("type", "volume"), "src": kv.get("src") or kv.get("source", ""),
                                "dst": kv.get("dst") or kv.get("destination") or kv.get("target", ""),
                                "ro": kv.get("readonly", kv.get("ro", "false")) in ("true", "1")})
        elif k in ("-v", "--volume"):
            parts = v.split(":")
            c["mounts"].append({"type": "bind" if parts[0].startswith("/") else "volume", "src": parts[0],
                                "dst": parts[1] if len(parts) > 1 else parts[0], "ro": len(parts) > 2 and "ro" in parts[2],
                                "from_v": True})
        elif k == "--tmpfs":
            dst, _, o = v.partition(":")
            c["tmpfs"][dst] = o
        elif k in ("--network", "--net"):
            c["network"] = v
        elif k in ("-p", "--publish"):
            c["ports"].append(v)
        elif k == "--gpus":
            c["gpus"] = v
        elif k == "--device":
            c["devices"].append(v)
        elif k == "--ipc":
            c["ipc"] = v
        elif k == "--shm-size":
            c["shm_size"] = _size(v)
        elif k == "--ulimit":
            c["ulimits"] = [u for u in c["ulimits"] if u.split("=", 1)[0] != v.split("=", 1)[0]] + [v]
        elif k == "--restart":
            name, _, n = v.partition(":")
            c["restart"] = {"Name": name, "MaximumRetryCount": int(n or 0)}
        elif k == "--runtime":
            c["runtime"] = v
        elif k == "--privileged":
            c["privileged"] = True
        elif k == "--cap-add":
            c["cap_add"].append(v)
        elif k == "--cap-drop":
            c["cap_drop"].append(v)
        elif k == "--security-opt":
            c["security_opt"].append(v)
        elif k == "--init":
            c["init"] = True
        elif k == "--pid":
            c["pid"] = v
        elif k == "--add-host":
            c["add_host"].append(v)
        elif k in ("-d", "--detach", "-dit"):
            detach = True
    if not detach:
        return {"rc": 125, "err": "this host's engine starts containers detached only: give -d\n"}
    if not c["name"]:
        c["name"] = "sim_" + c["id"][:8]
    if any(x["name"] == c["name"] for x in eng.containers):
        if RUNTIME == "podman":
            return {"rc": 125, "err": f"Error: creating container storage: the container name \"{c['name']}\" is already in "
                    "use by another container. You have to remove that container to be able to reuse that name: that "
                    "name is already in use\n"}
        return {"rc": 125, "err": f"{RUNTIME}: Error response from daemon: Conflict. The container name \"/{c['name']}\" "
                "is already in use by container. You have to remove (or rename) that container to be able to reuse "
                "that name.\n"}
    eng.containers.append(c)
    err = eng.start(c)
    if err:
        return {"rc": 127 if RUNTIME == "docker" else 126, "out": c["id"] + "\n",
                "err": f"{RUNTIME}: Error response from daemon: failed to create task for container: exec: {err}\n"}
    return {"rc": 0, "out": c["id"] + "\n"}


def _status(c):
    st = c["state"]
    if st["running"]:
        return "Up"
    if st["status"] == "created":
        return "Created"
    return f"Exited ({st.get('exit_code', 0)})"


def ps(eng, args):
    all_, quiet, trunc, fmt, filters = False, False, True, None, []
    it = iter(args)
    for a in it:
        if a in ("-a", "--all"):
            all_ = True
        elif a in ("-q", "--quiet"):
            quiet = True
        elif a == "--no-trunc":
            trunc = False
        elif a in ("--format", "-f") or a.startswith("--format="):
            fmt = a.split("=", 1)[1] if "=" in a else next(it, "")
        elif a == "--filter" or a.startswith("--filter="):
            filters.append(a.split("=", 1)[1] if a.startswith("--filter=") else next(it, ""))
        else:
            return {"rc": 125, "err": f"unknown flag: {a}\n"}
    rows = []
    for c in eng.containers:
        if not all_ and not c["state"]["running"]:
            continue
        ok = True
        for f in filters:
            k, _, v = f.partition("=")
            ok = ok and ((k == "name" and v in c["name"]) or (k == "id" and c["id"].startswith(v))
                         or (k == "status" and _status(c).lower().startswith(v[:4])))
        if ok:
            rows.append(c)
    out = []
    for c in rows:
        cid = c["id"][:12] if trunc else c["id"]
        cmd = " ".join([*c["entrypoint"], *c["cmd"]])
        fields = {"ID": cid, "Names": c["name"], "Image": c["image"], "Command": json.dumps(cmd if not trunc else cmd[:20]
                  + ("…" if len(cmd) > 20 else "")), "Status": _status(c), "State": c["state"]["status"],
                  "Ports": ", ".join(c["ports"]), "CreatedAt": c["created"],
                  "Labels": ",".join(f"{k}={v}" for k, v in sorted(c["labels"].items()))}
        if quiet:
            out.append(cid)
        elif fmt:
            out.append(go_template(fmt.removeprefix("table ").strip() if fmt.startswith("table") else fmt, fields))
        else:
            out.append(f"{cid}   {c['image']}   {fields['Command']}   {c['created'][:19]}   {fields['Status']}   "
                       f"{fields['Ports']}   {c['name']}")
    head = [] if quiet or fmt else ["CONTAINER ID   IMAGE   COMMAND   CREATED   STATUS   PORTS   NAMES"]
    return {"rc": 0, "out": "\n".join(head + out) + ("\n" if head or out else "")}


def handle(eng, req):
    verb, args = req["verb"], req["args"]
    if verb == "ps":
        return ps(eng, args)
    if verb == "run":
        return run(eng, args)
    if verb == "inspect":
        fmt, refs, it = None, [], iter(args)
        for a in it:
            if a in ("-f", "--format"):
                fmt = next(it, "")
            elif a.startswith("--format="):
                fmt = a.split("=", 1)[1]
            elif a == "--type":
                t = next(it, "")
                if t != "container":
                    return {"rc": 125, "err": f"this host's engine inspects containers only, not {t}\n"}
            elif a.startswith("--type="):
                continue
            elif a.startswith("-"):
                return {"rc": 125, "err": f"unknown flag: {a}\n"}
            else:
                refs.append(a)
        found, errs = [], []
        for r in refs:
            c = eng.find(r)
            if c is None:
                errs.append(r)
            else:
                found.append(inspect(eng, c))
        if fmt is not None:
            out = "".join(go_template(fmt, d) + "\n" for d in found)
        else:
            out = json.dumps(found, indent=4 if RUNTIME == "docker" else 5) + "\n"
        if errs:
            if RUNTIME == "podman":
                return {"rc": 125, "out": out if found else "[]\n",
                        "err": "".join(f"Error: no such object: \"{r}\"\n" for r in errs)}
            return {"rc": 1, "out": out if found or fmt is None else "",
                    "err": "".join(f"Error: No such object: {r}\n" for r in errs)}
        return {"rc": 0, "out": out}
    if verb == "rename":
        if len(args) != 2:
            return {"rc": 125, "err": f"\"{RUNTIME} rename\" requires exactly 2 arguments.\n"}
        c = eng.find(args[0])
        if c is None:
            return _no_such(args[0], verb)
        if any(x["name"] == args[1] for x in eng.containers):
            return {"rc": 125, "err": f"Error response from daemon: Error when allocating new name: Conflict. The container "
                    f"name \"/{args[1]}\" is already in use.\n"}
        c["name"] = args[1]
        eng.save()
        return {"rc": 0}
    if verb in ("stop", "start", "restart", "rm", "logs", "env"):
        force = any(a in ("-f", "--force") for a in args)
        tail = None
        names, it = [], iter(args)
        for a in it:
            if a in ("-t", "--time", "--timeout", "--tail", "-n"):
                v = next(it, "")
                if a in ("--tail", "-n"):
                    tail = v
            elif not a.startswith("-"):
                names.append(a)
        out, err, rc = [], [], 0
        for n in names:
            c = eng.find(n)
            if c is None:
                e = _no_such(n, verb)
                err.append(e["err"])
                rc = e["rc"]
                continue
            if verb == "env":   # for `exec`: what runs in it
                if not c["state"]["running"]:
                    return {"rc": 126 if RUNTIME == "podman" else 1,
                            "err": f"Error response from daemon: container {c['id']} is not running\n"}
                env = list(c["env"]) + (["container=podman"] if RUNTIME == "podman" else [])
                return {"rc": 0, "out": json.dumps({"env": env, "workdir": c.get("workdir") or "/"})}
            if verb == "logs":
                try:
                    text = open(eng.logfile(c), errors="replace").read()
                except OSError:
                    text = ""
                lines = text.splitlines(keepends=True)
                if tail and tail != "all":
                    lines = lines[-int(tail):] if int(tail) else []
                out.append("".join(lines).rstrip("\n"))
                continue
            if verb == "rm":
                if c["state"]["running"] and not force:
                    err.append(f"Error response from daemon: cannot remove container \"/{c['name']}\": container is "
                               "running: stop the container before removing or force remove\n")
                    rc = 1
                    continue
                eng.stop(c, timeout=0)
                eng.containers.remove(c)
                eng.save()
            elif verb in ("stop", "restart"):
                eng.stop(c)
            if verb in ("start", "restart"):
                e2 = eng.start(c)
                if e2:
                    err.append(f"Error response from daemon: {e2}\n")
                    rc = 1
                    continue
            out.append(n)
        return {"rc": rc, "out": "\n".join(out) + ("\n" if out else ""), "err": "".join(err)}
    return {"rc": 125, "err": f"{RUNTIME}: '{verb}' is not a {RUNTIME} command the simulated host answers.\n"}


def ask(verb, args):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(SOCKET)
    except OSError:
        if RUNTIME == "podman":
            print("Error: the container engine does not answer", file=sys.stderr)
            return None
        print(f"Cannot connect to the Docker daemon at unix://{SOCKET}. Is the docker daemon running?", file=sys.stderr)
        return None
    s.sendall((json.dumps({"verb": verb, "args": args}) + "\n").encode())
    return json.loads(s.makefile().readline())


def cli(argv):
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(f"Usage:  {RUNTIME} [OPTIONS] COMMAND\n\nCommands: ps inspect run exec stop start restart rm rename logs")
        return 0
    if argv[0] in ("-v", "--version", "version"):
        print(VERSION[RUNTIME])
        return 0
    verb, args = argv[0], argv[1:]
    if verb == "container" and args:   # `docker container inspect …`
        verb, args = args[0], args[1:]
    if verb == "exec":
        env_add, workdir, i = [], None, 0
        while i < len(args) and args[i].startswith("-"):
            a = args[i]
            if a in ("-e", "--env", "-w", "--workdir", "-u", "--user"):
                i += 1
                if a in ("-e", "--env"):
                    env_add.append(args[i])
                elif a in ("-w", "--workdir"):
                    workdir = args[i]
            i += 1
        if i >= len(args) or i + 1 >= len(args):
            print(f"\"{RUNTIME} exec\" requires at least 2 arguments.", file=sys.stderr)
            return 125
        reply = ask("env", [args[i]])
        if reply is None:
            return 1
        if reply.get("rc"):
            sys.stderr.write(reply.get("err", ""))
            return int(reply["rc"])
        got = json.loads(reply["out"])
        env = dict(e.split("=", 1) for e in got["env"] + env_add if "=" in e)
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        try:
            os.chdir(workdir or got["workdir"])
            os.execvpe(args[i + 1], args[i + 1:], env)
        except OSError as exc:
            print(f"OCI runtime exec failed: exec failed: {exc}: unknown", file=sys.stderr)
            return 126
    reply = ask(verb, args)
    if reply is None:
        return 1
    sys.stdout.write(reply.get("out", ""))
    sys.stderr.write(reply.get("err", ""))
    return int(reply.get("rc", 0))


TEMPLATE_DATA = {}


if __name__ == "__main__":
    if os.path.basename(sys.argv[0]) in ("docker", "podman"):
        sys.exit(cli(sys.argv[1:]))
    try:
        import ctypes
        ctypes.CDLL(None).prctl(15, b"dockerd" if RUNTIME == "docker" else b"conmon", 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass
    if RUNTIME == "podman":
        with open(TEMPLATE) as f:
            TEMPLATE_DATA = json.load(f)
    engine_main()
