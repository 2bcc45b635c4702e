"""``nvidia-smi`` and the benchmark of a simulated host: clients of the host's GPU service.

``nvidia-smi`` asks the service what the GPUs report now; the benchmark asks it to run
its workload (the flags it was given) against the running inference server and prints
the service's measurement. The service runs outside this host; it answers observations
only. The protocol of ``client.c`` (used where a C compiler is): the request is a 4-byte
big-endian length and NUL-terminated strings (program, arguments); the reply is the exit
code, stdout and stderr, each behind a 4-byte length. Built-in modules only (``_socket``),
so a call starts fast.
"""

import _socket
import os
import sys

SERVICE = "/run/nvidia-gpu/service.sock"


def readn(s, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def main() -> int:
    prog = os.path.basename(sys.argv[0])
    payload = b"".join(a.encode("utf-8", "surrogateescape") + b"\0" for a in [prog, *sys.argv[1:]])
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.connect(SERVICE)
    except OSError:
        sys.stderr.write(f"{prog}: cannot reach the GPU service at {SERVICE}\n")
        return 9
    s.sendall(len(payload).to_bytes(4, "big") + payload)
    try:
        rc = int.from_bytes(readn(s, 4), "big", signed=True)
        for out in (sys.stdout.buffer, sys.stderr.buffer):
            out.write(readn(s, int.from_bytes(readn(s, 4), "big")))
            out.flush()
    except EOFError:
        sys.stderr.write(f"{prog}: the GPU service closed the connection\n")
        return 9
    return rc


if __name__ == "__main__":
    sys.exit(main())
