"""Pins every lifecycle predicate's truth value against the miles semantics.

The expected values below are written out by hand from the design brief, not computed with the
predicates under test:

* FT components default to ``{rollout}`` when FT is on and none are given, and are empty when FT
  is off (a warning if given anyway).
* ``rollout_ft`` = FT on and ``rollout`` among the components; ``train_ft`` likewise for ``train``.
* Replay (``--load-debug-rollout-data``) forces train-only and never constructs the rollout
  function; plain train-only still constructs it (it is the data producer).
* Train-only (and so replay) starts no servers. Monitors exist only with servers and rollout FT;
  CI fault injection needs ``--ci-test`` and monitors.
* The trainer recovers rollout engines only under rollout FT, when it trains and servers exist.
* A trainer worker is healed only under train FT and when there is a trainer (not rollout-only).
"""

from __future__ import annotations

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.predicates import PREDICATES, lookup

MODES = ("normal", "train-only", "rollout-only", "replay")

COLUMNS = (
    "rollout_ft",
    "train_ft",
    "replay",
    "train_only",
    "rollout_only",
    "constructs_rollout_fn",
    "starts_servers",
    "monitors_rollout",
    "ci_injects_rollout_faults",
    "trainer_recovers_rollout",
    "heals_trainer",
)

# Columns: rollout_ft train_ft replay train_only rollout_only constructs_rollout_fn starts_servers
#          monitors_rollout ci_injects_rollout_faults trainer_recovers_rollout heals_trainer
# fmt: off
TABLE = [
    # FT    ft_components          mode             ci_test  expected
    (False, None,                  "normal",        False, "0 0 0 0 0 1 1 0 0 0 0"),
    (False, None,                  "normal",        True,  "0 0 0 0 0 1 1 0 0 0 0"),
    (False, None,                  "train-only",    False, "0 0 0 1 0 1 0 0 0 0 0"),
    (False, None,                  "train-only",    True,  "0 0 0 1 0 1 0 0 0 0 0"),
    (False, None,                  "rollout-only",  False, "0 0 0 0 1 1 1 0 0 0 0"),
    (False, None,                  "rollout-only",  True,  "0 0 0 0 1 1 1 0 0 0 0"),
    (False, None,                  "replay",        False, "0 0 1 1 0 0 0 0 0 0 0"),
    (False, None,                  "replay",        True,  "0 0 1 1 0 0 0 0 0 0 0"),
    (False, ["train"],             "normal",        False, "0 0 0 0 0 1 1 0 0 0 0"),
    (False, ["train"],             "normal",        True,  "0 0 0 0 0 1 1 0 0 0 0"),
    (False, ["train"],             "train-only",    False, "0 0 0 1 0 1 0 0 0 0 0"),
    (False, ["train"],             "train-only",    True,  "0 0 0 1 0 1 0 0 0 0 0"),
    (False, ["train"],             "rollout-only",  False, "0 0 0 0 1 1 1 0 0 0 0"),
    (False, ["train"],             "rollout-only",  True,  "0 0 0 0 1 1 1 0 0 0 0"),
    (False, ["train"],             "replay",        False, "0 0 1 1 0 0 0 0 0 0 0"),
    (False, ["train"],             "replay",        True,  "0 0 1 1 0 0 0 0 0 0 0"),
    (False, ["rollout"],           "normal",        False, "0 0 0 0 0 1 1 0 0 0 0"),
    (False, ["rollout"],           "normal",        True,  "0 0 0 0 0 1 1 0 0 0 0"),
    (False, ["rollout"],           "train-only",    False, "0 0 0 1 0 1 0 0 0 0 0"),
    (False, ["rollout"],           "train-only",    True,  "0 0 0 1 0 1 0 0 0 0 0"),
    (False, ["rollout"],           "rollout-only",  False, "0 0 0 0 1 1 1 0 0 0 0"),
    (False, ["rollout"],           "rollout-only",  True,  "0 0 0 0 1 1 1 0 0 0 0"),
    (False, ["rollout"],           "replay",        False, "0 0 1 1 0 0 0 0 0 0 0"),
    (False, ["rollout"],           "replay",        True,  "0 0 1 1 0 0 0 0 0 0 0"),
    (False, ["train", "rollout"],  "normal",        False, "0 0 0 0 0 1 1 0 0 0 0"),
    (False, ["train", "rollout"],  "normal",        True,  "0 0 0 0 0 1 1 0 0 0 0"),
    (False, ["train", "rollout"],  "train-only",    False, "0 0 0 1 0 1 0 0 0 0 0"),
    (False, ["train", "rollout"],  "train-only",    True,  "0 0 0 1 0 1 0 0 0 0 0"),
    (False, ["train", "rollout"],  "rollout-only",  False, "0 0 0 0 1 1 1 0 0 0 0"),
    (False, ["train", "rollout"],  "rollout-only",  True,  "0 0 0 0 1 1 1 0 0 0 0"),
    (False, ["train", "rollout"],  "replay",        False, "0 0 1 1 0 0 0 0 0 0 0"),
    (False, ["train", "rollout"],  "replay",        True,  "0 0 1 1 0 0 0 0 0 0 0"),
    (True,  None,                  "normal",        False, "1 0 0 0 0 1 1 1 0 1 0"),
    (True,  None,                  "normal",        True,  "1 0 0 0 0 1 1 1 1 1 0"),
    (True,  None,                  "train-only",    False, "1 0 0 1 0 1 0 0 0 0 0"),
    (True,  None,                  "train-only",    True,  "1 0 0 1 0 1 0 0 0 0 0"),
    (True,  None,                  "rollout-only",  False, "1 0 0 0 1 1 1 1 0 0 0"),
    (True,  None,                  "rollout-only",  True,  "1 0 0 0 1 1 1 1 1 0 0"),
    (True,  None,                  "replay",        False, "1 0 1 1 0 0 0 0 0 0 0"),
    (True,  None,                  "replay",        True,  "1 0 1 1 0 0 0 0 0 0 0"),
    (True,  ["train"],             "normal",        False, "0 1 0 0 0 1 1 0 0 0 1"),
    (True,  ["train"],             "normal",        True,  "0 1 0 0 0 1 1 0 0 0 1"),
    (True,  ["train"],             "train-only",    False, "0 1 0 1 0 1 0 0 0 0 1"),
    (True,  ["train"],             "train-only",    True,  "0 1 0 1 0 1 0 0 0 0 1"),
    (True,  ["train"],             "rollout-only",  False, "0 1 0 0 1 1 1 0 0 0 0"),
    (True,  ["train"],             "rollout-only",  True,  "0 1 0 0 1 1 1 0 0 0 0"),
    (True,  ["train"],             "replay",        False, "0 1 1 1 0 0 0 0 0 0 1"),
    (True,  ["train"],             "replay",        True,  "0 1 1 1 0 0 0 0 0 0 1"),
    (True,  ["rollout"],           "normal",        False, "1 0 0 0 0 1 1 1 0 1 0"),
    (True,  ["rollout"],           "normal",        True,  "1 0 0 0 0 1 1 1 1 1 0"),
    (True,  ["rollout"],           "train-only",    False, "1 0 0 1 0 1 0 0 0 0 0"),
    (True,  ["rollout"],           "train-only",    True,  "1 0 0 1 0 1 0 0 0 0 0"),
    (True,  ["rollout"],           "rollout-only",  False, "1 0 0 0 1 1 1 1 0 0 0"),
    (True,  ["rollout"],           "rollout-only",  True,  "1 0 0 0 1 1 1 1 1 0 0"),
    (True,  ["rollout"],           "replay",        False, "1 0 1 1 0 0 0 0 0 0 0"),
    (True,  ["rollout"],           "replay",        True,  "1 0 1 1 0 0 0 0 0 0 0"),
    (True,  ["train", "rollout"],  "normal",        False, "1 1 0 0 0 1 1 1 0 1 1"),
    (True,  ["train", "rollout"],  "normal",        True,  "1 1 0 0 0 1 1 1 1 1 1"),
    (True,  ["train", "rollout"],  "train-only",    False, "1 1 0 1 0 1 0 0 0 0 1"),
    (True,  ["train", "rollout"],  "train-only",    True,  "1 1 0 1 0 1 0 0 0 0 1"),
    (True,  ["train", "rollout"],  "rollout-only",  False, "1 1 0 0 1 1 1 1 0 0 0"),
    (True,  ["train", "rollout"],  "rollout-only",  True,  "1 1 0 0 1 1 1 1 1 0 0"),
    (True,  ["train", "rollout"],  "replay",        False, "1 1 1 1 0 0 0 0 0 0 1"),
    (True,  ["train", "rollout"],  "replay",        True,  "1 1 1 1 0 0 0 0 0 0 1"),
]
# fmt: on


def build(ft: bool, components: list[str] | None, mode: str, ci: bool, **extra: object) -> LifecycleConfig:
    """The config of one table row (servers get 2 GPUs; replay and train-only leave them unset, as miles does)."""
    values: dict[str, object] = {"use_fault_tolerance": ft, "ft_components": components, "ci_test": ci, **extra}
    if mode in ("normal", "rollout-only"):
        values["rollout_num_gpus"] = 2
    if mode == "train-only":
        values["debug_train_only"] = True
    elif mode == "rollout-only":
        values["debug_rollout_only"] = True
    elif mode == "replay":
        values["load_debug_rollout_data"] = "x/{rollout_id}.json"
    return LifecycleConfig.from_mapping(values, check_paths=False)


def test_table_covers_every_combination() -> None:
    keys = [(ft, tuple(c) if c else c, mode, ci) for ft, c, mode, ci, _ in TABLE]
    assert len(keys) == len(set(keys)) == 2 * 4 * len(MODES) * 2
    assert all(len(bits.split()) == len(COLUMNS) for *_, bits in TABLE)
    assert set(COLUMNS) <= set(PREDICATES)


@pytest.mark.parametrize(
    ("ft", "components", "mode", "ci", "bits"),
    TABLE,
    ids=[f"ft={ft}-{'+'.join(c) if c else 'none'}-{mode}-ci={ci}" for ft, c, mode, ci, _ in TABLE],
)
def test_predicate_table(ft: bool, components: list[str] | None, mode: str, ci: bool, bits: str) -> None:
    config = build(ft, components, mode, ci)
    assert config.mode == mode
    expected = {name: bit == "1" for name, bit in zip(COLUMNS, bits.split(), strict=True)}
    actual = {name: PREDICATES[name](config) for name in COLUMNS}
    assert actual == expected
    # The resolved components themselves (the input of rollout_ft / train_ft).
    if not ft:
        assert config.ft_components == frozenset()
    else:
        assert config.ft_components == frozenset(components or ["rollout"])


@pytest.mark.parametrize("components", [["train"], ["rollout"], ["train", "rollout"]])
def test_components_without_ft_warn(components: list[str]) -> None:
    config = build(False, components, "normal", False)
    assert config.ft_components == frozenset()
    assert any("--use-fault-tolerance" in w for w in config.warnings)


# eval_num_gpus=2: the fleet exists only where servers start, and self-probes exactly when rollout FT
# is off (then no monitor probes its engines). Rows: (FT, ft_components) -> rollout FT is on?
FT_SETTINGS = [
    (False, None, False),
    (False, ["rollout"], False),
    (True, None, True),
    (True, ["train"], False),
    (True, ["rollout"], True),
    (True, ["train", "rollout"], True),
]
# mode -> the fleet exists?
FLEET_BY_MODE = {"normal": True, "rollout-only": True, "train-only": False, "replay": False}


@pytest.mark.parametrize(("ft", "components", "rollout_ft_on"), FT_SETTINGS)
@pytest.mark.parametrize("mode", MODES)
def test_eval_fleet_predicates(ft: bool, components: list[str] | None, rollout_ft_on: bool, mode: str) -> None:
    config = build(ft, components, mode, False, eval_num_gpus=2)
    enabled = FLEET_BY_MODE[mode]
    assert PREDICATES["rollout_ft"](config) is rollout_ft_on
    assert PREDICATES["eval_fleet_enabled"](config) is enabled
    assert PREDICATES["eval_fleet_self_probes"](config) is (enabled and not rollout_ft_on)
    # Never both: a fleet engine is probed by a monitor or by the fleet itself, never twice.
    assert not (PREDICATES["eval_fleet_self_probes"](config) and PREDICATES["monitors_rollout"](config))


@pytest.mark.parametrize("mode", MODES)
def test_no_eval_fleet_without_eval_gpus(mode: str) -> None:
    config = build(True, ["train"], mode, False)
    assert PREDICATES["eval_fleet_enabled"](config) is False
    assert PREDICATES["eval_fleet_self_probes"](config) is False


@pytest.mark.lifecycle_gate
def test_train_only_ft_leaves_rollout_side_identical_to_no_ft() -> None:
    """The miles regression: FT components {train} must not change any rollout-side predicate."""
    rollout_side = (
        "rollout_ft",
        "monitors_rollout",
        "ci_injects_rollout_faults",
        "trainer_recovers_rollout",
        "eval_fleet_self_probes",
        "eval_fleet_enabled",
        "starts_servers",
        "constructs_rollout_fn",
    )
    for mode in MODES:
        base = build(False, None, mode, True, eval_num_gpus=2)
        train_ft = build(True, ["train"], mode, True, eval_num_gpus=2)
        assert {n: PREDICATES[n](base) for n in rollout_side} == {n: PREDICATES[n](train_ft) for n in rollout_side}


@pytest.mark.parametrize("name", sorted(PREDICATES))
def test_every_predicate_is_documented(name: str) -> None:
    predicate = PREDICATES[name]
    assert predicate.name == name
    assert isinstance(predicate.doc, str)
    assert predicate.doc.strip()
    assert lookup(name) is predicate


def test_lookup_unknown_predicate_lists_known_ones() -> None:
    with pytest.raises(KeyError, match="rollout_ft"):
        lookup("rolout_ft")


# -- capabilities: they decide which configs are valid, never what a valid config's machines do ------------
def _read_by_machines() -> set[str]:
    """Every predicate a machine guard, a conditional effect or a core operation reads."""
    from lifecycle.decide.core.plan import OPERATIONS
    from lifecycle.decide.machines import MACHINES

    names = {name for spec in MACHINES.values() for name in spec.guard_names()}
    return names | {op.when for op in OPERATIONS.values() if op.when is not None}


def capability_guards(read: set[str]) -> set[str]:
    return {name for name in read if PREDICATES[name].capability}


def test_no_machine_reads_a_capability() -> None:
    """So the checker may explore configs that differ only in a backend's abilities once (``behaviour``)."""
    read = _read_by_machines()
    assert read and "offloads_rollout" in read
    assert capability_guards(read) == set()
    assert capability_guards(read | {"releases_rollout_memory"}) == {"releases_rollout_memory"}


def test_capabilities_are_predicates_left_out_of_the_behaviour_vector() -> None:
    from lifecycle.decide.predicates import behaviour, vector

    caps = [name for name, p in PREDICATES.items() if p.capability]
    assert caps == ["releases_rollout_memory", "rollout_backend_broadcasts"]
    sglang = LifecycleConfig(rollout_num_gpus=2)
    vllm = LifecycleConfig(rollout_num_gpus=2, rollout_backend="vllm")
    assert vector(sglang) != vector(vllm)  # the graphs and `lifecycle explain` show the abilities
    assert behaviour(sglang) == behaviour(vllm)  # the machines cannot tell them apart
    assert len(behaviour(sglang)) == len(PREDICATES) - len(caps)
