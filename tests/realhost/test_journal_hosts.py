"""Two hosts that see one cache folder: this machine (``--host local``) and a bubblewrap box of its own mount and UTS
namespaces (``--host nsenter:PID``, its own ``/tmp``) that binds the test's folder, HOME with it, as a container with
the machine's home bound in, or two machines with one NFS home, would. Each leaves an unfinished journal there; a
run on each host restores only the journal written for it, and names the other's in one line; ``debugagent undo``
of a run, through the wrong host, refuses with exit 2 and says where to run it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from debugagent.agent.config import RunConfig
from debugagent.agent.graph import Ctx
from debugagent.agent.hosts import open_transport
from debugagent.agent.journal import HostFiles, Journal
from debugagent.agent.run import settle, undo_run
from debugagent.agent.transcript import Transcript
from debugagent.tools.errors import UsageError
from debugagent.tools.transport import LocalTransport

from .container import make_box, why_not

pytestmark = pytest.mark.skipif(bool(why_not()), reason=why_not() or "")


def ctx_for(folder: Path, run_id: str, transport, journal: Journal) -> Ctx:
    """What a run on ``transport`` is when it settles what other runs left (as ``debugagent undo`` makes it)."""
    return Ctx(transport=transport, transcript=Transcript(folder, run_id), playbook=None, run_id=run_id,  # type: ignore[arg-type]
               undo=journal, symptom=None)  # type: ignore[arg-type]


def said(folder: Path) -> str:
    return "\n".join(json.loads(ln).get("text", "") for ln in (folder / "events.jsonl").read_text().splitlines())


@pytest.fixture
def two_hosts(tmp_path):
    """This machine and the box, each with an unfinished journal of a run of its own in the one cache folder: the
    run's step removes a name in that host's /tmp (both /tmps hold both names: a run that restores the other host's
    journal removes a file of its own host's)."""
    box = make_box(tmp_path, hostname="other-host")
    here, there = LocalTransport(), open_transport(f"nsenter:{box.pid}")
    tag = tmp_path.name[-12:]
    ids = {"a": f"ra{tag}", "b": f"rb{tag}"}
    made = {k: f"/tmp/debugagent-{rid}-made" for k, rid in ids.items()}
    try:
        for t in (here, there):
            r = t.run("touch " + " ".join(made.values()))
            assert r.ok, r.tail()
        for k, t in (("a", here), ("b", there)):
            (tmp_path / k).mkdir()
            j = Journal(tmp_path / k / "journal.json", ids[k], "local" if k == "a" else f"nsenter:{box.pid}", HostFiles(t))
            j.record("remove_file", {"path": made[k]}, f"remove {made[k]}")
            (tmp_path / k / "run.json").write_text(json.dumps(
                RunConfig.model_validate({"host": j.data.host, "symptom": "latency 30 ms"}).saved(ids[k])))
        shared = Path(os.environ["HOME"]) / ".cache" / "debugagent"
        assert sorted(os.listdir(shared)) == sorted(f"journal-{rid}.json" for rid in ids.values())
        yield {"here": here, "there": there, "ids": ids, "made": made, "shared": shared, "box": box}
    finally:
        for t in (here, there):
            t.run("rm -f " + " ".join(made.values()))
        there.close()
        box.stop()


def test_each_host_restores_only_its_own_journal_from_a_shared_cache_folder(tmp_path, two_hosts):
    here, there, ids, made, shared = (two_hosts[k] for k in ("here", "there", "ids", "made", "shared"))
    # a run on the box restores the box's journal only, and names this machine's in one line
    (tmp_path / "c").mkdir()
    jc = Journal(tmp_path / "c" / "journal.json", "rc", f"nsenter:{two_hosts['box'].pid}", HostFiles(there))
    settle(ctx_for(tmp_path / "c", "rc", there, jc), there)
    assert there.run(f"test -e {made['a']}").ok, "a journal written for this machine was run in the box"
    assert not there.run(f"test -e {made['b']}").ok, "the box's own journal was not restored"
    assert here.run(f"test -e {made['a']} && test -e {made['b']}").ok
    assert os.listdir(shared) == [f"journal-{ids['a']}.json"]
    assert (f"A journal of run {ids['a']} written on host {os.uname().nodename}" in said(tmp_path / "c")
            and "is left alone: not this host" in said(tmp_path / "c"))
    # a run on this machine restores this machine's only (the box's is done; its name on the box's /tmp is gone)
    (tmp_path / "d").mkdir()
    jd = Journal(tmp_path / "d" / "journal.json", "rd", "local", HostFiles(here))
    settle(ctx_for(tmp_path / "d", "rd", here, jd), here)
    assert not here.run(f"test -e {made['a']}").ok and here.run(f"test -e {made['b']}").ok
    assert os.listdir(shared) == []


def test_undo_through_the_wrong_host_refuses_and_says_where_to_run_it(tmp_path, two_hosts):
    here, there, ids, made, shared = (two_hosts[k] for k in ("here", "there", "ids", "made", "shared"))
    for k, t, written in (("a", there, os.uname().nodename), ("b", here, "other-host")):
        with pytest.raises(UsageError) as e:
            undo_run(str(tmp_path / k), transport=t)
        assert e.value.exit_code == 2
        assert f"the journal of run {ids[k]} was written on host {written}" in e.value.message
        assert "where --host" in (e.value.fix or "")
    assert here.run(f"test -e {made['a']} && test -e {made['b']}").ok
    assert there.run(f"test -e {made['a']} && test -e {made['b']}").ok
    assert len(os.listdir(shared)) == 2


def test_a_journal_of_an_older_debugagent_is_restored_with_a_line_saying_its_host_is_unchecked(tmp_path):
    here = LocalTransport()
    made = Path(f"/tmp/debugagent-ro{tmp_path.name[-12:]}-made")
    made.touch()
    (tmp_path / "a").mkdir()
    old = Journal(tmp_path / "a" / "journal.json", f"ro{tmp_path.name[-12:]}", "ssh://box", HostFiles(here))
    old.record("remove_file", {"path": str(made)}, f"remove {made}")
    shared = Path(os.environ["HOME"]) / ".cache" / "debugagent" / f"journal-{old.data.run_id}.json"
    data = json.loads(shared.read_text())
    del data["host_id"]   # as an older debugagent wrote it
    shared.write_text(json.dumps(data))
    (tmp_path / "b").mkdir()
    jb = Journal(tmp_path / "b" / "journal.json", "rnew", "local", HostFiles(here))
    settle(ctx_for(tmp_path / "b", "rnew", here, jb), here)
    assert not made.exists() and not shared.exists()
    assert "names no host (written by an older debugagent): its host cannot be checked" in said(tmp_path / "b")


def test_what_tells_two_hosts_apart():
    """The machine id and the host name where both were read, the container, and the mount namespace within one boot
    only (a reboot makes every namespace anew: the same machine after one is still this host)."""
    from debugagent.agent.journal import HostFiles, HostId
    here = HostFiles(LocalTransport()).identity()
    assert here.known and here.boot_id and here.mnt_ns and here.other_than(here) is None
    rebooted = here.model_copy(update={"boot_id": "another-boot", "mnt_ns": "mnt:[1]"})
    assert rebooted.other_than(here) is None
    assert "mount namespace" in (here.model_copy(update={"mnt_ns": "mnt:[1]"}).other_than(here) or "")
    assert "host name" in (here.model_copy(update={"hostname": "gpu-7"}).other_than(here) or "")
    assert "machine-id" in (here.model_copy(update={"machine_id": "0" * 16}).other_than(here) or "")
    assert "container" in (here.model_copy(update={"container": "docker 4f2a"}).other_than(here) or "")
    assert HostId().other_than(here) is None and here.other_than(HostId()) is None   # nothing read: nothing to tell
