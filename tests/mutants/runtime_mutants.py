"""Runtime mutants: bugs re-introduced into the code that runs (shells, runner, core), not into spec copies.

Each mutant is one textual change to one module of a *copy of the tree*; the fast suite
(``pytest -m "not slow"``) must fail on it. Running the whole fast suite per mutant costs minutes
each, so the proof runs, per mutant, the fast tests that kill it (``killers``): they belong to the fast
suite, so the fast suite fails too. ``python tests/mutants/runtime_mutants.py --full NAME`` runs the
entire fast suite on one mutant instead, and ``--table`` prints the table of ``docs/checking.md``.

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
from collections.abc import Mapping
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


CONTROLLER, EXECUTOR, RUNNER = "rollout/controller.py", "rollout/executor.py", "lifecycle/decide/runner.py"
CORE, PLAN, HEALTH, FLEET = (
    "lifecycle/decide/core/core.py",
    "lifecycle/decide/core/plan.py",
    "engines/health.py",
    "rollout/eval_fleet.py",
)
CORE_STEP, CORE_TABLES, CORE_ENGINES = (
    "lifecycle/decide/core/step.py",
    "lifecycle/decide/core/tables.py",
    "lifecycle/decide/core/engines.py",
)
T_CONTROLLER, T_CORE, T_RUNNER = (
    "tests/rollout/test_controller.py",
    "tests/lifecycle/decide/test_core.py",
    "tests/lifecycle/decide/test_runner.py",
)
GROUP, ROUTING, ENGINE, LAUNCHER, BROADCAST, WEIGHT_GROUP = (
    "trainer/group.py",
    "rollout/routing.py",
    "engines/engine.py",
    "engines/launcher.py",
    "trainer/app/broadcast.py",
    "engines/models/weight_group.py",
)
T_RESUME, T_WITHDRAW, T_HEALTH, T_SLOT, T_STOP, T_TEARDOWN = (
    "tests/trainer/test_resume_restores.py",
    "tests/rollout/test_routing_withdraw.py",
    "tests/engines/test_health.py",
    "tests/engines/test_engine_slot_duties.py",
    "tests/lifecycle/decide/test_core_stop.py",
    "tests/trainer/app/test_broadcast_teardown.py",
)

STREAM, T_STREAM = "rollout/stream.py", "tests/trainer/app/test_stream_loop.py"

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
        "news_epochs_ignored_at_runtime",
        "a death report or probe verdict about an engine's replaced process marks the new one (miles #2172)",
        CORE_STEP,
        "if self.epoch is not None and trigger in self.core.fenced[part] and self.stale(part, trigger, src, group, i):",
        "if False:",
        (
            "tests/lifecycle/decide/test_core_epochs.py::test_a_late_report_after_a_restart_leaves_the_new_process_serving",
            f"{T_CONTROLLER}::test_a_late_verdict_about_a_replaced_process_is_fenced_and_the_new_one_keeps_serving",
        ),
    ),
    RuntimeMutant(
        "restart_budget_never_spent",
        "restarts are not remembered, so a crash-looping engine is restarted for ever",
        CORE_ENGINES,
        "return delay, (*recent, now)",
        "return delay, recent",
        (f"{T_CORE}::test_an_engine_that_keeps_dying_spends_its_budget_then_fails_the_run",),
    ),
    RuntimeMutant(
        "replay_generate_calls_rollout_fn",
        "replay's generate calls the rollout function it never constructed (miles: TypeError on None)",
        EXECUTOR,
        'if self.state == "Replay":\n            self._source("replay")\n            return []',
        'if False:\n            self._source("replay")\n            return []',
        (f"{T_CONTROLLER}::test_replay_constructs_nothing_and_starts_nothing",),
    ),
    RuntimeMutant(
        "catch_up_skipped",
        "a restarted engine is not caught up before generate (it never serves again: miles #692)",
        PLAN,
        '("recover", "reconcile", "catch_up", "rollout.generate", "ci_inject", "require_routable", "read_gateway")',
        '("recover", "reconcile", "rollout.generate", "ci_inject", "require_routable", "read_gateway")',
        (f"{T_CORE}::test_rollout_only_under_rollout_ft_recovers_a_dead_engine_at_the_next_generate",),
    ),
    RuntimeMutant(
        "recovery_only_through_the_trainer",
        "a dead engine is recovered only by the trainer's update (rollout-only never recovers it)",
        PLAN,
        '("recover", "reconcile", "catch_up", "rollout.generate", "ci_inject", "require_routable", "read_gateway")',
        '("reconcile", "catch_up", "rollout.generate", "ci_inject", "require_routable", "read_gateway")',
        (f"{T_CORE}::test_rollout_only_under_rollout_ft_recovers_a_dead_engine_at_the_next_generate",),
    ),
    RuntimeMutant(
        "lock_kept_on_failed_update",
        "the engine lock is not released when a weight update fails",
        CORE_TABLES,
        'coupled("the fact lock", lambda step, origin: weights.unlock_engines(step))',
        'coupled("the fact lock", lambda step, origin: None)',
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
        "rollout/watch.py",
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
        "                    if cmd is None:  # a label or a coupling: no work to wait for, recorded with its move\n",
        "                    labels.append(\n"
        "                        LedgerEntry(move.machine, move.instance, m.seq, move.trigger, move.src, move.dst,"
        " effect)\n"
        "                    )\n"
        "                    if cmd is None:  # the mutant: every effect ledgered when its move fires\n",
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
        "            raise self.engine_failure(failed.instance)",
        "            return",
        (f"{T_CONTROLLER}::test_no_rollout_ft_starts_no_monitor_and_a_dead_engine_fails_naming_the_flag",),
    ),
    # -- what a resumed run restores (issue 27) ---------------------------------------------------------------
    RuntimeMutant(
        "resume_rng_not_restored",
        "a resumed trainer restores the model and optimizer but not the random generators (it draws new numbers)",
        GROUP,
        '                await w.call("set_rng_state", self.resume.rng["ranks"][w.rank])\n',
        "",
        (f"{T_RESUME}::test_each_resumed_worker_gets_the_trainer_state_and_its_own_ranks_generators",),
    ),
    RuntimeMutant(
        "resume_rng_of_rank_0_everywhere",
        "every resumed worker gets rank 0's random generators (the ranks draw the same numbers)",
        GROUP,
        'self.resume.rng["ranks"][w.rank]',
        'self.resume.rng["ranks"][0]',
        (f"{T_RESUME}::test_each_resumed_worker_gets_the_trainer_state_and_its_own_ranks_generators",),
    ),
    RuntimeMutant(
        "resume_relabels_version_0",
        "a resumed job relaunches its engines with the checkpoint's weights labelled v0 (versions go backwards)",
        GROUP,
        'return await self._write_weights(self.resume.weight_version if self.resume is not None else "0")',
        'return await self._write_weights("0")',
        (f"{T_RESUME}::test_a_resumed_job_labels_the_relaunched_weights_with_the_checkpoints_version",),
    ),
    RuntimeMutant(
        "restart_ages_never_restored",
        "a resumed job forgets its engines' spent restarts (a crash-looping engine gets a fresh budget per resume)",
        GROUP,
        "            self.runner.restore_restart_ages(resume.restart_ages)  # before the first operation\n",
        "",
        (f"{T_RESUME}::test_restart_budget_ages_survive_a_resume_on_another_clock",),
    ),
    RuntimeMutant(
        "restart_ages_read_as_times",
        "a checkpoint's restart ages are read back as times of the new driver's clock (the budget is wrong)",
        RUNNER,
        "tuple(tuple(now - a for a in row) for row in ages)",
        "tuple(tuple(a for a in row) for row in ages)",
        (f"{T_RESUME}::test_restart_budget_ages_survive_a_resume_on_another_clock",),
    ),
    RuntimeMutant(
        "restart_ages_saved_as_times",
        "a checkpoint keeps restart times of the dead driver's monotonic clock, meaningless to the next one",
        RUNNER,
        "return [[round(now - t, 3) for t in e.restarts] for e in self.state.engines]",
        "return [[round(t, 3) for t in e.restarts] for e in self.state.engines]",
        (f"{T_RESUME}::test_restart_budget_ages_survive_a_resume_on_another_clock",),
    ),
    # -- withdrawing a drained or marked engine from routing ------------------------------------------------
    RuntimeMutant(
        "local_withdraw_keeps_member",
        "in-process routing keeps a withdrawn engine: requests still reach a drained or marked engine",
        ROUTING,
        "        self._members.pop(engine.id, None)\n        for request in self._inflight.pop(engine.id, ()):",
        "        for request in self._inflight.pop(engine.id, ()):",
        (f"{T_WITHDRAW}::test_a_withdrawn_engine_gets_no_more_requests_in_process",),
    ),
    RuntimeMutant(
        "local_withdraw_leaves_batch_waiting",
        "in-process routing withdraws a hung engine but leaves the batch out to it: the rollout waits on it for ever",
        ROUTING,
        "            request.cancel()  # its prompts are not answered",
        "            pass  # its prompts are not answered",
        (f"{T_WITHDRAW}::test_withdrawing_an_engine_cancels_its_batch_out_and_its_prompts_go_to_the_others",),
    ),
    RuntimeMutant(
        "router_withdraw_forgets_router",
        "withdrawing drops the engine from the shell's books but never unregisters it at the gateway (SMG)",
        ROUTING,
        "            await self.router.remove(url)\n",
        "            pass\n",
        (f"{T_WITHDRAW}::test_withdrawing_unregisters_the_engine_at_the_router_itself",),
    ),
    RuntimeMutant(
        "stop_routing_unbound",
        "the engine's stop_routing effect does nothing: an engine that leaves Serving stays routed",
        CONTROLLER,
        '"engine.stop_routing": lambda c: self.routings[self._group(c)].withdraw(self.slot(c)),',
        '"engine.stop_routing": lambda c: asyncio.sleep(0),',
        (f"{T_CONTROLLER}::test_the_routing_holds_exactly_the_serving_engines_after_a_recovery_and_a_drain",),
    ),
    # -- a monitor's consecutive failures ---------------------------------------------------------------------
    RuntimeMutant(
        "probe_success_keeps_failure_count",
        "a successful probe does not reset the failure count: a flaky but healthy engine is marked in the end",
        HEALTH,
        "            h.failures = 0\n",
        "            pass\n",
        (f"{T_HEALTH}::test_only_consecutive_failures_count_a_success_starts_the_count_again",),
    ),
    RuntimeMutant(
        "failure_threshold_off_by_one",
        "the monitor marks an engine one failed probe after the threshold",
        HEALTH,
        "if h.failures < self.config.rollout_health_check_failure_threshold:",
        "if h.failures <= self.config.rollout_health_check_failure_threshold:",
        (f"{T_HEALTH}::test_only_consecutive_failures_count_a_success_starts_the_count_again",),
    ),
    # -- confirming a stop ------------------------------------------------------------------------------------
    RuntimeMutant(
        "kill_reports_dead_unconfirmed",
        "the engine slot reports a kill as dead once SIGKILL is sent, before the death is confirmed",
        ENGINE,
        "if not await self.launcher.wait_dead(self.timeouts.death):",
        "if False:",
        (f"{T_SLOT}::test_a_kill_whose_death_is_not_confirmed_is_alive_not_dead",),
    ),
    RuntimeMutant(
        "wait_dead_timeout_is_death",
        "a process still running when the wait for its death runs out is reported dead",
        LAUNCHER,
        "        except EngineTimeout:\n            return False\n        return True",
        "        except EngineTimeout:\n            return True\n        return True",
        (f"{T_SLOT}::test_a_process_that_has_not_exited_is_not_reported_dead",),
    ),
    RuntimeMutant(
        "alive_after_kill_taken_as_dead",
        "the core takes a kill answered 'alive' as a death: Stopped (or restarted beside) a live zombie",
        CORE_TABLES,
        '        "kill_engine",\n        "alive",\n',
        '        "kill_engine",\n        "never",\n',
        (
            f"{T_STOP}::test_a_stop_whose_death_is_not_confirmed_never_reaches_stopped_and_stops_the_run",
            f"{T_STOP}::test_a_recovery_whose_kill_is_not_confirmed_never_starts_a_second_process",
        ),
    ),
    # -- tearing down the weight-update group on both sides ----------------------------------------------------
    RuntimeMutant(
        "destroy_forgets_the_engines",
        "destroying the weight-update group forgets its engines first: they stay in it and refuse the next init",
        BROADCAST,
        "members, self.members = self.members, []",
        "members, self.members = [], []",
        (f"{T_TEARDOWN}::test_destroying_the_group_makes_rank_0_and_every_engine_that_joined_leave",),
    ),
    RuntimeMutant(
        "trainer_never_leaves_the_group",
        "destroying the weight-update group makes the engines leave but not trainer worker 0 (rank 0)",
        BROADCAST,
        "await asyncio.gather(leave, *calls, return_exceptions=True)",
        "leave.close()\n        await asyncio.gather(*calls, return_exceptions=True)",
        (f"{T_TEARDOWN}::test_destroying_the_group_makes_rank_0_and_every_engine_that_joined_leave",),
    ),
    RuntimeMutant(
        "engine_leave_never_sent",
        "an engine slot's leave_group never calls /destroy_weights_update_group on its server",
        ENGINE,
        "        if self.server is not None:\n            with contextlib.suppress(EngineError):\n"
        "                await self.server.leave_group(",
        "        if self.server is None:\n            with contextlib.suppress(EngineError):\n"
        "                await self.server.leave_group(",
        (f"{T_SLOT}::test_leaving_the_weight_update_group_reaches_the_server",),
    ),
    RuntimeMutant(
        "engine_keeps_destroyed_group",
        "the CPU engine closes a destroyed group but keeps it registered: the next init is refused",
        "engines/cpu/engine.py",
        "group = self.groups.pop(body.group_name, None)",
        "group = self.groups.get(body.group_name)",
        (
            "tests/engines/cpu/test_distributed.py::"
            "test_a_destroyed_group_is_gone_from_the_engine_and_the_next_update_forms_it_again",
        ),
    ),
    RuntimeMutant(
        "leaving_keeps_the_connections",
        "leaving the group only flags it closed: members blocked in a collective wait out their whole deadline",
        WEIGHT_GROUP,
        "        self.closed = True\n        with contextlib.suppress(Exception):  # already broken: nothing more to "
        "release\n            self.pg.shutdown()\n        del self.pg\n",
        "        self.closed = True\n",
        (f"{T_TEARDOWN}::test_when_rank_0_leaves_a_member_blocked_in_the_collective_fails_now_not_at_its_deadline",),
    ),
    # -- publishing an engine only once it holds the weights ---------------------------------------------------
    RuntimeMutant(
        "load_unverified",
        "a weight load counts as loaded without /model_info reporting the version (it serves the old weights)",
        ENGINE,
        "if got != version:",
        "if False:",
        (f"{T_SLOT}::test_a_load_counts_only_once_the_server_reports_the_version",),
    ),
    RuntimeMutant(
        "refused_load_finishes_update",
        "an engine that refused the weights finishes its update and serves with the old ones",
        CORE_TABLES,
        '        "transfer_weights",\n        "loaded",\n',
        '        "transfer_weights",\n        "refused",\n        "planted",\n'
        "        lambda step, cmd, o: weights.loaded(step, cmd),\n        engine_updating,\n    ),\n"
        '    ResultRow(\n        "engine",\n        "transfer_weights",\n        "loaded",\n',
        (f"{T_CORE}::test_an_engine_that_refuses_the_weights_never_serves_with_the_old_ones",),
    ),
    # -- a resumed job is the job it continues -------------------------------------------------------------------
    RuntimeMutant(
        "resume_skips_python_rng",
        "a resumed worker restores torch's generator but not Python's: its sampling after the resume is not the job's",
        "trainer/workers.py",
        '        if "python" in state:\n',
        "        if False:\n",
        ("tests/trainer/app/test_resume_fast.py::test_a_workers_generators_survive_the_checkpoint_on_disk",),
    ),
    RuntimeMutant(
        "resume_engines_from_initial_weights",
        "a resumed job's engines start from the initial weights, not the checkpoint's version (they serve version 0)",
        "trainer/app/job.py",
        "weights = await trainer.start() or await initial_weights(",
        "weights = await trainer.start() and await initial_weights(",
        ("tests/trainer/app/test_resume_fast.py::test_the_resumed_engines_start_from_the_checkpoints_version",),
    ),
    RuntimeMutant(
        "launch_publishes",
        "an engine is registered for routing as soon as its server answers, before it holds the weights (miles #1724)",
        CONTROLLER,
        '        if outcome.name == "ready":\n            await self._keep(engine)\n',
        '        if outcome.name == "ready":\n            await self.routings[self._group(cmd)].publish(engine)\n'
        "            await self._keep(engine)\n",
        (f"{T_CONTROLLER}::test_the_routing_holds_exactly_the_serving_engines_after_a_recovery_and_a_drain",),
    ),
    # -- the stream (--fully-async) ----------------------------------------------------------------------------
    RuntimeMutant(
        "requeue_keeps_the_stale_group",
        "the take's requeue_prompts re-sends a stale group's prompt but leaves the group in the batch: it is trained "
        "(the staleness filter silently inert, miles #2244's symptom)",
        STREAM,
        "        group = self.offered.pop(0)\n",
        "        group = self.offered[0]\n",
        (f"{T_STREAM}::test_a_dropped_group_is_never_trained_and_its_prompt_comes_back",),
    ),
    RuntimeMutant(
        "stamp_at_finish",
        "a sample is stamped with the version committed when its request finished, not the oldest it may hold: a "
        "request that spans an update looks fresh (rllm #622: under-counted staleness)",
        STREAM,
        "                answers[r.index] = (a, a.engine, first, last)\n",
        "                answers[r.index] = (a, a.engine, last, last)\n",
        (f"{T_STREAM}::test_a_stream_learns_within_its_bound_while_updates_land_mid_request[1]",),
    ),
    RuntimeMutant(
        "resume_forgets_the_stream_version",
        "a resumed stream's core counts its weight version from 0 again (miles #2244: 57 -> 1): its restored groups "
        "look newer than the version",
        GROUP,
        "                self.runner.restore_stream(int(resume.weight_version))\n",
        "                pass\n",
        (f"{T_STREAM}::test_a_stream_saves_and_resumes_its_version_and_queue",),
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


def child_environ() -> dict[str, str]:
    """This process's environment for a child, less pytest's per-test variable. Read it on the test session's
    thread and hand it to a pool's worker: a worker reading os.environ races pytest setting and removing
    PYTEST_CURRENT_TEST between tests (a KeyError in CI)."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def run_tests(
    tree: Path, tests: list[str], *, timeout: float = 900.0, environ: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The fast suite's tests ``tests`` on ``tree`` (its packages shadow the installed ones)."""
    env = {**(child_environ() if environ is None else environ), "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    contracts = ROOT.parent / "shared" / "contracts"
    if "LIFECYCLE_CONTRACTS" not in env and contracts.is_dir():
        env["LIFECYCLE_CONTRACTS"] = str(contracts)
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider", *tests]
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)


def kill(
    mutant: RuntimeMutant, tests: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        tree = mutated_copy(mutant, Path(tmp))
        return run_tests(tree, list(tests if tests is not None else mutant.killers), environ=environ)


def markdown_table() -> str:
    lines = ["| runtime mutant | bug | module | killed by (fast suite) |", "|---|---|---|---|"]
    for m in MUTANTS:
        killers = ", ".join(f"`{k.split('::')[-1]}`" for k in m.killers)
        lines.append(f"| `{m.name}` | {m.bug} | `{m.path}` | {killers} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="print the table of docs/checking.md")
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
