"""The README's embedding example runs as written on a real Ray cluster.

It is the public API's contract: config, a user's task, a user's trainer backend, and one ``Job`` that
assembles the run around the user's own loop, in at most four imports of the project. The example must
train (engines served, weights pushed) and its event log must show the machines it drove.
"""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path

import pytest

from lifecycle.decide.events import read_jsonl

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()
EMBEDDING = (Path(__file__).resolve().parents[3] / "docs" / "embedding.md").read_text()


PROJECT = ("lifecycle", "engines", "rollout", "trainer")


def _embedding_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    found = [b for b in blocks if "async with Job(" in b]
    assert found, "README lost its embedding example (async with Job(...))"
    return str(found[0])


def _project_imports(block: str) -> list[str]:
    """The block's import statements of the project's packages (stdlib ones do not count)."""
    imports = [n for n in ast.walk(ast.parse(block)) if isinstance(n, ast.Import | ast.ImportFrom)]
    names = [n.module or "" if isinstance(n, ast.ImportFrom) else n.names[0].name for n in imports]
    return [name for name in names if name.split(".")[0] in PROJECT]


def test_readme_embedding_example_needs_at_most_four_imports_and_keeps_its_own_loop() -> None:
    block = _embedding_block()
    project = _project_imports(block)
    assert project and len(project) <= 4, project
    assert re.search(r"^\s+for step in range\(steps\):", block, re.M), "the user's loop is the example's own"
    for verb in ("generate", "train", "update_weights"):
        assert f"await job.{verb}(" in block, verb


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


def _stream_block() -> str:
    found = re.findall(r"\[start:stream\] -->\n```python\n(.*?)```", EMBEDDING, re.S)
    assert found, "docs/embedding.md lost its streaming example"
    return str(found[0])


def test_the_streaming_example_is_a_users_own_loop() -> None:
    block = _stream_block()
    assert not _project_imports(block), "it reuses the README example's imports and task"
    assert re.search(r"^\s+for step in range\(steps\):", block, re.M)
    for verb in ("job.streaming()", "await job.take(", "await job.update_weights("):
        assert verb in block, verb


@pytest.mark.usefixtures("ray_cluster")
def test_the_streaming_example_trains_within_its_bound(tmp_path: Path) -> None:
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(_embedding_block(), "README.md:embedding", "exec", dont_inherit=True), namespace)
    exec(compile(_stream_block(), "docs/embedding.md:stream", "exec", dont_inherit=True), namespace)
    stream = namespace["stream"]
    lags = asyncio.run(stream(steps=3, run_dir=str(tmp_path)))  # type: ignore[operator]
    assert lags and all(0 <= lag <= 1 for lag in lags), lags
    events = read_jsonl(tmp_path / "events.jsonl")
    moves = {(e.get("machine"), e.get("trigger")) for e in events}
    assert ("rollout", "stream") in moves and ("engine", "pause") in moves and ("rollout", "update_done") in moves
    assert sum(e["event"] == "stream.group_taken" for e in events) == len(lags)


def _elastic_block() -> str:
    found = re.findall(r"\[start:elastic\] -->\n```python\n(.*?)```", EMBEDDING, re.S)
    assert found, "docs/embedding.md lost its elastic-fleet example"
    return str(found[0])


def test_the_elastic_example_is_a_users_own_loop() -> None:
    block = _elastic_block()
    assert not _project_imports(block), "it reuses the README example's imports and task"
    assert re.search(r"^\s+for step in range\(steps\):", block, re.M)
    for verb in ("await job.add_engines(", "await job.retire_engines(", "job.fleet"):
        assert verb in block, verb


@pytest.mark.usefixtures("ray_cluster")
def test_the_elastic_example_grows_and_shrinks_its_fleet(tmp_path: Path) -> None:
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(_embedding_block(), "README.md:embedding", "exec", dont_inherit=True), namespace)
    exec(compile(_elastic_block(), "docs/embedding.md:elastic", "exec", dont_inherit=True), namespace)
    elastic = namespace["elastic"]
    members = asyncio.run(elastic(steps=3, run_dir=str(tmp_path)))  # type: ignore[operator]
    assert members == [2, 3, 2], members
    events = read_jsonl(tmp_path / "events.jsonl")
    moves = [(e.get("instance"), e.get("trigger"), e.get("dst")) for e in events if e.get("machine") == "engine"]
    assert ("engine-2", "join", "Joining") in moves and ("engine-0", "retired", "Retired") in moves, moves
    joiner = [i for i, e in enumerate(events) if e.get("instance") == "engine-2"]
    loaded = next(i for i in joiner if events[i].get("event") == "engine.weights")
    routed = next(i for i in joiner if events[i].get("event") == "engine.routed")
    assert loaded < routed, "the joiner was routed before it loaded the committed weights"
    assert not [e for e in events if e["event"] == "lifecycle.invariant_violated"]
