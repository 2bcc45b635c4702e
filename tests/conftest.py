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
