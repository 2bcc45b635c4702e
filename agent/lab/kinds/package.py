"""``package_restore``: put back the baseline's build of a compiled dependency, in an overlay folder first on
the server's PYTHONPATH (the environment itself is never changed): a wheel found on the host (the wheelhouse,
pip's cache), or with ``--peer`` the peer's own build (its installed files read from the peer, packed here into a
wheel and sent to the host), or pip download; installed beside it and checked by hashing its compiled files."""

from __future__ import annotations

import re
import shlex
import shutil
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from debugagent.tools.mutate import release_key, wheel_version
from debugagent.tools.peerwheel import MAX_BUILD, chunk_count, pack_wheel_dir, read_build, wheel_chunks
from debugagent.tools.registry import Runner
from pydantic import BaseModel, Field

from ..errors import ExperimentError
from ..server import ServerRun, edit_argv
from ..spec import Kind, RestoreSpec, Text

if TYPE_CHECKING:
    from ...facts import LabFacts
    from ...results import ExperimentResult
    from ..lab import Lab


class PackageRestoreSpec(RestoreSpec):
    kind: Literal["package_restore"]  # pyright: ignore[reportIncompatibleVariableOverride]  (each kind narrows the base str)
    area: ClassVar[str] = "packages.*"
    package: Text | None = None           # one distribution (template); default: every changed one
    # the restart onto the overlay also changes these (the confirmed causes reverted together: verdicts.joint_experiment)
    set_flags: dict[str, str] = Field(default_factory=dict)
    unset_flags: list[str] = Field(default_factory=list)
    set_env: dict[str, str] = Field(default_factory=dict)
    unset_env: list[str] = Field(default_factory=list)


class PackageTarget(BaseModel):
    """A distribution to put back: the build the baseline had (``build`` None: any build other than the current)."""

    name: str
    version: str
    build: str | None = None
    current_version: str | None = None
    current_build: str | None = None


def package_targets(facts: LabFacts, spec: PackageRestoreSpec | dict[str, Any]) -> list[PackageTarget]:
    """The builds to put back: every compiled dependency that differs from the baseline snapshot, or ``spec.package``."""
    if isinstance(spec, dict):
        spec = PackageRestoreSpec.model_validate(spec)
    by_norm = {n.lower().replace("_", "-"): p for n, p in facts.packages.items()}
    out: dict[str, PackageTarget] = {}
    for c in spec.restored(facts.changes):
        parts = c.path.split(".")
        if len(parts) < 3 or c.a is None:
            continue  # a package the baseline did not have: nothing to put back
        name, what = parts[1], parts[2]
        cur = by_norm.get(name.lower().replace("_", "-"))
        t = out.get(name) or PackageTarget(name=name, version=cur.version if cur else "",
                                           current_version=cur.version if cur else None,
                                           current_build=cur.build_hash if cur else None)
        if what == "version":
            t.version = str(c.a)
        elif what == "build":
            t.build = str(c.a)
        out[name] = t
    want = (spec.package or "").strip()
    if want:
        hit = [t for n, t in out.items() if n.lower().replace("_", "-") == want.lower().replace("_", "-")]
        if hit:
            return hit
        cur = by_norm.get(want.lower().replace("_", "-"))
        if cur is None:
            return []
        return [PackageTarget(name=cur.name, version=cur.version, current_version=cur.version,
                              current_build=cur.build_hash)]
    return list(out.values())


def build_matches(t: PackageTarget, version: str | None, build: str | None) -> bool:
    """Is an installed candidate the build ``t`` asks for?"""
    if version != t.version:
        return False
    if t.build is not None:
        return build == t.build
    return t.current_version != version or build != t.current_build


def diffed(facts: LabFacts, targets: list[PackageTarget]) -> bool:
    """Whether the baseline snapshot named these versions (a version change in its diff)."""
    paths = {c.path for c in facts.changes}
    return any(f"packages.{t.name}.version" in paths for t in targets)


def _wanted(t: PackageTarget) -> str:
    return f"{t.name} {t.version}" + (f" (build {t.build})" if t.build else " (another build)")


class PackageRestore(Kind):
    spec = PackageRestoreSpec
    restarts = True
    fresh = True           # only when no server runs (no restart, so no control after it)
    fresh_first = False    # it first looks for a build to install
    # its fix is the command it found (``ExperimentResult.fix``): the conclusion carries it

    def apply(self, lab: Lab, r: Runner, spec: PackageRestoreSpec, facts: LabFacts, bad: list[float],
              regression: float | None) -> ExperimentResult:
        targets = package_targets(facts, spec)
        if not targets:
            raise ExperimentError("no installed package differs from the baseline in a way a build could put back")
        srv = lab.server.find_or_none(r)
        python = lab.setup.python or (srv.python if srv else None) or facts.server_python
        if not python:
            raise ExperimentError("the server's Python is unknown, so no build can be installed for it (give --python)")
        root = f"/tmp/debugagent-overlay-{lab.run_id}"
        lab.push_undo("remove_tree", {"path": root}, f"remove the package overlay {root}")
        found: list[tuple[PackageTarget, str, str]] = []  # target, wheel, overlay folder
        missing: list[PackageTarget] = []
        for t in targets:
            overlay = f"{root}/{re.sub(r'[^A-Za-z0-9_.-]', '_', t.name)}"
            got = self.baseline_build(lab, r, python, t, overlay)
            if got:
                found.append(got)
            else:
                missing.append(t)
        if not found:
            places = ", ".join(lab.setup.wheelhouse) or "no --wheelhouse"
            cmds = "; ".join(f"`{python} -m pip install --no-deps --target {root}/{t.name} {shlex.quote(f'{t.name}=={t.version}')}`"
                             for t in missing)
            raise ExperimentError(f"no wheel of {', '.join(_wanted(t) for t in missing)} was found on the host ({places}, pip's "
                                  f"cache, pip download); to test it: {cmds} (add `--no-index --find-links DIR` for a "
                                  "folder of wheels, or give the .whl), then restart the server with that folder first on "
                                  "PYTHONPATH and benchmark; or run again with --wheelhouse DIR")
        overlays = [o for _, _, o in found]
        from_peer = [(t, w) for t, w, _ in found if self.peer_wheel(lab, w)]
        rest = [(t, w, o) for t, w, o in found if not self.peer_wheel(lab, w)]
        down = [t for t, _, _ in rest if t.current_version and t.version != t.current_version]
        parts = [f"the peer's build of {t.name} {t.version}, read from {lab.peer.name if lab.peer else '?'}"
                 for t, _ in from_peer]
        if rest:
            parts.append("the " + ("previous version" if len(down) == len(rest) and not diffed(facts, down)
                                   else "baseline build") + ("s" if len(rest) > 1 else "") + " of " + ", ".join(
                f"{t.name} {t.version}" + (f" (instead of {t.current_version})" if t in down else "") for t, _, _ in rest))
        change = "; ".join(parts) + f", first on PYTHONPATH ({root})"
        sf, uf = {k: v for k, v in spec.set_flags.items() if k}, [f for f in spec.unset_flags if f]
        se, ue = {k: v for k, v in spec.set_env.items() if k}, [v for v in spec.unset_env if v]
        also = "; ".join(x for x in [", ".join(f"--{f}" for f in uf) + " removed" if uf else "",
                                     " ".join(f"--{k} {v}" for k, v in sf.items()),
                                     ", ".join(ue) + " unset" if ue else "", " ".join(f"{k}={v}" for k, v in se.items())] if x)
        if also and srv is None:
            raise ExperimentError("no server process was found, so no restart can change its flags or environment "
                                  "with the overlay")
        change += f"; {also}" if also else ""
        if srv is not None:
            lab.server.start(r, srv, ServerRun(argv=edit_argv(srv.argv, sf, uf), cwd=srv.cwd, set=se, unset=ue,
                                               set_flags={k: str(v) for k, v in sf.items()}, unset_flags=uf,
                                               path_first=overlays), change)
            vals, d = lab.sample(r, lab.measure_spec.cwd, bad, regression, why=f"the benchmark with {change}")
        else:
            lab.emit("experiment", phase="plan", text="no server process was found: the benchmark itself runs with the overlay first on PYTHONPATH")
            lab.reference(bad)   # no restart, so no control after it: the reference is re-measured now, before the change
            vals, d = lab.sample(r, lab.measure_spec.cwd, bad, regression, why=f"the benchmark with {change}",
                                 env={"PYTHONPATH": ":".join(overlays)})
        # the wheel sent from the peer is removed with the overlay: the run folder keeps a copy, to be copied to /tmp
        fix = "; ".join(f"{python} -m pip install --force-reinstall --no-deps "
                        + (f"/tmp/{w.rsplit('/', 1)[-1]}" if self.peer_wheel(lab, w) else w) for _, w, _ in found)
        if from_peer:
            fix += ("  # " + ", ".join(w.rsplit("/", 1)[-1] for _, w in from_peer) + ": the peer's build, kept in the "
                    "run folder's peer-wheels/; copy it to the host's /tmp first")
        text = f"with {change}: {d.text}"
        if d.significant:
            text += f"; fix: {fix}"
        if missing:
            text += "; not found, so not tested: " + ", ".join(_wanted(t) for t in missing)
        return lab.result(spec, vals, d, text, change=change, fix=fix,
                          packages=[{"name": t.name, "version": t.version, "build": t.build, "wheel": w} for t, w, _ in found])

    def previous_version(self, lab: Lab, r: Runner, python: str, t: PackageTarget,
                         overlay: str) -> tuple[PackageTarget, str, str] | None:
        """The newest wheel of ``t`` older than its installed version in the wheelhouse or pip's cache, installed into
        ``overlay`` and checked: (its target, the wheel, the overlay)."""
        recorded = getattr(getattr(r, "transport", None), "recorded_tools", None)
        if recorded is not None and "find_older_wheels" not in recorded:
            return None   # a recording made before this step existed replays without it
        o = r.call("find_older_wheels", {"name": t.name, "places": lab.setup.wheelhouse},
                   why=f"older versions of {t.name} than {t.version} on the host: the wheelhouse and pip's cache")
        now = release_key(t.version)
        by_version: dict[str, list[str]] = {}
        for w in o.output.wheels if o.ok else []:
            v = wheel_version(w)
            if v and release_key(v) < now:
                by_version.setdefault(v, []).append(w)
        for v in sorted(by_version, key=release_key, reverse=True):
            older = t.model_copy(update={"version": v, "build": None})
            lab.emit("experiment", phase="plan", text=f"no baseline names {t.name}'s previous version: trying {v}, the "
                     f"newest older than {t.version} found on the host")
            for w in by_version[v]:
                got = self.install_checked(lab, r, python, older, w, overlay)
                if got:
                    return older, *got
            return None   # the newest older version only: an older one still is another question
        return None

    def install_checked(self, lab: Lab, r: Runner, python: str, t: PackageTarget, w: str,
                        overlay: str) -> tuple[str, str] | None:
        """``w`` installed into ``overlay``, when the server would then see the build ``t`` asks for."""
        inst = r.call("overlay_install", {"python": python, "wheel": w, "overlay": overlay},
                      why=f"install {w.rsplit('/', 1)[-1]} beside the environment (never into it)")
        if not inst.ok:
            return None
        chk = r.call("overlay_packages", {"python": python, "overlay": overlay},
                     why=f"which build of {t.name} the server would see with the overlay first")
        if not chk.ok:
            return None
        p = chk.output.get(t.name)
        if p is not None and build_matches(t, p.version, p.build_hash):
            lab.emit("experiment", phase="plan", text=f"{w} is {t.name} {p.version} with compiled files hashing to "
                     f"{p.build_hash}" + (" (the baseline's)" if t.build else f" (installed: {t.current_build})"))
            return w, overlay
        return None

    def baseline_build(self, lab: Lab, r: Runner, python: str, t: PackageTarget,
                       overlay: str) -> tuple[PackageTarget, str, str] | None:
        """A wheel of ``t`` on the host, installed into ``overlay`` and checked by hashing its compiled files: (the
        target it is, the wheel, the overlay). Where no baseline names the version (``t`` is the installed one) and
        the host holds no other build of it, the newest older version the host holds comes before the index."""
        o = r.call("find_wheels", {"name": t.name, "version": t.version, "places": lab.setup.wheelhouse},
                   why=f"wheels of {t.name} {t.version} on the host: the wheelhouse and pip's cache")
        wheels = o.output.wheels if o.ok else []
        if not wheels and t.build is None and t.version == t.current_version:
            older = self.previous_version(lab, r, python, t, overlay)
            if older is not None:
                return older
        if not wheels and lab.peer is not None:
            got = self.peer_build(lab, r, python, t, overlay)
            if got is not None:
                return t, *got
        if not wheels:
            dest = f"/tmp/debugagent-dl-{lab.run_id}"
            lab.push_undo("remove_tree", {"path": dest}, f"remove the downloaded wheels {dest}")
            dl = r.call("pip_download", {"python": python, "name": t.name, "version": t.version, "dest": dest},
                        why=f"{t.name}=={t.version} from the package index, if the host reaches one")
            wheels = dl.output.wheels if dl.ok else []
        for w in wheels:
            got = self.install_checked(lab, r, python, t, w, overlay)
            if got:
                return t, *got
        return None

    @staticmethod
    def peer_wheel(lab: Lab, w: str) -> bool:
        return lab.peer is not None and w.startswith(f"/tmp/debugagent-peer-{lab.run_id}/")

    def peer_build(self, lab: Lab, r: Runner, python: str, t: PackageTarget, overlay: str) -> tuple[str, str] | None:
        """``--peer``: the peer's own build of ``t``: its installed files read from the peer (its connection opened
        again, read-only, and closed right after), packed here into a wheel, sent to the host in a folder of the run's
        own (journalled first), then installed into ``overlay`` and checked as any wheel is."""
        peer = lab.peer
        assert peer is not None
        if not peer.python:
            lab.emit("experiment", phase="plan", text=f"the peer {peer.name}'s Python is unknown: its build of {t.name} "
                     "cannot be read")
            return None
        lab.emit("experiment", phase="plan", text=f"no wheel of {t.name} {t.version} on the host: reading the peer "
                 f"{peer.name}'s build (the files its RECORD lists); the peer is opened again to be read, never "
                 "changed, and closed right after")
        keep = lab.journal.path.parent / "peer-wheels"   # the run's own copy, for the fix (the host's goes with the overlay)
        spool = keep / f".read-{t.name}"
        try:
            pr = peer.open()
            try:
                spool.mkdir(parents=True, exist_ok=True)
                keep.chmod(0o700)
                dist = read_build(pr, peer.python, t.name, spool,
                                  why=f"peer {peer.name}: the installed files of {t.name} (as its RECORD lists them), read to "
                                  "pack the peer's build into a wheel; nothing on the peer is changed")
            finally:
                peer.close()
        except Exception as exc:   # noqa: BLE001  (the peer unreachable now: this source is out, the others remain)
            shutil.rmtree(spool, ignore_errors=True)
            lab.emit("experiment", phase="plan", text=f"the peer {peer.name} could not be read again: {exc}")
            return None
        why = (dist.error or
               dist.too_large and f"its files are {dist.size} bytes, more than the {MAX_BUILD} read from a peer "
               "(copy them by hand, or give --wheelhouse DIR)" or
               dist.version != t.version and f"it has {t.name} {dist.version}, not {t.version}" or None)
        if why:
            shutil.rmtree(spool, ignore_errors=True)
            lab.emit("experiment", phase="plan", text=f"the peer {peer.name}'s build of {t.name} was not read: {why}")
            return None
        try:
            wheel = pack_wheel_dir(dist, keep)
        except (ValueError, OSError) as exc:
            lab.emit("experiment", phase="plan", text=f"the peer {peer.name}'s build of {t.name} cannot be packed: {exc}")
            return None
        finally:
            shutil.rmtree(spool, ignore_errors=True)
        name, size = wheel.name, wheel.stat().st_size
        wheel.chmod(0o600)
        folder = f"/tmp/debugagent-peer-{lab.run_id}"
        lab.push_undo("remove_tree", {"path": folder}, f"remove the peer's wheel {folder}")
        path = f"{folder}/{name}"
        n = chunk_count(wheel)
        for i, c in enumerate(wheel_chunks(wheel)):
            w = r.call("write_chunk", {"path": path, "data": c, "first": i == 0},
                       why=f"send the peer's build of {t.name} to the host: {name}, {size} bytes"
                       + (f" (part {i + 1} of {n})" if n > 1 else ""))
            if not w.ok:
                lab.emit("experiment", phase="plan", text=f"the peer's wheel could not be sent to the host: {w.error}")
                return None
        left = f"; left out: {len(dist.skipped)} files pip writes or compiles, or outside the site folder" if dist.skipped else ""
        lab.emit("experiment", phase="plan", text=f"the peer's build of {t.name} {t.version}, read from {peer.name}: "
                 f"{len(dist.sizes)} files ({dist.size} bytes, read in {dist.reads} part{'s' * (dist.reads > 1)}) packed into "
                 f"{name} ({size} bytes{left}), sent to {path}")
        return self.install_checked(lab, r, python, t, path, overlay)
