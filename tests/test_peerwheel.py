"""A peer's build of a package larger than one command's output: read from the peer in parts (each output under the
transport's cap), packed into a wheel on disk and sent in chunks, with the memory it takes bounded by one part, not
the build. The package is a real wheel holding an incompressible file, pip-installed into a real environment, read
over the local transport."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

from debugagent.tools import probes  # noqa: F401  (registers the tools)
from debugagent.tools.peerwheel import CHUNK, pack_wheel_dir, read_build, wheel_chunks
from debugagent.tools.registry import Runner
from debugagent.tools.transport import DEFAULT_MAX_OUTPUT, LocalTransport


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A wheel as a build backend writes it: the files, then METADATA, WHEEL and a RECORD of their sha256."""
    info = f"{name}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rec = "".join(f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}\n"
                  for k, v in files.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for k, v in {**files, f"{info}/RECORD": rec.encode()}.items():
            z.writestr(k, v)
    return path


def environment(folder: Path, wheel: Path) -> Path:
    """A virtual environment with ``wheel`` installed into its site folder by pip; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(site), str(wheel)], check=True, capture_output=True)
    return folder / "bin" / "python"


def test_a_peer_build_larger_than_one_output_is_read_in_parts_packed_and_installs(tmp_path):
    blob = os.urandom(4_000_000)   # incompressible: its base64 alone is more than one command's output may carry
    src = tmp_path / "src"
    src.mkdir()
    whl = make_wheel(src, "bigblob", "1.2", {"bigblob/__init__.py": b"VALUE = 7\n", "bigblob/data/blob.bin": blob})
    peer = environment(tmp_path / "peer", whl)
    results: list[dict] = []   # what each call's result was (its sizes: a run's transcript goes to a file, not memory)

    def seen(ev: str, d: dict) -> None:
        if ev == "tool_result":
            results.append({"tool": d["tool"], "exit_code": d["exit_code"], "truncated": d["truncated"],
                            "stdout": len(d["stdout"]), "output": len(json.dumps(d["output"]))})
    runner = Runner(LocalTransport(), observer=seen)
    tracemalloc.start()
    try:
        # parts of 250 kB (the default: a megabyte), the memory held bounded by one part's output
        got = read_build(runner, str(peer), "bigblob", tmp_path / "read", read_bytes=250_000)
        wheel = pack_wheel_dir(got, tmp_path / "wheels")
        sent = 0
        for c in wheel_chunks(wheel):
            assert len(c) <= CHUNK
            sent += len(base64.b64decode(c))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.error is None and not got.too_large, got
    assert (got.name, got.version) == ("bigblob", "1.2")
    assert got.size > len(blob)
    reads = [r for r in results if r["tool"] == "dist_files"]
    # read in parts, each output under the cap, and none of the parts' bytes copied into the parsed output
    assert len(reads) == got.reads == -(-got.size // 250_000) and all(r["exit_code"] == 0 and not r["truncated"] for r in reads)
    assert max(r["stdout"] for r in reads) < DEFAULT_MAX_OUTPUT
    assert all(r["output"] < 10_000 for r in reads)
    # the memory held is a part's (its output as bytes and text, the JSON, the decoded bytes: about a dozen times the part),
    # not the build's
    assert peak < 14 * 250_000 < len(blob), f"{peak} bytes at most in memory for a {len(blob)}-byte build"
    assert sent == wheel.stat().st_size
    # the wheel is one pip installs, its files the peer's bytes
    site = tmp_path / "host"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(site), str(wheel)], check=True, capture_output=True)
    assert (site / "bigblob" / "data" / "blob.bin").read_bytes() == blob
    assert (site / "bigblob-1.2.dist-info" / "METADATA").is_file()
    with zipfile.ZipFile(wheel) as z:
        record = z.read("bigblob-1.2.dist-info/RECORD").decode()
    assert f"bigblob/data/blob.bin,sha256={base64.urlsafe_b64encode(hashlib.sha256(blob).digest()).rstrip(b'=').decode()}," \
        f"{len(blob)}" in record
    # a build over the most that is read is not read at all: its size only, nothing written
    big = read_build(runner, str(peer), "bigblob", tmp_path / "read-capped", max_build=1_000_000)
    assert big.too_large and big.size == got.size and not (tmp_path / "read-capped" / "files").exists()
