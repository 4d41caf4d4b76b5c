"""Named example configurations used by ``lifecycle graph --preset`` and ``lifecycle check``.

Each preset runs two rollout engines and a two-engine eval fleet with offload on, so every
machine has something to show; they differ in fault tolerance and mode, the axes of the two
miles regressions.
"""

from __future__ import annotations

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError

_COMMON = {"rollout_num_gpus": 2, "eval_num_gpus": 2, "offload_rollout": True, "offload_train": True}

# The four fault-tolerance configurations (the columns of the reliability matrix too).
FT_PRESETS: dict[str, dict[str, object]] = {
    "no-ft": {},
    "ft-rollout": {"use_fault_tolerance": True, "ft_components": ["rollout"]},
    "ft-train": {"use_fault_tolerance": True, "ft_components": ["train"]},
    "ft-both": {"use_fault_tolerance": True, "ft_components": ["train", "rollout"]},
}
PRESET_FLAGS: dict[str, dict[str, object]] = {
    **FT_PRESETS,
    "replay": {"load_debug_rollout_data": "runs/replay/{rollout_id}.json"},
    "debug-train-only": {"debug_train_only": True},
    "debug-rollout-only": {"debug_rollout_only": True},
    # a job resumed after its driver died (lifecycle run --resume): restored from, and writing, job checkpoints
    "resume": {
        "use_fault_tolerance": True,
        "ft_components": ["train", "rollout"],
        "save": "runs/job/checkpoints",
        "save_interval": 1,
        "load": "runs/job/checkpoints",
    },
    # streaming RL (--fully-async, K = 1): the engines generate on while the trainer takes groups and pushes weights
    # in flight; under both FT components (a worker heals, an engine recovers, mid-stream); a stream cannot offload
    "streaming": {
        "fully_async": True,
        "use_fault_tolerance": True,
        "ft_components": ["train", "rollout"],
        "offload_rollout": False,
        "offload_train": False,
    },
    # an elastic fleet (--rollout-min/max-num-gpus): engines join and leave mid-run, a notice drains one; under
    # rollout FT (a member recovers, a leaver never does); an elastic fleet cannot offload (its GPUs are its own)
    "elastic": {
        "rollout_min_num_gpus": 1,
        "rollout_max_num_gpus": 3,
        "use_fault_tolerance": True,
        "ft_components": ["rollout"],
        "offload_rollout": False,
        "offload_train": False,
    },
}


def preset(name: str) -> LifecycleConfig:
    """The config of a preset (paths are not checked: presets describe, they do not run)."""
    if name not in PRESET_FLAGS:
        raise ConfigError("--preset", name, "unknown preset", f"choose one of: {', '.join(PRESET_FLAGS)}")
    return LifecycleConfig.from_mapping({**_COMMON, **PRESET_FLAGS[name]}, check_paths=False)


PRESETS: tuple[str, ...] = tuple(PRESET_FLAGS)
