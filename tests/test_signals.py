"""A signal during a run is raised once, and never half-way through a change on the host."""

from __future__ import annotations

import os
import signal
import time

import pytest
from debugagent.agent.signals import Interrupted, Signals, held
from debugagent.tools.registry import Runner
from debugagent.tools.transport import CommandResult, FakeTransport

HOST_S = 2.0   # how long each command runs on the host: long beside any scheduling delay of a loaded machine


def signalled_mid_command(sig: signal.Signals):
    """A host whose every command is still running when ``sig`` reaches the run."""
    def handler(command: str) -> str:
        os.kill(os.getpid(), sig)
        time.sleep(HOST_S)       # the handler runs here, on the main thread
        return "done\n"
    return handler


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_during_a_mutation_waits_for_its_result(sig):
    seen: list[tuple[str, dict]] = []
    told: list[int] = []
    r = Runner(FakeTransport(signalled_mid_command(sig)), lambda e, d: seen.append((e, d)), hold=held)
    with Signals(on_held=told.append), pytest.raises(Interrupted) as exc:
        r.call("remove_file", {"path": "/tmp/debugagent-x.env"})
    assert exc.value.signum == sig
    assert told == [sig]
    # the change's command ran to its end and its result is recorded before the run stops
    assert [e for e, _ in seen] == ["tool_call", "tool_result"]
    assert seen[1][1]["stdout"] == "done\n"


def test_a_signal_during_a_probe_stops_it_at_once():
    seen: list[str] = []
    r = Runner(FakeTransport(signalled_mid_command(signal.SIGTERM)), lambda e, d: seen.append(e), hold=held)
    started = time.monotonic()
    with Signals(), pytest.raises(Interrupted):
        r.call("host_info")
    assert time.monotonic() - started < 0.75 * HOST_S   # raised inside the wait, not after it
    assert seen == ["tool_call"]


def test_a_second_signal_is_ignored_and_a_later_section_runs_whole():
    r = Runner(FakeTransport(signalled_mid_command(signal.SIGTERM)), hold=held)
    with Signals() as s:
        with pytest.raises(Interrupted):
            r.call("remove_file", {"path": "/tmp/debugagent-x.env"})
        out = r.call("remove_file", {"path": "/tmp/debugagent-x.env"})   # the undo: not cut short
        assert out.ok and len(s.received) == 2


def test_outside_a_run_a_held_section_is_plain():
    assert Signals.active is None
    with held():
        pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_during_the_host_journals_write_waits_for_it(sig, tmp_path):
    """The host's copy of the journal (and the lock) is written by a command like any other: a signal arriving
    while it is on its way must wait for it, or the undo's removal of the host copy can reach the host first and
    the late write leave a journal of a run that is over."""
    from debugagent.agent.journal import HostFiles, Journal
    answered: list[str] = []

    def host(command: str) -> str:
        if "journal-" in command and "printf" in command:
            os.kill(os.getpid(), sig)
            time.sleep(0.3)      # the signal's handler runs here
            answered.append("write")
            return "written\n"
        answered.append("other")
        return "removed\n"
    j = Journal(tmp_path / "journal.json", "run-1", "h", HostFiles(FakeTransport(host)))
    with Signals(), pytest.raises(Interrupted):
        j.record("set_governor", {"governor": "powersave"}, "set the governor back")
    # the write's answer came back before the run stopped (the host's identity is read before it, once)
    assert answered.count("write") == 1 and answered[-1] == "write", answered
    assert j.steps and j.steps[0].tool == "set_governor"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_while_starting_lets_go_of_a_lock_its_command_took(sig, tmp_path):
    """Before a run's handlers, the command's own (agent/entry.py) answer SIGTERM and SIGHUP with an interrupt.
    One that lands while the lock's command is on the host (it took the lock; its answer not yet read) must not
    leave the host locked by a run that never started: the lock is let go, and the run says nothing changed."""
    from types import SimpleNamespace

    from debugagent.agent.entry import _stop
    from debugagent.agent.journal import HostFiles, HostLock
    from debugagent.agent.session import _locked
    host: dict[str, str | None] = {"lock": None}

    def answer(command: str) -> str:
        if "echo acquired" in command:
            host["lock"] = "run-1"       # the command took the lock on the host ...
            os.kill(os.getpid(), sig)    # ... and the signal lands before its answer is read
            time.sleep(0.3)
            return "acquired\n"
        if "echo unlocked" in command:
            if "run-1" in command:
                host["lock"] = None
            return "unlocked\n"
        return ""   # the host's identity: not known
    fake = FakeTransport(answer)
    old = signal.signal(sig, _stop)
    try:
        with pytest.raises(KeyboardInterrupt, match=sig.name):
            _locked(HostLock(HostFiles(fake), "run-1"), SimpleNamespace(force_unlock=False), None, tmp_path, fake,
                    False)
    finally:
        signal.signal(sig, old)
    assert host["lock"] is None, fake.calls


def test_once_a_run_is_over_the_commands_handler_no_longer_says_while_starting(monkeypatch, capfd):
    """A signal after a run's handlers are gone (its outputs being written) is answered by the command's own
    handler again: it must not say that nothing on the host was changed."""
    from debugagent.agent import entry
    monkeypatch.setitem(entry.WHEN, "now", entry.STARTING)   # as a command starts (put back after the test)
    with pytest.raises(KeyboardInterrupt):
        entry._stop(signal.SIGTERM, None)
    assert "while starting; nothing on the host was changed" in capfd.readouterr().err
    with Signals():
        pass
    with pytest.raises(KeyboardInterrupt):
        entry._stop(signal.SIGHUP, None)
    err = capfd.readouterr().err
    assert "interrupted (SIGHUP) as the run ended, after its undo" in err and "nothing on the host" not in err



def dropping(on_restart):
    """A simulated host (launch-blocking) whose connection drops at the first benchmark after the experiment's
    restart, and ``on_restart(n, host)`` told of the server's n-th restart (the experiment's, then each undo's)
    before it runs: it may raise, or signal the run. Returns the transport and what it saw."""
    from debugagent.tools.errors import ConnectError
    from debugagent.tools.sim import load_scenario
    from debugagent.tools.sim.sandbox import SimTransport
    bench = load_scenario("launch-blocking").bench.command()
    seen = {"restarts": 0, "dropped": False}

    class Dropping(SimTransport):
        def run(self, command: str, **kw) -> CommandResult:
            if command.startswith(bench) or f"&& {bench}" in command:
                if seen["restarts"] == 1 and not seen["dropped"]:
                    seen["dropped"] = True
                    raise ConnectError("the connection dropped", host=self.host)
            elif "keyof()" in command:      # a restart of the server
                seen["restarts"] += 1
                on_restart(seen["restarts"], self.host)
            return super().run(command, **kw)
    return Dropping("sim:launch-blocking"), seen


def run_on(t, tmp_path):
    from debugagent.agent.run import RunOptions, investigate
    return investigate(RunOptions(host="sim:launch-blocking", symptom="verify 30ms", baseline="verify 20ms",
                                  as_json=True, out=str(tmp_path / "run")), transport=t)


def events_and_steps(tmp_path) -> tuple[list[dict], list[dict]]:
    import json
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    return events, json.loads((tmp_path / "run" / "journal.json").read_text())["steps"]


def test_a_signal_during_the_undo_after_an_error_still_reports_that_error(tmp_path):
    """The connection fails while a restart experiment measures (an error of the run), and SIGTERM arrives while
    the undo that follows restarts the server. The undo goes on to its end (the host as found), the run stops as
    interrupted, and the error it met is still reported (the transcript and the line said): the signal must not
    replace what the person needs to read."""
    def on_restart(n: int, host: str) -> None:
        if n == 2:
            os.kill(os.getpid(), signal.SIGTERM)   # lands while the undo's restart runs (held)
    t, seen = dropping(on_restart)
    try:
        out = run_on(t, tmp_path)
        assert seen == {"restarts": 2, "dropped": True}
        assert out["interrupted"] is True
        events, steps = events_and_steps(tmp_path)
        errors = [e for e in events if e["event"] == "error" and "the connection dropped" in e.get("message", "")]
        stopped = [e for e in events if e["event"] == "interrupted"]
        assert len(errors) == 1 and errors[0]["kind"] == "transport", errors
        assert len(stopped) == 1 and "interrupted (SIGTERM) after an error (" in stopped[0]["text"]
        assert "every change was undone" in stopped[0]["text"]
        assert steps and all(st["done"] for st in steps)
        assert "the connection dropped" in (tmp_path / "run" / "transcript.md").read_text()
    finally:
        t.close()


def test_a_signal_during_the_undo_of_a_failed_run_lets_that_undo_finish_and_the_error_stand(tmp_path):
    """The connection fails while a restart experiment measures, and again as the experiment's own undo restarts
    the server, so the run's last undo (after the error) is the one that restores the host; SIGTERM lands while it
    restarts the server. That undo goes on to its end, and the run ends with its first error (exit 4), reported."""
    from debugagent.tools.errors import ConnectError

    def on_restart(n: int, host: str) -> None:
        if n == 2:
            raise ConnectError("the connection dropped again", host=host)
        if n == 3:
            os.kill(os.getpid(), signal.SIGTERM)   # lands while the last undo's restart runs (held)
    t, seen = dropping(on_restart)
    try:
        with pytest.raises(ConnectError) as exc:
            run_on(t, tmp_path)
        assert exc.value.message == "the connection dropped" and seen == {"restarts": 3, "dropped": True}
        events, steps = events_and_steps(tmp_path)
        assert [e["kind"] for e in events if e["event"] == "error" and e["message"] == "the connection dropped"] == [
            "transport"]
        assert not any(e["event"] == "interrupted" for e in events)
        assert steps and all(st["done"] for st in steps)
    finally:
        t.close()
