"""An elastic fleet's bounds (--rollout-min/max-num-gpus, --rollout-drain-timeout): derived engine counts, the
``elastic`` predicate, and one refusal per bad combination naming the flag and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from lifecycle.decide.config import DEFAULT_DRAIN_TIMEOUT, LifecycleConfig
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.predicates import elastic


def config(**values: Any) -> LifecycleConfig:
    return LifecycleConfig.from_mapping({"rollout_num_gpus": 2, **values}, check_paths=False)


def test_without_bounds_nothing_changes() -> None:
    c = config()
    assert not elastic(c)
    assert (c.rollout_min_num_gpus, c.rollout_max_num_gpus, c.rollout_drain_timeout) == (None, None, None)
    assert c.min_rollout_engines == c.max_rollout_engines == c.num_rollout_engines == 2
    assert c.to_flags() == ["--rollout-num-gpus", "2"]


def test_bounds_derive_engines_and_resolve_the_drain_timeout() -> None:
    c = config(rollout_min_num_gpus=1, rollout_max_num_gpus=4)
    assert elastic(c)
    assert (c.min_rollout_engines, c.num_rollout_engines, c.max_rollout_engines) == (1, 2, 4)
    assert c.rollout_drain_timeout == DEFAULT_DRAIN_TIMEOUT
    # the resolved default is left out of the shortest command line, and the line reproduces the config
    assert c.to_flags() == ["--rollout-num-gpus", "2", "--rollout-min-num-gpus", "1", "--rollout-max-num-gpus", "4"]
    assert LifecycleConfig.from_args(c.to_flags(), check_paths=False) == c


def test_one_bound_defaults_the_other() -> None:
    only_max = config(rollout_max_num_gpus=4)
    assert (only_max.min_rollout_engines, only_max.max_rollout_engines) == (1, 4)  # one engine's worth
    only_min = config(rollout_min_num_gpus=2)
    assert (only_min.min_rollout_engines, only_min.max_rollout_engines) == (2, 2)  # no growth
    wide = config(rollout_num_gpus=4, rollout_num_gpus_per_engine=2, rollout_max_num_gpus=8)
    assert (wide.min_rollout_engines, wide.num_rollout_engines, wide.max_rollout_engines) == (1, 2, 4)


def test_drain_timeout_given_is_kept() -> None:
    assert config(rollout_max_num_gpus=3, rollout_drain_timeout=0).rollout_drain_timeout == 0
    assert config(rollout_max_num_gpus=3, rollout_drain_timeout=5.5).rollout_drain_timeout == 5.5


REFUSED = [
    # (values, the flag named, words of the problem, words of the fix)
    ({"rollout_num_gpus": 4, "rollout_num_gpus_per_engine": 2, "rollout_min_num_gpus": 3}, "--rollout-min-num-gpus",
     "not divisible", "multiple of --rollout-num-gpus-per-engine"),
    ({"rollout_num_gpus": 4, "rollout_num_gpus_per_engine": 2, "rollout_max_num_gpus": 5}, "--rollout-max-num-gpus",
     "not divisible", "multiple of --rollout-num-gpus-per-engine"),
    ({"rollout_min_num_gpus": 0}, "--rollout-min-num-gpus", "below one engine", "to 1 or more"),
    ({"rollout_min_num_gpus": 3}, "--rollout-min-num-gpus", "above --rollout-num-gpus 2", "at most 2"),
    ({"rollout_max_num_gpus": 1}, "--rollout-max-num-gpus", "below --rollout-num-gpus 2", "to 2 or more"),
    ({"rollout_max_num_gpus": 4, "rollout_drain_timeout": -1}, "--rollout-drain-timeout", "negative", "0 or more"),
    ({"rollout_drain_timeout": 10}, "--rollout-drain-timeout", "no bounds", "add --rollout-min-num-gpus"),
    ({"rollout_max_num_gpus": 4, "rollout_external_engine_addrs": ["h:1", "h:2"]}, "--rollout-max-num-gpus",
     "cannot add any", "drop --rollout-max-num-gpus"),
    ({"rollout_min_num_gpus": 1, "debug_train_only": True}, "--rollout-min-num-gpus", "starts no rollout engine",
     "drop --rollout-min-num-gpus"),
    ({"rollout_max_num_gpus": 4, "offload_rollout": True}, "--rollout-max-num-gpus", "colocated",
     "drop --offload-rollout/--offload/--colocate"),
    ({"rollout_max_num_gpus": 4, "colocate": True}, "--rollout-max-num-gpus", "colocated",
     "drop --offload-rollout/--offload/--colocate"),
    ({"rollout_max_num_gpus": 4, "detach_engines": True, "save": "/tmp/ckpt"}, "--rollout-max-num-gpus",
     "records no target", "drop --detach-engines"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "flag", "problem", "fix"), REFUSED)
def test_each_bad_combination_names_the_flag_and_the_fix(
    values: dict[str, Any], flag: str, problem: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as err:
        config(**values)
    assert err.value.flag == flag
    message = str(err.value)
    assert problem in message, message
    assert "Fix:" in message and fix in message.split("Fix:", 1)[1], message


def test_replay_with_bounds_is_refused_too() -> None:
    with pytest.raises(ConfigError) as err:
        config(rollout_max_num_gpus=4, load_debug_rollout_data="/tmp/r_{rollout_id}.pt")
    assert err.value.flag == "--rollout-max-num-gpus"
