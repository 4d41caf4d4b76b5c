"""The README's embedding example runs as written on a real Ray cluster.

It is the public API's contract: config, a user's task, a user's trainer backend, rollout manager,
trainer group, event log. The example must train (engines served, weights pushed) and its event log
must show the machines it drove.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from lifecycle.decide.events import read_jsonl

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _embedding_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    found = [b for b in blocks if "RolloutManager" in b and "TrainerGroup" in b]
    assert found, "README lost its embedding example (RolloutManager + TrainerGroup)"
    return found[0]


@pytest.mark.usefixtures("ray_cluster")
def test_readme_embedding_example_trains_through_the_machines(tmp_path: Path) -> None:
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(_embedding_block(), "README.md:embedding", "exec", dont_inherit=True), namespace)  # as a script
    main = namespace["main"]
    rewards = asyncio.run(main(steps=2, run_dir=str(tmp_path)))  # type: ignore[operator]
    assert len(rewards) == 2 and all(0.0 <= r <= 1.0 for r in rewards)
    events = read_jsonl(tmp_path / "events.jsonl")
    moves = {(e.get("machine"), e.get("trigger")) for e in events}
    assert ("rollout", "init") in moves and ("rollout", "start_servers") in moves
    assert ("trainer", "update_weights") in moves and ("engine", "finish_update") in moves
    assert ("monitor", "create") in moves  # rollout FT (the default component) starts the monitor
    assert {e["event"] for e in events} >= {"lifecycle.started", "engine.weights", "weights.committed"}
    assert not [e for e in events if e["event"] == "lifecycle.invariant_violated"]  # the live monitor ran clean
