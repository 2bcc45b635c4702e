"""A peer's build of a package, as a wheel: its installed files read from the peer (read-only), packed here into a
wheel (PEP 427: a zip with the ``.dist-info`` folder and its ``RECORD``), and sent to the host in base64 chunks.

``dist_files`` (read-only, on the peer) prints the files its ``RECORD`` lists under the environment's site folder,
base64'd, as JSON; what pip wrote at install time (``RECORD``, ``INSTALLER``, ``REQUESTED``, ``direct_url.json``),
byte code and files outside the site folder (console scripts) are left out and named. ``pack_wheel`` makes the wheel
with the standard library's ``zipfile``, entries sorted and dated 1980-01-01, so the same files give the same bytes
(a replay sends the same command). ``write_chunk`` (a mutation) appends one chunk to a file in a folder of the run's
own (``/tmp/debugagent-…``), which the run's undo removes."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import zipfile

from pydantic import BaseModel, ConfigDict, Field

from .errors import ParseError
from .transport import q

# the most a peer's build may hold, its files read in one command: the command channel carries them as base64 text
# in one output (``transport.DEFAULT_MAX_OUTPUT``, 4 MiB), and the run's recording holds them
MAX_BYTES = 2_500_000
CHUNK = 60_000   # base64 characters a chunk: one argument of a command stays under Linux's 128 KiB

DIST_FILES_SCRIPT = r'''
import base64, importlib.metadata as md, json, os, sys
name, cap = sys.argv[1], int(sys.argv[2])
def norm(n): return n.lower().replace("_", "-")
d = next((x for x in md.distributions() if norm(x.metadata["Name"] or "") == norm(name)), None)
if d is None:
    print(json.dumps({"error": "not installed"})); sys.exit(0)
site = os.path.realpath(str(d.locate_file("")))
info = os.path.basename(str(d._path))
out = {"name": d.metadata["Name"], "version": d.version, "dist_info": info, "files": {}, "skipped": [], "size": 0}
made = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
for f in d.files or []:
    rel = str(f)
    path = os.path.realpath(str(d.locate_file(f)))
    if not path.startswith(site + os.sep) or rel.endswith(".pyc") or "__pycache__" in rel \
            or (rel.startswith(info + "/") and rel.rsplit("/", 1)[-1] in made):
        out["skipped"].append(rel); continue
    if not os.path.isfile(path):
        out["skipped"].append(rel); continue
    out["size"] += os.path.getsize(path)
    if out["size"] > cap:
        continue
    with open(path, "rb") as fh:
        out["files"][rel] = base64.b64encode(fh.read()).decode()
if out["size"] > cap:
    out["files"] = {}
print(json.dumps(out))
'''


class DistFiles(BaseModel):
    """Read-only: the installed files of distribution ``name`` in ``python``'s environment, as its RECORD lists
    them (base64), up to ``cap`` bytes in all (over it, only their size)."""

    model_config = ConfigDict(extra="forbid")
    python: str
    name: str
    cap: int = MAX_BYTES

    def command(self) -> str:
        return f"{q(self.python)} -c {q(DIST_FILES_SCRIPT.strip())} {q(self.name)} {int(self.cap)}"

    def display_command(self) -> str:
        return f"{self.python} -c '<read the files of {self.name} its RECORD lists>' {self.name} {int(self.cap)}"


class InstalledFiles(BaseModel):
    name: str = ""
    version: str = ""
    dist_info: str = ""
    files: dict[str, str] = Field(default_factory=dict)   # path in the site folder -> base64 of its bytes
    skipped: list[str] = Field(default_factory=list)
    size: int = 0
    error: str | None = None

    @property
    def too_large(self) -> bool:
        return self.error is None and self.size > 0 and not self.files


def parse_dist_files(text: str) -> InstalledFiles:
    line = next((ln for ln in reversed(text.strip().splitlines()) if ln.startswith("{")), None)
    if line is None:
        raise ParseError("no JSON line", tool="dist_files", excerpt=text[-80:])
    try:
        out = InstalledFiles.model_validate(json.loads(line))
        for v in out.files.values():
            base64.b64decode(v, validate=True)
    except ValueError as exc:
        raise ParseError(f"not the files of a distribution: {str(exc).splitlines()[0]}", tool="dist_files",
                         excerpt=line[:80]) from None
    if out.error is None and (not out.dist_info or not re.fullmatch(r"[^/\\]+\.dist-info", out.dist_info)):
        raise ParseError("no .dist-info folder named", tool="dist_files", excerpt=line[:80])
    return out


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def pack_wheel(dist: InstalledFiles) -> tuple[str, bytes]:
    """The wheel of ``dist``'s files: its file name (``NAME-VERSION-TAG.whl``, the tag its ``WHEEL`` file names, else
    ``py3-none-any``) and its bytes, with a ``WHEEL`` file where the installed one has none and a ``RECORD`` of every
    file's sha256 and size (PEP 376/427). The same files give the same bytes."""
    info = dist.dist_info
    files = {k: base64.b64decode(v) for k, v in dist.files.items()}
    if any(k.startswith("/") or ".." in k.split("/") for k in files):
        raise ValueError("a file outside the site folder")
    wheel_meta = f"{info}/WHEEL"
    tag = "py3-none-any"
    if wheel_meta in files:
        m = re.search(r"^Tag:\s*(\S+)", files[wheel_meta].decode(errors="replace"), re.M)
        tag = m.group(1) if m and re.fullmatch(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+", m.group(1)) else tag
    else:
        files[wheel_meta] = (f"Wheel-Version: 1.0\nGenerator: debugagent (packed from installed files)\n"
                             f"Root-Is-Purelib: false\nTag: {tag}\n").encode()
    record = "".join(f"{k},{_digest(v)},{len(v)}\n" for k, v in sorted(files.items())) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        # the dist-info last, RECORD the very last (PEP 427's recommendation)
        for k in sorted(files, key=lambda k: (k.startswith(info + "/"), k == f"{info}/RECORD", k)):
            zi = zipfile.ZipInfo(k, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            z.writestr(zi, files[k])
    stem = re.sub(r"[-_.]+", "_", dist.name)
    version = re.sub(r"-", "_", dist.version)
    return f"{stem}-{version}-{tag}.whl", buf.getvalue()


def chunks(data: bytes, size: int = CHUNK) -> list[str]:
    text = base64.b64encode(data).decode()
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


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
