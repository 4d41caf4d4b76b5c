"""--fully-async and its settings (miles' names): resolved where they mean something, refused where they do not."""

from __future__ import annotations

from typing import Any

import pytest

from lifecycle.decide.config import DEFAULT_BUFFER_BATCHES, DEFAULT_STALENESS, LifecycleConfig
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.predicates import streaming


def config(**values: Any) -> LifecycleConfig:
    return LifecycleConfig.from_mapping({"rollout_num_gpus": 2, **values}, check_paths=False)


def test_off_by_default_and_nothing_resolved() -> None:
    c = config()
    assert not c.fully_async and not streaming(c)
    assert (c.max_weight_staleness, c.pause_generation_mode, c.async_data_buffer_max_batches) == (None, None, None)


def test_fully_async_resolves_a_bound_a_keeping_pause_and_a_buffer() -> None:
    c = config(fully_async=True)
    assert streaming(c)
    assert c.max_weight_staleness == DEFAULT_STALENESS
    assert c.async_data_buffer_max_batches == DEFAULT_BUFFER_BATCHES
    assert c.pause_generation_mode == "retract"  # SGLang's (and the CPU engine's) first pause that keeps requests
    assert config(fully_async=True, rollout_backend="vllm").pause_generation_mode == "keep"


@pytest.mark.parametrize("k", [0, 1, 4, 64])
def test_staleness_bounds_accepted(k: int) -> None:
    assert config(fully_async=True, max_weight_staleness=k).max_weight_staleness == k


def test_resolved_defaults_are_left_out_of_the_shortest_command_line() -> None:
    c = config(fully_async=True)
    assert c.to_flags() == ["--rollout-num-gpus", "2", "--fully-async"]
    d = config(fully_async=True, max_weight_staleness=4, pause_generation_mode="in_place")
    assert d.to_flags()[-4:] == ["--max-weight-staleness", "4", "--pause-generation-mode", "in_place"]
    for x in (c, d):
        assert LifecycleConfig.from_args(x.to_flags(), check_paths=False) == x
        assert LifecycleConfig.from_mapping(x.to_dict(), check_paths=False) == x


@pytest.mark.parametrize(
    ("values", "flag", "says"),
    [
        ({"max_weight_staleness": 1}, "--max-weight-staleness", "without --fully-async"),
        ({"pause_generation_mode": "retract"}, "--pause-generation-mode", "without --fully-async"),
        ({"async_data_buffer_max_batches": 2}, "--async-data-buffer-max-batches", "without --fully-async"),
        ({"fully_async": True, "debug_rollout_only": True}, "--fully-async", "trains nothing"),
        ({"fully_async": True, "debug_train_only": True}, "--fully-async", "starts no rollout engine"),
        ({"fully_async": True, "offload": True}, "--fully-async", "cannot be offloaded"),
        ({"fully_async": True, "colocate": True}, "--fully-async", "cannot be offloaded"),
        ({"fully_async": True, "max_weight_staleness": -1}, "--max-weight-staleness", "negative"),
        ({"fully_async": True, "max_weight_staleness": 65}, "--max-weight-staleness", "too large"),
        ({"fully_async": True, "max_weight_staleness": None, "async_data_buffer_max_batches": 0}, "--async-data", "0"),
        ({"fully_async": True, "pause_generation_mode": "abort"}, "--pause-generation-mode", "ends the requests"),
        ({"fully_async": True, "pause_generation_mode": "keep"}, "--pause-generation-mode", "no pause mode 'keep'"),
        (
            {"fully_async": True, "rollout_backend": "vllm", "pause_generation_mode": "retract"},
            "--pause-generation-mode",
            "no pause mode 'retract'",
        ),
        (
            {"fully_async": True, "rollout_backend": "vllm", "pause_generation_mode": "wait"},
            "--pause-generation-mode",
            "ends the requests",
        ),
        ({"fully_async": True, "pause_generation_mode": "freeze"}, "--pause-generation-mode", "not one of"),
    ],
)
def test_nonsense_is_one_config_error_naming_the_flag(values: dict[str, Any], flag: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config(**values)
    assert caught.value.flag.startswith(flag)
    assert says in str(caught.value)


def test_replay_with_fully_async_is_refused() -> None:
    with pytest.raises(ConfigError, match="starts no rollout engine"):
        LifecycleConfig.from_mapping(
            {"load_debug_rollout_data": "x/{rollout_id}.json", "fully_async": True}, check_paths=False
        )


def test_save_and_resume_are_allowed_in_streaming() -> None:
    c = config(fully_async=True, save="ck", load="ck")
    assert streaming(c) and c.save == "ck"
