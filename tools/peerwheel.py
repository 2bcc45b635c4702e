"""A peer's build of a package, as a wheel: its installed files read from the peer (read-only) in parts, packed here
into a wheel (PEP 427: a zip with the ``.dist-info`` folder and its ``RECORD``), and sent to the host in base64 chunks.

``dist_files`` (read-only, on the peer) lists the files its ``RECORD`` lists under the environment's site folder
(their sizes) and prints one part of their bytes, base64'd, as JSON: the bytes ``start`` to ``start + count`` of the
files laid end to end in sorted order, so that no output is over the command channel's cap however large the build
(``read_build`` asks for the parts one after the other, writing each into a folder here: the memory it takes is one
part's, not the build's). What pip wrote at install time (``RECORD``, ``INSTALLER``, ``REQUESTED``,
``direct_url.json``), byte code and files outside the site folder (console scripts) are left out and named.
``pack_wheel_dir`` makes the wheel from that folder with the standard library's ``zipfile``, file by file, entries
sorted and dated 1980-01-01, so the same files give the same bytes (a replay sends the same command); ``wheel_chunks``
reads it back a chunk at a time. ``write_chunk`` (a mutation) appends one chunk to a file in a folder of the run's own
(``/tmp/debugagent-…``), which the run's undo removes."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .errors import ParseError
from .transport import q

# the bytes of a build one read carries: their base64 (4/3 of them) and the file list stay well under one command's
# output (``transport.DEFAULT_MAX_OUTPUT``, 4 MiB)
READ_BYTES = 1_000_000
# the most a peer's build may hold to be read at all (in parts of READ_BYTES): over it, its size only
MAX_BUILD = 1 << 30
CHUNK = 60_000   # base64 characters a chunk sent to the host: one argument of a command stays under Linux's 128 KiB

DIST_FILES_SCRIPT = r"""
import base64, importlib.metadata as md, json, os, sys
name, cap, start, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def norm(n): return n.lower().replace("_", "-")
d = next((x for x in md.distributions() if norm(x.metadata["Name"] or "") == norm(name)), None)
if d is None:
    print(json.dumps({"error": "not installed"})); sys.exit(0)
site = os.path.realpath(str(d.locate_file("")))
info = os.path.basename(str(d._path))
out = {"name": d.metadata["Name"], "version": d.version, "dist_info": info, "sizes": {}, "skipped": [], "size": 0,
       "cap": cap, "start": start, "parts": []}
made = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
paths = {}
for f in d.files or []:
    rel = str(f)
    path = os.path.realpath(str(d.locate_file(f)))
    if not path.startswith(site + os.sep) or rel.endswith(".pyc") or "__pycache__" in rel \
            or (rel.startswith(info + "/") and rel.rsplit("/", 1)[-1] in made) or not os.path.isfile(path):
        out["skipped"].append(rel); continue
    paths[rel] = path
    out["sizes"][rel] = os.path.getsize(path)
    out["size"] += out["sizes"][rel]
if out["size"] <= cap:
    at = 0
    for rel in sorted(paths):
        n = out["sizes"][rel]
        lo, hi = max(start, at), min(start + count, at + n)
        if lo < hi:
            with open(paths[rel], "rb") as fh:
                fh.seek(lo - at)
                out["parts"].append([rel, lo - at, base64.b64encode(fh.read(hi - lo)).decode()])
        at += n
print(json.dumps(out))
"""


class DistFiles(BaseModel):
    """Read-only: the installed files of distribution ``name`` in ``python``'s environment, as its RECORD lists
    them (their sizes), and the bytes ``start`` to ``start + count`` of them laid end to end in sorted order
    (base64), where they hold ``cap`` bytes or fewer in all (over it, only their sizes)."""

    model_config = ConfigDict(extra="forbid")
    python: str
    name: str
    cap: int = MAX_BUILD
    start: int = 0
    count: int = READ_BYTES

    def command(self) -> str:
        return (f"{q(self.python)} -c {q(DIST_FILES_SCRIPT.strip())} {q(self.name)} {int(self.cap)} {int(self.start)} "
                f"{int(self.count)}")

    def display_command(self) -> str:
        return (f"{self.python} -c '<read the files of {self.name} its RECORD lists, bytes {int(self.start)} to "
                f"{int(self.start) + int(self.count)}>' {self.name} {int(self.cap)} {int(self.start)} {int(self.count)}")


class Part(BaseModel):
    path: str
    offset: int
    # the bytes, base64: the command's output holds them; the parsed output (recorded too) does not hold them again
    data: str = Field(default="", exclude=True)


class InstalledFiles(BaseModel):
    name: str = ""
    version: str = ""
    dist_info: str = ""
    sizes: dict[str, int] = Field(default_factory=dict)   # path in the site folder -> its size
    skipped: list[str] = Field(default_factory=list)
    size: int = 0
    cap: int = MAX_BUILD
    start: int = 0
    parts: list[Part] = Field(default_factory=list)
    error: str | None = None

    @property
    def too_large(self) -> bool:
        return self.error is None and self.size > self.cap


def parse_dist_files(text: str) -> InstalledFiles:
    # the last line that starts with "{", found without copying the output line by line (it may be megabytes)
    at = text.rfind("\n{") + 1
    if at == 0 and not text.startswith("{"):
        raise ParseError("no JSON line", tool="dist_files", excerpt=text[-80:])
    end = text.find("\n", at)
    line = text[at:end if end >= 0 else len(text)]
    try:
        raw = json.loads(line)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        parts = raw.pop("parts", [])
        if not isinstance(parts, list) or not all(isinstance(p, list) and len(p) == 3 for p in parts):
            raise ValueError("parts: not a list of [path, offset, data]")
        out = InstalledFiles.model_validate({**raw, "parts": [{"path": p[0], "offset": p[1], "data": p[2]} for p in parts]})
        for p in out.parts:
            base64.b64decode(p.data, validate=True)
    except ValueError as exc:
        raise ParseError(f"not the files of a distribution: {str(exc).splitlines()[0]}", tool="dist_files",
                         excerpt=line[:80]) from None
    if out.error is None and (not out.dist_info or not re.fullmatch(r"[^/\\]+\.dist-info", out.dist_info)):
        raise ParseError("no .dist-info folder named", tool="dist_files", excerpt=line[:80])
    return out


def _outside(rel: str) -> bool:
    return not rel or rel.startswith("/") or "\\" in rel or any(s in ("", ".", "..") for s in rel.split("/"))


@dataclass
class BuildRead:
    """A peer's build as ``read_build`` read it: its files under ``folder / "files"``, or why they were not read."""

    name: str
    version: str = ""
    dist_info: str = ""
    folder: Path = Path()
    sizes: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    size: int = 0
    reads: int = 0
    too_large: bool = False
    error: str | None = None


def read_build(runner: Any, python: str, name: str, folder: Path, *, why: str = "", read_bytes: int = READ_BYTES,
               max_build: int = MAX_BUILD) -> BuildRead:
    """The installed files of ``name`` in ``python``'s environment (on ``runner``'s host, read-only), read in parts of
    ``read_bytes`` (one ``dist_files`` call each), each part written into ``folder / "files"`` as it comes. A build
    over ``max_build`` bytes is not read (``too_large``, its size only); files that change between the parts (their
    list or sizes) are an error."""
    got = BuildRead(name=name, folder=folder)
    files = folder / "files"
    start, first = 0, None
    while True:
        n = -(-first.size // read_bytes) if first is not None else 0
        o = runner.call("dist_files", {"python": python, "name": name, "cap": max_build, "start": start,
                                       "count": read_bytes},
                        why=why + (f" (part {got.reads + 1} of {n})" if n > 1 else ""))
        got.reads += 1
        d = o.output if o.ok else None
        if d is None:
            got.error = o.error or "no output"
            return got
        if d.error is not None:
            got.error = f"{name} is not installed there"
            return got
        if first is None:
            first = d
            got.version, got.dist_info, got.sizes, got.skipped, got.size = d.version, d.dist_info, d.sizes, d.skipped, d.size
            if d.too_large:
                got.too_large = True
                return got
            bad = next((r for r in d.sizes if _outside(r)), None)
            if bad is not None:
                got.error = f"a file outside the site folder: {bad}"
                return got
            shutil.rmtree(files, ignore_errors=True)
            for rel in d.sizes:   # every file, the empty ones too; the parts fill them
                (files / rel).parent.mkdir(parents=True, exist_ok=True)
                (files / rel).write_bytes(b"")
        elif (d.version, d.dist_info, d.sizes) != (first.version, first.dist_info, first.sizes):
            got.error = "its files changed while they were read"
            return got
        for p in d.parts:
            data = base64.b64decode(p.data)
            if p.path not in first.sizes or p.offset < 0 or p.offset + len(data) > first.sizes[p.path]:
                got.error = f"a part of a file it did not list, or past its end: {p.path}"
                return got
            with open(files / p.path, "r+b") as f:
                f.seek(p.offset)
                f.write(data)
        start += read_bytes
        if start >= first.size:
            return got


def _digest_file(path: Path) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(1 << 18):
            h.update(block)
            n += len(block)
    return "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode(), n


def pack_wheel_dir(read: BuildRead, dest: Path) -> Path:
    """The wheel of ``read``'s files, written into ``dest`` file by file (its name ``NAME-VERSION-TAG.whl``, the tag
    its ``WHEEL`` file names, else ``py3-none-any``), with a ``WHEEL`` file where the installed one has none and a
    ``RECORD`` of every file's sha256 and size (PEP 376/427). The same files give the same bytes."""
    info = read.dist_info
    files = read.folder / "files"
    if any(_outside(k) for k in read.sizes):
        raise ValueError("a file outside the site folder")
    wheel_meta = f"{info}/WHEEL"
    tag = "py3-none-any"
    made: dict[str, bytes] = {}
    if wheel_meta in read.sizes:
        m = re.search(r"^Tag:\s*(\S+)", (files / wheel_meta).read_text(errors="replace"), re.M)
        tag = m.group(1) if m and re.fullmatch(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+", m.group(1)) else tag
    else:
        made[wheel_meta] = (f"Wheel-Version: 1.0\nGenerator: debugagent (packed from installed files)\n"
                            f"Root-Is-Purelib: false\nTag: {tag}\n").encode()
    lines = []
    for k in sorted([*read.sizes, *made]):
        if k in made:
            d = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(made[k]).digest()).rstrip(b"=").decode()
            lines.append(f"{k},{d},{len(made[k])}\n")
        else:
            d, n = _digest_file(files / k)
            lines.append(f"{k},{d},{n}\n")
    made[f"{info}/RECORD"] = ("".join(lines) + f"{info}/RECORD,,\n").encode()
    stem = re.sub(r"[-_.]+", "_", read.name)
    version = re.sub(r"-", "_", read.version)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{stem}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        # the dist-info last, RECORD the very last (PEP 427's recommendation)
        for k in sorted([*read.sizes, *made], key=lambda k: (k.startswith(info + "/"), k == f"{info}/RECORD", k)):
            zi = zipfile.ZipInfo(k, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            if k in made:
                z.writestr(zi, made[k])
            else:
                zi.file_size = read.sizes[k]   # known ahead: zip64 where a file needs it
                with open(files / k, "rb") as src, z.open(zi, "w") as w:
                    shutil.copyfileobj(src, w, 1 << 18)
    return path


def wheel_chunks(path: Path, size: int = CHUNK) -> Iterator[str]:
    """``path``'s bytes as base64 chunks of at most ``size`` characters, each decodable alone, read a chunk at a time."""
    step = size // 4 * 3
    with open(path, "rb") as f:
        while block := f.read(step):
            yield base64.b64encode(block).decode()


def chunk_count(path: Path, size: int = CHUNK) -> int:
    return max(1, -(-path.stat().st_size // (size // 4 * 3)))


class WriteChunk(BaseModel):
    """Append one base64 chunk to ``path`` (the first chunk makes the file, in a folder of the run's own under
    ``/tmp``): a wheel sent to the host over the command channel."""

    model_config = ConfigDict(extra="forbid")
    path: str
    data: str
    first: bool = False

    def command(self) -> str:
        p = self.path
        if not re.fullmatch(r"/tmp/debugagent-[^/]+/[^/]+", p) or not re.fullmatch(r"[A-Za-z0-9+/=]*", self.data):
            return f"echo {q('refusing to write ' + p + ': not a file in a folder debugagent makes')}; exit 1"
        folder = p.rsplit("/", 1)[0]
        mk = f"mkdir -p -m 700 {q(folder)} && " if self.first else ""
        return f"{mk}printf %s {q(self.data)} | base64 -d {'>' if self.first else '>>'} {q(p)} && wc -c < {q(p)}"

    def display_command(self) -> str:
        return f"printf %s '<{len(self.data)} characters of base64>' | base64 -d {'>' if self.first else '>>'} {self.path}"
