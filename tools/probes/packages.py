"""Python packages: every distribution in the server's interpreter, with hashes of its compiled files.

Snapshot fields ``python``, ``packages``; difference paths ``packages.NAME.version`` and ``packages.NAME.build``
(a package installed editable counts as a change of source); facts ``packages``, ``later_packages`` (the few
installed well after the rest of the environment) and ``env_installed``.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from .. import host, peerwheel
from .base import Add, Call, FactsInput, Gathering, Probe, Tool
from .text import plural, table, when

if TYPE_CHECKING:
    from ..snapshot import Snapshot

MAX_LATER = 3  # late packages tested one by one, newest first
LATER_S = 24 * 3600


class Fields(BaseModel):
    python: str | None = None
    packages: host.PackageSet | None = None


def iso(ts: float | int | None) -> str | None:
    if not ts:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def later_packages(packages: dict[str, dict[str, Any]]) -> tuple[float | None, list[dict[str, Any]]]:
    """The base environment's install time, and the packages installed well after it (newest first)."""
    times = [p["installed_at"] for p in packages.values() if p.get("installed_at") and not p.get("editable")]
    if not times:
        return None, []
    # the base environment: the first quarter of install times; the suspects: the newest
    # cluster of installs (within 3 days of the newest), if it came after the base
    env_installed_ts = sorted(times)[len(times) // 4]
    newest = max(times)
    later: list[dict[str, Any]] = []
    for p in packages.values():
        ts = p.get("installed_at")
        if ts and not p.get("editable") and ts > env_installed_ts + LATER_S and ts >= newest - 3 * LATER_S:
            later.append({**p, "installed_at": iso(ts), "_ts": ts})
    later.sort(key=lambda p: -p["_ts"])
    # a suspect stands out: a few late installs with compiled files, not a whole later layer of the image
    compiled = [p for p in later if p.get("build_hash")]
    return env_installed_ts, compiled[:MAX_LATER] if len(later) <= max(MAX_LATER, len(packages) // 4) else []


def render_packages(parsed: dict[str, Any]) -> list[str]:
    """``python_packages``: the packages that stand out (installed at another time than most of the
    environment, or editable) in a table; every package in a collapsed block."""
    pkgs = parsed["packages"]
    header = ["package", "version", "installed (UTC)", "build hash", "editable"]

    def row(p: dict[str, Any]) -> list[Any]:
        return [p["name"], p["version"], when(p.get("installed_at")), p.get("build_hash") or "", p.get("editable") or ""]

    times = Counter(when(p.get("installed_at")) for p in pkgs)
    usual, n_usual = times.most_common(1)[0]
    odd = [p for p in pkgs if when(p.get("installed_at")) != usual or p.get("editable")] if len(pkgs) > 8 else pkgs
    head = f"Output (JSON, {plural(len(pkgs), 'package')}, Python {parsed.get('python_version', '?')})"
    if odd is pkgs:
        return [head + ":", *table(header, [row(p) for p in pkgs])]
    head += f"; {n_usual} of them installed {usual}, the others and the editable ones here"
    return [head + (":" if odd else ": none"), *(table(header, [row(p) for p in odd]) if odd else []),
            "", "<details><summary>every package</summary>", "", *table(header, [row(p) for p in pkgs]), "", "</details>"]


def _summary(ev: dict[str, Any]) -> list[str] | None:
    parsed = ev.get("output") or {}
    return render_packages(parsed) if parsed.get("packages") else None


def _second(g: Gathering) -> list[Call]:
    if not g.python:
        return []
    server = g.discovery.server if g.discovery else None
    pk_in: dict[str, Any] = {"python": g.python}
    pp = server.env.get("PYTHONPATH", "") if server is not None else ""
    if server is not None and server.env and g.python == server.python and "[REDACTED]" not in pp:
        pk_in["pythonpath"] = pp   # the packages as the server sees them
    if server is not None and g.python == server.python:
        pk_in["pid"] = server.pid   # its interpreter runs as the server's user, never with more privilege
    return [("python_packages", pk_in, "versions and compiled-file hashes")]


def _fill(g: Gathering) -> dict[str, Any]:
    return {"python": g.python, "packages": g.output("python_packages")}


def _diff(a: Snapshot, b: Snapshot, add: Add) -> None:
    pa = {p.name: p for p in (a.packages.packages if a.packages else [])}
    pb = {p.name: p for p in (b.packages.packages if b.packages else [])}
    editable = {n for n, p in {**pa, **pb}.items() if p.editable}
    for name in sorted(set(pa) | set(pb)):
        x, y = pa.get(name), pb.get(name)
        if x is None or y is None:
            add(f"packages.{name}.version", x.version if x else None, y.version if y else None,
                "installed" if x is None else "removed", editable=name in editable)
        elif x.version != y.version:
            add(f"packages.{name}.version", x.version, y.version, "", editable=name in editable)
        elif x.build_hash != y.build_hash and not x.editable:
            add(f"packages.{name}.build", x.build_hash, y.build_hash,
                f"same version {x.version}, different build (compiled files differ)", editable=name in editable)


def _facts(snap: Snapshot, fx: FactsInput) -> dict[str, Any]:
    packages = {p.name: p.model_dump() for p in snap.packages.packages} if snap.packages else None
    env_installed_ts, later = later_packages(packages) if packages else (None, [])
    return {"packages": packages, "later_packages": later, "env_installed": iso(env_installed_ts)}


PROBE = Probe(
    "packages",
    tools=(Tool("python_packages", host.PythonPackages, lambda i, r: host.parse_python_packages(r.stdout), timeout=120.0,
                summary=_summary, optional=True, wave=2, check=True),
           # a peer's build of one package, read to pack it into a wheel (``tools.peerwheel``; experiments only)
           Tool("dist_files", peerwheel.DistFiles, lambda i, r: peerwheel.parse_dist_files(r.stdout), timeout=120.0)),
    second=_second, fill=_fill, diff_paths=("packages.NAME.version", "packages.NAME.build"), diff=_diff, facts=_facts,
)
