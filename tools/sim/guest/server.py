"""An inference server's entry point, as a simulated host runs it.

At start it imports its code and its compiled dependencies, exactly as Python finds them
(the working directory, ``PYTHONPATH``, the environment's editable installs), prints its
start-up log, starts its worker process if it has one, tells the host's GPU service what
it loaded, and serves until it is stopped. What it loaded is fixed from then on: a
checkout or a reinstall changes nothing until the server is restarted.

As SGLang or vLLM it also answers on its port (``/health``; SGLang ``/server_info``,
``/get_server_info``, ``/model_info``, ``/get_model_info``, ``/metrics`` with
``--enable-metrics``; vLLM ``/version``, ``/metrics``, ``/server_info`` with
``VLLM_SERVER_DEV_MODE=1``) and logs the engines' start-up lines: the settings it chose by
default (``Attention backend not specified. Use X backend by default.``), its arguments.
"""

import hashlib
import importlib
import json
import os
import pkgutil
import socket
import sys
import threading
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


# flag -> the ServerArgs field it sets, where the names differ
FIELD = {"tp": "tp_size", "model": "model_path", "dp": "dp_size", "pp": "pp_size"}


def value(v: str):
    """A flag's text as the engine's argument parser types it (numbers, booleans)."""
    if v == "true":
        return True
    for t in (int, float):
        try:
            return t(v)
        except ValueError:
            pass
    return v


def effective(f: dict) -> tuple:
    """The server's arguments as its engine resolves them (flags over the engine's defaults), and the names of
    those it chose by default."""
    args = {FIELD.get(k, k.replace("-", "_")): value(v) for k, v in f.items()}
    chose = []
    for k, v in (CONFIG.get("defaults") or {}).items():
        if args.get(k) is None:
            args[k] = v
            chose.append(k)
    return args, chose


def stamp() -> str:
    return time.strftime("[%Y-%m-%d %H:%M:%S]")


def startup_lines(f: dict, args: dict, chose: list) -> list:
    """The engine's own start-up lines, in its words."""
    engine = CONFIG.get("engine")
    if engine == "sglang":
        out = []
        if "attention_backend" in chose:
            out.append(f"{stamp()} INFO server_args.py:1970: Attention backend not specified. Use "
                       f"{args['attention_backend']} backend by default.")
        shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
        out.append(f"{stamp()} INFO engine.py:157: server_args=ServerArgs({shown})")
        if args.get("kv_cache_tokens"):
            out.append(f"{stamp()} TP0] KV Cache is allocated. #tokens: {args['kv_cache_tokens']}, K size: 1.00 GB")
        return out
    if engine == "vllm":
        out = [f"INFO {time.strftime('%m-%d %H:%M:%S')} [api_server.py:1839] vLLM API server version {CONFIG.get('version')}",
               f"INFO {time.strftime('%m-%d %H:%M:%S')} [utils.py:233] non-default args: "
               + repr({k.replace("-", "_"): v for k, v in f.items()})]
        if args.get("attention_backend"):
            b = args["attention_backend"]
            out.append(f"INFO {time.strftime('%m-%d %H:%M:%S')} [cuda.py:366] Using {b} attention backend out of "
                       f"potential backends: [{b!r}]")
        if args.get("kv_cache_tokens"):
            out.append(f"INFO {time.strftime('%m-%d %H:%M:%S')} [kv_cache_utils.py:1087] GPU KV cache size: "
                       f"{int(args['kv_cache_tokens']):,} tokens")
        return out
    return []


def serve_http(f: dict, args: dict) -> None:
    """Answer the engine's endpoints on its port, in a thread (on another port when that one is taken: the host
    is not sealed and shares this machine's loopback; discovery finds the port it listens on)."""
    engine = CONFIG.get("engine")
    if engine not in ("sglang", "vllm"):
        return
    port = int(CONFIG.get("port") or f.get("port") or (30000 if engine == "sglang" else 8000))
    version = CONFIG.get("version") or "0.0.0"

    def body(path: str):
        if path == "/health":
            return ""
        if engine == "sglang":
            if path in ("/server_info", "/get_server_info"):
                state = {k: args.get(k) for k in ("attention_backend", "prefill_attention_backend",
                                                  "decode_attention_backend", "sampling_backend") if k in args}
                state.update({"last_gen_throughput": 0.0, "memory_usage": {"weight": 1.0, "kvcache": 1.0}})
                return {**args, "version": version, "internal_states": [state]}
            if path in ("/model_info", "/get_model_info"):
                return {"model_path": args.get("model_path"), "tokenizer_path": args.get("model_path"),
                        "is_generation": True}
            if path == "/metrics" and args.get("enable_metrics") not in (None, False, "false"):
                return "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{{model_name=\"m\"}} 0.0\n"
            return None
        if path == "/version":
            return {"version": version}
        if path == "/metrics":
            return "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 0.0\n"
        if path == "/server_info" and os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
            return {"vllm_config": {k: v for k, v in args.items()}}
        return None

    def handler():
        import http.server  # noqa: PLC0415 - what no simple GET needs: its import is most of a start's CPU

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code, data = answer(self.path)
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format, *args) -> None:  # noqa: A002  (the base class's name)
                pass

        return Handler

    def answer(target: str) -> tuple:
        b = body(target.split("?")[0])
        if b is None:
            return 404, b'{"detail":"Not Found"}'
        return 200, (b if isinstance(b, str) else json.dumps(b)).encode()

    def simple_get(conn: socket.socket) -> bool:
        """A whole ``GET TARGET HTTP/1.x`` request already here: answered as http.server's handler answers it (HTTP/1.0,
        its Server and Date headers, the connection closed); anything else is left unread for that handler."""
        conn.settimeout(10)
        head = conn.recv(65536, socket.MSG_PEEK)
        end = head.find(b"\r\n\r\n")
        line = head.split(b"\r\n", 1)[0].split()
        if end < 0 or len(line) != 3 or line[0] != b"GET" or line[2] not in (b"HTTP/1.0", b"HTTP/1.1") \
                or not line[1].startswith(b"/") or line[1].startswith(b"//"):
            return False
        conn.recv(end + 4)
        code, data = answer(line[1].decode("iso-8859-1"))
        when = time.gmtime()
        day = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[when.tm_wday]
        month = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")[when.tm_mon - 1]
        date = (f"{day}, {when.tm_mday:02d} {month} {when.tm_year:04d} "   # as email.utils.formatdate(usegmt=True)
                f"{when.tm_hour:02d}:{when.tm_min:02d}:{when.tm_sec:02d} GMT")
        reason = {200: "OK", 404: "Not Found"}[code]
        conn.sendall((f"HTTP/1.0 {code} {reason}\r\nServer: BaseHTTP/0.6 Python/{sys.version.split()[0]}\r\n"
                      f"Date: {date}\r\nContent-Length: {len(data)}\r\n\r\n").encode("latin-1") + data)
        return True

    def serve_one(conn: socket.socket, addr) -> None:
        try:
            if not simple_get(conn):
                conn.settimeout(None)
                handler()(conn, addr, None)  # pyright: ignore[reportArgumentType] - the handler reads no server attribute
        except OSError:
            pass
        finally:
            try:
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            conn.close()

    def serve_forever(sock: socket.socket) -> None:
        while True:
            conn, addr = sock.accept()
            threading.Thread(target=serve_one, args=(conn, addr), daemon=True).start()

    def listen(p: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as socketserver's HTTPServer binds
        try:
            sock.bind(("127.0.0.1", p))
            sock.listen(5)
        except OSError:
            sock.close()
            raise
        return sock

    try:
        sock = listen(port)
    except OSError as exc:   # a host that is not sealed shares this machine's loopback: another port, as found
        sock = listen(0)
        print(f"{stamp()} WARNING: cannot listen on 127.0.0.1:{port} ({exc}); listening on "
              f"127.0.0.1:{sock.getsockname()[1]}", flush=True)
    threading.Thread(target=serve_forever, args=(sock,), daemon=True).start()


def workload(code: int, builds: dict) -> None:
    """An offline workload (no server): it asks the GPU service for its run's number, with what it loaded, prints
    it as a benchmark does, and exits."""
    s = tell_service({"op": "up", "role": "workload", "pid": os.getpid(), "code": code, "builds": builds,
                      "argv": sys.argv[1:]})
    reply = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        reply += chunk
    r = json.loads(reply or b'{"out": "", "err": "no answer from the GPU\\n", "rc": 1}')
    sys.stdout.write(r["out"])
    sys.stderr.write(r["err"])
    sys.exit(int(r["rc"]))


def main() -> None:
    builds = loaded_builds()
    code = loaded_code()
    if CONFIG.get("offline"):
        workload(code, builds)
        return
    f = flags(sys.argv[1:])
    args, chose = effective(f)
    for line in startup_lines(f, args, chose) + CONFIG.get("log", []):
        for k, v in f.items():
            line = line.replace("{flag:" + k + "}", v)
        for k, v in os.environ.items():
            line = line.replace("{env:" + k + "}", v)
        print(line, flush=True)
    serve_http(f, args)
    conn = tell_service({"op": "up", "role": "server", "pid": os.getpid(), "code": code, "builds": builds})
    if CONFIG.get("worker") is not None:
        os.environ.update(CONFIG["worker"])
        import multiprocessing  # noqa: PLC0415 - only a server with a worker starts one
        p = multiprocessing.get_context("spawn").Process(target=worker, args=(code, builds, os.getpid()), daemon=True)
        p.start()
        for k in CONFIG["worker"]:
            os.environ.pop(k, None)
    print("The server is fired up and ready to roll!", flush=True)
    while conn:
        time.sleep(3600)


if __name__ == "__main__":
    main()
