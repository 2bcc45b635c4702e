"""The NVIDIA driver: its version and CUDA version (from ``nvidia-smi -q``, the GPU probe's call), the kernel
module against the user-space library, and when the library was installed.

Snapshot fields ``driver`` and ``driver_files``; difference paths ``driver.version`` and ``driver.cuda``;
fact ``driver`` (against torch's CUDA build, and whether it came after the environment).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from .. import gpu, host
from .base import Add, Call, FactsInput, Gathering, Probe, Tool
from .packages import LATER_S, iso, later_packages

if TYPE_CHECKING:
    from ..snapshot import Snapshot


class Fields(BaseModel):
    driver: dict[str, str] = Field(default_factory=dict)


class FileFields(BaseModel):
    driver_files: dict[str, Any] = Field(default_factory=dict)


def _first(g: Gathering) -> list[Call]:
    return [("driver_files", None, "the driver's kernel module and library, and when it was installed")]


def _fill(g: Gathering) -> dict[str, Any]:
    q: gpu.DriverInfo | None = g.output("gpu_q")
    files: host.DriverFacts | None = g.output("driver_files")
    return {"driver": {"version": q.driver_version, "cuda": q.cuda_version} if q else {},
            "driver_files": files.model_dump() if files else {}}


def _diff(a: Snapshot, b: Snapshot, add: Add) -> None:
    if a.driver.get("version") != b.driver.get("version"):
        add("driver.version", a.driver.get("version"), b.driver.get("version"))
    if a.driver.get("cuda") != b.driver.get("cuda"):
        add("driver.cuda", a.driver.get("cuda"), b.driver.get("cuda"))


def _version(v: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v or ""))


def driver_facts(snap: Snapshot, packages: dict[str, dict[str, Any]] | None,
                 env_installed_ts: float | None) -> dict[str, Any] | None:
    """The driver against torch's CUDA, the kernel module against the library, and when it was installed."""
    if not snap.driver:
        return None
    torch = (packages or {}).get("torch")
    tc = None
    if torch:
        m = re.search(r"\+cu(\d+)(\d)$", torch["version"])
        tc = f"{m.group(1)}.{m.group(2)}" if m else None
    df = snap.driver_files or {}
    inst = df.get("installed_at")
    return {**snap.driver, "torch_cuda": tc, "installed_at": iso(inst),
            "module_version": df.get("module_version"), "library_version": df.get("library_version"),
            "mismatch": bool(df.get("module_version") and df.get("library_version")
                             and df["module_version"] != df["library_version"]),
            "later": bool(inst and env_installed_ts and inst > env_installed_ts + LATER_S),
            "cuda_older_than_torch": bool(tc and snap.driver.get("cuda")
                                          and _version(snap.driver["cuda"])[:1] < _version(tc)[:1])}


def _facts(snap: Snapshot, fx: FactsInput) -> dict[str, Any]:
    packages = fx.so_far.get("packages")
    env_installed_ts, _ = later_packages(packages) if packages else (None, [])
    return {"driver": driver_facts(snap, packages, env_installed_ts)}


PROBE = Probe(
    "driver",
    tools=(Tool("driver_files", host.DriverFiles, lambda i, r: host.parse_driver_files(r.stdout), optional=True,
                wave=1, check=True),),
    first=_first, fill=_fill, diff_paths=("driver.version", "driver.cuda"), diff=_diff, facts=_facts,
)
