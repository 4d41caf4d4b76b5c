"""``--fully-async`` at the run loop's door: refused with --async (it streams already), accepted on its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from trainer.app.checks import check_async, check_run
from trainer.app.options import API_NAMES, RunOptions

STREAMING = LifecycleConfig.from_mapping({"rollout_num_gpus": 2, "fully_async": True}, check_paths=False)


def test_async_with_fully_async_is_refused() -> None:
    with pytest.raises(ConfigError, match="streams already") as caught:
        check_async(STREAMING, True)
    assert caught.value.flag == "--async"


def test_the_run_loop_accepts_a_stream(tmp_path: Path) -> None:
    check_run(STREAMING, RunOptions(run_dir=tmp_path / "run"))
    check_run(STREAMING, RunOptions(run_dir=tmp_path / "run2"), names=API_NAMES)


def test_a_rollout_function_is_refused_in_a_stream(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="never stops generating") as caught:
        check_run(STREAMING, RunOptions(run_dir=tmp_path / "run", rollout_fn="json:loads"))
    assert caught.value.flag == "--rollout-function"
    with pytest.raises(ConfigError, match="never stops generating") as caught:
        check_run(STREAMING, RunOptions(run_dir=tmp_path / "run", rollout_fn="json:loads"), names=API_NAMES)
    assert caught.value.flag == "RunOptions.rollout_fn"


def test_a_stream_pushes_consecutive_versions(tmp_path: Path) -> None:
    """A stream's staleness counts updates: a version that skips one is refused before anything is sent (the
    same check on a lock-step job lets it through to the trainer)."""
    import asyncio

    from rollout.pattern import PatternTask
    from trainer.app.job import Job

    job = Job(STREAMING, PatternTask(), run_dir=tmp_path / "run")
    job._version = 3
    with pytest.raises(ConfigError, match="skips versions after 3") as caught:
        asyncio.run(job.update_weights(5))
    assert caught.value.flag == "Job.update_weights(version=)" and "push 4" in caught.value.fix
    job._dirs.release()
