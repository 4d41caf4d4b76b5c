"""``LifecycleConfig``: validation table, miles resolution rules, builders, round trips, fuzz."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lifecycle.decide.config import (
    FLAG_BY_NAME,
    FLAGS,
    ConfigWarning,
    LifecycleConfig,
    add_lifecycle_arguments,
    load_config_file,
)
from lifecycle.decide.errors import ConfigError, UsageError

# Servers start in normal and rollout-only mode, so most rows need a GPU count to get past that check.
GPUS = {"rollout_num_gpus": 2}
NAN = float("nan")
INF = float("inf")
_UNSET = object()


# --------------------------------------------------------------------------------------------------
# The table of bad inputs
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bad:
    """One invalid input and the ConfigError it must produce."""

    id: str
    flag: str  # ConfigError.flag
    problem: str  # substring of str(exc)
    mapping: dict[str, Any] | None = None  # -> from_mapping(..., check_paths=False)
    argv: list[str] | None = None  # -> from_args(...)
    file: tuple[str, str] | None = None  # (name, text) -> from_file(tmp_path / name)
    replay: str | None = None  # path under tmp_path -> from_mapping(..., check_paths=True)
    value: Any = _UNSET  # the offending value (exc.value); its repr must appear in the message
    extra: tuple[str, ...] = field(default=())  # more substrings of str(exc)


BAD: list[Bad] = [
    # -- FT components -------------------------------------------------------------------------
    Bad(
        "unknown-component",
        "--ft-components",
        "unknown component 'inference'",
        {**GPUS, "use_fault_tolerance": True, "ft_components": ["inference"]},
        value=["inference"],
        extra=("train, rollout",),
    ),
    Bad(
        "typo-component-did-you-mean",
        "--ft-components",
        "unknown component 'rolout'",
        {**GPUS, "use_fault_tolerance": True, "ft_components": ["train", "rolout"]},
        value=["train", "rolout"],
        extra=("did you mean 'rollout'?",),
    ),
    Bad(
        "none-element",
        "--ft-components",
        "contains None",
        {**GPUS, "use_fault_tolerance": True, "ft_components": ["rollout", None]},
        value=["rollout", None],
    ),
    Bad(
        "duplicate-component",
        "--ft-components",
        "'rollout' is listed twice",
        {**GPUS, "use_fault_tolerance": True, "ft_components": ["rollout", "rollout"]},
        value=["rollout", "rollout"],
    ),
    Bad(
        "int-component",
        "--ft-components",
        "contains a int",
        {**GPUS, "use_fault_tolerance": True, "ft_components": [1]},
        value=[1],
    ),
    Bad(
        "empty-string-component",
        "--ft-components",
        "no component is listed",
        {**GPUS, "use_fault_tolerance": True, "ft_components": ""},
        value="",
    ),
    Bad(
        "components-not-a-list",
        "--ft-components",
        "expected a list of components",
        {**GPUS, "use_fault_tolerance": True, "ft_components": 5},
        value=5,
    ),
    Bad(
        "components-a-mapping",
        "--ft-components",
        "expected a list of components",
        {**GPUS, "use_fault_tolerance": True, "ft_components": {"rollout": True}},
        value={"rollout": True},
    ),
    Bad(
        "components-bad-even-without-ft",
        "--ft-components",
        "unknown component 'trian'",
        {**GPUS, "ft_components": ["trian"]},
        extra=("did you mean 'train'?",),
    ),
    Bad(
        "argv-unknown-component",
        "--ft-components",
        "unknown component 'bogus'",
        argv=["--rollout-num-gpus", "2", "--use-fault-tolerance", "--ft-components", "train", "bogus"],
        value=["train", "bogus"],
    ),
    # -- modes ---------------------------------------------------------------------------------
    Bad(
        "both-debug-modes",
        "--debug-rollout-only",
        "exclude each other",
        {**GPUS, "debug_train_only": True, "debug_rollout_only": True},
        value=True,
    ),
    Bad(
        "argv-both-debug-modes",
        "--debug-rollout-only",
        "exclude each other",
        argv=["--debug-train-only", "--debug-rollout-only"],
    ),
    Bad(
        "replay-and-rollout-only",
        "--load-debug-rollout-data",
        "--debug-rollout-only disables training",
        {**GPUS, "load_debug_rollout_data": "d/{rollout_id}.json", "debug_rollout_only": True},
        value="d/{rollout_id}.json",
    ),
    Bad(
        "replay-and-save",
        "--save-debug-rollout-data",
        "nothing to save",
        {"load_debug_rollout_data": "d/{rollout_id}.json", "save_debug_rollout_data": "e/{rollout_id}.json"},
        value="e/{rollout_id}.json",
    ),
    # -- path templates ------------------------------------------------------------------------
    Bad(
        "load-template-without-rollout-id",
        "--load-debug-rollout-data",
        "3 rollouts would share one file",
        {"load_debug_rollout_data": "d/rollouts.json", "num_rollout": 3},
        value="d/rollouts.json",
        extra=("{rollout_id}",),
    ),
    Bad(
        "save-template-without-rollout-id",
        "--save-debug-rollout-data",
        "2 rollouts would share one file",
        {**GPUS, "save_debug_rollout_data": "d/rollouts.json", "num_rollout": 2},
        value="d/rollouts.json",
    ),
    Bad(
        "escaped-braces-are-not-a-placeholder",
        "--save-debug-rollout-data",
        "4 rollouts would share one file",
        {**GPUS, "save_debug_rollout_data": "d/{{rollout_id}}.json", "num_rollout": 4},
        value="d/{{rollout_id}}.json",
    ),
    Bad(
        "template-unknown-field",
        "--load-debug-rollout-data",
        "malformed",
        {"load_debug_rollout_data": "d/{foo}.json"},
        value="d/{foo}.json",
        extra=("KeyError",),
    ),
    Bad(
        "template-unclosed-brace",
        "--save-debug-rollout-data",
        "malformed",
        {**GPUS, "save_debug_rollout_data": "d/{"},
        value="d/{",
    ),
    Bad(
        "template-positional-field",
        "--load-debug-rollout-data",
        "malformed",
        {"load_debug_rollout_data": "d/{}.json"},
        value="d/{}.json",
    ),
    Bad(
        "template-attribute-access",
        "--load-debug-rollout-data",
        "malformed",
        {"load_debug_rollout_data": "d/{rollout_id.x}.json"},
        value="d/{rollout_id.x}.json",
    ),
    Bad(
        "template-index-access",
        "--save-debug-rollout-data",
        "malformed",
        {**GPUS, "save_debug_rollout_data": "d/{rollout_id[0]}.json"},
        value="d/{rollout_id[0]}.json",
    ),
    Bad(
        "path-not-a-string",
        "--save-debug-rollout-data",
        "expected a path, got int",
        {**GPUS, "save_debug_rollout_data": 5},
        value=5,
    ),
    Bad(
        "path-empty",
        "--load-debug-rollout-data",
        "the path is empty",
        {"load_debug_rollout_data": "  "},
        value="  ",
    ),
    # -- health check timing -------------------------------------------------------------------
    Bad(
        "interval-zero",
        "--rollout-health-check-interval",
        "greater than 0",
        {**GPUS, "rollout_health_check_interval": 0, "rollout_health_check_timeout": 0.0},
        value=0.0,
    ),
    Bad(
        "interval-negative",
        "--rollout-health-check-interval",
        "greater than 0",
        {**GPUS, "rollout_health_check_interval": -5.0},
        value=-5.0,
    ),
    Bad(
        "interval-nan",
        "--rollout-health-check-interval",
        "finite",
        {**GPUS, "rollout_health_check_interval": NAN},
        value=NAN,
    ),
    Bad(
        "interval-none",
        "--rollout-health-check-interval",
        "not None",
        {**GPUS, "rollout_health_check_interval": None},
        value=None,
    ),
    Bad(
        "interval-too-large-int",
        "--rollout-health-check-interval",
        "too large",
        {**GPUS, "rollout_health_check_interval": 10**400},
    ),
    Bad(
        "argv-interval-negative",
        "--rollout-health-check-interval",
        "greater than 0",
        argv=["--rollout-num-gpus", "2", "--rollout-health-check-interval", "-5"],
        value=-5.0,
    ),
    Bad(
        "timeout-zero",
        "--rollout-health-check-timeout",
        "greater than 0",
        {**GPUS, "rollout_health_check_timeout": 0},
        value=0.0,
    ),
    Bad(
        "timeout-inf",
        "--rollout-health-check-timeout",
        "finite",
        {**GPUS, "rollout_health_check_timeout": INF},
        value=INF,
    ),
    Bad(
        "timeout-string-inf",
        "--rollout-health-check-timeout",
        "finite",
        {**GPUS, "rollout_health_check_timeout": "inf"},
        value=INF,
    ),
    Bad(
        "timeout-longer-than-interval",
        "--rollout-health-check-timeout",
        "longer than --rollout-health-check-interval 30.0",
        {**GPUS, "rollout_health_check_timeout": 60},
        value=60.0,
    ),
    Bad(
        "first-wait-negative",
        "--rollout-health-check-first-wait",
        "must not be negative",
        {**GPUS, "rollout_health_check_first_wait": -1},
        value=-1.0,
    ),
    Bad(
        "jitter-one",
        "--rollout-health-check-jitter",
        "[0, 1)",
        {**GPUS, "rollout_health_check_jitter": 1.0},
        value=1.0,
    ),
    Bad(
        "jitter-negative",
        "--rollout-health-check-jitter",
        "[0, 1)",
        {**GPUS, "rollout_health_check_jitter": -0.1},
        value=-0.1,
    ),
    Bad(
        "failure-threshold-zero",
        "--rollout-health-check-failure-threshold",
        "greater than 0",
        {**GPUS, "rollout_health_check_failure_threshold": 0},
        value=0,
    ),
    # -- restart budget ------------------------------------------------------------------------
    Bad(
        "max-restarts-negative",
        "--engine-max-restarts",
        "must not be negative",
        {**GPUS, "engine_max_restarts": -1},
        value=-1,
    ),
    Bad(
        "backoff-above-max",
        "--engine-restart-backoff",
        "greater than --engine-restart-backoff-max 5.0",
        {**GPUS, "engine_restart_backoff": 10, "engine_restart_backoff_max": 5},
        value=10.0,
    ),
    Bad(
        "restart-window-zero",
        "--engine-restart-window",
        "greater than 0",
        {**GPUS, "engine_restart_window": 0},
        value=0.0,
    ),
    Bad(
        "restart-window-list",
        "--engine-restart-window",
        "expected a number, got list",
        {**GPUS, "engine_restart_window": [600]},
        value=[600],
    ),
    # -- GPUs ----------------------------------------------------------------------------------
    Bad(
        "rollout-gpus-missing",
        "--rollout-num-gpus",
        "no GPU count was given",
        {"use_fault_tolerance": True},
        value=None,
        extra=("--debug-train-only",),
    ),
    Bad(
        "rollout-gpus-missing-rollout-only",
        "--rollout-num-gpus",
        "no GPU count was given",
        {"debug_rollout_only": True},
        value=None,
    ),
    Bad(
        "argv-rollout-gpus-missing",
        "--rollout-num-gpus",
        "no GPU count was given",
        argv=[],
        value=None,
    ),
    Bad("rollout-gpus-zero", "--rollout-num-gpus", "greater than 0", {"rollout_num_gpus": 0}, value=0),
    Bad(
        "rollout-gpus-not-divisible",
        "--rollout-num-gpus",
        "not divisible by --rollout-num-gpus-per-engine 2",
        {"rollout_num_gpus": 3, "rollout_num_gpus_per_engine": 2},
        value=3,
    ),
    Bad(
        "gpus-per-engine-zero",
        "--rollout-num-gpus-per-engine",
        "greater than 0",
        {"rollout_num_gpus": 2, "rollout_num_gpus_per_engine": 0},
        value=0,
    ),
    Bad(
        "eval-gpus-not-divisible",
        "--eval-num-gpus",
        "not divisible by --eval-num-gpus-per-engine 2",
        {**GPUS, "eval_num_gpus": 3, "eval_num_gpus_per_engine": 2},
        value=3,
    ),
    Bad("eval-gpus-negative", "--eval-num-gpus", "must not be negative", {**GPUS, "eval_num_gpus": -2}, value=-2),
    Bad("num-rollout-zero", "--num-rollout", "greater than 0", {**GPUS, "num_rollout": 0}, value=0),
    Bad(
        "transfer-mode-unknown",
        "--update-weight-transfer-mode",
        "not one of disk, broadcast",
        {**GPUS, "update_weight_transfer_mode": "nccl"},
        value="nccl",
    ),
    Bad(
        "weight-timeout-zero",
        "--update-weight-timeout",
        "greater than 0",
        {**GPUS, "update_weight_timeout": 0},
        value=0.0,
    ),
    Bad("eval-interval-zero", "--eval-interval", "greater than 0", {**GPUS, "eval_interval": 0}, value=0),
    Bad("eval-interval-negative", "--eval-interval", "greater than 0", {**GPUS, "eval_interval": -3}, value=-3),
    Bad("eval-interval-fraction", "--eval-interval", "whole number", {**GPUS, "eval_interval": 2.5}, value=2.5),
    Bad("eval-interval-bool", "--eval-interval", "got a boolean", {**GPUS, "eval_interval": True}, value=True),
    Bad(
        "argv-eval-interval-word",
        "--eval-interval",
        "not a number",
        argv=["--rollout-num-gpus", "2", "--eval-interval", "often"],
        value="often",
    ),
    Bad(
        "argv-eval-interval-zero",
        "--eval-interval",
        "greater than 0",
        argv=["--rollout-num-gpus", "2", "--eval-interval", "0"],
        value=0,
    ),
    # -- types ---------------------------------------------------------------------------------
    Bad("bool-for-number", "--rollout-num-gpus", "got a boolean", {"rollout_num_gpus": True}, value=True),
    Bad(
        "string-for-number",
        "--rollout-health-check-interval",
        "not a number",
        {**GPUS, "rollout_health_check_interval": "abc"},
        value="abc",
    ),
    Bad(
        "argv-string-for-number",
        "--rollout-num-gpus",
        "not a number",
        argv=["--rollout-num-gpus", "abc"],
        value="abc",
    ),
    Bad(
        "fraction-for-int",
        "--rollout-num-gpus-per-engine",
        "whole number",
        {**GPUS, "rollout_num_gpus_per_engine": 2.5},
        value=2.5,
    ),
    Bad(
        "argv-fraction-for-int",
        "--rollout-num-gpus",
        "whole number",
        argv=["--rollout-num-gpus", "2.5"],
        value=2.5,
    ),
    Bad("maybe-for-bool", "--ci-test", "expected true or false", {**GPUS, "ci_test": "maybe"}, value="maybe"),
    Bad(
        "maybe-for-offload-shorthand",
        "--offload",
        "expected true or false",
        {**GPUS, "offload": "maybe"},
        value="maybe",
    ),
    Bad(
        "int-for-bool",
        "--use-fault-tolerance",
        "expected true or false",
        {**GPUS, "use_fault_tolerance": 2},
        value=2,
    ),
    Bad(
        "unknown-key-did-you-mean",
        "--use-fault-tolerence",
        "unknown setting",
        {**GPUS, "use_fault_tolerence": True},
        value=True,
        extra=("did you mean --use-fault-tolerance?",),
    ),
    Bad(
        "unknown-key-hyphenated",
        "--rollout-health-check-intervall",
        "unknown setting",
        {**GPUS, "rollout-health-check-intervall": 3},
        value=3,
        extra=("did you mean --rollout-health-check-interval?",),
    ),
    # -- files ---------------------------------------------------------------------------------
    Bad("file-missing", "--config", "does not exist", file=("absent.toml", "")),
    Bad(
        "file-bad-toml",
        "--config",
        "cannot parse the file",
        file=("bad.toml", "use_fault_tolerance = \nrollout_num_gpus = 2\n"),
        extra=("bad.toml",),
    ),
    Bad("file-unknown-suffix", "--config", "unknown file type '.ini'", file=("cfg.ini", "[x]\n")),
    Bad("file-yaml-not-a-mapping", "--config", "does not hold a table", file=("list.yaml", "- a\n- b\n")),
    Bad("file-json-not-a-mapping", "--config", "does not hold a table", file=("list.json", "[1, 2]")),
    Bad("file-bad-json", "--config", "cannot parse the file", file=("broken.json", '{"a": ')),
    Bad(
        "file-bad-value-names-the-file",
        "--rollout-num-gpus",
        "greater than 0",
        file=("zero.toml", "rollout_num_gpus = 0\n"),
        value=0,
        extra=("zero.toml: --rollout-num-gpus",),
    ),
    Bad(
        "replay-file-missing",
        "--load-debug-rollout-data",
        "the replay file does not exist",
        replay="nowhere/rollouts.json",
    ),
    Bad(
        "replay-directory-missing",
        "--load-debug-rollout-data",
        "the replay directory",
        replay="nowhere/{rollout_id}.json",
    ),
]


def _raise_for(case: Bad, tmp_path: Path) -> LifecycleConfig:
    if case.mapping is not None:
        return LifecycleConfig.from_mapping(case.mapping, check_paths=False)
    if case.argv is not None:
        return LifecycleConfig.from_args(case.argv, check_paths=False)
    if case.file is not None:
        name, text = case.file
        path = tmp_path / name
        if name != "absent.toml":
            path.write_text(text, encoding="utf-8")
        return LifecycleConfig.from_file(path, check_paths=False)
    assert case.replay is not None
    return LifecycleConfig.from_mapping({"load_debug_rollout_data": str(tmp_path / case.replay)}, check_paths=True)


def test_bad_table_is_large_and_distinct() -> None:
    assert len({c.id for c in BAD}) == len(BAD)
    inputs = {repr((c.mapping, c.argv, c.file, c.replay)) for c in BAD}
    assert len(inputs) == len(BAD)
    assert len(BAD) >= 35


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_bad_input_raises_one_config_error(case: Bad, tmp_path: Path) -> None:
    with pytest.raises(Exception) as info:  # the exact type is asserted below
        _raise_for(case, tmp_path)
    exc = info.value
    assert type(exc) is ConfigError, f"{type(exc).__name__}: {exc}"
    message = str(exc)
    assert exc.flag == case.flag
    assert case.flag in message
    assert case.problem in message
    assert "Fix:" in message
    assert exc.fix and exc.fix in message
    for fragment in case.extra:
        assert fragment in message
    if case.value is not _UNSET:
        if isinstance(case.value, float) and math.isnan(case.value):
            assert isinstance(exc.value, float)
            assert math.isnan(exc.value)
        else:
            assert exc.value == case.value
            assert type(exc.value) is type(case.value)
        assert repr(case.value) in message
    if case.file is not None or case.replay is not None:
        assert str(tmp_path) in message


def test_none_as_whole_component_list_means_default() -> None:
    config = LifecycleConfig.from_mapping({**GPUS, "use_fault_tolerance": True, "ft_components": None})
    assert config.ft_components == frozenset({"rollout"})


def test_source_is_prefixed_once() -> None:
    with pytest.raises(ConfigError) as info:
        LifecycleConfig.from_mapping({"rollout_num_gpus": -1}, source="job.toml")
    assert str(info.value).startswith("job.toml: --rollout-num-gpus")
    assert info.value.source == "job.toml"


# --------------------------------------------------------------------------------------------------
# Resolution rules (miles)
# --------------------------------------------------------------------------------------------------
def test_ft_on_without_components_defaults_to_rollout() -> None:
    config = LifecycleConfig.from_mapping({**GPUS, "use_fault_tolerance": True})
    assert config.ft_components == frozenset({"rollout"})
    assert config.warnings == ()


def test_ft_on_with_explicit_components_keeps_them() -> None:
    config = LifecycleConfig.from_mapping({**GPUS, "use_fault_tolerance": True, "ft_components": ["train"]})
    assert config.ft_components == frozenset({"train"})


def test_ft_off_with_components_is_empty_and_warns() -> None:
    config = LifecycleConfig.from_mapping({**GPUS, "ft_components": ["train", "rollout"]})
    assert config.ft_components == frozenset()
    assert len(config.warnings) == 1
    assert "--use-fault-tolerance" in config.warnings[0]
    with pytest.warns(ConfigWarning, match="no effect without --use-fault-tolerance"):
        config.emit_warnings()


def test_ft_off_without_components_is_silent() -> None:
    config = LifecycleConfig.from_mapping(GPUS)
    assert config.ft_components == frozenset()
    assert config.warnings == ()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.emit_warnings()


def test_replay_forces_train_only_and_needs_no_gpus() -> None:
    config = LifecycleConfig.from_mapping({"load_debug_rollout_data": "d/{rollout_id}.json"}, check_paths=False)
    assert config.debug_train_only is True
    assert config.mode == "replay"
    assert config.rollout_num_gpus is None
    assert config.num_rollout_engines == 0
    assert config.replay_path(7) == Path("d/7.json")


def test_replay_accepts_formatted_placeholder() -> None:
    config = LifecycleConfig.from_mapping(
        {"load_debug_rollout_data": "d/{rollout_id:04d}.json", "num_rollout": 5}, check_paths=False
    )
    assert config.replay_path(3) == Path("d/0003.json")


def test_single_replay_file_is_fine_for_one_rollout() -> None:
    config = LifecycleConfig.from_mapping(
        {"load_debug_rollout_data": "d/all.json", "num_rollout": 1}, check_paths=False
    )
    assert config.replay_path(0) == Path("d/all.json")


def test_replay_paths_that_exist_pass_check(tmp_path: Path) -> None:
    (tmp_path / "one.json").write_text("[]", encoding="utf-8")
    LifecycleConfig.from_mapping({"load_debug_rollout_data": str(tmp_path / "one.json")})
    LifecycleConfig.from_mapping({"load_debug_rollout_data": str(tmp_path / "{rollout_id}.json")})


def test_train_only_needs_no_gpus() -> None:
    config = LifecycleConfig.from_mapping({"debug_train_only": True})
    assert config.mode == "train-only"
    assert config.num_rollout_engines == 0


@pytest.mark.memory
def test_offload_sets_both_flags() -> None:
    config = LifecycleConfig.from_mapping({**GPUS, "offload": True})
    assert config.offload_rollout is True
    assert config.offload_train is True
    assert "offload" not in config.to_dict()
    flags = LifecycleConfig.from_args(["--rollout-num-gpus", "2", "--offload"])
    assert (flags.offload_rollout, flags.offload_train) == (True, True)


@pytest.mark.memory
def test_offload_false_sets_nothing() -> None:
    config = LifecycleConfig.from_mapping({**GPUS, "offload": False, "offload_train": True})
    assert (config.offload_rollout, config.offload_train) == (False, True)


@pytest.mark.memory
def test_colocate_implies_both_offloads() -> None:
    config = LifecycleConfig.from_mapping({**GPUS, "colocate": True})
    assert (config.colocate, config.offload_rollout, config.offload_train) == (True, True, True)


@pytest.mark.parametrize("spelling", ["train,rollout", "train rollout", " rollout, train ", "rollout\ttrain"])
def test_component_strings(spelling: str) -> None:
    config = LifecycleConfig.from_mapping({**GPUS, "use_fault_tolerance": True, "ft_components": spelling})
    assert config.ft_components == frozenset({"train", "rollout"})


def test_component_tuple_and_set() -> None:
    for value in (("train",), {"train"}, frozenset({"train"})):
        config = LifecycleConfig.from_mapping({**GPUS, "use_fault_tolerance": True, "ft_components": value})
        assert config.ft_components == frozenset({"train"})


def test_eval_gpus_with_train_only_warns() -> None:
    config = LifecycleConfig.from_mapping({"debug_train_only": True, "eval_num_gpus": 2})
    assert any("--eval-num-gpus" in w for w in config.warnings)


def test_string_numbers_and_bools_are_converted() -> None:
    config = LifecycleConfig.from_mapping(
        {
            "rollout_num_gpus": "4",
            "rollout_num_gpus_per_engine": 2.0,
            "rollout_health_check_interval": "10",
            "rollout_health_check_timeout": 5,
            "ci_test": "yes",
            "use_fault_tolerance": "true",
        }
    )
    assert config.rollout_num_gpus == 4
    assert type(config.rollout_num_gpus) is int
    assert config.rollout_num_gpus_per_engine == 2
    assert type(config.rollout_num_gpus_per_engine) is int
    assert config.rollout_health_check_interval == 10.0
    assert type(config.rollout_health_check_interval) is float
    assert type(config.rollout_health_check_timeout) is float
    assert config.ci_test is True
    assert config.use_fault_tolerance is True
    assert config.num_rollout_engines == 2


# --------------------------------------------------------------------------------------------------
# Builders: namespace, parser, files
# --------------------------------------------------------------------------------------------------
def test_from_miles_namespace_with_unrelated_attributes() -> None:
    ns = argparse.Namespace(
        hidden_size=4096,
        num_layers=32,
        lr=1e-6,
        micro_batch_size=1,
        hf_checkpoint="/models/qwen",
        sglang_server_concurrency=512,
        use_fault_tolerance=True,
        ft_components=None,
        debug_train_only=False,
        debug_rollout_only=False,
        load_debug_rollout_data=None,
        save_debug_rollout_data=None,
        ci_test=False,
        rollout_num_gpus=8,
        rollout_num_gpus_per_engine=2,
        colocate=False,
        offload=False,
        num_rollout=100,
    )
    config = LifecycleConfig.from_namespace(ns)
    assert config.ft_components == frozenset({"rollout"})
    assert config.num_rollout_engines == 4
    assert config.num_rollout == 100
    assert config.rollout_health_check_interval == 30.0  # absent from the namespace: miles default


def test_from_namespace_of_a_replay_run_with_none_gpus() -> None:
    ns = argparse.Namespace(
        lr=3e-4, load_debug_rollout_data="saved/{rollout_id}.pt", rollout_num_gpus=None, debug_train_only=False
    )
    config = LifecycleConfig.from_namespace(ns, check_paths=False)
    assert config.mode == "replay"
    assert config.debug_train_only is True


def test_from_namespace_accepts_plain_objects() -> None:
    class Args:
        rollout_num_gpus = 2
        use_fault_tolerance = True
        ft_components = ("train",)

    assert LifecycleConfig.from_namespace(Args()).ft_components == frozenset({"train"})


def test_parser_defaults_are_miles_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_lifecycle_arguments(parser)
    ns = parser.parse_args([])
    for f in FLAGS:
        assert getattr(ns, f.name) == f.default
    config = LifecycleConfig.from_args(["--rollout-num-gpus", "2"])
    assert config.rollout_health_check_interval == 30.0
    assert config.rollout_health_check_timeout == 30.0
    assert config.rollout_health_check_first_wait == 0.0
    assert config.use_fault_tolerance is False
    assert config.ft_components == frozenset()
    assert config.mode == "normal"
    assert config.rollout_num_gpus_per_engine == 1
    assert config.eval_num_gpus == 0


def test_parser_flags_parse() -> None:
    config = LifecycleConfig.from_args(
        [
            "--use-fault-tolerance",
            "--ft-components",
            "train",
            "rollout",
            "--rollout-num-gpus",
            "4",
            "--rollout-num-gpus-per-engine",
            "2",
            "--ci-test",
            "--rollout-health-check-interval",
            "5",
            "--rollout-health-check-timeout",
            "2.5",
            "--rollout-health-check-first-wait",
            "60",
        ]
    )
    assert config.ft_components == frozenset({"train", "rollout"})
    assert config.ci_test is True
    assert config.rollout_health_check_timeout == 2.5
    assert config.rollout_health_check_first_wait == 60.0
    assert config.num_rollout_engines == 2


def test_add_arguments_keeps_users_existing_flag() -> None:
    parser = argparse.ArgumentParser()
    mine = parser.add_argument("--use-fault-tolerance", action="store_true", help="the user's own")
    parser.add_argument("--lr", type=float, default=1e-6)
    add_lifecycle_arguments(parser)  # must not raise argparse.ArgumentError (conflicting option)
    assert parser._option_string_actions["--use-fault-tolerance"] is mine
    assert "--ft-components" in parser._option_string_actions
    ns = parser.parse_args(["--use-fault-tolerance", "--rollout-num-gpus", "2", "--lr", "0.1"])
    assert ns.lr == 0.1
    config = LifecycleConfig.from_namespace(ns)
    assert config.use_fault_tolerance is True
    assert config.ft_components == frozenset({"rollout"})


def test_add_arguments_twice_is_harmless() -> None:
    parser = argparse.ArgumentParser()
    add_lifecycle_arguments(parser)
    add_lifecycle_arguments(parser)
    assert LifecycleConfig.from_namespace(parser.parse_args(["--rollout-num-gpus", "1"])).rollout_num_gpus == 1


def test_add_arguments_suppressed_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_lifecycle_arguments(parser, suppress_defaults=True)
    ns = parser.parse_args(["--ci-test"])
    assert vars(ns) == {"ci_test": True}


def test_help_renders() -> None:
    parser = argparse.ArgumentParser()
    add_lifecycle_arguments(parser)
    text = parser.format_help()
    for f in FLAGS:
        assert f.flag in text


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        'use_fault_tolerance = true\nft_components = ["train", "rollout"]\nrollout_num_gpus = 4\n'
        "rollout-health-check-interval = 10\nrollout_health_check_timeout = 5\n",
        encoding="utf-8",
    )
    config = LifecycleConfig.from_file(path)
    assert config.ft_components == frozenset({"train", "rollout"})
    assert config.rollout_num_gpus == 4
    assert config.rollout_health_check_interval == 10.0


def test_toml_lifecycle_table(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        '[model]\nname = "tiny"\n\n[lifecycle]\nuse_fault_tolerance = true\nrollout_num_gpus = 2\ncolocate = true\n',
        encoding="utf-8",
    )
    config = LifecycleConfig.from_file(str(path))
    assert config.use_fault_tolerance is True
    assert config.offload_rollout is True


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_yaml_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"job{suffix}"
    path.write_text(
        "lifecycle:\n  use_fault_tolerance: yes\n  ft_components: [train]\n  debug_train_only: true\n",
        encoding="utf-8",
    )
    config = LifecycleConfig.from_file(path)
    assert config.ft_components == frozenset({"train"})
    assert config.mode == "train-only"


def test_json_file(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"rollout_num_gpus": 2, "offload": True}), encoding="utf-8")
    config = LifecycleConfig.from_file(path)
    assert (config.offload_rollout, config.offload_train) == (True, True)


def test_empty_yaml_file_needs_gpus(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("", encoding="utf-8")
    assert load_config_file(path) == {}
    with pytest.raises(ConfigError, match="--rollout-num-gpus"):
        LifecycleConfig.from_file(path)


def test_packaged_cpu_defaults_load(tmp_path: Path) -> None:
    text = resources.files("lifecycle").joinpath("defaults/cpu.toml").read_text(encoding="utf-8")
    path = tmp_path / "cpu.toml"
    path.write_text(text, encoding="utf-8")
    config = LifecycleConfig.from_file(path)
    assert config.use_fault_tolerance is True
    assert config.ft_components == frozenset({"rollout"})


# --------------------------------------------------------------------------------------------------
# Round trips, immutability, hashing
# --------------------------------------------------------------------------------------------------
ROUND_TRIP: list[dict[str, Any]] = [
    {"rollout_num_gpus": 2},
    {"rollout_num_gpus": 4, "use_fault_tolerance": True},
    {
        "rollout_num_gpus": 4,
        "rollout_num_gpus_per_engine": 2,
        "use_fault_tolerance": True,
        "ft_components": ["train", "rollout"],
        "ci_test": True,
        "eval_num_gpus": 2,
    },
    {"rollout_num_gpus": 2, "use_fault_tolerance": True, "ft_components": ["train"]},
    {"debug_train_only": True, "use_fault_tolerance": True, "ft_components": ["train"]},
    {"load_debug_rollout_data": "runs/d/{rollout_id}.json", "num_rollout": 5},
    {"debug_rollout_only": True, "rollout_num_gpus": 8, "save_debug_rollout_data": "out/{rollout_id}.pt"},
    {"rollout_num_gpus": 2, "colocate": True},
    {"rollout_num_gpus": 2, "save_debug_rollout_data": "-dash/{rollout_id}.json"},
    {"rollout_num_gpus": 2, "offload": True},
    {"rollout_num_gpus": 2, "offload_train": True},
    {
        "rollout_num_gpus": 2,
        "rollout_health_check_interval": 2.5,
        "rollout_health_check_timeout": 0.25,
        "rollout_health_check_first_wait": 12,
        "rollout_health_check_failure_threshold": 1,
        "rollout_health_check_jitter": 0,
        "engine_max_restarts": 0,
        "engine_restart_window": 1e-3,
        "engine_restart_backoff": 0.5,
        "engine_restart_backoff_max": 0.5,
    },
]


@pytest.mark.parametrize("values", ROUND_TRIP)
def test_to_dict_round_trips(values: dict[str, Any]) -> None:
    config = LifecycleConfig.from_mapping(values, check_paths=False)
    data = config.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert LifecycleConfig.from_mapping(data, check_paths=False) == config


@pytest.mark.parametrize("values", ROUND_TRIP)
def test_to_flags_round_trips(values: dict[str, Any]) -> None:
    config = LifecycleConfig.from_mapping(values, check_paths=False)
    argv = config.to_flags()
    assert all(isinstance(a, str) for a in argv)
    assert LifecycleConfig.from_args(argv, check_paths=False) == config


def test_to_flags_is_minimal() -> None:
    assert LifecycleConfig.from_mapping({"rollout_num_gpus": 2}).to_flags() == ["--rollout-num-gpus", "2"]
    replay = LifecycleConfig.from_mapping({"load_debug_rollout_data": "d/{rollout_id}.json"}, check_paths=False)
    assert "--debug-train-only" not in replay.to_flags()


def test_eval_interval_default_none_and_parses() -> None:
    assert LifecycleConfig.from_args(["--rollout-num-gpus", "2"]).eval_interval is None
    config = LifecycleConfig.from_args(["--rollout-num-gpus", "2", "--eval-interval", "5"])
    assert config.eval_interval == 5
    assert config.to_flags() == ["--rollout-num-gpus", "2", "--eval-interval", "5"]
    assert LifecycleConfig.from_mapping({**GPUS, "eval-interval": "1"}).eval_interval == 1


def test_config_is_frozen() -> None:
    config = LifecycleConfig.from_mapping(GPUS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.use_fault_tolerance = True  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.ft_components = frozenset({"train"})  # type: ignore[misc]
    assert isinstance(config.ft_components, frozenset)


def test_config_is_hashable_and_compares_by_value() -> None:
    a = LifecycleConfig.from_mapping({**GPUS, "use_fault_tolerance": True, "ft_components": "rollout train"})
    b = LifecycleConfig.from_mapping({**GPUS, "use_fault_tolerance": True, "ft_components": ["train", "rollout"]})
    c = LifecycleConfig.from_mapping(GPUS)
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b, c}) == 2
    # Warnings are notes, not identity.
    assert LifecycleConfig.from_mapping({**GPUS, "ft_components": ["train"]}) == c


def test_replace_revalidates() -> None:
    config = LifecycleConfig.from_mapping(GPUS)
    with pytest.raises(ConfigError, match="--rollout-num-gpus"):
        dataclasses.replace(config, rollout_num_gpus=None)
    assert dataclasses.replace(config, rollout_num_gpus=4).num_rollout_engines == 4


# --------------------------------------------------------------------------------------------------
# Fuzz: ConfigError or a config, never anything else
# --------------------------------------------------------------------------------------------------
KEYS = sorted(FLAG_BY_NAME)
INTERESTING_STRINGS = st.sampled_from(
    [
        "",
        " ",
        "train",
        "rollout",
        "train,rollout",
        "rollout rollout",
        "x/{rollout_id}.json",
        "x/{rollout_id:03d}.json",
        "x.json",
        "{",
        "}",
        "{foo}",
        "{}",
        "{0}",
        "{rollout_id.real}",
        "{rollout_id.x}",
        "{rollout_id[0]}",
        "{rollout_id!z}",
        "{rollout_id:{x}}",
        "{{rollout_id}}",
        "1",
        "-1",
        "0",
        "2.5",
        "1e3",
        "nan",
        "inf",
        "true",
        "no",
        "maybe",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-3, max_value=8),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-2, max_value=100),
    st.text(max_size=12),
    INTERESTING_STRINGS,
)
VALUES = st.one_of(
    SCALARS,
    st.lists(
        st.one_of(st.sampled_from(["train", "rollout", "trian", ""]), st.none(), st.integers(), st.text()), max_size=4
    ),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.tuples(st.integers()),
)
ANY_MAPPING = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=len(KEYS))

# Mostly-valid values, so that the fuzz also reaches the cross-field checks and successful builds.
PLAUSIBLE = {
    "use_fault_tolerance": st.booleans(),
    "ft_components": st.one_of(st.none(), st.lists(st.sampled_from(["train", "rollout"]), max_size=2, unique=True)),
    "debug_train_only": st.booleans(),
    "debug_rollout_only": st.booleans(),
    "load_debug_rollout_data": st.one_of(st.none(), st.sampled_from(["r/{rollout_id}.json", "r.json", "{x}"])),
    "save_debug_rollout_data": st.one_of(st.none(), st.sampled_from(["s/{rollout_id}.json", "s.json"])),
    "save": st.one_of(st.none(), st.sampled_from(["ckpt", ""])),
    "save_interval": st.one_of(st.none(), st.integers(-1, 3)),
    "load": st.one_of(st.none(), st.sampled_from(["ckpt", ""])),
    "ci_test": st.booleans(),
    "rollout_num_gpus": st.sampled_from([None, -1, 0, 3, 2, 4, 4, 8, 8]),
    "rollout_num_gpus_per_engine": st.sampled_from([0, 1, 1, 2, 2, 3]),
    "eval_num_gpus": st.sampled_from([-1, 0, 0, 2, 3, 4]),
    "eval_num_gpus_per_engine": st.sampled_from([0, 1, 1, 2, 2]),
    "colocate": st.booleans(),
    "offload": st.booleans(),
    "offload_rollout": st.booleans(),
    "offload_train": st.booleans(),
    "rollout_health_check_interval": st.floats(-1, 60),
    "rollout_health_check_timeout": st.floats(-1, 20),
    "rollout_health_check_first_wait": st.floats(-1, 60),
    "rollout_health_check_failure_threshold": st.integers(-1, 5),
    "rollout_health_check_jitter": st.floats(-0.5, 1.5),
    "rollout_health_check_endpoint": st.sampled_from(["health_generate", "health", "/health", "helth", ""]),
    "gateway_health_check": st.booleans(),
    "detach_engines": st.booleans(),
    "engine_max_restarts": st.integers(-1, 5),
    "engine_restart_window": st.floats(-1, 1000),
    "engine_restart_backoff": st.floats(-1, 60),
    "engine_restart_backoff_max": st.floats(-1, 60),
    "num_rollout": st.one_of(st.none(), st.integers(-1, 5)),
    "update_weight_transfer_mode": st.sampled_from(["disk", "broadcast", "nccl"]),
    "rollout_backend": st.sampled_from(["sglang", "vllm", "vLLM", ""]),
    "rollout_device": st.sampled_from(["cpu", "cuda", "gpu"]),
    "update_weight_buffer_size": st.integers(-1, 1 << 20),
    "update_weight_timeout": st.one_of(st.floats(-1, 120), st.just(0.0)),
    "eval_interval": st.one_of(st.none(), st.integers(-1, 5), st.just(2.5)),
    "rollout_external_engine_addrs": st.one_of(
        st.none(),
        st.lists(st.sampled_from(["127.0.0.1:30000", "h:1", "http://h:2", "h", "h:x", "ftp://h:1", ""]), max_size=3),
        st.just("h:1,h:2"),
    ),
    "fully_async": st.booleans(),
    "max_weight_staleness": st.one_of(st.none(), st.integers(-1, 65)),
    "pause_generation_mode": st.sampled_from([None, "keep", "retract", "in_place", "abort", "wait", "freeze"]),
    "async_data_buffer_max_batches": st.one_of(st.none(), st.integers(-1, 3)),
    "rollout_min_num_gpus": st.one_of(st.none(), st.integers(-1, 5)),
    "rollout_max_num_gpus": st.one_of(st.none(), st.integers(-1, 6)),
    "rollout_drain_timeout": st.one_of(st.none(), st.floats(-1, 60)),
}
assert set(PLAUSIBLE) == set(KEYS)
PLAUSIBLE_MAPPING = st.fixed_dictionaries(
    {"rollout_num_gpus": PLAUSIBLE["rollout_num_gpus"]},
    optional={k: v for k, v in PLAUSIBLE.items() if k != "rollout_num_gpus"},
)


def _check_outcome(build: Callable[[], LifecycleConfig]) -> LifecycleConfig | None:
    try:
        config = build()
    except ConfigError as exc:
        message = str(exc)
        assert exc.flag.startswith("--")
        assert exc.flag in message
        assert "Fix:" in message
        return None
    assert isinstance(config, LifecycleConfig)
    return config


def _check_config(config: LifecycleConfig) -> None:
    from lifecycle.decide.predicates import evaluate

    hash(config)
    assert isinstance(config.ft_components, frozenset)
    assert all(isinstance(v, bool) for v in evaluate(config).values())
    assert LifecycleConfig.from_mapping(config.to_dict(), check_paths=False) == config


@given(ANY_MAPPING)
@example({"load_debug_rollout_data": "{rollout_id.x}"})
@example({"save_debug_rollout_data": "{rollout_id[0]}", "rollout_num_gpus": 1})
@example({"rollout_health_check_interval": 10**400, "rollout_num_gpus": 1})
@example({"ft_components": [None, 1, ""], "use_fault_tolerance": True})
def test_fuzz_any_mapping_is_config_or_config_error(values: dict[str, Any]) -> None:
    config = _check_outcome(lambda: LifecycleConfig.from_mapping(values, check_paths=False))
    if config is not None:
        _check_config(config)


@given(PLAUSIBLE_MAPPING)
def test_fuzz_plausible_mapping_is_config_or_config_error(values: dict[str, Any]) -> None:
    config = _check_outcome(lambda: LifecycleConfig.from_mapping(values, check_paths=False))
    if config is not None:
        _check_config(config)
        assert LifecycleConfig.from_args(config.to_flags(), check_paths=False) == config


@pytest.mark.parametrize(
    ("argv", "names"),
    [(["--no-such-flag"], "--no-such-flag"), (["--rollout-num-gpus"], "--rollout-num-gpus")],
)
def test_from_args_raises_usage_error_instead_of_exiting(argv: list[str], names: str) -> None:
    """A library call must not end the caller's process with argparse's SystemExit(2)."""
    with pytest.raises(UsageError) as info:
        LifecycleConfig.from_args(argv, check_paths=False)
    assert names in str(info.value) and "Fix:" in str(info.value)


# -- engine backends: what a backend cannot do on its device is refused before anything starts ------------
@pytest.mark.parametrize("flag", ["offload_rollout", "colocate"])
def test_vllm_on_cpu_cannot_offload(flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        LifecycleConfig(rollout_num_gpus=2, rollout_backend="vllm", **{flag: True})
    message = str(err.value)
    assert err.value.flag == f"--{flag.replace('_', '-')}"
    assert "--rollout-backend vllm on --rollout-device cpu" in message and "sleep mode" in message
    assert "--rollout-device cuda" in message  # the fix names the platform that can


def test_what_a_backend_can_do_is_allowed() -> None:
    on_gpu = LifecycleConfig(rollout_num_gpus=2, rollout_backend="vllm", rollout_device="cuda", colocate=True)
    assert on_gpu.offload_rollout
    assert LifecycleConfig(rollout_num_gpus=2, offload_rollout=True).rollout_backend == "sglang"
    # rollout-only vLLM with --offload-rollout offloads nothing (no trainer), so nothing is refused
    assert LifecycleConfig(rollout_num_gpus=2, rollout_backend="vllm", offload_rollout=True, debug_rollout_only=True)


def test_a_backend_without_broadcast_refuses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broadcast refusal reads the declared table: a backend declared without it is refused by name."""
    import dataclasses

    from lifecycle.decide import backends

    key = ("vllm", "cpu")
    reduced = dataclasses.replace(
        backends.CAPABILITIES[key], broadcast=False, why_not=(("broadcast", "no transfer engine registered"),)
    )
    monkeypatch.setitem(backends.CAPABILITIES, key, reduced)
    with pytest.raises(ConfigError) as err:
        LifecycleConfig(rollout_num_gpus=2, rollout_backend="vllm", update_weight_transfer_mode="broadcast")
    assert err.value.flag == "--update-weight-transfer-mode"
    assert "no transfer engine registered" in str(err.value)
    assert LifecycleConfig(rollout_num_gpus=2, rollout_backend="sglang", update_weight_transfer_mode="broadcast")


def test_every_backend_and_device_declares_its_abilities() -> None:
    from lifecycle.decide.backends import BACKENDS, CAPABILITIES, DEVICES, MEMORY_TAGS
    from lifecycle.decide.config import HEALTH_ENDPOINTS

    assert set(CAPABILITIES) == {(b, d) for b in BACKENDS for d in DEVICES}
    for can in CAPABILITIES.values():
        assert can.releases <= MEMORY_TAGS and can.pause_modes and can.probes
        assert set(can.probes) <= set(HEALTH_ENDPOINTS)  # each answers only flag values
        if not can.releases:
            assert can.reason("release memory") != f"the {can.backend} backend cannot release memory on {can.device}"
