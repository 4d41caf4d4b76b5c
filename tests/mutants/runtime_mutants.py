"""Runtime mutants: bugs re-introduced into the code that runs (shells, runner, core), not into spec copies.

Each mutant is one textual change to one module of a *copy of the tree*; the fast suite
(``pytest -m "not slow"``) must fail on it. Running the whole fast suite per mutant costs minutes
each, so the proof runs, per mutant, the fast tests that kill it (``killers``): they belong to the fast
suite, so the fast suite fails too. ``python tests/mutants/runtime_mutants.py --full NAME`` runs the
entire fast suite on one mutant instead, and ``--table`` prints the README's table.

A mutant whose ``old`` text no longer occurs exactly once fails the harness (it would otherwise
silently test nothing after a refactoring).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RuntimeMutant:
    name: str
    bug: str  # the bug class, as the field met it
    path: str  # the module changed
    old: str
    new: str
    killers: tuple[str, ...]  # fast tests that fail on it


CONTROLLER, EXECUTOR, RUNNER = "rollout/controller.py", "rollout/executor.py", "lifecycle/runner.py"
CORE, PLAN, HEALTH, FLEET = (
    "lifecycle/core/core.py",
    "lifecycle/core/plan.py",
    "engines/health.py",
    "rollout/eval_fleet.py",
)
T_CONTROLLER, T_CORE, T_RUNNER = (
    "tests/rollout/test_controller.py",
    "tests/lifecycle/test_core.py",
    "tests/lifecycle/test_runner.py",
)

MUTANTS: tuple[RuntimeMutant, ...] = (
    RuntimeMutant(
        "onload_restores_one_tag",
        "onload resumes the weights twice and never the KV cache (the engine serves with its KV cache released)",
        CONTROLLER,
        '"engine.resume_kv_cache": lambda c: self.slot(c).resume("kv_cache"),',
        '"engine.resume_kv_cache": lambda c: self.slot(c).resume("weights"),',
        (f"{T_CONTROLLER}::test_monitor_paused_at_creation_resumed_only_at_generate",),
    ),
    RuntimeMutant(
        "recovered_engine_gets_old_weights",
        "the committed weights never advance, so a recovered engine is caught up with an older version",
        RUNNER,
        "if result.commits and self.pending is not None:",
        "if False:",
        (f"{T_CONTROLLER}::test_a_dead_engine_is_recovered_and_caught_up_under_the_lock_before_it_serves",),
    ),
    RuntimeMutant(
        "restart_budget_never_spent",
        "restarts are not remembered, so a crash-looping engine is restarted for ever",
        CORE,
        "return delay, (*recent, now)",
        "return delay, recent",
        (f"{T_CORE}::test_an_engine_that_keeps_dying_spends_its_budget_then_fails_the_run",),
    ),
    RuntimeMutant(
        "replay_generate_calls_rollout_fn",
        "replay's generate calls the rollout function it never constructed (miles: TypeError on None)",
        EXECUTOR,
        'if self.state == "Replay":\n            self._source("replay")\n            return self._samples',
        'if False:\n            self._source("replay")\n            return self._samples',
        (f"{T_CONTROLLER}::test_replay_constructs_nothing_and_starts_nothing",),
    ),
    RuntimeMutant(
        "catch_up_skipped",
        "a restarted engine is not caught up before generate (it never serves again: miles #692)",
        PLAN,
        '("recover", "catch_up", "rollout.generate", "ci_inject", "require_routable")',
        '("recover", "rollout.generate", "ci_inject", "require_routable")',
        (f"{T_CORE}::test_rollout_only_under_rollout_ft_recovers_a_dead_engine_at_the_next_generate",),
    ),
    RuntimeMutant(
        "recovery_only_through_the_trainer",
        "a dead engine is recovered only by the trainer's update (rollout-only never recovers it)",
        PLAN,
        '("recover", "catch_up", "rollout.generate", "ci_inject", "require_routable")',
        '("catch_up", "rollout.generate", "ci_inject", "require_routable")',
        (f"{T_CORE}::test_rollout_only_under_rollout_ft_recovers_a_dead_engine_at_the_next_generate",),
    ),
    RuntimeMutant(
        "lock_kept_on_failed_update",
        "the engine lock is not released when a weight update fails",
        CORE,
        'elif effect == "release_engine_lock":\n                self.upd(lock=False)',
        'elif effect == "release_engine_lock":\n                pass',
        (f"{T_CORE}::test_a_weight_update_whose_shell_fails_releases_the_lock_and_blocks_generation_until_redone",),
    ),
    RuntimeMutant(
        "monitor_never_paused",
        "the monitor's pause handler does nothing: it keeps probing engines that are being updated",
        CONTROLLER,
        '"monitor.pause_monitor": self.monitor.pause,',
        '"monitor.pause_monitor": lambda c: asyncio.sleep(0),',
        (f"{T_CONTROLLER}::test_monitor_paused_at_creation_resumed_only_at_generate",),
    ),
    RuntimeMutant(
        "death_reports_dropped",
        "the death watcher drops every report: a dead engine is counted alive",
        CONTROLLER,
        "if self._watch_gen.get(engine.id) != gen:",
        "if True:",
        (f"{T_CONTROLLER}::test_a_dead_engine_is_recovered_and_caught_up_under_the_lock_before_it_serves",),
    ),
    RuntimeMutant(
        "stale_probe_acted_on",
        "a probe that fails after the monitor was paused counts toward the threshold (a healthy engine is marked)",
        HEALTH,
        "if epoch != self._epoch or not self._running:",
        "if False:",
        ("tests/engines/test_health.py::test_a_probe_failure_returning_after_a_pause_is_reported_as_stale",),
    ),
    RuntimeMutant(
        "pending_engines_routable",
        "engines that do not hold the committed weights receive requests (miles #1724)",
        CORE,
        'return tuple(i for i, e in enumerate(s.group(group)) if e.state == "Serving")',
        "return tuple(i for i, e in enumerate(s.group(group)) if e.state in self.live)",
        (f"{T_CONTROLLER}::test_without_the_catch_up_a_restarted_engine_is_never_routed",),
    ),
    RuntimeMutant(
        "eval_fleet_probes_under_rollout_ft",
        "the eval fleet sends /health_generate to every eval engine on every pin, also under rollout FT",
        FLEET,
        '    await runner.operate("pin")\n',
        '    for e in controller.evals:\n        await e.probe(5.0)\n    await runner.operate("pin")\n',
        ("tests/rollout/test_eval_fleet.py::test_the_fleets_own_health_generate_on_the_wire",),
    ),
    RuntimeMutant(
        "ledger_records_before_work",
        "the ledger records an effect when its move fires, before the work is done or even attempted",
        RUNNER,
        "                if cmd is None:\n                    labels.append(effect)",
        "                labels.append(effect)\n                if cmd is None:\n                    pass",
        (f"{T_RUNNER}::test_the_ledger_records_work_when_it_has_run_and_a_failure_as_failed",),
    ),
    RuntimeMutant(
        "unbound_effect_ignored",
        "an effect without a handler is silently skipped (a declared effect that does nothing)",
        RUNNER,
        "        missing = self.unbound()\n",
        "        missing: list[str] = []\n",
        (f"{T_RUNNER}::test_a_job_with_an_unbound_effect_fails_at_its_first_operation_naming_it",),
    ),
    RuntimeMutant(
        "fleet_operations_sequential",
        "a fan-out runs one engine after another (N latencies per step for N engines)",
        RUNNER,
        "outcomes = await asyncio.gather(*(self._carry_out(c) for c in commands))",
        "outcomes = [await self._carry_out(c) for c in commands]",
        (f"{T_RUNNER}::test_the_launches_run_at_once_not_one_after_another",),
    ),
    RuntimeMutant(
        "engine_failure_names_no_fix",
        "an engine that dies without rollout FT stops the run with a bare reason, not the flag to turn on",
        CONTROLLER,
        "            raise self.engine_failure(instance)",
        "            return",
        (f"{T_CONTROLLER}::test_no_rollout_ft_starts_no_monitor_and_a_dead_engine_fails_naming_the_flag",),
    ),
)
BY_NAME = {m.name: m for m in MUTANTS}


def _tree_files() -> list[str]:
    """The project's files as a clean clone has them (tracked and new, never ignored build output)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [f for f in out.stdout.splitlines() if (ROOT / f).is_file()]


def mutated_copy(mutant: RuntimeMutant, dest: Path) -> Path:
    """A copy of the tree under ``dest`` with ``mutant`` applied; raises when its text is not there once."""
    for rel in _tree_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    module = dest / mutant.path
    text = module.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise AssertionError(f"{mutant.name}: its text occurs {count} times in {mutant.path} (want exactly once)")
    module.write_text(text.replace(mutant.old, mutant.new))
    return dest


def run_tests(tree: Path, tests: list[str], *, timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
    """The fast suite's tests ``tests`` on ``tree`` (its packages shadow the installed ones)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    contracts = ROOT.parent / "shared" / "contracts"
    if "LIFECYCLE_CONTRACTS" not in env and contracts.is_dir():
        env["LIFECYCLE_CONTRACTS"] = str(contracts)
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider", *tests]
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)


def kill(mutant: RuntimeMutant, tests: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        tree = mutated_copy(mutant, Path(tmp))
        return run_tests(tree, list(tests if tests is not None else mutant.killers))


def markdown_table() -> str:
    lines = ["| runtime mutant | bug | module | killed by (fast suite) |", "|---|---|---|---|"]
    for m in MUTANTS:
        killers = ", ".join(f"`{k.split('::')[-1]}`" for k in m.killers)
        lines.append(f"| `{m.name}` | {m.bug} | `{m.path}` | {killers} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="print the README's table")
    parser.add_argument("--full", metavar="NAME", help="run the whole fast suite on mutant NAME (minutes)")
    args = parser.parse_args()
    if args.table:
        print(markdown_table())
    elif args.full:
        run = kill(BY_NAME[args.full], tests=["tests"])
        print(run.stdout[-3000:])
        print("killed" if run.returncode else "SURVIVED")
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
