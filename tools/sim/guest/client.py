"""``nvidia-smi`` and the benchmark of a simulated host: clients of the host's GPU service.

``nvidia-smi`` asks the service what the GPUs report now; the benchmark asks it to run
its workload (the flags it was given) against the running inference server and prints
the service's measurement. The service runs outside this host; it answers observations
only. Standard library only, so a call starts in a few milliseconds.
"""

import json
import os
import socket
import sys

SERVICE = "/run/nvidia-gpu/service.sock"


def main() -> int:
    prog = os.path.basename(sys.argv[0])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(SERVICE)
    except OSError as exc:
        print(f"{prog}: cannot reach the GPU service at {SERVICE}: {exc}", file=sys.stderr)
        return 9
    s.sendall(json.dumps({"op": prog, "argv": sys.argv[1:]}).encode() + b"\n")
    buf = bytearray()
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    if not buf:
        print(f"{prog}: the GPU service closed the connection", file=sys.stderr)
        return 9
    reply = json.loads(buf)
    sys.stdout.write(reply["out"])
    sys.stdout.flush()
    sys.stderr.write(reply["err"])
    return int(reply["rc"])


if __name__ == "__main__":
    sys.exit(main())
