"""Until issue 44's runtime lands, `lifecycle run` and `Job` refuse an elastic config before anything starts."""

from __future__ import annotations

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from trainer.app.checks import check_elastic


def config(**values: object) -> LifecycleConfig:
    return LifecycleConfig.from_mapping({"rollout_num_gpus": 2, **values}, check_paths=False)


def test_lifecycle_run_and_job_refuse_elastic_until_the_runtime_lands() -> None:
    """The one check ``lifecycle run`` and ``Job`` share (trainer/app/checks.check_run) refuses bounds for now."""
    check_elastic(config())  # without bounds: nothing to refuse
    with pytest.raises(ConfigError) as err:
        check_elastic(config(rollout_max_num_gpus=4))
    assert err.value.flag == "--rollout-max-num-gpus" and "issue 44" in str(err.value)
