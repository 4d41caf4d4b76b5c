"""A run is assembled in one place (:class:`trainer.app.Job`): ``lifecycle run``, the examples and the
benchmarks are built from it, so none of them may construct the parts a Job wires (the core's runner, the
trainer group, the rollout manager, the weight-broadcast shell, the metrics exporter) by hand."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = {"Runner", "TrainerGroup", "RolloutManager", "WeightBroadcast", "serve_metrics"}
ASSEMBLY = ROOT / "trainer" / "app" / "job.py"


def users() -> list[Path]:
    """The code that runs a whole job: the application (beside the Job), the examples, the benchmarks."""
    found = [*(ROOT / "trainer" / "app").glob("*.py"), *(ROOT / "examples").rglob("*.py")]
    found += (ROOT / "benchmarks").glob("*.py")
    return sorted(p for p in found if p != ASSEMBLY)


def hand_wired(source: str) -> list[str]:
    """The parts a module constructs itself: calls of ``Runner(...)``, ``x.RolloutManager(...)`` and so on."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            if name in PARTS:
                out.append(f"line {node.lineno}: {name}(...)")
    return out


def test_the_scan_finds_a_hand_wired_part() -> None:
    planted = "from rollout.executor import RolloutManager\nm = RolloutManager(cfg, task, runner=lc.Runner(cfg))\n"
    assert hand_wired(planted) == ["line 2: RolloutManager(...)", "line 2: Runner(...)"]
    assert hand_wired("from trainer.app import Job\njob = Job(cfg, task, run_dir='r')\n") == []


def test_the_scan_covers_the_loop_examples_and_benchmarks() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in users()}
    assert {"trainer/app/loop.py", "benchmarks/bench_fleet.py", "benchmarks/bench_engines.py"} <= names
    assert any(n.startswith("examples/") for n in names), names


def test_nothing_but_the_job_wires_a_run() -> None:
    wired = {p.relative_to(ROOT).as_posix(): hand_wired(p.read_text()) for p in users()}
    assert not {k: v for k, v in wired.items() if v}, "build these from trainer.app.Job"
    assert hand_wired(ASSEMBLY.read_text()), "the Job itself must construct the parts (the scan would be blind)"
