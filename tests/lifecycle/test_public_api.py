"""``import lifecycle`` gives what a loop that embeds the core needs, and nothing of the machinery below it."""

from __future__ import annotations

import lifecycle
from lifecycle import ROLLOUT, Completed, Core, JobState, LifecycleConfig, Op, Outcome, Result

BELOW_THE_CORE = {"LifecycleMachine", "FireResult", "evaluate", "PREDICATES", "MACHINES", "MachineSpec", "T"}


def test_every_exported_name_exists_and_none_is_below_the_core() -> None:
    assert all(hasattr(lifecycle, name) for name in lifecycle.__all__)
    assert not BELOW_THE_CORE & set(lifecycle.__all__)
    assert not [name for name in BELOW_THE_CORE if hasattr(lifecycle, name)]


def test_a_loop_drives_the_core_with_the_top_level_names_alone() -> None:
    config = LifecycleConfig.from_mapping({"use_fault_tolerance": True, "rollout_num_gpus": 2})
    core = Core(config)
    nominal = {"launch_engine": "ready", "transfer_weights": "loaded"}
    step: Result = core.step(core.initial(), Op("init"))
    while step.commands:
        done = tuple((c, Outcome(nominal.get(c.effect, "done"))) for c in step.commands)
        step = core.step(step.state, Completed(done))
    state: JobState = step.state
    assert state.rollout == "Ready" and [e.state for e in state.engines] == ["Quiesced", "Quiesced"]
    died = core.step(state, Outcome("died", ROLLOUT, 1, "exit code -9"))
    assert died.ok and died.state.engines[1].state == "Unhealthy"  # under rollout FT, recovered at the next generate
