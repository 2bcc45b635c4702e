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


def container_id(sim: SimHost) -> str:
    c = container(sim) or {}
    return c.get("id") or hashlib.sha256(f"container:{sim.scenario.name}".encode()).hexdigest()


def unsealed_roots(sim: SimHost) -> set[str]:
    """Folders an unsealed host needs rewritten for its supervisor (sealed, /etc, /usr/local and /var are its own)."""
    sup = supervisor(sim)
    if not sup:
        return set()
    return {os.path.dirname(sup["config"]), LOG_DIR, "/usr/local/lib"}


def bwrap_args(sim: SimHost) -> list[str]:
    """What a sealed host's root needs for its supervisor (Debian's /var/run link, supervisord's log folder)."""
    if not supervisor(sim):
        return []
    return ["--symlink", "../run", "/var/run", "--dir", LOG_DIR]


def root_files(sim: SimHost) -> dict[str, bytes]:
    """Files of a sealed host's ``/`` itself (written into it, not bound): a docker container's ``/.dockerenv``."""
    c = container(sim)
    return {"/.dockerenv": b""} if c and c["runtime"] == "docker" else {}


def server_env(sim: SimHost) -> dict[str, str]:
    """What every process of the container carries (podman gives its processes ``container=podman``)."""
    c = container(sim)
    return {"container": "podman"} if c and c["runtime"] == "podman" else {}


def layout(sim: SimHost) -> None:
    c = container(sim)
    if c and c["runtime"] == "podman":
        cid = container_id(sim)
        image = c.get("image") or "localhost/inference:latest"
        text = (f'engine="podman-4.3.1"\nname="{c.get("name") or sim.state["hostname"]}"\nid="{cid}"\n'
                f'image="{image}"\nimageid="{hashlib.sha256(image.encode()).hexdigest()}"\nrootless=0\n')
        sim.path("/run").mkdir(parents=True, exist_ok=True)
        (sim.path("/run") / ".containerenv").write_text(text)
    if supervisor(sim):
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
                        ignore=shutil.ignore_patterns("tests", "__pycache__"))
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
    """supervisord started as its init starts it (Debian's unit: ``supervisord -n -c CONFIG``), in the background."""
    sup = supervisor(sim)
    assert sup is not None
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                                           "LANG": "C.UTF-8", **server_env(sim)}.items())
    return (f"mkdir -p {LOG_DIR} && cd / && {{ setsid nohup env -i {env} /usr/local/bin/supervisord -n -c "
            f"{shlex.quote(sup['config'])} > /dev/null 2>&1 < /dev/null & }}; echo started")
