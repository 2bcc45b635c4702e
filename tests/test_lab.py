"""The experiment kinds: one class each, and what the registry builds from them."""

from __future__ import annotations

import typing

from debugagent.agent.lab import KINDS, Experiment, Kind, kind_of
from debugagent.agent.lab.spec import ExperimentSpec, RestoreSpec
from debugagent.agent.playbook import Playbook

BEFORE = {"code_revert", "server_restart", "restore_baseline_flags", "restore_baseline_env", "power_limit", "governor",
          "package_restore"}


def test_each_kind_declares_its_model_and_the_union_is_built_from_them():
    """Every kind names its spec model by its `kind`; the playbook's experiment is the union of those models."""
    union = typing.get_args(typing.get_args(Experiment)[0])
    assert [m.model_fields["kind"].annotation for m in union] == [typing.Literal[k] for k in KINDS]
    for name, k in KINDS.items():
        assert issubclass(k, Kind) and issubclass(k.spec, ExperimentSpec) and k.name() == name
    tags = Playbook.model_json_schema()["$defs"]["Rule"]["properties"]["experiment"]["anyOf"][0]["discriminator"]["mapping"]
    assert set(tags) == set(KINDS)


def test_what_each_kind_declares_matches_what_the_run_did_before():
    """Restarts, re-measuring the reference before the change, and putting baseline changes back (the kinds the
    run had before they were classes; a new kind says its own)."""
    old = {k: c for k, c in KINDS.items() if k in BEFORE}
    assert set(old) == BEFORE
    assert {k for k, c in old.items() if c.restarts} == {"code_revert", "server_restart", "restore_baseline_flags",
                                                         "restore_baseline_env", "package_restore"}
    assert {k for k, c in old.items() if c.fresh} == {"power_limit", "governor", "package_restore"}
    assert {k: c.spec.area for k, c in old.items() if issubclass(c.spec, RestoreSpec)} == {
        "restore_baseline_flags": "server.args.*", "restore_baseline_env": "server.env.*", "package_restore": "packages.*"}
    assert kind_of({"kind": "governor"}) is KINDS["governor"] and kind_of({"kind": "nope"}) is None and kind_of(None) is None
