"""``debugagent run`` and ``debugagent resume``: set up, run the graph, report, exit.

``investigate`` reads as the run's outline: the inputs (``session.inputs_from_options``), the
folder, the live view, the session (``session.open_run``: host, transcript, journal, lock),
then ``drive`` (the graph over SQLite checkpoints, with SIGINT/SIGTERM/SIGHUP undoing the host)
and the ``--json`` object.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from debugagent.tools.errors import (
    DebugAgentError,
    RestoreError,
    RunFolderError,
    TransportError,
    UsageError,
    write_problem,
)
from debugagent.tools.redact import private_file, redact, redact_argv, redact_text
from rich.markup import escape

from .config import RunConfig
from .graph import RECURSION_LIMIT, Ctx, build_graph
from .hosts import open_transport
from .journal import HostLock, Journal, host_instance, host_side, sort_journals, state_dir
from .lab import Lab, Measure
from .session import RunOptions, Session, inputs_from_options, make_view, open_run
from .signals import Interrupted, Signals
from .sinks import console
from .state import RunState, conclusion_of, to_jsonable
from .transcript import Transcript

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

__all__ = ["RunConfig", "RunOptions", "execute", "investigate", "resume_run", "undo_run"]

err = console(stderr=True)


def held_note(signum: int) -> None:
    """Said at once when a signal waits for the change under way (a plain write: a signal handler must not
    re-enter the console)."""
    name = signal.Signals(signum).name
    try:
        os.write(2, f"{name}: the change under way on the host finishes first; then every change is undone\n".encode())
    except OSError:
        pass


def say_err(text: str, markup: bool = False) -> None:
    """A console line that must not fail (a closed terminal after SIGHUP). Its text is printed as it is: a step's
    text or a host's name holding ``[conceal]`` or ``[link=…]`` is not rich markup."""
    try:
        err.print(text, markup=markup)
    except OSError:
        pass


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "run"


def execute(opts: RunConfig, *, folder: Path | None = None, resume: bool = False, unattended_check: bool = False) -> int:
    """Run (or resume) an investigation, print its result, return the exit code. ``unattended_check`` (the
    command line's ``run``): a real host with no terminal to ask on needs --allow-mutations or --read-only."""
    from . import STARTED
    output = investigate(opts, folder=folder, resume=resume, since=STARTED, unattended_check=unattended_check)
    if "interrupted" in output:
        return 130
    if opts.as_json:
        print(json.dumps(redact(output), indent=1))
    else:
        print_human(redact(output))
    return int(output["exit_code"])


def investigate(opts: RunConfig, *, folder: Path | None = None, resume: bool = False,
                transport: Any = None, since: float | None = None, unattended_check: bool = False) -> dict[str, Any]:
    """The investigation itself; returns the ``--json`` object.

    ``transport`` lets a caller (a test, a notebook) pass an open transport; it is then
    left open. ``since`` (a ``time.monotonic()`` value) is where the live view's elapsed time starts.
    """
    peer = None
    if opts.peer and not opts.baseline_snapshot:
        path, peer = peer_snapshot(opts)
        opts = opts.model_copy(update={"baseline_snapshot": str(path)})
    try:
        return _investigate(opts, folder, resume, transport, since, unattended_check, peer)
    finally:
        if peer is not None:
            peer.close()


def _investigate(opts: RunConfig, folder: Path | None, resume: bool, transport: Any, since: float | None,
                 unattended_check: bool, peer: Any) -> dict[str, Any]:
    inputs = inputs_from_options(opts)
    if unattended_check:
        from .consent import check_unattended
        check_unattended(opts)
    if folder is None:   # decided and checked now; nothing is written until the host is open
        folder = new_run_folder(opts, inputs.symptom.metric)
    view = make_view(inputs, opts, folder, resume, since)
    with view:   # visible at once: opening a host can take seconds
        session = open_run(opts, inputs, folder, resume=resume, transport=transport, view=view, peer=peer)
        try:   # at once: the session holds the host's lock
            started = time.monotonic()
            state = drive(session, resume)
        finally:
            session.close()
    if session.transcript.broken:   # the run finished, the host restored, but its folder is not whole
        raise RunFolderError(folder, session.transcript.broken)
    if isinstance(state, Stopped):   # said now, under the live view's last frame (a line under a live panel is drawn over)
        say_err(state.line)
        return {"interrupted": True, "transcript": str(folder)}
    return output_of(conclusion_of(state), folder, time.monotonic() - started)


PEER_RUNS = 1   # the snapshot's own run (its GPUs read under load, its benchmark checked); the baseline's runs come
# later, interleaved with the host's in the reproduce step


def peer_snapshot(opts: RunConfig) -> tuple[Path, Any]:
    """``--peer HOST``: a snapshot of the healthy peer, taken now (read-only, nothing on it is changed) with
    ``PEER_RUNS`` run of the same benchmark, written under the state folder's ``peers/``; it is then the run's
    baseline snapshot, so the diff against it drives the suspects and experiments run on ``--host`` alone. Its
    connection is left open (the ``Peer`` returned): the reproduce step alternates its benchmark runs with the
    host's, then closes it."""
    from debugagent.tools.redact import write_private
    from debugagent.tools.registry import Runner
    from debugagent.tools.snapshot import collect, dump

    from .context import Peer
    from .hosts import check_host
    from .symptom import parse_symptom
    if opts.baseline or opts.baseline_snapshot:
        raise UsageError("--peer and " + ("--baseline" if opts.baseline else "--baseline-snapshot") + " both given",
                         fix="give one baseline: the peer measured now, a number, or a snapshot of the good state")
    if opts.peer == opts.host:
        raise UsageError(f"--peer {opts.peer} is the host itself", fix="give a healthy peer of the host: another host")
    check_host(opts.host)
    check_host(str(opts.peer))
    metric = parse_symptom(opts.symptom).metric
    quiet = opts.as_json or not err.is_terminal
    if not quiet:
        err.print(escape(f"reading the peer {opts.peer} ({PEER_RUNS} benchmark runs; nothing on it is changed) …"))
    tr = open_transport(str(opts.peer), opts.ssh)
    try:
        snap = collect(Runner(tr), bench=opts.bench, python=opts.python, repo=opts.repo,
                       server_pattern=opts.server_pattern, metric=metric, bench_regex=opts.bench_regex,
                       bench_runs=PEER_RUNS)
    except BaseException:
        tr.close()
        raise
    peer = Peer(name=str(opts.peer), transport=tr, bench=snap.bench.get("cmd"), metric=snap.bench.get("metric") or metric,
                cwd=snap.discovery.repo if snap.discovery else None, regex=snap.bench.get("regex"),
                reopen=lambda: open_transport(str(opts.peer), opts.ssh), python=peer_python(snap))
    if not snap.bench.get("samples"):
        peer.close()
        raise UsageError(f"--peer {opts.peer}: its benchmark gave no numbers of `{metric}`"
                         + (f" ({snap.errors[0]})" if snap.errors else ""),
                         fix="give the benchmark with --bench (and --metric in the symptom), the same on both hosts")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = state_dir() / "peers" / f"{stamp}-{re.sub(r'[^A-Za-z0-9._-]', '_', str(opts.peer))[:60]}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, dump(snap) + "\n")
    except BaseException:
        peer.close()
        raise
    if not quiet:
        samples = snap.bench["samples"]
        err.print(escape(f"the peer's snapshot: {metric} {samples[0]:g} {snap.bench.get('unit') or ''} ({path}); its "
                         "baseline runs alternate with the host's when the run reproduces"))
    return path, peer


def peer_python(snap: Any) -> str | None:
    """The peer's server's Python, as its snapshot found it: the one whose packages its snapshot lists."""
    server = getattr(snap, "server", None)
    packages = getattr(snap, "packages", None)
    return (server.python if server is not None else None) or (packages.python if packages is not None else None)


def output_of(conclusion: dict[str, Any], folder: Path, wall: float) -> dict[str, Any]:
    """The ``--json`` object from the conclusion; ``regression.runs`` is the reproduce step's run count as the
    run folder's events give it (``runfacts``: the number the live view and the transcript show)."""
    output = {k: conclusion.get(k) for k in ("schema", "root_cause", "root_causes", "suspects", "ruled_out",
                                             "inconclusive", "not_judged", "joint", "commands")}
    regression = conclusion.get("regression")
    if isinstance(regression, dict):
        regression = {**regression, "runs": reproduce_runs(folder)}
    output.update(transcript=str(folder), exit_code=conclusion.get("exit_code", 3), summary=conclusion.get("summary"),
                  bench_runs=conclusion.get("bench_runs"), regression=regression,
                  notes=conclusion.get("notes"), wall_s=round(wall, 2), server=server_of(folder),
                  bench_format=bench_format_of(folder))
    return output


def bench_format_of(folder: Path) -> str | None:
    """The format the benchmark's metric was read from (added to schema 2: ``sglang``, ``vllm``, ``genai-perf``,
    ``llmperf``, ``serving-table``, ``pairs`` or ``regex``); None where the run folder does not say."""
    from .runfacts import gather
    from .transcript import read_events
    path = folder / "events.jsonl"
    return gather(read_events(path)).bench_format if path.is_file() else None


def server_of(folder: Path) -> dict[str, Any] | None:
    """The server as discovery described it (added to schema 2): pid, command line, folder, interpreter, and its
    shape (launcher, engine origin, process tree, supervisor, container); None when none was found."""
    from .runfacts import gather
    from .transcript import read_events
    path = folder / "events.jsonl"
    if not path.is_file():
        return None
    outs = gather(read_events(path)).outputs
    srv = outs.get("server_details")
    if not srv:
        return None
    shape = outs.get("server_shape")
    return {"pid": srv.get("pid"), "argv": redact_argv(srv.get("argv") or []), "cwd": srv.get("cwd"),
            "python": srv.get("python"), "entry": srv.get("entry"),
            "workers": [w.get("pid") for w in (shape or {}).get("tree") or []], "shape": shape}


def reproduce_runs(folder: Path) -> int | None:
    """How many runs the reproduce step took (the check's run first), from the folder's ``events.jsonl``; None
    without one."""
    from .runfacts import gather
    from .transcript import read_events
    path = folder / "events.jsonl"
    return len(gather(read_events(path)).reproduce) if path.is_file() else None


class Stopped:
    """An interrupted run (every change undone): the line that says so and how to continue."""

    def __init__(self, line: str) -> None:
        self.line = line


def drive(session: Session, resume: bool) -> dict[str, Any] | Stopped:
    """The graph over the run folder's SQLite checkpoints, the host restored at the end or on a signal or an
    error; the final state, or ``Stopped`` when interrupted (every change undone)."""
    ctx, folder = session.ctx, session.folder
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer  # noqa: PLC0415 - loaded once a run starts
    from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: PLC0415
    conn = sqlite3.connect(str(private_file(folder / "checkpoints.sqlite")), check_same_thread=False)
    graph = build_graph(ctx, checkpointer=SqliteSaver(conn, serde=RedactingSerde(JsonPlusSerializer())))
    config: RunnableConfig = {"configurable": {"thread_id": ctx.run_id}, "recursion_limit": RECURSION_LIMIT}
    try:
        if resume:
            check_checkpoints(folder, conn, config)
        view = session.view
        live = view is not None and view.live is not None
        with Signals(on_held=(lambda signum: None) if live else held_note,
                     on_first=view.stopping if view is not None else None):
            return _guarded(ctx, folder, lambda: graph.invoke(None if resume else RunState(), config))
    except RestoreError as exc:
        if not exc.fix:
            exc.fix = f"debugagent undo {folder}"
        ctx.transcript.emit("error", kind="undo", message=f"{exc.message}; left to do: {'; '.join(exc.left)}")
        raise
    finally:
        conn.close()


def _guarded(ctx: Ctx, folder: Path, invoke: Any) -> dict[str, Any] | Stopped:
    """Settle what a crashed run left, run the graph, and restore the host whatever happens."""
    try:
        try:
            settle(ctx, ctx.transport)
            state = invoke()
        except (OSError, sqlite3.Error) as exc:   # the run folder refused a write (the checkpoints, a file)
            why = write_problem(exc)
            if why is None:
                raise
            ctx.transcript.broken = ctx.transcript.broken or why
            raise RunFolderError(folder, why) from None
    except KeyboardInterrupt as exc:
        name = exc.args[0] if isinstance(exc, Interrupted) else "SIGINT"
        met = error_under(exc)
        if met is not None:   # the run's own error, met before the signal cut its undo short: still reported
            ctx.transcript.emit("error", message=str(met), kind=error_kind(met))
        after = f" after an error ({met.message})" if met is not None else ""
        left = restore(ctx)
        if left:
            raise RestoreError(f"interrupted ({name}){after} and the host could not be fully restored", left=left,
                               fix=f"debugagent undo {folder}") from None
        ctx.transcript.emit("interrupted", text=f"interrupted ({name}){after}; every change was undone; `debugagent "
                            f"resume {folder}` continues from the last finished step")
        ctx.transcript.close()
        from .outputs import write_outputs
        write_outputs(folder)
        return Stopped(f"interrupted ({name}){after}; {found_line(ctx.undo)}. Continue with: debugagent resume {folder}")
    except DebugAgentError as exc:
        try:
            left = restore(ctx)
        except KeyboardInterrupt:   # a signal during this undo: the undo went on to its end (a second pass finds
            left = restore(ctx)     # what is left, later signals ignored); the error is what the run reports
        ctx.transcript.emit("error", message=str(exc), kind=error_kind(exc))
        if left and not isinstance(exc, RestoreError):
            raise RestoreError(f"{exc.message}; the host could not be fully restored", left=left,
                               fix=f"debugagent undo {folder} (once {ctx.transport.host} answers)") from exc
        raise
    left = restore(ctx)
    if left:
        raise RestoreError("the run finished but the host could not be fully restored", left=left,
                           fix=f"debugagent undo {folder}")
    return state


def error_under(exc: BaseException) -> DebugAgentError | None:
    """The run's own error that an interrupt replaced (raised while that error's undo ran: ``__context__``)."""
    seen: set[int] = set()
    cur = exc.__context__
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, DebugAgentError):
            return cur
        seen.add(id(cur))
        cur = cur.__context__
    return None


def error_kind(exc: DebugAgentError) -> str:
    return "transport" if isinstance(exc, TransportError) else type(exc).__name__


def state_runs_dir() -> Path:
    """Where runs go by default: ``$XDG_STATE_HOME/debugagent/runs`` (``~/.local/state`` when unset)."""
    return state_dir() / "runs"


# what a run writes into its folder: --out may be a folder that holds only these (a run that stopped before it began)
RUN_FILE = re.compile(r"run\.json|journal\.json|events\.jsonl|transcript\.md|report\.html|checkpoints\.sqlite(-wal|-shm|-journal)?"
                      r"|recovered-.+\.json")


def _writable(folder: Path, flag: str, shown: str) -> None:
    """Refuse a folder that exists as something else, holds a run, or cannot be made (exit 2)."""
    fix = ("give a folder you can write to" + (", or leave --out out (runs then go under "
                                               f"{state_runs_dir()})" if flag == "--out" else
                                               ", or set XDG_STATE_HOME to one, or give --out DIR"))
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{flag} {shown}: exists and is not a folder", fix=fix)
    if (folder / "events.jsonl").exists():
        raise UsageError(f"{flag} {shown} already holds a run", fix="choose a new folder, or `debugagent resume` it")
    if flag == "--out" and folder.is_dir():
        resolved = folder.resolve()
        foreign = sorted(p.name for p in folder.iterdir() if not RUN_FILE.fullmatch(p.name))
        if resolved == Path(resolved.anchor) or foreign:
            what = "is the root folder" if resolved == Path(resolved.anchor) else (
                f"holds files that are not a debugagent run's ({', '.join(foreign[:3])}{', …' if len(foreign) > 3 else ''})")
            raise UsageError(f"{flag} {shown}: {what}; a run writes its files straight into --out",
                             fix=f"give a new or empty folder, e.g. --out {Path(shown) / 'debugagent-run'}")
    p = folder
    while not p.exists():
        p = p.parent
    if not p.is_dir() or not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {shown}: cannot write there ({p} is not a writable folder)", fix=fix)


def new_run_folder(opts: RunConfig, metric: str) -> Path:
    """The run's folder, checked but not made: ``--out``, or a new ``<UTC stamp>-<slug>`` in the state folder."""
    if opts.out:
        folder = Path(opts.out).expanduser()
        _writable(folder, "--out", opts.out)
        return folder.absolute()
    runs = state_runs_dir()
    _writable(runs, "the state folder", str(runs))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    name = f"{stamp}-{slug(opts.host.split(':')[-1] + '-' + metric)}"
    folder, n = runs / name, 1
    while folder.exists():
        n += 1
        folder = runs / f"{name}-{n}"
    return folder


class RedactingSerde:
    """The checkpointer's serializer with the redactor in front: the graph state saved in
    ``checkpoints.sqlite`` holds no secret (a resumed run re-reads the server from the host)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return self.inner.dumps_typed(redact(to_jsonable(obj)))

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return self.inner.loads_typed(data)


def check_checkpoints(folder: Path, conn: sqlite3.Connection, config: RunnableConfig) -> None:
    """A resumed run's checkpoints can be read, or exit 2 naming the file (the journal still undoes)."""
    from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: PLC0415
    try:
        SqliteSaver(conn).get_tuple(config)
    except Exception as exc:  # noqa: BLE001 - sqlite, msgpack and langgraph each raise their own on a damaged file
        raise UsageError(f"{folder / 'checkpoints.sqlite'}: the checkpoints cannot be read ({type(exc).__name__}: "
                         f"{str(exc)[:160]})",
                         fix=f"start a new run; `debugagent undo {folder}` still restores the host from its journal") from exc


def settle(ctx: Ctx, transport: Any) -> None:
    """Before anything else: finish what this run (when resumed) or a crashed run left on the host."""
    undo = ctx.undo
    if undo.gone:
        ctx.say(f"The interrupted run's simulated host ended with it; its {len(undo.gone)} pending undo step(s) "
                "went with that sandbox and are not run here.")
        undo.save()
    if undo.remote is None:
        return
    undo.check_host(f"debugagent undo {ctx.transcript.folder}")
    undo.merge_host_copy()
    if undo.foreign_copy:
        ctx.say(undo.foreign_copy[:1].upper() + undo.foreign_copy[1:] + ".")
    if undo.steps:
        ctx.say(f"The interrupted run left {len(undo.steps)} undo step(s) unfinished ({undo.describe_left()}); "
                "restoring them first, so the host is recorded as it was found, not as an experiment left it.")
        left = restore(ctx)
        if left:
            raise RestoreError("the changes the interrupted run left could not be undone", left=left)
    mine, notes = sort_journals(undo.remote, ctx.run_id)
    for note in notes:
        ctx.say(note[:1].upper() + note[1:] + ".")
    for data in mine:
        other = Journal(ctx.transcript.folder / f"recovered-{data.run_id}.json", data.run_id, data.host, undo.remote, data)
        ctx.say(f"Run {data.run_id} left {len(other.steps)} undo step(s) unfinished on this host "
                f"({other.describe_left()}); restoring them before anything is measured.")
        left = restore(ctx, other)
        if left:
            raise RestoreError(f"run {data.run_id} left changes on {transport.host} that could not be undone", left=left,
                               fix="restore them by hand (listed above), then run again")


def restore(ctx: Ctx, journal: Journal | None = None) -> list[str]:
    """Undo whatever is still pending in the journal, then check the host as found (``lab.undo``); print on the
    console what could not be undone and each difference from the host as found."""
    journal = journal or ctx.undo
    if journal.settled:
        return []
    lab = Lab(ctx.runner, lambda ev, **kw: ctx.transcript.emit(ev, **kw), journal, Measure("", "", None), ctx.run_id, True)
    why = ""
    left: list[str] = []
    try:
        left = lab.do_undo(ctx.runner("undo"))
    except UsageError:
        raise   # a journal step that does not fit its tool: exit 2, naming it
    except DebugAgentError as exc:
        why = f": {exc.message}"
    if journal.steps:
        left = [s.text + (f" (last error: {s.error})" if s.error else "") for s in journal.pending()]
    if not left:
        return []
    msg = (f"could not undo on {ctx.transport.host}{why}; left to do: {'; '.join(left)} "
           f"(journal: {journal.path}; the host's copy: ~/.cache/debugagent/{journal.host_name})")
    ctx.transcript.emit("error", kind="undo", message=msg)
    say_err(f"[red]warning[/]: {escape(redact_text(msg))}", markup=True)
    return left


def found_line(journal: Journal) -> str:
    """What the console may say of the host after the undo: "as it was found" only once that was checked."""
    if journal.data.verified:
        return "the host is as it was found (checked after the undo)"
    if not journal.data.steps:
        return "nothing on the host was changed"
    return "every change was undone (not checked against the host as found: there is no host to read)"


def print_human(o: dict[str, Any]) -> None:
    """The answer once: the headline (at most ~160 characters), the evidence as a short list, the notes, the
    counts, and where the transcript and the report are (agent/answer.py)."""
    from .answer import evidence_lines, headline
    out = console()
    out.print()
    out.print(f"[bold]{escape(headline(o))}[/]")
    for line in evidence_lines(o):
        out.print(escape("  " + line))
    for n in o.get("notes") or []:
        out.print(f"  [yellow]note[/]: {escape(n)}")
    out.print(f"\n{o['commands']} commands, {o.get('bench_runs') or 0} benchmark runs, {o['wall_s']} s. "
              f"Transcript: {o['transcript']}/transcript.md")
    out.print(f"Report: {o['transcript']}/report.html (`debugagent report {o['transcript']}` opens it in a browser)")


def load_run(run_dir: str) -> tuple[RunConfig, str]:
    """A run folder's configuration and run id, or a ``UsageError`` naming what is wrong."""
    folder = Path(run_dir)
    p = folder / "run.json"
    if not p.is_file():
        raise UsageError(f"{run_dir}: no run.json (not a debugagent run folder)", fix="give the folder `debugagent run` wrote")
    try:
        opts, run_id = RunConfig.from_saved(json.loads(p.read_text()))
    except ValueError as exc:   # pydantic's ValidationError is one
        raise UsageError(f"{p}: not a debugagent run.json ({str(exc).splitlines()[0]})",
                         fix="the file is damaged; start a new run (its journal, if any, is still read by `debugagent undo`)") from exc
    return opts, run_id or folder.name


def resume_run(run_dir: str, *, allow_mutations: bool = False, as_json: bool = False, bench: str | None = None,
               llm: str | None = None, force_unlock: bool = False) -> int:
    saved, _ = load_run(run_dir)
    again: dict[str, Any] = {"allow_mutations": saved.allow_mutations or allow_mutations, "as_json": as_json,
                             "force_unlock": force_unlock}
    # secrets were never saved: a value that held one must be given again
    for name, given in (("bench", bench), ("llm", llm)):
        if given:
            again[name] = given
        elif "REDACTED" in (getattr(saved, name) or ""):
            raise UsageError(f"{run_dir}/run.json: --{name} held a secret, so it was not saved",
                             fix=f"give it again: debugagent resume {run_dir} --{name} '…'")
    opts = RunConfig.model_validate({**saved.model_dump(), **again})
    return execute(opts, folder=Path(run_dir), resume=True)


def undo_run(run_dir: str, *, force_unlock: bool = False, transport: Any = None) -> int:
    """``debugagent undo RUN``: finish the run's journal on its host; 0 when nothing is left, 6 otherwise."""
    opts, run_id = load_run(run_dir)
    folder = Path(run_dir)
    owned = transport is None
    transport = transport or open_transport(opts.host, opts.ssh)
    try:
        remote = host_side(transport)
        journal = Journal.open(folder / "journal.json", run_id, opts.host, remote, host_instance(transport))
        if journal.gone:
            say_err(f"{opts.host} was a simulated host: it ended with the run, and its changes with it "
                    f"({'; '.join(journal.gone)})")
            journal.save()
        journal.check_host(f"debugagent undo {folder}")
        found = journal.merge_host_copy()
        if journal.foreign_copy:
            say_err(journal.foreign_copy)
        if journal.settled:
            say_err(f"nothing to undo: every step of {run_id} is done" + ("" if found or journal.data.steps else
                    " (no journal in the run folder nor on the host)") + (
                    "; the host was checked as found after it" if journal.data.verified else ""))
            return 0
        lock = HostLock(remote, run_id)
        lock.acquire(force=force_unlock)
        if lock.took_over:
            say_err(lock.took_over)
        transcript = Transcript(folder, run_id)
        try:
            from .graph import Ctx
            ctx = Ctx(transport=transport, transcript=transcript, playbook=None, run_id=run_id, undo=journal,  # type: ignore[arg-type]
                      symptom=None)  # type: ignore[arg-type]
            if journal.steps:
                say_err(f"undoing {len(journal.steps)} step(s) on {transport.host}: {journal.describe_left()}")
                ctx.say(f"`debugagent undo`: {len(journal.steps)} undo step(s) were left unfinished; running them now.")
            else:
                say_err(f"every step of {run_id} is done; checking {transport.host} against the host as found")
                ctx.say("`debugagent undo`: every undo step is done, but the host was not yet checked as found; "
                        "checking it now.")
            left = restore(ctx)
        finally:
            lock.release()
            transcript.close()
        if left:
            raise RestoreError(f"{transport.host} could not be fully restored", left=left,
                               fix=f"debugagent undo {folder} again once the cause is fixed, or undo those by hand")
        say_err(f"done: {transport.host} is restored ({len(journal.data.steps)} step(s) in the journal, none left); "
                f"{found_line(journal)}")
        return 0
    finally:
        if owned:
            transport.close()
