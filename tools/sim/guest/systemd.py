"""A simulated host's service manager and its ``systemctl`` (one file, two names): enough of systemd for one
``Type=simple`` service unit, as a GPU host runs an inference server.

As ``systemd`` it reads ``/etc/systemd/system/*.service`` and their drop-ins (``UNIT.d/*.conf``), starts each unit's
``ExecStart=`` (``WorkingDirectory=``, ``Environment=``, ``UnsetEnvironment=``, ``StandardOutput=append:FILE``) in a
process group of its own with ``INVOCATION_ID`` as systemd gives it, has the host
show its cgroup (``0::/system.slice/UNIT``) in ``/proc/PID/cgroup``, restarts it when it exits (``Restart=always``,
``RestartSec=``), and answers ``systemctl`` on ``/run/systemd/private``. As ``systemctl`` it sends its arguments
there and prints the answer: ``daemon-reload``, ``restart``, ``start``, ``stop``, ``status``, ``cat``, ``show``
(``-p``/``--property``, ``--value``), ``is-active``, as systemd prints them.
"""

import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

SOCKET = "/run/systemd/private"
UNITS = "/etc/systemd/system"
SERVICE = "/run/nvidia-gpu/service.sock"   # the host's GPU service: told which cgroup a unit's process is in
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def words(value):
    """A command line or ``Environment=`` value as systemd splits it (quotes, ``\\``), ``%%`` and ``$$`` undone."""
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(value, posix=True)]


class Unit:
    def __init__(self, name):
        self.name = name
        self.proc = None
        self.pid = 0
        self.since = 0.0
        self.stopping = False
        self.state = "inactive"
        self.load()

    def files(self):
        main = os.path.join(UNITS, self.name)
        d = main + ".d"
        drops = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".conf")) if os.path.isdir(d) else []
        return main, drops

    def load(self):
        main, drops = self.files()
        self.fragment, self.dropins = main, drops
        cfg = {"ExecStart": [], "Environment": {}, "UnsetEnvironment": [], "WorkingDirectory": "/",
               "Restart": "no", "RestartSec": "0.1", "StandardOutput": "journal", "Description": self.name}
        for path in [main, *drops]:
            section = ""
            with open(path) as f:
                for line in f:
                    line = line.strip()
                    if not line or line[0] in "#;":
                        continue
                    if line.startswith("["):
                        section = line.strip("[]")
                        continue
                    key, _, value = line.partition("=")
                    key, value = key.strip(), value.strip()
                    if section not in ("Service", "Unit"):
                        continue
                    if key == "ExecStart":
                        cfg["ExecStart"] = words(value) if value else []
                    elif key == "Environment":
                        for w in words(value):
                            k, _, v = w.partition("=")
                            cfg["Environment"][k] = v
                    elif key == "UnsetEnvironment":
                        cfg["UnsetEnvironment"] += words(value)
                    else:
                        cfg[key] = value
        self.cfg = cfg

    def env(self):
        env = {"LANG": "C.UTF-8", "PATH": PATH, "INVOCATION_ID": secrets.token_hex(16)}
        env.update(self.cfg["Environment"])
        for k in self.cfg["UnsetEnvironment"]:
            env.pop(k.split("=", 1)[0], None)
        return env

    def start(self):
        if self.proc is not None and self.proc.poll() is None:
            return
        argv = self.cfg["ExecStart"]
        out = self.cfg["StandardOutput"]
        log = open(out.split(":", 1)[1], "ab") if out.startswith(("append:", "file:")) else open(os.devnull, "wb")
        gate_r, gate_w = os.pipe()
        # the process waits until its cgroup shows, then runs ExecStart= (the same pid)
        gate = ["/bin/sh", "-c", f'read _ <&{gate_r}; exec {gate_r}<&-; unset PWD OLDPWD; exec "$@"', "sh", *argv]
        self.proc = subprocess.Popen(gate, cwd=self.cfg["WorkingDirectory"], env=self.env(), stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(gate_r,))
        os.close(gate_r)
        log.close()
        self.pid, self.since, self.stopping, self.state = self.proc.pid, time.time(), False, "active"
        tell_cgroup(self.pid, f"/system.slice/{self.name}")
        os.write(gate_w, b"x")
        os.close(gate_w)

    def stop(self):
        if self.proc is None:
            self.state = "inactive"
            return
        self.stopping = True
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=float(self.cfg.get("TimeoutStopSec", "30").rstrip("s") or 30))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        self.proc, self.pid, self.state = None, 0, "inactive"

    def watch(self):
        """Restart=always: started again RestartSec after it exits on its own."""
        p = self.proc
        if p is None or p.poll() is None or self.stopping:
            return
        self.proc, self.pid, self.state = None, 0, "activating"
        if self.cfg["Restart"] in ("always", "on-failure") and (self.cfg["Restart"] == "always" or p.returncode):
            time.sleep(float(self.cfg["RestartSec"].rstrip("s") or 0.1))
            self.start()
        else:
            self.state = "failed" if p.returncode else "inactive"

    def props(self):
        main, drops = self.fragment, self.dropins
        active = self.state == "active"
        return {"Type": "simple", "Restart": self.cfg["Restart"], "MainPID": str(self.pid),
                "ExecMainPID": str(self.pid), "Id": self.name, "Names": self.name,
                "Description": self.cfg.get("Description", self.name), "LoadState": "loaded",
                "ActiveState": self.state, "SubState": "running" if active else "dead",
                "FragmentPath": main, "DropInPaths": " ".join(drops), "UnitFileState": "enabled",
                "WorkingDirectory": self.cfg["WorkingDirectory"],
                "Environment": " ".join(f"{k}={v}" for k, v in self.cfg["Environment"].items()),
                "ControlGroup": f"/system.slice/{self.name}" if active else "",
                "ExecStart": "{ path=" + (self.cfg["ExecStart"][0] if self.cfg["ExecStart"] else "") + " ; argv[]="
                             + " ".join(self.cfg["ExecStart"]) + " ; ignore_errors=no ; start_time=[n/a] ; "
                             "stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }"}


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
        print(f"systemd: cgroup of {pid}: {exc}", file=sys.stderr)


def manager():
    units = {n: Unit(n) for n in sorted(os.listdir(UNITS)) if n.endswith(".service")}
    lock = threading.Lock()
    for u in units.values():
        u.start()
    if os.path.exists(SOCKET):
        os.unlink(SOCKET)
    os.makedirs(os.path.dirname(SOCKET), exist_ok=True)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(SOCKET)
    srv.listen(16)

    def watcher():
        while True:
            time.sleep(0.2)
            with lock:
                for u in units.values():
                    u.watch()

    threading.Thread(target=watcher, daemon=True).start()
    while True:
        conn, _ = srv.accept()
        try:
            req = json.loads(conn.makefile().readline())
            with lock:
                reply = handle(units, req)
        except Exception as exc:  # noqa: BLE001 - a bad request is answered, never ends the manager
            reply = {"rc": 1, "err": f"Failed: {exc}\n"}
        conn.sendall((json.dumps(reply) + "\n").encode())
        conn.close()


def handle(units, req):
    verb, names = req["verb"], req["units"]
    if verb == "daemon-reload":
        for u in units.values():
            u.load()
        return {"rc": 0}
    found = []
    for n in names:
        n = n if n.endswith(".service") else n + ".service"
        if n not in units:
            return {"rc": 5 if verb != "show" else 0, "err": f"Unit {n} could not be found.\n" if verb != "show" else "",
                    "out": "" if verb != "show" else f"Id={n}\nLoadState=not-found\nActiveState=inactive\n"}
        found.append(units[n])
    out = []
    for u in found:
        if verb in ("restart", "stop", "start"):
            if verb != "start":
                u.stop()
            if verb != "stop":
                u.start()
        elif verb == "is-active":
            out.append(u.state)
        elif verb == "cat":
            for path in [u.fragment, *u.dropins]:
                out.append(f"# {path}\n" + open(path).read().rstrip("\n") + "\n")
        elif verb == "show":
            props = u.props()
            want = req.get("props") or list(props)
            out += [props.get(p, "") if req.get("value") else f"{p}={props.get(p, '')}" for p in want]
        elif verb == "status":
            p = u.props()
            out.append(f"\u25cf {u.name} - {p['Description']}\n     Loaded: loaded ({u.fragment}; enabled; preset: enabled)\n"
                       + (f"    Drop-In: {os.path.dirname(u.dropins[0])}\n             \u2514\u2500"
                          + ", ".join(os.path.basename(d) for d in u.dropins) + "\n" if u.dropins else "")
                       + f"     Active: {u.state} ({p['SubState']})\n   Main PID: {u.pid}\n")
        else:
            return {"rc": 1, "err": f"Unknown command verb {verb}.\n"}
    rc = 3 if verb == "is-active" and any(u.state != "active" for u in found) else 0
    return {"rc": rc, "out": "\n".join(out) + ("\n" if out and verb not in ("cat",) else "")}


def systemctl(args):
    props, value, verb, names = [], False, None, []
    it = iter(args)
    for a in it:
        if a in ("-p", "--property"):
            props += next(it, "").split(",")
        elif a.startswith("--property="):
            props += a.split("=", 1)[1].split(",")
        elif a == "--value":
            value = True
        elif a in ("--no-pager", "-q", "--quiet", "--system", "--full", "-l", "--no-legend"):
            continue
        elif a.startswith("-"):
            print(f"systemctl: unrecognized option '{a}'", file=sys.stderr)
            return 1
        elif verb is None:
            verb = a
        else:
            names.append(a)
    if verb is None:
        verb = "list-units"
        print("UNIT LOAD ACTIVE SUB DESCRIPTION")
        return 0
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(SOCKET)
    except OSError:
        print("System has not been booted with systemd as init system (PID 1). Can't operate.\n"
              "Failed to connect to bus: Host is down", file=sys.stderr)
        return 1
    s.sendall((json.dumps({"verb": verb, "units": names, "props": props, "value": value}) + "\n").encode())
    reply = json.loads(s.makefile().readline())
    sys.stdout.write(reply.get("out", ""))
    sys.stderr.write(reply.get("err", ""))
    return int(reply.get("rc", 0))


if __name__ == "__main__":
    if os.path.basename(sys.argv[0]) == "systemctl":
        sys.exit(systemctl(sys.argv[1:]))
    try:
        import ctypes
        ctypes.CDLL(None).prctl(15, b"systemd", 0, 0, 0)   # PR_SET_NAME: its comm, as systemd's
    except (OSError, AttributeError):
        pass
    manager()
