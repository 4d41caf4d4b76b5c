"""``--fully-async`` at the run loop's door: refused with --async (it streams already), and refused by ``lifecycle run``
and ``Job`` until they run a stream -- never accepted and silently run lock-step."""

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


def test_the_run_loop_does_not_accept_a_stream_it_would_run_lock_step(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="do not run a stream yet") as caught:
        check_run(STREAMING, RunOptions(run_dir=tmp_path / "run"))
    assert caught.value.flag == "--fully-async" and "--async" in caught.value.fix
    with pytest.raises(ConfigError, match=r"RunOptions\.async_mode"):
        check_run(STREAMING, RunOptions(run_dir=tmp_path / "run"), names=API_NAMES)
