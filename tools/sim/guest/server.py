"""An inference server's entry point, as a simulated host runs it.

At start it imports its code and its compiled dependencies, exactly as Python finds them
(the working directory, ``PYTHONPATH``, the environment's editable installs), prints its
start-up log, starts its worker process if it has one, tells the host's GPU service what
it loaded, and serves until it is stopped. What it loaded is fixed from then on: a
checkout or a reinstall changes nothing until the server is restarted.
"""

import hashlib
import importlib
import json
import multiprocessing
import os
import pkgutil
import socket
import sys
import time

CONFIG: dict = {}
SERVICE = "/run/nvidia-gpu/service.sock"


def service() -> str:
    """The host's GPU service: ``/run/nvidia-gpu/service.sock`` of the root the interpreter lives under
    (the host's ``/``), so this code names no folder of its own and is the same file on every host."""
    d = os.path.dirname(os.path.abspath(sys.executable))
    while True:
        p = os.path.join(d, SERVICE.lstrip("/"))
        if os.path.exists(p) or d == os.path.dirname(d):
            return p
        d = os.path.dirname(d)


def loaded_builds() -> dict:
    """The compiled files of each dependency, as imported now: module -> sha256 of its bytes."""
    out = {}
    for name in CONFIG.get("deps", []):
        try:
            mod = importlib.import_module(name)
        except ImportError as exc:
            print(f"ImportError: {exc}", file=sys.stderr, flush=True)
            sys.exit(1)
        so = os.path.join(os.path.dirname(mod.__file__ or ""), "_C.abi3.so")
        if os.path.isfile(so):
            with open(so, "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def loaded_code() -> int:
    """The newest change among the code package's modules (-1 when there is no code package)."""
    if CONFIG.get("code_dir"):   # a script's own modules, a folder beside it
        return loaded_code_dir(os.path.join(os.path.dirname(os.path.abspath(__file__)), CONFIG["code_dir"]))
    pkg_name = CONFIG.get("code")
    if not pkg_name:
        return -1
    pkg = importlib.import_module(pkg_name)
    newest = -1
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg_name}.{info.name}")
        newest = max(newest, int(getattr(mod, "CHANGE", -1)))
    return newest


def loaded_code_dir(folder: str) -> int:
    """The newest change among the modules of a folder (a script's code, found beside the script)."""
    import importlib.util
    newest = -1
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".py") and name != "__init__.py":
            spec = importlib.util.spec_from_file_location(f"_code_{name[:-3]}", os.path.join(folder, name))
            if spec and spec.loader:
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                newest = max(newest, int(getattr(mod, "CHANGE", -1)))
    return newest


def flags(argv: list) -> dict:
    out, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            k, eq, v = a[2:].partition("=")
            if eq:
                out[k] = v
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[k] = argv[i + 1]
                i += 1
            else:
                out[k] = "true"
        i += 1
    return out


def tell_service(report: dict) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(service())
    s.sendall(json.dumps(report).encode() + b"\n")
    return s  # kept open for the process's life: the service knows it runs while it is open


def worker(code: int, builds: dict, parent: int) -> None:
    """The worker: it runs as long as the server that started it."""
    conn = tell_service({"op": "up", "role": "worker", "pid": os.getpid(), "code": code, "builds": builds})
    while conn and os.getppid() == parent:
        time.sleep(0.2)


def main() -> None:
    builds = loaded_builds()
    code = loaded_code()
    f = flags(sys.argv[1:])
    for line in CONFIG.get("log", []):
        for k, v in f.items():
            line = line.replace("{flag:" + k + "}", v)
        for k, v in os.environ.items():
            line = line.replace("{env:" + k + "}", v)
        print(line, flush=True)
    conn = tell_service({"op": "up", "role": "server", "pid": os.getpid(), "code": code, "builds": builds})
    if CONFIG.get("worker") is not None:
        os.environ.update(CONFIG["worker"])
        p = multiprocessing.get_context("spawn").Process(target=worker, args=(code, builds, os.getpid()), daemon=True)
        p.start()
        for k in CONFIG["worker"]:
            os.environ.pop(k, None)
    print("The server is fired up and ready to roll!", flush=True)
    while conn:
        time.sleep(3600)


if __name__ == "__main__":
    main()
