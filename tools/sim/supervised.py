"""A simulated host's supervisor and container (``host.supervisor``, ``host.container``).

supervisord: the real one (the ``supervisor`` package's code, as ``pip install supervisor`` lays it out for the
system's python: ``/usr/local/lib/python3.X/dist-packages/supervisor`` and the ``supervisord`` / ``supervisorctl``
launchers in ``/usr/local/bin``), with Debian's ``/etc/supervisor/supervisord.conf`` and the server as
``[program:NAME]`` in ``conf.d/NAME.conf``. It is started with ``-n -c CONFIG`` as its init would, starts the server,
gives it the ``SUPERVISOR_*`` variables, and restarts it on ``supervisorctl restart`` / ``update``: an experiment
goes through it as on any host. Nothing of the scenario is in its files but the server's command line, folder and
environment, as a real program section holds them.

A container: the marks its runtime leaves in its root (docker's empty ``/.dockerenv``; podman's
``/run/.containerenv`` naming the container, and ``container=podman`` in the environment of what runs in it).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ScenarioError

if TYPE_CHECKING:
    from .sandbox import SimHost

PYV = f"python{sys.version_info.major}.{sys.version_info.minor}"
DIST_PACKAGES = f"/usr/local/lib/{PYV}/dist-packages"
SOCKET = "/var/run/supervisor.sock"
LOG_DIR = "/var/log/supervisor"

# Debian's /etc/supervisor/supervisord.conf (package supervisor 4.2.5), as installed
MAIN_CONF = """; supervisor config file

[unix_http_server]
file={socket}   ; (the path to the socket file)
chmod=0700                       ; sockef file mode (default 0700)

[supervisord]
logfile={logs}/supervisord.log ; (main log file;default $CWD/supervisord.log)
pidfile={run}/supervisord.pid ; (supervisord pidfile;default supervisord.pid)
childlogdir={logs}            ; ('AUTO' child log dir, default $TEMP)

; the below section must remain in the config file for RPC
; (supervisorctl/web interface) to work, additional interfaces may be
; added by defining them in separate rpcinterface: sections
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{socket} ; use a unix:// URL  for a unix socket

; The [include] section can just contain the "files" setting.  This
; setting can list multiple files (separated by whitespace or
; newlines).  It can also contain wildcards.  The filenames are
; interpreted as relative to this file.  Included files *cannot*
; include files themselves.

[include]
files = {confd}/*.conf
"""

# pip's launcher of a console script (what `pip install supervisor` writes), with the folder it was installed to
LAUNCHER = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
if {site!r} not in sys.path:
    sys.path.append({site!r})
from supervisor.{module} import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""

# the unsealed host's sha256sum: the bytes as the host shows them (its folder's prefix removed), as `cat` shows them
SHA256SUM = """#!{python} -I
import hashlib, sys
SANDBOX = {sandbox!r}.encode()
args = sys.argv[1:]
if any(a.startswith("-") and a != "-" for a in args):
    import os
    os.execv("/usr/bin/sha256sum", ["sha256sum", *args])
rc = 0
for name in args or ["-"]:
    try:
        data = sys.stdin.buffer.read() if name == "-" else open(name, "rb").read()
    except OSError as e:
        print(f"sha256sum: {{name}}: {{e.strerror}}", file=sys.stderr)
        rc = 1
        continue
    print(f"{{hashlib.sha256(data.replace(SANDBOX, b'')).hexdigest()}}  {{name}}")
sys.exit(rc)
"""


def supervisor(sim: SimHost) -> dict[str, Any] | None:
    return sim.state.get("supervisor")


def container(sim: SimHost) -> dict[str, Any] | None:
    return sim.state.get("container")


def inside(sim: SimHost) -> dict[str, Any] | None:
    """The container debugagent's commands run in (``connect: inside``), else None."""
    c = container(sim)
    return c if c and c.get("connect", "inside") == "inside" else None


def engine(sim: SimHost) -> dict[str, Any] | None:
    """The container the host runs, seen from the host (``connect: host``): its runtime's CLI answers there."""
    c = container(sim)
    return c if c and c.get("connect") == "host" else None


PID1_SCRIPT = "/run/.container-init"


def pid1(sim: SimHost) -> bool:
    """The server is its container's pid 1 (``host.container.pid1``)."""
    c = inside(sim)
    return bool(c and c.get("pid1"))


def start_pid1(sim: SimHost, env: str, argv: str, cwd: str, log: str) -> None:
    """Sealed: the namespace's pid 1 (a shell waiting for this script) runs it and becomes the server (``exec``),
    its output in the server's log; the script removes itself first."""
    tmp = sim.path(PID1_SCRIPT + ".tmp")
    tmp.write_text(f"rm -f {PID1_SCRIPT}\nmkdir -p {shlex.quote(os.path.dirname(log))}\ncd {shlex.quote(cwd)} || exit 1\n"
                   f"exec env -i {env} {argv} > {shlex.quote(log)} 2>&1 < /dev/null\n")
    tmp.rename(sim.path(PID1_SCRIPT))


def container_id(sim: SimHost) -> str:
    c = container(sim) or {}
    return c.get("id") or hashlib.sha256(f"container:{sim.scenario.name}".encode()).hexdigest()


# where a container's runtime leaves its marks in the root (what debugagent's host id and server_shape look for): an
# unsealed host rewrites them onto its own folder, whether it is a container or not, so this machine's own marks
# (a /.dockerenv where it runs in docker) never show on a simulated host; sealed, its root is its own
MARKS = frozenset({"/.dockerenv", "/run/.containerenv"})


def unsealed_roots(sim: SimHost) -> set[str]:
    """Folders an unsealed host needs rewritten for its supervisor (sealed, /etc, /usr/local and /var are its own)."""
    sup = supervisor(sim)
    eng = engine(sim)
    if eng:
        return {ENGINE_STATE[eng["runtime"]], "/usr/local/lib", "/usr/local/libexec"}
    if not sup:
        return set()
    if sup["kind"] == "systemd":
        return {"/etc/systemd", "/run/systemd", "/usr/local/lib"}
    return {os.path.dirname(sup["config"]), LOG_DIR, "/usr/local/lib"}


def bwrap_args(sim: SimHost) -> list[str]:
    """What a sealed host's root needs for its supervisor (Debian's /var/run link, supervisord's log folder)."""
    sup = supervisor(sim)
    eng = engine(sim)
    if eng:
        d = ENGINE_STATE[eng["runtime"]]
        return ["--symlink", "../run", "/var/run", "--bind", str(sim.path(d)), d]
    if not sup:
        return []
    return ["--symlink", "../run", "/var/run", *(["--dir", LOG_DIR] if sup["kind"] == "supervisord" else [])]


def root_files(sim: SimHost) -> dict[str, bytes]:
    """Files of a sealed host's ``/`` itself (written into it, not bound): a docker container's ``/.dockerenv``."""
    c = inside(sim)
    return {"/.dockerenv": b""} if c and c["runtime"] == "docker" else {}


def server_env(sim: SimHost) -> dict[str, str]:
    """What every process of the container carries (podman gives its processes ``container=podman``)."""
    c = inside(sim)
    return {"container": "podman"} if c and c["runtime"] == "podman" else {}


def layout(sim: SimHost) -> None:
    if engine(sim):
        _engine(sim)
        return
    c = inside(sim)
    if c and not sim.sealed:   # the marks in the host's folder (an unsealed host's MARKS are rewritten onto it)
        for dest, content in root_files(sim).items():
            sim.path(dest).write_bytes(content)
            sim.path(dest).chmod(0o755)
    if c and c["runtime"] == "podman":
        cid = container_id(sim)
        image = c.get("image") or "localhost/inference:latest"
        text = (f'engine="podman-4.3.1"\nname="{c.get("name") or sim.state["hostname"]}"\nid="{cid}"\n'
                f'image="{image}"\nimageid="{hashlib.sha256(image.encode()).hexdigest()}"\nrootless=0\n')
        sim.path("/run").mkdir(parents=True, exist_ok=True)
        (sim.path("/run") / ".containerenv").write_text(text)
    sup = supervisor(sim)
    if sup and sup["kind"] == "systemd":
        _systemd(sim)
    elif sup:
        _supervisord(sim)


def _supervisord(sim: SimHost) -> None:
    sup = supervisor(sim)
    assert sup is not None
    try:
        import supervisor as pkg  # noqa: PLC0415 - only where a host has one
    except ImportError as exc:
        raise ScenarioError("host.supervisor needs the `supervisor` package where debugagent runs (the simulated "
                            "host runs the real supervisord)", file=sim.scenario.source, field="host.supervisor",
                            fix="pip install supervisor (it is in debugagent's [test] extra)") from exc
    from .sandbox import _link_or_copy
    src = Path(pkg.__file__).parent
    site = sim.path(DIST_PACKAGES)
    site.mkdir(parents=True, exist_ok=True)
    if not (site / "supervisor").exists():
        shutil.copytree(src, site / "supervisor", copy_function=_link_or_copy,
                        ignore=shutil.ignore_patterns("tests"))   # its bytecode too, as installed (hard links)
        info = next(src.parent.glob("supervisor-*.dist-info"), None)
        if info is not None:
            shutil.copytree(info, site / info.name, copy_function=_link_or_copy)
    python = sim.base_python() if sim.sealed else sim.inside(sim.state["python"])
    bindir = sim.path("/usr/local/bin")
    for name in ("supervisord", "supervisorctl"):
        (bindir / name).write_text(LAUNCHER.format(python=python, site=sim.inside(DIST_PACKAGES), module=name))
        (bindir / name).chmod(0o755)
    conf = sup["config"]
    confd = os.path.join(os.path.dirname(conf), "conf.d")
    sim.path(confd).mkdir(parents=True, exist_ok=True)
    sim.path(LOG_DIR).mkdir(parents=True, exist_ok=True)
    # unsealed, supervisord itself reads these paths: its socket, pid file and logs in the host's folder
    run = "/var/run" if sim.sealed else sim.inside("/run")
    main = MAIN_CONF.format(socket=f"{run}/supervisor.sock", run=run, logs=sim.inside(LOG_DIR), confd=sim.inside(confd))
    sim.path(conf).write_text(main)
    program = program_text(sim)
    sim.path(f"{confd}/{sup['program']}.conf").write_text(program if sim.sealed else sim.shell.rewrite(program))
    if not sim.sealed:
        sha = bindir / "sha256sum"
        sha.write_text(SHA256SUM.format(python=sys.executable, sandbox=str(sim.sandbox)))
        sha.chmod(0o755)


def _value(v: str) -> str:
    return v.replace("%", "%%")


def program_text(sim: SimHost) -> str:
    """``[program:NAME]`` as an operator writes it for an inference server: its command line, folder, environment
    (supervisord's ``KEY="value"`` list), its whole process group stopped with it (the engine's workers), its output
    in the server's log."""
    sup = supervisor(sim)
    assert sup is not None
    srv = sim.state["server"]
    command = " ".join(shlex.quote(a) for a in sim.server_argv())
    env = ",".join(f'{k}="{v}"' for k, v in {**server_env(sim), **srv["env"]}.items())
    lines = [f"[program:{sup['program']}]", f"command={_value(command)}", f"directory={_value(sim._cwd())}"]
    if env:
        lines.append(f"environment={_value(env)}")
    lines += ["autostart=true", "autorestart=true", "startsecs=1", "stopwaitsecs=30", "stopasgroup=true",
              "killasgroup=true", "redirect_stderr=true", f"stdout_logfile={srv.get('log_file') or '/tmp/server.log'}"]
    return "\n".join(lines) + "\n"


def start_command(sim: SimHost) -> str:
    """supervisord started as its init starts it (Debian's unit: ``supervisord -n -c CONFIG``), in the background;
    systemd's service manager, which starts its units."""
    eng = engine(sim)
    if eng:
        return (f"cd / && {{ setsid nohup env -i LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
                f"{ENGINE[eng['runtime']]} > /dev/null 2>&1 < /dev/null & }}; echo started")
    sup = supervisor(sim)
    assert sup is not None
    if sup["kind"] == "systemd":
        return (f"cd / && {{ setsid nohup env -i LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
                f"{MANAGER} > /dev/null 2>&1 < /dev/null & }}; echo started")
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                                           "LANG": "C.UTF-8", **server_env(sim)}.items())
    return (f"mkdir -p {LOG_DIR} && cd / && {{ setsid nohup env -i {env} /usr/local/bin/supervisord -n -c "
            f"{shlex.quote(sup['config'])} > /dev/null 2>&1 < /dev/null & }}; echo started")


# ---------------------------------------------------------------- systemd
MANAGER = "/usr/local/lib/systemd/systemd"
UNIT_DIR = "/etc/systemd/system"

# Bind a file over /proc/PID/cgroup in the sealed host's mount namespace: the namespace's user namespace joined first
# where this machine's user is not root, then no exec, so the capabilities it gives are kept for mount(2)
BIND_HELPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
init, src, dst = sys.argv[1:4]
for ns, flag in (("user", 0x10000000), ("mnt", 0x00020000)):
    if ns == "user" and os.geteuid() == 0:
        continue
    if libc.setns(os.open("/proc/%s/ns/%s" % (init, ns), os.O_RDONLY), flag) != 0:
        sys.exit("setns %s: %s" % (ns, os.strerror(ctypes.get_errno())))
if libc.mount(src.encode(), dst.encode(), None, 4096, None) != 0:
    sys.exit("mount: %s" % os.strerror(ctypes.get_errno()))
"""


def systemd_word(word: str) -> str:
    """One word of ``ExecStart=`` / ``Environment=``: bare where systemd reads it so, else quoted as systemd reads it."""
    from ..supervise import systemd_quote
    return word if word and not re.search(r"[\s\"'\\%$;]", word) else systemd_quote(word)


def unit_text(sim: SimHost) -> str:
    """``/etc/systemd/system/NAME.service`` as an operator writes one for an inference server (vllm-project/vllm#27542
    shows one): its folder, environment, command line, restarted always, its output appended to the server's log."""
    sup = supervisor(sim)
    assert sup is not None
    srv = sim.state["server"]
    engine = "vLLM" if "vllm" in srv["cmd"] else "SGLang" if "sglang" in srv["cmd"] else "inference"
    lines = ["[Unit]", f"Description={engine} server", "After=network-online.target", "", "[Service]", "Type=simple",
             f"WorkingDirectory={sim._cwd()}"]
    lines += [f"Environment={systemd_word(f'{k}={v}')}" for k, v in srv["env"].items()]
    lines += ["ExecStart=" + " ".join(systemd_word(a) for a in sim.server_argv()), "Restart=always", "RestartSec=5",
              f"StandardOutput=append:{srv.get('log_file') or '/tmp/server.log'}", "StandardError=inherit", "",
              "[Install]", "WantedBy=multi-user.target"]
    return "\n".join(lines) + "\n"


def _systemd(sim: SimHost) -> None:
    sup = supervisor(sim)
    assert sup is not None
    units = sim.path(UNIT_DIR)
    units.mkdir(parents=True, exist_ok=True)
    text = unit_text(sim)
    (units / f"{sup['program']}.service").write_text(text if sim.sealed else sim.shell.rewrite(text))
    code = (Path(__file__).parent / "guest" / "systemd.py").read_text()
    for const, value in (("SOCKET", "/run/systemd/private"), ("UNITS", UNIT_DIR), ("SERVICE", "/run/nvidia-gpu/service.sock")):
        code = code.replace(f'{const} = "{value}"', f'{const} = "{sim.inside(value)}"', 1)
    python = sim.base_python() if sim.sealed else sim.inside(sim.state["python"])
    for path in (MANAGER, "/usr/local/bin/systemctl"):
        p = sim.path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"#!{python} -I\n" + code)
        p.chmod(0o755)
    sim.path("/run/systemd").mkdir(parents=True, exist_ok=True)


def show_cgroup(sim: SimHost, pid: int, path: str) -> str:
    """The unit's process shows ``0::PATH`` in ``/proc/PID/cgroup`` (cgroup v2, as a systemd host): sealed, a file
    bound over it in the host's mount namespace; not sealed, the host's ``/proc/PID`` made a folder of the real one's
    entries with that file (``SimShell.sync_proc``). "" when done, else why not."""
    import subprocess
    text = f"0::{path}\n"
    if not sim.sealed:
        d = sim.base / "cgroups"
        d.mkdir(exist_ok=True)
        (d / str(pid)).write_text(text)
        return ""
    d = sim.path("/run/systemd/cgroup")
    d.mkdir(parents=True, exist_ok=True)
    (d / str(pid)).write_text(text)
    r = subprocess.run([sys.executable, "-I", "-c", BIND_HELPER, str(sim.init_pid), f"/run/systemd/cgroup/{pid}",
                        f"/proc/{pid}/cgroup"], capture_output=True, text=True, timeout=30)
    return "" if r.returncode == 0 else (r.stderr.strip() or "the cgroup could not be shown")


# ---------------------------------------------------------------- a host that runs the container (connect: host)
ENGINE = {"docker": "/usr/local/bin/dockerd", "podman": "/usr/local/libexec/podman/engine"}
ENGINE_STATE = {"docker": "/var/lib/docker", "podman": "/var/lib/containers"}
ENGINE_SOCKET = {"docker": "/run/docker.sock", "podman": "/run/podman/podman.sock"}
ENGINE_TEMPLATE = "/usr/local/lib/sim-engine/podman-4.3.1-inspect.json"
IMAGE_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _engine(sim: SimHost) -> None:
    """The runtime's state as ``RUNTIME run -d`` left it: the image (its entrypoint is the server's command, its
    working folder the server's), the container (its command the server's flags, its environment the image's and the
    server's ``-e``), running; the engine and its CLI (``tools/sim/guest/engine.py``) in ``/usr/local``."""
    import json
    eng = engine(sim)
    assert eng is not None
    rt = eng["runtime"]
    srv = sim.state["server"]
    argv = sim.server_argv()
    words = srv["cmd"].split()
    image = eng.get("image") or "localhost/inference:latest"
    cid = container_id(sim)
    img_id = hashlib.sha256(f"image:{image}".encode()).hexdigest()
    env = [IMAGE_PATH, "LANG=C.UTF-8"] + [f"{k}={v}" for k, v in srv["env"].items()]
    mounts = []
    for m in eng.get("mounts") or []:
        parts = m.split(":")
        mounts.append({"type": "bind", "src": parts[0], "dst": parts[1], "ro": parts[2:] == ["ro"], "from_v": True})
        sim.path(parts[0]).mkdir(parents=True, exist_ok=True)
    restart = eng.get("restart") or ""
    name, _, n = restart.partition(":")
    create = [rt, "run", "-d", "--name", eng["name"], *[x for k, v in srv["env"].items() for x in ("-e", f"{k}={v}")],
              *(["--network", eng["network"]] if eng.get("network") else []), *(["--gpus", eng["gpus"]] if eng.get("gpus") else []),
              *(["--ipc", eng["ipc"]] if eng.get("ipc") else []), *[x for m in eng.get("mounts") or [] for x in ("-v", m)],
              *[x for k, v in (eng.get("labels") or {}).items() for x in ("--label", f"{k}={v}")],
              *(["--restart", restart] if restart else []), image, *argv[len(words):]]
    state = {
        "images": {image: {"id": img_id, "digest": hashlib.sha256(f"digest:{image}".encode()).hexdigest(),
                           "entrypoint": words, "cmd": [], "env": [IMAGE_PATH, "LANG=C.UTF-8"], "workdir": sim._cwd()}},
        "containers": [{
            "id": cid, "name": eng["name"], "image": image, "created": "2026-11-29T21:14:00.000000000Z",
            "entrypoint": words, "cmd": argv[len(words):], "env": env, "workdir": sim._cwd(), "user": "",
            "labels": dict(eng.get("labels") or {}), "mounts": mounts, "tmpfs": {}, "ports": [],
            "network": eng.get("network") or "", "gpus": eng.get("gpus") or "", "devices": [], "ipc": eng.get("ipc") or "",
            "shm_size": 0, "ulimits": [], "restart": {"Name": name, "MaximumRetryCount": int(n or 0)} if name else {},
            "runtime": "", "privileged": False, "cap_add": [], "cap_drop": [], "security_opt": [], "init": False,
            "pid": "", "add_host": [], "hostname": "", "create_command": create,
            "state": {"status": "running", "running": True, "pid": 0}}]}
    d = sim.path(ENGINE_STATE[rt])
    d.mkdir(parents=True, exist_ok=True)
    text = json.dumps(state, indent=1)
    (d / "sim-engine.json").write_text(text if sim.sealed else sim.shell.rewrite(text))
    code = (Path(__file__).parent / "guest" / "engine.py").read_text()
    for const, value in (("STATE", f"{ENGINE_STATE['docker']}/sim-engine.json"), ("SOCKET", ENGINE_SOCKET["docker"]),
                         ("SERVICE", "/run/nvidia-gpu/service.sock"), ("TEMPLATE", ENGINE_TEMPLATE)):
        want = {"STATE": f"{ENGINE_STATE[rt]}/sim-engine.json", "SOCKET": ENGINE_SOCKET[rt]}.get(const, value)
        code = code.replace(f'{const} = "{value}"', f'{const} = "{sim.inside(want)}"', 1)
    code = code.replace('RUNTIME = "docker"', f'RUNTIME = {rt!r}', 1).replace(
        'HOSTNAME = "localhost"', f'HOSTNAME = {sim.state["hostname"]!r}', 1)
    python = sim.base_python() if sim.sealed else sim.inside(sim.state["python"])
    for path in (ENGINE[rt], f"/usr/local/bin/{rt}"):
        p = sim.path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"#!{python} -I\n" + code)
        p.chmod(0o755)
    t = sim.path(ENGINE_TEMPLATE)
    t.parent.mkdir(parents=True, exist_ok=True)
    t.write_text((Path(__file__).parent / "guest" / "podman-4.3.1-inspect.json").read_text())
    sim.path(ENGINE_SOCKET[rt]).parent.mkdir(parents=True, exist_ok=True)
