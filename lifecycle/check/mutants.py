"""The bug classes that hit miles, re-introduced one at a time into copies of the real specs.

Each mutant is a small, named edit of the shipped machines (never of the files): the checker and
the hypothesis suite must both reject every one. ``lifecycle check --mutant NAME`` shows the
counterexample a mutant produces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from lifecycle.decide.machines import MACHINES
from lifecycle.decide.spec import EffectRef, Guard, MachineSpec, TransitionSpec


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str  # what the mutant re-introduces, in the words of the miles history
    edit: Callable[[dict[str, MachineSpec]], dict[str, MachineSpec]]

    def machines(self) -> dict[str, MachineSpec]:
        return self.edit(dict(MACHINES))


def _edit(
    machine: str, match: Callable[[TransitionSpec], bool], change: Callable[[TransitionSpec], TransitionSpec]
) -> Callable[[dict[str, MachineSpec]], dict[str, MachineSpec]]:
    def apply(specs: dict[str, MachineSpec]) -> dict[str, MachineSpec]:
        spec = specs[machine]
        hits = [t for t in spec.transitions if match(t)]
        if not hits:
            raise LookupError(f"mutant edit matched no transition of {machine}")
        new = tuple(change(t) if match(t) else t for t in spec.transitions)
        specs[machine] = replace(spec, transitions=new)  # re-validated like any spec
        return specs

    return apply


def _regate(effect: str, predicate: str) -> Callable[[TransitionSpec], TransitionSpec]:
    """Gate ``effect`` on another predicate (the wrong one)."""

    def change(t: TransitionSpec) -> TransitionSpec:
        effects = tuple(EffectRef(e.name, Guard.parse(predicate)) if e.name == effect else e for e in t.effects)
        return replace(t, effects=effects)

    return change


def _effects(*names: str) -> Callable[[TransitionSpec], TransitionSpec]:
    return lambda t: replace(t, effects=tuple(EffectRef.parse(n) for n in names))


def _is(trigger: str, source: str | None = None) -> Callable[[TransitionSpec], bool]:
    return lambda t: t.trigger == trigger and (source is None or source in t.source)


def _has_effect(effect: str) -> Callable[[TransitionSpec], bool]:
    return lambda t: any(e.name == effect for e in t.effects)


def _chain(
    *edits: Callable[[dict[str, MachineSpec]], dict[str, MachineSpec]],
) -> Callable[[dict[str, MachineSpec]], dict[str, MachineSpec]]:
    def apply(specs: dict[str, MachineSpec]) -> dict[str, MachineSpec]:
        for e in edits:
            specs = e(specs)
        return specs

    return apply


def _resumes(t: TransitionSpec) -> TransitionSpec:
    """The move resumes the engine into routing instead (``finally: continue_generation``)."""
    effects = tuple(EffectRef.parse(n) for n in ("continue_generation", "route_traffic"))
    return replace(t, dest="Serving", effects=effects)


def _unfence(*machines: str) -> Callable[[dict[str, MachineSpec]], dict[str, MachineSpec]]:
    """The machines act on news whatever engine generation it names."""

    def apply(specs: dict[str, MachineSpec]) -> dict[str, MachineSpec]:
        for machine in machines:
            specs[machine] = replace(specs[machine], fenced=frozenset())
        return specs

    return apply


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "replay_constructs_rollout_fn",
            "replay constructs the rollout function (miles: class-based rollout built eagerly in __init__)",
            _edit(
                "rollout",
                _is("init", "Init"),
                lambda t: (
                    replace(t, effects=(EffectRef("construct_rollout_fn"), EffectRef("construct_eval_fn")))
                    if t.dest == "Replay"
                    else t
                ),
            ),
        ),
        Mutant(
            "construction_gated_on_train_only",
            "the construction gate tests debug_train_only instead of replay (breaks SFT data production)",
            _edit(
                "rollout",
                _is("init", "Init"),
                lambda t: replace(t, guards=(Guard("train_only", t.dest != "Replay"),)),
            ),
        ),
        Mutant(
            "monitors_on_ft_master_switch",
            "health monitors started on --use-fault-tolerance instead of rollout_ft",
            _chain(
                _edit("rollout", _has_effect("start_monitor"), _regate("start_monitor", "ft_enabled")),
                _edit("monitor", _is("create"), lambda t: replace(t, guards=(Guard("ft_enabled"),))),
            ),
        ),
        Mutant(
            "ci_injection_without_rollout_ft",
            "CI fault injection armed on --ci-test alone, without rollout_ft",
            _edit("rollout", _has_effect("arm_ci_fault_injection"), _regate("arm_ci_fault_injection", "ci_mode")),
        ),
        Mutant(
            "trainer_recovery_on_ft_master_switch",
            "the trainer's update_weights recovers rollout engines on --use-fault-tolerance alone",
            _edit("trainer", _has_effect("recover_engine"), _regate("recover_engine", "ft_enabled")),
        ),
        Mutant(
            "eval_fleet_skips_self_probe",
            "the eval fleet skips its own probing when rollout FT is off (nobody probes)",
            _edit(
                "eval_fleet",
                _is("pin", "Idle"),
                lambda t: replace(t, guards=(Guard("rollout_ft", t.dest == "Restarting"),)),
            ),
        ),
        Mutant(
            "recovered_engine_routable_early",
            "a (re)started engine becomes routable before it holds the current weights (an aborted load counts)",
            _edit("engine", _is("abort_update", "LoadingWeights"), lambda t: replace(t, dest="Quiesced")),
        ),
        Mutant(
            "lock_kept_on_failed_update",
            "the engine lock is not released when a weight update fails",
            _edit("rollout", _is("update_failed", "UpdatingWeights"), _effects()),
        ),
        Mutant(
            "stopped_before_death_confirmed",
            "an engine is marked Stopped before its death is confirmed",
            _edit(
                "engine",
                lambda t: t.trigger == "stop" and "Unhealthy" in t.source,
                lambda t: replace(t, dest="Stopped"),
            ),
        ),
        Mutant(
            "external_engine_restarted",
            "an engine started outside the job (slime's --rollout-external-engine-addrs) is restarted by rollout FT",
            _chain(
                _edit("engine", _is("recover", "Unhealthy"), lambda t: replace(t, guards=(Guard("rollout_ft"),))),
                _edit("engine", _is("detach", "Unhealthy"), lambda t: replace(t, guards=(Guard.parse("!rollout_ft"),))),
            ),
        ),
        Mutant(
            "probe_result_after_pause",
            "a probe result is acted on after the monitor was paused",
            _edit("monitor", _is("threshold_reached", "Paused"), _effects("mark_engine_unhealthy")),
        ),
        Mutant(
            "stale_group_broadcast",
            "the weight-update group notices a membership change only during a broadcast: an engine restarted "
            "between updates gets the next broadcast over a group its new process never joined (miles "
            "#1444/#2092: has_new_engines, connection freshness)",
            _edit(
                "weight_sync", _is("membership_changed", "Connected"), lambda t: replace(t, source=("Broadcasting",))
            ),
        ),
        Mutant(
            "aborted_broadcast_served",
            "an engine whose distributed update failed goes back into routing with the half-written weights it "
            "holds (sglang-omni #784)",
            _edit(
                "engine",
                _is("abort_update", "UpdatingWeights"),
                lambda t: replace(
                    t,
                    dest="Serving",
                    effects=tuple(EffectRef.parse(n) for n in ("continue_generation", "route_traffic")),
                ),
            ),
        ),
        Mutant(
            "news_epochs_ignored",
            "news about an engine's previous process is acted on after its restart: a verdict of an older "
            "generation marks the new process (miles #2172)",
            _unfence("engine", "monitor"),
        ),
        Mutant(
            "adopted_behind_served",
            "a resumed job adopts a kept engine that holds a later (voided) or torn version without reloading it: it "
            "serves weights the job's checkpoint never committed (a takeover nobody checks)",
            _edit("engine", _is("adopted_behind"), lambda t: replace(t, dest="Quiesced")),
        ),
        Mutant(
            "staleness_guard_dropped",
            "the staleness filter is gone: the trainer takes every buffered group, however many versions behind its "
            "oldest token is (slime #1800: fully_async neither tracks versions nor bounds staleness)",
            _edit("rollout", _is("drop_stale"), lambda t: replace(t, trigger="drop_stale_never_fired")),
        ),
        Mutant(
            "version_reset_on_resume",
            "a resumed stream counts its weight version from 0 again instead of the checkpoint's, so the groups it "
            "restored look newer than the version (miles #2244: a failover published 57 -> 1)",
            _edit(
                "trainer",
                _is("restored"),
                lambda t: replace(t, effects=tuple(e for e in t.effects if e.name != "restore_weight_version")),
            ),
        ),
        Mutant(
            "failed_refit_resumes",
            "a failed in-flight refit resumes the engines it paused, serving weights that were never published "
            "(the SMG paused() helper: continue_generation on every exit)",
            _chain(
                _edit("engine", _is("abort_update", "UpdatingInFlight"), _resumes),
                _edit("engine", _is("revert", "Paused"), _resumes),
            ),
        ),
        Mutant(
            "join_routed_before_catch_up",
            "a joining engine is taken as quiesced once it is up, skipping its catch-up load: the next resume routes "
            "it on its launch weights (a scale-up served by a stale or random checkpoint)",
            _edit("engine", _is("ready", "Joining"), lambda t: replace(t, dest="Quiesced")),
        ),
        Mutant(
            "draining_engine_routed",
            "a retired engine drains without leaving the gateway: requests keep going to an engine about to be "
            "stopped (NeMo-RL #3613: deregistration skipped on one way out)",
            _edit("engine", _is("retire", "Serving"), _effects("drain_requests")),
        ),
        Mutant(
            "departed_member_awaited",
            "the weight-update group does not notice a planned departure: the next broadcast waits on a rank that "
            "left (AReaL #1086: a group cannot be shrunk in place, it must be formed anew)",
            _edit("weight_sync", _is("member_left", "Connected"), lambda t: replace(t, dest="Connected")),
        ),
        Mutant(
            "preempted_engine_failed",
            "a preemption notice is treated as a death: the engine is marked unhealthy and, without rollout FT, the "
            "whole run stops (verl #6583: one engine's end brought a 256-GPU job down)",
            _edit("engine", _is("retire", "Serving"), lambda t: replace(t, dest="Unhealthy", effects=t.effects[:1])),
        ),
        Mutant(
            "death_while_paused_ignored",
            "an engine that dies while monitors are paused is still counted alive",
            _edit("monitor", _is("engine_died", "Paused"), _effects()),
        ),
    )
}
