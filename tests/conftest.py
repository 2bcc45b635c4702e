"""Fixtures shared by the suite: vectors, an isolated environment, and the shipped fixtures
(``debugagent_testing.fixtures``: simulated hosts, replays) that playbook authors use too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# no per-example deadline: one example slowed by a loaded machine is not a failure (the examples' count stays)
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

pytest_plugins = ["debugagent_testing.fixtures"]   # sim_host, replay_recording: the fixtures we ship

ROOT = Path(__file__).resolve().parents[1]
VECTORS = Path(os.environ.get("DEBUGAGENT_VECTORS", ROOT.parent / "shared" / "vectors" / "h200"))
if not VECTORS.is_dir():
    VECTORS = ROOT / "tests" / "vectors" / "h200"


def vector(name: str) -> str:
    """The command output captured on the H200 host, without the `$ cmd` line and `[exit N]`."""
    path = VECTORS / name
    if not path.is_file():  # captured by this project, kept beside the copies of the shared ones
        path = ROOT / "tests" / "vectors" / "h200" / name
    text = path.read_text()
    lines = text.splitlines()
    if lines and lines[0].startswith("$ "):
        lines = lines[1:]
    while lines and lines[-1].startswith("[exit"):
        lines = lines[:-1]
    return "\n".join(lines) + "\n"


# The files that take longest, longest first (test seconds of one file on a loaded 2-core machine, measured
# with --durations=0): ./run-tests gives each worker one file at a time in the suite's order
# (--dist loadfile --no-loadscope-reorder), so these start first and the short files fill in at the end. In
# xdist's own order (most tests first) a file of one 250-s test started last and the suite waited on it alone.
LONGEST_FIRST = (
    "tests/test_ssh.py",                          # 470
    "tests/test_agent.py",                        # 420
    "tests/realhost/test_shapes.py",              # 390
    "tests/test_faults_overlay_governor.py",      # 330
    "tests/test_faults_power_worktree.py",        # 330
    "tests/realhost/test_containers.py",          # 300
    "tests/realhost/test_experiments.py",         # 270
    "tests/test_faults.py",                       # 260
    "tests/realhost/test_fault_shapes.py",        # 80-250
    "tests/test_sim.py",                          # 210
    "tests/test_sim_host.py",                     # 140
    "tests/test_fleet.py",                        # 100
    "tests/test_replay.py",                       # 100
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of ``LONGEST_FIRST`` first, in its order; the rest after them as collected (each file's tests
    stay together and in their order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        try:
            return rank.get(item.path.relative_to(config.rootpath).as_posix(), len(rank))
        except ValueError:
            return len(rank)
    items.sort(key=key)


def isolate(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Keep the user's ~/.ssh and LLM keys out, runs out of the repository, and the host lock of `--host local`
    (one for every account of this machine) out of /run/lock: all of them under ``folder``."""
    monkeypatch.setenv("HOME", str(folder / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(folder / "state"))
    monkeypatch.setenv("DEBUGAGENT_LOCK_DIR", str(folder / "lock"))   # the host lock of `--host local`: per test
    (folder / "home").mkdir(exist_ok=True)
    for k in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "SSH_AUTH_SOCK"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """Every test isolated in its own folder (``isolate``)."""
    isolate(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def module_isolated(tmp_path_factory):
    """The same isolation for a module-scoped fixture, which pytest sets up before any test's own ``_isolated``:
    a run made there, read by several tests, keeps out of the user's home, state and /run/lock too. Yields the
    module's folder."""
    folder = tmp_path_factory.mktemp("module")
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, folder)
        yield folder


@pytest.fixture(scope="module")
def fault_hosts(module_isolated):
    """The fault tests' served hosts (tests/faults.py ``Hosts``): one per scenario for the module, stopped after it."""
    from tests.faults import Hosts
    hosts = Hosts()
    try:
        yield hosts
    finally:
        hosts.close()
