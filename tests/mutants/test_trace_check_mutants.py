"""``lifecycle trace check`` fails, naming the invariant, on the event log of a run whose runtime carries a bug.

Each case copies the tree, applies one runtime mutant of the mutation harness (:mod:`runtime_mutants`),
runs a real ``lifecycle run`` on the copy (its own Ray, engines and trainer) and judges the log it wrote
with the *unmutated* checker. The mutants chosen are those whose bug changes what the shells do or report
(the weights an engine loads, probes sent while paused, the memory tags resumed, the rollout function
called in replay); the others break what the core decides, which the fast suite's killers and the
explorer catch, and leave an event log that looks like a correct run of a different job.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from lifecycle.cli import main
from lifecycle.observe.monitor import JUDGED

from .runtime_mutants import BY_NAME, ROOT, child_environ, mutated_copy

FT = ["--use-fault-tolerance", "--ft-components", "rollout"]


@dataclass(frozen=True)
class Case:
    mutant: str
    argv: tuple[str, ...]  # lifecycle run's flags (the run directory is added)
    invariant: str


CASES = (
    Case(
        "recovered_engine_gets_old_weights",
        ("--steps", "4", *FT, "--inject", "kill-engine:1@2"),
        "serving_engines_hold_current_weights",
    ),
    Case(
        "monitor_never_paused",
        (
            "--steps",
            "12",  # offloaded between generate and update: every step's training is a window the probes hit
            *FT,
            "--offload-rollout",
            "--rollout-health-check-interval",
            "0.05",
            "--rollout-health-check-timeout",
            "0.05",
            # a probe that misses 0.05 s on a loaded CI machine is noise here, not a fault: no restarts for it
            "--rollout-health-check-failure-threshold",
            "1000",
        ),
        "monitors_run_only_during_generate_or_eval",
    ),
    Case("onload_restores_one_tag", ("--steps", "3", "--offload-rollout"), "onload_restores_what_offload_released"),
    Case(
        "replay_generate_calls_rollout_fn",
        ("--config", "none", "--steps", "2", "--load-debug-rollout-data", "{data}"),
        "replay_never_constructs",
    ),
)


def test_every_case_names_a_real_mutant_and_an_invariant_the_monitor_judges() -> None:
    assert len(CASES) >= 4
    for case in CASES:
        assert case.mutant in BY_NAME and case.invariant in JUDGED


def _run(tree: Path, argv: list[str], environ: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1", "RAY_DEDUP_LOGS": "0"}
    cmd = [sys.executable, "-m", "lifecycle.cli", "run", "--quiet", *argv]
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=600)


RunResult = tuple[subprocess.CompletedProcess[str], Path]
CI_TEST = (CASES[0].mutant, "ci-test")  # the --ci-test run (on the first case's mutant), beside the cases' runs


def _replay_data(root: Path, environ: Mapping[str, str]) -> str:
    """Two saved rollouts of the real tree, for the replay case."""
    template = str(root / "data" / "{rollout_id}.json")
    run = _run(ROOT, ["--steps", "2", "--save-debug-rollout-data", template, "--run-dir", str(root / "run")], environ)
    assert run.returncode == 0, run.stderr[-2000:]
    return template


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, bool | str], Future[RunResult]]]:
    """Every case's run on its mutant's tree and on the real one, and the ``--ci-test`` run, two at a time (each is a
    ``lifecycle run`` of its own: its Ray, engines and gateway mostly wait), keyed by (mutant, mutated). The replay
    case's saved rollouts are made first, in the same pool; the replay runs, submitted last, wait for them."""
    root = tmp_path_factory.mktemp("trace-runs")
    environ = child_environ()  # read here, not in the pool: see child_environ

    def one(case: Case, mutated: bool, replay_data: Future[str]) -> RunResult:
        where = root / f"{case.mutant}-{'mutant' if mutated else 'real'}"
        tree = mutated_copy(BY_NAME[case.mutant], where / "tree") if mutated else ROOT
        argv = [a.replace("{data}", replay_data.result()) if "{data}" in a else a for a in case.argv]
        return _run(tree, [*argv, "--run-dir", str(where / "run")], environ), where / "run" / "events.jsonl"

    def ci_test() -> RunResult:
        where = root / "ci-test"
        case = CASES[0]
        tree = mutated_copy(BY_NAME[case.mutant], where / "tree")
        run = _run(tree, [*case.argv, "--ci-test", "--run-dir", str(where / "run")], environ)
        return run, where / "run" / "events.jsonl"

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="trace-run") as pool:
        replay_data = pool.submit(_replay_data, tmp_path_factory.mktemp("saved"), environ)
        futures: dict[tuple[str, bool | str], Future[RunResult]] = {
            (c.mutant, m): pool.submit(one, c, m, replay_data) for c in CASES for m in (True, False)
        }
        futures[CI_TEST] = pool.submit(ci_test)
        yield futures


@pytest.mark.slow  # a tree copy and a real run (its own Ray cluster) per mutant
@pytest.mark.parametrize("case", CASES, ids=[c.mutant for c in CASES])
def test_trace_check_names_the_invariant_a_runtime_mutant_breaks(
    case: Case, runs: dict[tuple[str, bool | str], Future[RunResult]], capsys: pytest.CaptureFixture[str]
) -> None:
    run, log = runs[(case.mutant, True)].result()
    assert log.is_file(), f"{case.mutant}: the run wrote no event log (exit {run.returncode}):\n{run.stderr[-2000:]}"
    capsys.readouterr()
    assert main(["trace", "check", str(log)]) == 1, f"{case.mutant}: trace check found nothing"
    out = capsys.readouterr().out
    assert out.startswith(f"invariant {case.invariant} violated at event "), out


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.mutant for c in CASES])
def test_the_same_run_on_the_real_tree_passes_trace_check(
    case: Case, runs: dict[tuple[str, bool | str], Future[RunResult]], capsys: pytest.CaptureFixture[str]
) -> None:
    """The control: each scenario without its mutant breaks nothing (the check is specific, not noisy)."""
    run, log = runs[(case.mutant, False)].result()
    assert run.returncode == 0, run.stderr[-2000:]
    assert main(["trace", "check", str(log)]) == 0, capsys.readouterr().out


@pytest.mark.slow
def test_under_ci_test_the_live_monitor_stops_the_run_at_the_violation(
    runs: dict[tuple[str, bool | str], Future[RunResult]],
) -> None:
    """--ci-test: the first violation the live monitor logs ends the run, exit 2 naming the invariant."""
    case = CASES[0]
    run, log = runs[CI_TEST].result()
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert f"invariant {case.invariant} violated" in run.stderr, run.stderr[-2000:]
    steps = (log.parent / "metrics.jsonl").read_text().splitlines()
    assert len(steps) < 4  # it stopped at the step that showed the violation, not at the end
