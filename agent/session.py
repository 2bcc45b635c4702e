"""One session factory: what `run`, `resume` and `replay` each need to drive the graph, built in
one place.

::

    RunConfig (the flags, run.json)  ──► inputs_from_options ─┐
    a recording's run_started header ──► inputs_from_recording ┴► Inputs ──► make_ctx(inputs, transport,
                                                                   transcript, journal, advisor) ──► Ctx
    open_run:    the run folder, the transport, the transcript, the journal, the host's lock, the advisor
    open_replay: a ReplayTransport over the events, a transcript in a scratch folder, a local journal

``Inputs.overrides`` (``context.Overrides``) comes from the same dict in both: a live run's
``RunConfig.recorded_inputs()`` is what its recording's ``inputs`` hold.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from debugagent.tools.errors import DebugAgentError, RecordingError, TransportError, UsageError, write_problem
from debugagent.tools.redact import private_dir, redacted_dump
from debugagent.tools.replay import ReplayTransport
from debugagent.tools.snapshot import Snapshot
from debugagent.tools.transport import q
from pydantic import BaseModel, ConfigDict

from . import __version__
from .config import RunConfig
from .consent import make_ask
from .context import Ctx, Overrides, Peer
from .discovery import DiscoveryInput, check_input
from .events import Event, EventBase
from .hosts import check_container, check_host, open_transport
from .journal import HostLock, HostLocked, Journal, host_instance, host_side
from .playbook import Playbook, load_playbook
from .sinks import console
from .symptom import Direction, Symptom, as_direction, check_pair, parse_symptom
from .transcript import SCHEMA_VERSION, Transcript, read_events, write_markdown
from .view import View

err = console(stderr=True)


RunOptions = RunConfig   # the name callers and older code use


# ---------------------------------------------------------------- what a run was asked
class Inputs(BaseModel):
    """What a run was asked: the symptom and baseline, the playbook, the overrides, whether it may change the host."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    host: str
    symptom: Symptom
    baseline: Symptom | None = None
    baseline_snapshot: Snapshot | None = None
    playbook: Playbook
    overrides: Overrides
    allow_mutations: bool = False
    read_only: bool = False    # --read-only: no experiment, even on a simulated host


def overrides_of(d: Mapping[str, Any]) -> Overrides:
    """The overrides from a run's ``recorded_inputs()`` or a recording's ``inputs`` (the same dict)."""
    return Overrides.model_validate(dict(d))


def _symptoms(symptom: str, baseline: str | None, direction: Direction | None) -> tuple[Symptom, Symptom | None]:
    sym = parse_symptom(symptom, "--symptom", direction)
    base = parse_symptom(baseline, "--baseline", direction) if baseline else None
    if base:
        check_pair(sym, base)
    return sym, base


def inputs_from_options(opts: RunConfig) -> Inputs:
    """The flags checked (exit 2 on bad input, before anything connects) and parsed."""
    check_host(opts.host)
    check_container(opts.host, opts.ssh.container)
    symptom, baseline = _symptoms(opts.symptom, opts.baseline, opts.direction)
    if opts.baseline and opts.baseline_snapshot:
        raise UsageError("--baseline and --baseline-snapshot both given", fix="give one: a number or a snapshot of the good state")
    try:
        snap = Snapshot.load(opts.baseline_snapshot) if opts.baseline_snapshot else None
    except UsageError as exc:
        raise UsageError(f"--baseline-snapshot: {exc.message}", fix=exc.fix) from None
    measured = (snap.bench.get("metric") or "") if snap and snap.bench.get("samples") else ""
    if measured and measured.lower() != symptom.metric.lower():   # its runs are the baseline, and part of the noise
        raise UsageError(f"--baseline-snapshot {opts.baseline_snapshot}: its benchmark measured `{measured}`, but "
                         f"--symptom names `{symptom.metric}`",
                         fix=f"take the snapshot with `debugagent snapshot --metric {symptom.metric} ...`, or give "
                         f"--baseline with the good number of `{symptom.metric}`")
    if opts.llm:   # before anything connects: the API key goes only where it is safe (agent/llm.py)
        from .llm import check_llm_url
        check_llm_url(opts.llm, insecure=opts.llm_insecure)
    check_input(DiscoveryInput(server_pattern=opts.server_pattern, python=opts.python, repo=opts.repo,
                               bench=opts.bench, bench_regex=opts.bench_regex, metric=symptom.metric))
    return Inputs(host=opts.host, symptom=symptom, baseline=baseline, baseline_snapshot=snap,
                  playbook=load_playbook(opts.playbook), overrides=overrides_of(opts.recorded_inputs()),
                  allow_mutations=opts.allow_mutations, read_only=opts.read_only)


def inputs_from_recording(head: EventBase | dict[str, Any], playbook: str | None, file: str) -> Inputs:
    """What the recorded run was asked (its ``run_started`` header); ``playbook`` replays it against another."""
    pb = load_playbook(playbook or head.get("playbook"))
    inputs = head.get("inputs") or {}
    symptom, baseline = _symptoms(head["symptom"], head.get("baseline"), as_direction(inputs.get("direction")))
    try:
        snap = Snapshot.model_validate(head["baseline_snapshot_data"]) if head.get("baseline_snapshot_data") else None
    except ValueError as exc:
        raise RecordingError(f"run_started: baseline_snapshot_data is not a snapshot ({str(exc).splitlines()[0]})",
                             file=file, line=1, fix="the recording is edited or damaged; record the run again") from exc
    return Inputs(host=head.get("host", ""), symptom=symptom, baseline=baseline, baseline_snapshot=snap, playbook=pb,
                  overrides=overrides_of(inputs), allow_mutations=True)


def make_ctx(inputs: Inputs, transport: Any, transcript: Transcript, undo: Journal, run_id: str, *,
             advisor: Any = None, confirm: Any = None, peer: Any = None) -> Ctx:
    return Ctx(peer=peer, transport=transport, transcript=transcript, playbook=inputs.playbook, run_id=run_id, undo=undo,
               symptom=inputs.symptom, baseline=inputs.baseline, baseline_snapshot=inputs.baseline_snapshot,
               allow_mutations=not inputs.read_only and (inputs.allow_mutations or transport.sandbox),
               confirm=None if inputs.read_only else confirm, advisor=advisor,
               overrides=inputs.overrides)


# ---------------------------------------------------------------- a live run (or a resumed one)
def header(opts: RunConfig, playbook: Any, run_id: str, snap: Snapshot | None = None) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "debugagent_version": __version__, "run_id": run_id, "host": opts.host,
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "symptom": opts.symptom, "baseline": opts.baseline, "baseline_snapshot": opts.baseline_snapshot,
            "playbook": playbook.name, "playbook_source": os.path.basename(playbook.source), "playbook_digest": playbook.digest,
            "inputs": opts.recorded_inputs(),
            "baseline_snapshot_data": snap.model_dump(mode="json") if snap else None}


def start_folder(folder: Path, opts: RunConfig, resume: bool) -> str:
    """Make the run folder (0700) and write ``run.json`` (redacted, 0600); returns the run id."""
    if resume:
        return json.loads((folder / "run.json").read_text()).get("run_id") or folder.name
    try:
        private_dir(folder)
    except OSError as exc:
        flag = "--out" if opts.out else "the state folder"
        raise UsageError(f"{flag} {folder}: cannot make it ({exc.strerror})", fix="give a folder you can write to") from exc
    # unique on the host too: it names debugagent's worktree and saved files there
    run_id = f"{folder.name}-{secrets.token_hex(3)}"
    redacted_dump(folder / "run.json", opts.saved(run_id))
    return run_id


def make_view(inputs: Inputs, opts: RunConfig, folder: Path, resume: bool, since: float | None) -> View:
    """The live view on the terminal (quiet under --json); a resumed run's starts where the run stands."""
    view = View(inputs.playbook.order(), quiet=opts.as_json, since=since)
    if resume and (folder / "events.jsonl").is_file():
        view.load(read_events(folder / "events.jsonl"))
    view.state.set_phase(f"connecting to {opts.host}")
    return view


def advisor_for(opts: RunConfig) -> Any:
    if not opts.llm:
        return None
    from .llm import Advisor
    return Advisor(opts.llm, opts.llm_model, insecure=opts.llm_insecure)


@dataclass
class Session:
    """A run's open pieces; ``close`` releases the host's lock, closes an owned transport and the transcript."""

    ctx: Ctx
    folder: Path
    lock: HostLock | None = None
    owned: bool = True
    view: View | None = None   # the live view: told at once of a signal (its header stops promising time left)

    @property
    def transcript(self) -> Transcript:
        return self.ctx.transcript

    def close(self) -> None:
        if self.ctx.peer is not None:
            self.ctx.peer.close()
        if self.lock is not None:
            self.lock.release()
        if self.owned:
            self.ctx.transport.close()
        if not self.transcript._file.closed:
            self.transcript.close()
            try:   # every output (transcript.md and report.html): a run that ends in an error has a report too
                from .outputs import write_outputs
                write_outputs(self.folder)
            except DebugAgentError:
                pass
            except OSError as exc:   # a full disk: said by the caller (``investigate``), after the host is restored
                if write_problem(exc) is None:
                    raise
                self.transcript.broken = self.transcript.broken or write_problem(exc)


def _failed_to_connect(folder: Path, opts: RunConfig, inputs: Inputs, resume: bool, view: View, exc: Exception) -> None:
    """The host could not be opened: the run folder still says so."""
    run_id = start_folder(folder, opts, resume)
    transcript = Transcript(folder, run_id)
    transcript.listeners.append(view.feed)
    if not resume:
        transcript.emit("run_started", **header(opts, inputs.playbook, run_id))
    transcript.emit("error", message=str(exc), kind="transport")
    transcript.close()
    write_markdown(folder)


def check_on_host(opts: RunConfig, transport: Any) -> None:
    """The flags that name a path on the host, checked there once it is open and before anything is written: exit 2
    naming the flag (a replay has no host to ask)."""
    if not opts.wheelhouse or not transport.live:
        return
    w = opts.wheelhouse
    r = transport.run(f"test -d {q(w)} || test -f {q(w)}", timeout=60)
    if r.exit_code != 0:
        raise UsageError(f"--wheelhouse {w}: no such folder or wheel on {transport.host}",
                         fix="give the folder of wheels (or one .whl) as the host names it, or leave --wheelhouse out "
                             "(pip's cache on the host is searched anyway)")


def open_run(opts: RunConfig, inputs: Inputs, folder: Path, *, resume: bool, transport: Any, view: View,
             peer: Any = None) -> Session:
    """Open the host (unless a transport is given: it is then left open), the run folder, the transcript, the
    journal and the host's lock; nothing is changed on the host."""
    owned = transport is None
    try:
        if transport is None:
            transport = open_transport(opts.host, opts.ssh)
    except TransportError as exc:
        _failed_to_connect(folder, opts, inputs, resume, view, exc)
        raise
    try:
        check_on_host(opts, transport)
        run_id = start_folder(folder, opts, resume)
    except BaseException:
        if owned:
            transport.close()
        raise
    transcript = Transcript(folder, run_id)
    transcript.listeners.append(view.feed)
    remote = host_side(transport)
    undo = Journal.open(folder / "journal.json", run_id, opts.host, remote, host_instance(transport))
    if resume:
        transcript.emit("resumed", text=f"resumed on {transport.host}; the last finished step is kept, the rest runs again")
    else:
        transcript.emit("run_started", **header(opts, inputs.playbook, run_id, inputs.baseline_snapshot))
    lock = _locked(HostLock(remote, run_id), opts, transcript, folder, transport, owned)
    try:
        transport.on_event = lambda kind, text: transcript.emit("error", kind=kind, message=text)
        ctx = make_ctx(inputs, transport, transcript, undo, run_id, advisor=advisor_for(opts), confirm=make_ask(view),
                       peer=peer)
    except BaseException:   # Ctrl-C while starting, a bad --llm: the lock is let go before the error is said
        lock.release()
        if owned:
            transport.close()
        raise
    return Session(ctx=ctx, folder=folder, lock=lock, owned=owned, view=view)


def _locked(lock: HostLock, opts: RunConfig, transcript: Transcript, folder: Path, transport: Any,
            owned: bool) -> HostLock:
    """The host's lock taken, or the refusal recorded (and the transport closed) before it is raised."""
    try:
        lock.acquire(force=opts.force_unlock)
        if lock.took_over:
            transcript.emit("reasoning", text=lock.took_over)
    except (HostLocked, OSError, TransportError) as exc:
        transcript.emit("error", message=str(exc), kind="lock")
        transcript.close()
        write_markdown(folder)
        if owned:
            transport.close()
        if isinstance(exc, OSError):
            raise TransportError(str(exc), host=transport.host) from exc
        raise
    except KeyboardInterrupt:
        # a signal while starting (the entry point's handler) may land once the lock's command has taken it and
        # before its answer is read: it is let go (the host's command removes only a lock naming this run)
        lock.held = True
        lock.release()
        if owned:
            transport.close()
        raise
    return lock


# ---------------------------------------------------------------- a replay
def open_replay(events: list[Event], *, playbook: str | None, out: Path, file: str) -> tuple[Ctx, ReplayTransport]:
    """The recorded run's inputs against its recorded outputs, writing a transcript of its own in ``out``."""
    head = events[0]
    inputs = inputs_from_recording(head, playbook, file)
    transport = ReplayTransport(events, file)
    out.mkdir(parents=True, exist_ok=True)
    transcript = Transcript(out, head["run_id"])
    transcript.emit("run_started", **{k: v for k, v in head.items() if k not in ("event", "seq", "t", "run_id")},
                    replay_of=file)
    llm_answers = [e for e in events if e["event"] == "llm_call"]
    advisor = None
    if llm_answers:
        from .llm import RecordedAdvisor
        advisor = RecordedAdvisor(llm_answers)
    undo = Journal(out / "journal.json", head["run_id"], transport.host)
    return make_ctx(inputs, transport, transcript, undo, head["run_id"], advisor=advisor,
                    peer=replayed_peer(head, transport)), transport


def replayed_peer(head: Any, transport: ReplayTransport) -> Peer | None:
    """A ``--peer`` run's peer in its replay: the recording answers its calls too (in the order they were made)."""
    name = (head.get("inputs") or {}).get("peer")
    if not name:
        return None
    bench = (head.get("baseline_snapshot_data") or {}).get("bench") or {}
    repo = ((head.get("baseline_snapshot_data") or {}).get("discovery") or {}).get("repo")
    snap = head.get("baseline_snapshot_data") or {}
    python = (snap.get("server") or {}).get("python") or (snap.get("packages") or {}).get("python")
    return Peer(name=str(name), transport=transport, bench=bench.get("cmd"), metric=bench.get("metric") or "",
                cwd=repo, regex=bench.get("regex"), owned=False, python=python)
