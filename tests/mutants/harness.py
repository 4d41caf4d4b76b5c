"""Run one mutant against the explorer and against the hypothesis suite; render the kill table.

Witness hints say where a mutant is observable (as predicate values), so the explorer tries
those lattice groups first and hypothesis draws only those configs. They are *ordering hints*:
the explorer falls back to every other group of the lattice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from jobmodel import JobModelBase, make_machine

from lifecycle.check.explore import explore, lattice
from lifecycle.check.mutants import MUTANTS
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.predicates import evaluate
from lifecycle.decide.spec import MachineSpec

# Where each mutant shows (predicate values); every one shows with a single engine but an elastic fleet's
# (MUTANT_ENGINES_OF).
WITNESS: dict[str, dict[str, bool]] = {
    "replay_constructs_rollout_fn": {"replay": True},
    "construction_gated_on_train_only": {"train_only": True, "replay": False},
    "monitors_on_ft_master_switch": {"ft_enabled": True, "rollout_ft": False, "starts_servers": True},
    "ci_injection_without_rollout_ft": {"ci_mode": True, "rollout_ft": False, "starts_servers": True},
    "trainer_recovery_on_ft_master_switch": {"ft_enabled": True, "rollout_ft": False, "updates_rollout_weights": True},
    "eval_fleet_skips_self_probe": {"eval_fleet_enabled": True},
    # a restarted engine's catch-up fails; without a trainer no weight push gets in the way
    "recovered_engine_routable_early": {"starts_servers": True, "trains": False, "eval_fleet_enabled": False},
    "lock_kept_on_failed_update": {"updates_rollout_weights": True},
    "stopped_before_death_confirmed": {"starts_servers": True},
    "probe_result_after_pause": {"monitors_rollout": True},
    "external_engine_restarted": {"external_engines": True, "rollout_ft": True},
    "death_while_paused_ignored": {"monitors_rollout": True},
    "news_epochs_ignored": {"starts_servers": True},
    "adopted_behind_served": {"keeps_engines": True},
    "stale_group_broadcast": {"broadcasts_weights": True, "rollout_ft": True},
    "aborted_broadcast_served": {"broadcasts_weights": True},
    "staleness_guard_dropped": {"streaming": True},
    "failed_refit_resumes": {"streaming": True},
    "version_reset_on_resume": {"streaming": True, "resumes": True},
    # an elastic fleet's: a join (a scale-up or a replacement), a retirement, a notice; the group's re-form
    "join_routed_before_catch_up": {"elastic": True, "streaming": False},
    "draining_engine_routed": {"elastic": True},
    "departed_member_awaited": {"elastic": True, "broadcasts_weights": True},
    "preempted_engine_failed": {"elastic": True, "rollout_ft": False},
}

# The invariants that state each bug: a kill for any other reason would be a kill by accident.
EXPECTED: dict[str, frozenset[str]] = {
    "replay_constructs_rollout_fn": frozenset({"replay_never_constructs"}),
    "construction_gated_on_train_only": frozenset({"plain_train_only_constructs_rollout_fn"}),
    "monitors_on_ft_master_switch": frozenset(
        {"monitors_only_with_rollout_ft", "train_only_ft_never_recovers_rollout"}
    ),
    "ci_injection_without_rollout_ft": frozenset({"ci_injection_only_with_rollout_ft"}),
    "trainer_recovery_on_ft_master_switch": frozenset({"recover_only_with_rollout_ft"}),
    "eval_fleet_skips_self_probe": frozenset(
        {"fleet_probes_only_when_unmonitored", "fleet_self_probes_when_unmonitored"}
    ),
    "recovered_engine_routable_early": frozenset({"serving_engines_hold_current_weights"}),
    "lock_kept_on_failed_update": frozenset({"engine_lock_held_only_while_updating"}),
    "stopped_before_death_confirmed": frozenset({"stopped_only_after_death_confirmed"}),
    "probe_result_after_pause": frozenset({"healthy_engines_are_not_marked_unhealthy"}),
    "external_engine_restarted": frozenset({"external_engines_never_restarted"}),
    "death_while_paused_ignored": frozenset({"dead_engines_are_not_counted_alive"}),
    "news_epochs_ignored": frozenset({"no_news_of_an_older_epoch_acted_on"}),
    "adopted_behind_served": frozenset({"serving_engines_hold_current_weights"}),
    "stale_group_broadcast": frozenset({"no_broadcast_on_stale_group"}),
    "aborted_broadcast_served": frozenset(
        {"no_engine_routed_with_mixed_weights", "serving_engines_hold_current_weights"}
    ),
    "staleness_guard_dropped": frozenset({"no_trained_group_beyond_staleness"}),
    "failed_refit_resumes": frozenset({"no_generation_after_failed_update", "serving_engines_hold_current_weights"}),
    "version_reset_on_resume": frozenset({"no_group_newer_than_the_version"}),
    "join_routed_before_catch_up": frozenset({"serving_engines_hold_current_weights"}),
    "draining_engine_routed": frozenset({"withdrawn_before_it_leaves"}),
    "departed_member_awaited": frozenset({"no_broadcast_on_stale_group"}),
    "preempted_engine_failed": frozenset({"planned_leave_never_fails_the_run"}),
}

# Hypothesis budget: the slowest mutant falls within ~400 runs; 3000 leaves a wide margin.
# Generation only: a kill is what is proven here, and shrinking a 50-step run costs minutes.
MUTANT_SETTINGS = settings(
    max_examples=3000,
    stateful_step_count=50,
    deadline=None,
    database=None,
    derandomize=True,
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
MUTANT_ENGINES = (1,)
# an elastic fleet's mutants need a second slot: one engine leaves while another stays in the weight-update group
# (with one slot, a replacement's launch re-forms the group anyway)
ELASTIC_MUTANTS = (
    "join_routed_before_catch_up",
    "draining_engine_routed",
    "departed_member_awaited",
    "preempted_engine_failed",
)
MUTANT_ENGINES_OF = {name: (2,) for name in ELASTIC_MUTANTS}


def witness_configs(name: str) -> list[LifecycleConfig]:
    want = WITNESS[name]
    return [c for c in lattice().valid if all(evaluate(c)[k] == v for k, v in want.items())]


def ordered_groups(name: str) -> list[list[LifecycleConfig]]:
    """Every lattice group, those matching the mutant's witness hint first."""
    want = WITNESS[name]

    def hinted(group: list[LifecycleConfig]) -> bool:
        return all(evaluate(group[0])[k] == v for k, v in want.items())

    groups = list(lattice().groups.values())
    return sorted(groups, key=lambda g: not hinted(g))  # stable: lattice order within each half


@dataclass(frozen=True)
class ExplorerKill:
    invariant: str
    steps: int
    config: LifecycleConfig
    groups_tried: int
    rendered: str


@dataclass(frozen=True)
class HypothesisKill:
    invariant: str
    message: str
    steps: int


@functools.cache
def explorer_kill(name: str, engines: int = 2) -> ExplorerKill | None:
    machines = MUTANTS[name].machines()
    for n, group in enumerate(ordered_groups(name), start=1):
        result = explore(group[0], engines=engines, machines=machines)
        if result.violations:
            v = result.violations[0]
            return ExplorerKill(v.invariant, len(v.path), group[0], n, v.render())
    return None


def invariant_of(message: str) -> str:
    """``invariant NAME: ...`` (the suite's assertion messages) -> NAME; otherwise the first line."""
    first = message.strip().splitlines()[0] if message.strip() else "(assertion without message)"
    return first.split(":", 1)[0].removeprefix("invariant ") if first.startswith("invariant ") else first


def run_hypothesis(cls: type[JobModelBase], st: settings = MUTANT_SETTINGS) -> HypothesisKill | None:
    """Run a state machine class; the failure it raised, or None when every run passed."""
    try:
        run_state_machine_as_test(cls, settings=st)
    except AssertionError as exc:
        message = str(exc)
        steps = sum(1 for line in message.splitlines() if line.lstrip()[:1].isdigit())
        return HypothesisKill(invariant_of(message), message, steps)
    return None


def mutant_machine(name: str, machines: dict[str, MachineSpec] | None = None) -> type[JobModelBase]:
    specs = MUTANTS[name].machines() if machines is None else machines
    return make_machine(specs, witness_configs(name), engines=MUTANT_ENGINES_OF.get(name, MUTANT_ENGINES))


@functools.cache
def hypothesis_kill(name: str) -> HypothesisKill | None:
    return run_hypothesis(mutant_machine(name))


def markdown_table() -> str:
    """The kill table of ``docs/checking.md``: mutant | bug | explorer | hypothesis."""
    lines = [
        "| mutant | bug | killed by explorer (invariant, counterexample length) | killed by hypothesis (invariant) |",
        "|---|---|---|---|",
    ]
    for name, mutant in MUTANTS.items():
        e = explorer_kill(name)
        h = hypothesis_kill(name)
        ex = f"`{e.invariant}`, {e.steps} steps" if e else "**survived**"
        hy = f"`{h.invariant}`" if h else "**survived**"
        lines.append(f"| `{name}` | {mutant.bug} | {ex} | {hy} |")
    return "\n".join(lines)
