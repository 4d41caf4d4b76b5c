"""`lifecycle check`: exit codes, the table, readable shortest counterexamples, JSON, filters."""

from __future__ import annotations

import json

from lifecycle.cli import main
from lifecycle.explore import explore, lattice
from lifecycle.job import EngineView, Product
from lifecycle.mutants import MUTANTS
from lifecycle.presets import preset

ONE = ["--rollout-num-gpus", "2", "--jobs", "1"]


def test_single_config_passes_and_prints_the_table(capsys):
    assert main(["check", "--use-fault-tolerance", "--ft-components", "train", *ONE]) == 0
    out = capsys.readouterr().out
    assert "states" in out and "transitions" in out
    assert "OK: every invariant holds" in out
    assert "--ft-components train" in out


def test_a_mutant_fails_with_a_numbered_counterexample_naming_the_invariant(capsys):
    assert main(["check", "--mutant", "lock_kept_on_failed_update", *ONE]) == 1
    out = capsys.readouterr().out
    assert "config: --rollout-num-gpus 2" in out
    assert "  1. rollout.init" in out
    assert "the weight update fails" in out
    assert "✗ invariant engine_lock_held_only_while_updating" in out


def test_json_output_carries_the_violation_steps(capsys):
    assert main(["check", "--mutant", "stopped_before_death_confirmed", "--json", *ONE]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    violation = data["violations"][0]
    assert violation["invariant"] == "stopped_only_after_death_confirmed"
    assert violation["steps"][-1]["label"].startswith("an operator stops engine-")


def test_bad_filters_are_clear_errors(capsys):
    assert main(["check", "--invariant", "bogus", *ONE]) == 2
    assert "--invariant" in capsys.readouterr().err
    assert main(["check", "--mutant", "nope", *ONE]) == 2
    assert main(["check", "--engines", "9", *ONE]) == 2


def test_counterexamples_are_shortest():
    """Stopping an engine needs init, start_servers, two readies, servers_ready, then the stop: 6 steps."""
    result = explore(preset("no-ft"), machines=MUTANTS["stopped_before_death_confirmed"].machines())
    assert [len(v.path) for v in result.violations] == [6]


def test_lattice_counts_and_groups():
    lat = lattice()
    assert len(lat.valid) + len(lat.invalid) == 2 * 4 * 4 * 2 * 2 * 2
    from lifecycle.predicates import vector

    for vec, configs in lat.groups.items():
        assert all(vector(c) == vec for c in configs)


def test_identical_engines_share_one_key():
    a, b = EngineView("Serving", True), EngineView("Unhealthy")
    one = Product("Ready", "Ready", "Init", "Init", (a, b))
    other = Product("Ready", "Ready", "Init", "Init", (b, a))
    assert one.key() == other.key()
