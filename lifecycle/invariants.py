"""The job-level invariants (the README's invariant table) and the effect-gating rules, as named functions.

Three kinds, each a plain function the explorer *and* the hypothesis suite call:

* ``state``  -- ``fn(job, state) -> problem | None``, over one product state;
* ``step``   -- ``fn(job, transition, before) -> problem | None``, over one product step and the
  effects it recorded (its slice of the ledger);
* ``reach``  -- ``fn(job, seen_effects) -> problem | None``, over every effect seen while
  exploring (none registered today: "must happen" rules are written as step obligations, e.g.
  "plain train-only's init constructs the rollout function", so hypothesis can check them too).

``no_deadlock`` and ``no_stuck_recovery`` are properties of the whole state graph; the explorer
implements them and lists them here so that ``--invariant`` can select them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lifecycle.job import (
    BUSY_ROLLOUT,
    DEAD_NOTIFIED,
    LIVE,
    UP,
    UPDATING_ROLLOUT,
    Job,
    Product,
    Transition,
)

Problem = str | None


@dataclass(frozen=True)
class Invariant:
    name: str
    kind: str  # state | step | reach | graph
    fn: Callable[..., Problem] | None
    doc: str


INVARIANTS: dict[str, Invariant] = {}


def _register(kind: str) -> Callable[[Callable[..., Problem]], Callable[..., Problem]]:
    def deco(fn: Callable[..., Problem]) -> Callable[..., Problem]:
        doc = " ".join((fn.__doc__ or "").split())
        INVARIANTS[fn.__name__] = Invariant(fn.__name__, kind, fn, doc)
        return fn

    return deco


def _effects(t: Transition, machine: str | None = None) -> Iterable[tuple[str, str]]:
    for m in t.moves:
        if machine is None or m.machine == machine:
            for e in m.effects:
                yield m.instance, e


# -- 1, 2: the construction gate -------------------------------------------------------------------
NEVER_IN_REPLAY = frozenset(
    {"construct_rollout_fn", "construct_eval_fn", "start_servers", "start_monitor", "start_eval_fleet"}
)


@_register("step")
def replay_never_constructs(job: Job, t: Transition, before: Product) -> Problem:
    """(1) Replay never constructs the rollout/eval function and starts no server, monitor or fleet."""
    if job.p["replay"]:
        for who, effect in _effects(t):
            if effect in NEVER_IN_REPLAY:
                return f"{who} performed {effect} while replaying (--load-debug-rollout-data)"
    return None


@_register("step")
def train_only_starts_no_server(job: Job, t: Transition, before: Product) -> Problem:
    """(2) --debug-train-only starts no rollout server."""
    if job.p["train_only"]:
        for who, effect in _effects(t):
            if effect == "start_servers":
                return f"{who} started servers under --debug-train-only"
    return None


@_register("step")
def plain_train_only_constructs_rollout_fn(job: Job, t: Transition, before: Product) -> Problem:
    """(2) Plain --debug-train-only (no replay) still constructs the rollout function: it is the data source."""
    if job.p["train_only"] and not job.p["replay"]:
        for m in t.moves:
            if m.machine == "rollout" and m.trigger == "init" and "construct_rollout_fn" not in m.effects:
                return "--debug-train-only without replay skipped constructing the rollout function (no data for SFT)"
    return None


# -- 3: rollout FT is the one gate -------------------------------------------------------------------
@_register("step")
def recover_only_with_rollout_ft(job: Job, t: Transition, before: Product) -> Problem:
    """(3) recover_engine runs only under rollout FT -- engine side and trainer side."""
    if not job.p["rollout_ft"]:
        for who, effect in _effects(t):
            if effect == "recover_engine":
                return f"{who} performed recover_engine without rollout fault tolerance"
    return None


@_register("step")
def monitors_only_with_rollout_ft(job: Job, t: Transition, before: Product) -> Problem:
    """(3) Health monitors are started, and probe, only when monitors_rollout (servers + rollout FT)."""
    if not job.p["monitors_rollout"]:
        for who, effect in _effects(t):
            if effect == "start_monitor" or (who == "monitor" and effect == "probe_engine"):
                return f"{who} performed {effect} although monitors_rollout is false"
    return None


@_register("step")
def ci_injection_only_with_rollout_ft(job: Job, t: Transition, before: Product) -> Problem:
    """(3) CI fault injection is armed only under rollout FT (ci_injects_rollout_faults)."""
    if not job.p["ci_injects_rollout_faults"]:
        for who, effect in _effects(t):
            if effect == "arm_ci_fault_injection":
                return f"{who} armed CI fault injection without rollout fault tolerance"
    return None


@_register("step")
def fleet_probes_only_when_unmonitored(job: Job, t: Transition, before: Product) -> Problem:
    """(3) The eval fleet probes its engines only when no monitor does (eval_fleet_self_probes)."""
    if not job.p["eval_fleet_self_probes"]:
        for who, effect in _effects(t, "eval_fleet"):
            if effect == "probe_engine":
                return f"{who} probed its engines although rollout monitors cover them"
    return None


@_register("step")
def fleet_self_probes_when_unmonitored(job: Job, t: Transition, before: Product) -> Problem:
    """(3) When no rollout monitor exists (rollout FT off), the eval fleet's pin probes its engines itself."""
    if job.p["eval_fleet_self_probes"]:
        for m in t.moves:
            if m.machine == "eval_fleet" and m.trigger == "pin" and "probe_engine" not in m.effects:
                return "the eval fleet pinned without probing, and no rollout monitor probes its engines"
    return None


@_register("state")
def train_only_ft_never_recovers_rollout(job: Job, s: Product) -> Problem:
    """(3) With --ft-components train no engine is ever Recovering and no monitor exists."""
    if job.p["train_ft"] and not job.p["rollout_ft"]:
        if any(e.state == "Recovering" for e in s.engines):
            return "an engine is Recovering under train-only fault tolerance"
        if s.monitor not in ("Init",):
            return f"a rollout monitor is {s.monitor} under train-only fault tolerance"
    return None


# -- 4: routing ---------------------------------------------------------------------------------------
@_register("state")
def serving_engines_hold_current_weights(job: Job, s: Product) -> Problem:
    """(4) Every Serving (routable) engine holds the committed weight version; recovered ones wait in PendingWeights."""
    for i, e in enumerate(s.engines):
        if e.state == "Serving" and not e.current:
            return f"engine-{i} is Serving without the current weight version"
    return None


@_register("step")
def traffic_only_to_serving(job: Job, t: Transition, before: Product) -> Problem:
    """(4) route_traffic happens only on a transition into Serving."""
    for m in t.moves:
        if "route_traffic" in m.effects and m.dst != "Serving":
            return f"{m.instance} made routable while entering {m.dst}"
    return None


# -- 5: weight updates ----------------------------------------------------------------------------------
@_register("step")
def weight_update_targets_quiesced_snapshot(job: Job, t: Transition, before: Product) -> Problem:
    """(5) A weight update starts on one snapshot of quiesced, weight-holding engines, with monitors paused."""
    for m in t.moves:
        if m.machine == "rollout" and m.trigger == "begin_update":
            if before.monitor == "Running":
                return "a weight update started while the health monitor was running"
            if not job.snapshot_ready(before):
                states = ", ".join(e.state for e in before.engines)
                return f"a weight update started on a fleet that is not one quiesced snapshot ({states})"
    return None


@_register("state")
def engine_lock_held_only_while_updating(job: Job, s: Product) -> Problem:
    """(5) The engine lock is held exactly while the rollout side updates weights: released on every exit."""
    updating = s.rollout in UPDATING_ROLLOUT
    if s.lock and not updating:
        return f"the engine lock is still held in rollout state {s.rollout}"
    if updating and not s.lock:
        return "weights are being updated without the engine lock"
    return None


# -- 6: offload/onload -------------------------------------------------------------------------------------
_RELEASED = {
    "Offloaded": frozenset({"weights", "kv_cache"}),
    "WeightsOnly": frozenset({"kv_cache"}),
    "UpdatingWeightsKVReleased": frozenset({"kv_cache"}),
}


@_register("state")
def onload_restores_what_offload_released(job: Job, s: Product) -> Problem:
    """(6) An engine's released memory tags match its state; a resident state has released nothing."""
    for i, e in enumerate(s.engines):
        if e.state in LIVE and e.released != _RELEASED.get(e.state, frozenset()):
            return f"engine-{i} is {e.state} with released memory {sorted(e.released)}"
    return None


@_register("step")
def offload_only_from_quiesced(job: Job, t: Transition, before: Product) -> Problem:
    """(6) Memory is released only from a quiesced engine while no generation or eval runs."""
    for m in t.moves:
        released = {"release_weights", "release_kv_cache"} & set(m.effects)
        if m.machine == "engine" and released and (m.src != "Quiesced" or before.rollout in BUSY_ROLLOUT):
            return f"{m.instance} released memory from {m.src} while the rollout manager was {before.rollout}"
    return None


# -- 7: monitors -----------------------------------------------------------------------------------------------
@_register("state")
def monitors_run_only_during_generate_or_eval(job: Job, s: Product) -> Problem:
    """(7) A monitor runs only while the rollout manager generates or evaluates."""
    if s.monitor == "Running" and s.rollout not in BUSY_ROLLOUT:
        return f"the health monitor is running while the rollout manager is {s.rollout}"
    return None


# -- health and shutdown -------------------------------------------------------------------------------------
@_register("state")
def dead_engines_are_not_counted_alive(job: Job, s: Product) -> Problem:
    """An engine whose death Ray has reported is never left in a live state (also while monitors are paused)."""
    for i, e in enumerate(s.engines):
        if e.proc == DEAD_NOTIFIED and e.state in LIVE:
            return f"engine-{i} is dead (Ray reported it) but still counted alive in {e.state}"
    return None


@_register("step")
def healthy_engines_are_not_marked_unhealthy(job: Job, t: Transition, before: Product) -> Problem:
    """A probe result is acted on only while the monitor runs: a stale failure must not kill a healthy engine."""
    for m in t.moves:
        if m.machine == "engine" and m.trigger == "mark_unhealthy":
            i = int(m.instance.rsplit("-", 1)[1])
            if before.engines[i].proc == UP:
                return f"{m.instance} was marked Unhealthy although its process is healthy (a stale probe result)"
    return None


@_register("state")
def stopped_only_after_death_confirmed(job: Job, s: Product) -> Problem:
    """An engine is Stopped only once its process is confirmed dead."""
    for i, e in enumerate(s.engines):
        if e.state == "Stopped" and e.proc != DEAD_NOTIFIED:
            return f"engine-{i} is Stopped but its process was not confirmed dead ({e.proc})"
    return None


# -- graph-level (implemented by the explorer) ------------------------------------------------------------------------
INVARIANTS["no_deadlock"] = Invariant(
    "no_deadlock", "graph", None, "Every non-terminal product state has an enabled controller event (not only faults)."
)
INVARIANTS["no_stuck_recovery"] = Invariant(
    "no_stuck_recovery",
    "graph",
    None,
    "Under rollout FT, from every state with an Unhealthy or Recovering engine, a state where all engines are "
    "Serving-capable again, or the run failed fast, is reachable.",
)
INVARIANTS["train_only_ft_rollout_side_equals_no_ft"] = Invariant(
    "train_only_ft_rollout_side_equals_no_ft",
    "lattice",
    None,
    "(8) The rollout-side machines (rollout, engine, monitor, eval fleet) behave identically under "
    "--ft-components train and without FT, so their event streams are equal.",
)

STATE = [i for i in INVARIANTS.values() if i.kind == "state"]
STEP = [i for i in INVARIANTS.values() if i.kind == "step"]
REACH = [i for i in INVARIANTS.values() if i.kind == "reach"]


def check_state(job: Job, s: Product, only: frozenset[str] | None = None) -> list[tuple[str, str]]:
    """Every state-invariant violation of ``s`` as (name, problem)."""
    out = []
    for inv in STATE:
        if only is None or inv.name in only:
            assert inv.fn is not None
            problem = inv.fn(job, s)
            if problem:
                out.append((inv.name, problem))
    return out


def check_step(
    job: Job, t: Transition, before: Product, only: frozenset[str] | None = None, *, with_state: bool = True
) -> list[tuple[str, str]]:
    """Every step-invariant violation of one product step, and of the state it reaches (``with_state``)."""
    out = []
    for inv in STEP:
        if only is None or inv.name in only:
            assert inv.fn is not None
            problem = inv.fn(job, t, before)
            if problem:
                out.append((inv.name, problem))
    return out + check_state(job, t.state, only) if with_state else out


def check_reach(
    job: Job, seen: frozenset[tuple[str, str]], only: frozenset[str] | None = None
) -> list[tuple[str, str]]:
    out = []
    for inv in REACH:
        if only is None or inv.name in only:
            assert inv.fn is not None
            problem = inv.fn(job, seen)
            if problem:
                out.append((inv.name, problem))
    return out
