"""A short ``lifecycle run`` writes exactly the committed event log (canonical form: no timestamps).

The golden file pins behaviour across refactors: a restructuring that changes which machine moves,
in which order, with which guards and effects, fails here with the first divergent event. When a
change of behaviour is intended, regenerate it
(``LIFECYCLE_WRITE_GOLDEN=1 pytest tests/trainer/app/test_golden_trace.py``) and review the diff of
``tests/trainer/app/golden/short-run.events.jsonl`` with the change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lifecycle.cli import main
from lifecycle.observe.trace import diff, load
from tests.helpers import GOLDEN_RUN

pytest.importorskip("ray")
pytest.importorskip("torch")

# no monitor (its probes follow the wall clock), offload and eval on: every machine but the fleet moves
ARGV = ["--config", "none", "--rollout-num-gpus", "2", "--offload-rollout", "--eval-interval", "1"]


@pytest.mark.determinism
@pytest.mark.usefixtures("ray_cluster")
def test_short_run_writes_the_golden_event_log(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert main(["run", *ARGV, "--steps", "2", "--seed", "0", "--quiet", "--run-dir", str(run_dir)]) == 0
    events = load(run_dir / "events.jsonl")
    if os.environ.get("LIFECYCLE_WRITE_GOLDEN") == "1":
        GOLDEN_RUN.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in events))
    found = diff(load(GOLDEN_RUN), events)
    assert found is None, found.describe("golden", "this run")
