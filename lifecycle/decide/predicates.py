"""Named predicates over :class:`LifecycleConfig`: the only guards the machines may use.

Each gate of the miles fixes is one function here, referenced *by name* from every site that
needs it (monitors, CI injection, trainer-side recovery, eval-fleet probing), so a graph edge
shows the name and one definition governs them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from lifecycle.decide.backends import Capabilities, capabilities

if TYPE_CHECKING:  # the config validates itself with these predicates, so it imports this module
    from lifecycle.decide.config import LifecycleConfig


@dataclass(frozen=True)
class Predicate:
    """A named, documented boolean function of the config."""

    name: str
    fn: Callable[[LifecycleConfig], bool]
    doc: str
    capability: bool = False  # an engine backend's ability: it decides which configs are valid, not what they do

    def __call__(self, config: LifecycleConfig) -> bool:
        return self.fn(config)


PREDICATES: dict[str, Predicate] = {}


def predicate(fn: Callable[[LifecycleConfig], bool]) -> Callable[[LifecycleConfig], bool]:
    """Register ``fn`` under its own name; its docstring's first line is the graph tooltip."""
    doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
    PREDICATES[fn.__name__] = Predicate(fn.__name__, fn, doc)
    return fn


def capability(fn: Callable[[LifecycleConfig], bool]) -> Callable[[LifecycleConfig], bool]:
    """Register a backend ability (:mod:`lifecycle.decide.backends`): the config refuses a combination that
    needs one the backend lacks, and no machine guard reads it, so configs that differ only in abilities
    behave alike (:func:`behaviour` leaves them out)."""
    predicate(fn)
    PREDICATES[fn.__name__] = replace(PREDICATES[fn.__name__], capability=True)
    return fn


@predicate
def ft_enabled(c: LifecycleConfig) -> bool:
    """The FT master switch (--use-fault-tolerance); gates nothing rollout-side on its own."""
    return c.use_fault_tolerance


@predicate
def ci_mode(c: LifecycleConfig) -> bool:
    """--ci-test alone; on its own it must arm nothing (rollout FT decides)."""
    return c.ci_test


@predicate
def rollout_ft(c: LifecycleConfig) -> bool:
    """Rollout fault tolerance: FT on and 'rollout' among --ft-components (the lifecycle gate)."""
    return c.use_fault_tolerance and "rollout" in c.ft_components


@predicate
def train_ft(c: LifecycleConfig) -> bool:
    """Trainer fault tolerance: FT on and 'train' among --ft-components."""
    return c.use_fault_tolerance and "train" in c.ft_components


@predicate
def replay(c: LifecycleConfig) -> bool:
    """Replaying saved rollouts (--load-debug-rollout-data): the construction gate."""
    return c.load_debug_rollout_data is not None


@predicate
def train_only(c: LifecycleConfig) -> bool:
    """No rollout servers (--debug-train-only, forced by replay)."""
    return c.debug_train_only


@predicate
def rollout_only(c: LifecycleConfig) -> bool:
    """Generate without training (--debug-rollout-only)."""
    return c.debug_rollout_only


@predicate
def trains(c: LifecycleConfig) -> bool:
    """A trainer group exists and trains (everything but rollout-only)."""
    return not c.debug_rollout_only


@predicate
def constructs_rollout_fn(c: LifecycleConfig) -> bool:
    """Build the rollout/eval functions: always, except replay (plain train-only needs them as data source)."""
    return not replay(c)


@predicate
def starts_servers(c: LifecycleConfig) -> bool:
    """Start rollout inference servers: every mode but train-only (and so replay)."""
    return not train_only(c)


@predicate
def external_engines(c: LifecycleConfig) -> bool:
    """The rollout engines were started outside the job (--rollout-external-engine-addrs): never restarted."""
    return starts_servers(c) and bool(c.rollout_external_engine_addrs)


@predicate
def monitors_rollout(c: LifecycleConfig) -> bool:
    """Create rollout health monitors: servers exist and rollout FT is on."""
    return starts_servers(c) and rollout_ft(c)


@predicate
def ci_injects_rollout_faults(c: LifecycleConfig) -> bool:
    """Arm CI fault injection on rollout engines: --ci-test under rollout FT, on engines the job started."""
    return c.ci_test and monitors_rollout(c) and not external_engines(c)


@predicate
def eval_fleet_enabled(c: LifecycleConfig) -> bool:
    """A dedicated eval fleet exists: --eval-num-gpus > 0 and servers start."""
    return c.eval_num_gpus > 0 and starts_servers(c)


@predicate
def eval_fleet_self_probes(c: LifecycleConfig) -> bool:
    """The eval fleet probes its engines itself: exactly when no rollout monitor does (rollout FT off)."""
    return eval_fleet_enabled(c) and not rollout_ft(c)


@predicate
def updates_rollout_weights(c: LifecycleConfig) -> bool:
    """The trainer pushes weights to rollout engines: it trains and servers exist."""
    return trains(c) and starts_servers(c)


@predicate
def broadcasts_weights(c: LifecycleConfig) -> bool:
    """The trainer's updates go over a process group with every engine (--update-weight-transfer-mode broadcast)."""
    return updates_rollout_weights(c) and c.update_weight_transfer_mode == "broadcast"


@predicate
def trainer_recovers_rollout(c: LifecycleConfig) -> bool:
    """The trainer's update_weights recovers dead rollout engines first: rollout FT, engines the job started."""
    return updates_rollout_weights(c) and rollout_ft(c) and not external_engines(c)


@predicate
def heals_trainer(c: LifecycleConfig) -> bool:
    """A crashed trainer worker is replaced and healed from a peer: train FT with a trainer."""
    return trains(c) and train_ft(c)


@predicate
def offloads_rollout(c: LifecycleConfig) -> bool:
    """Release rollout engine memory around training: --offload-rollout with servers and a trainer."""
    return c.offload_rollout and starts_servers(c) and trains(c)


@predicate
def offloads_train(c: LifecycleConfig) -> bool:
    """Release trainer memory around generation: --offload-train with a trainer."""
    return c.offload_train and trains(c)


@predicate
def saves_rollout_data(c: LifecycleConfig) -> bool:
    """Write each rollout's samples for later replay (--save-debug-rollout-data)."""
    return c.save_debug_rollout_data is not None


@predicate
def saves_job(c: LifecycleConfig) -> bool:
    """Write checkpoints of the whole job (--save): a run can continue after its driver died."""
    return c.save is not None and trains(c)


@predicate
def resumes(c: LifecycleConfig) -> bool:
    """Continue a job from its latest checkpoint (--load, or lifecycle run --resume): restore, then relaunch."""
    return c.load is not None and trains(c)


@predicate
def streaming(c: LifecycleConfig) -> bool:
    """Streaming RL (--fully-async): engines generate on while the trainer takes groups and pushes weights."""
    return c.fully_async and updates_rollout_weights(c)


@predicate
def keeps_engines(c: LifecycleConfig) -> bool:
    """Rollout engines outlive the driver (--detach-engines): a resumed job adopts the ones its ledger names."""
    return c.detach_engines and starts_servers(c) and not external_engines(c) and saves_job(c)


@predicate
def elastic(c: LifecycleConfig) -> bool:
    """An elastic fleet: engines join and leave mid-run within --rollout-min/max-num-gpus, on engines the job starts."""
    return (
        starts_servers(c)
        and not external_engines(c)
        and (c.rollout_min_num_gpus is not None or c.rollout_max_num_gpus is not None)
    )


@capability
def releases_rollout_memory(c: LifecycleConfig) -> bool:
    """The rollout backend can release and resume its engines' weights and KV cache on --rollout-device."""
    return bool(_abilities(c).releases)


@capability
def rollout_backend_broadcasts(c: LifecycleConfig) -> bool:
    """The rollout backend can join the trainer's weight-update group (--update-weight-transfer-mode broadcast)."""
    return _abilities(c).broadcast


def _abilities(c: LifecycleConfig) -> Capabilities:
    return capabilities(c.rollout_backend, c.rollout_device)


def evaluate(config: LifecycleConfig) -> dict[str, bool]:
    """Every predicate's value under ``config``, in registry order."""
    return {name: p.fn(config) for name, p in PREDICATES.items()}


def vector(config: LifecycleConfig) -> tuple[bool, ...]:
    """The predicate vector: configs with equal vectors behave identically in every machine."""
    return tuple(p.fn(config) for p in PREDICATES.values())


def behaviour(config: LifecycleConfig) -> tuple[bool, ...]:
    """The vector of the predicates machines read (all but capabilities): configs with equal behaviour
    vectors explore the same states, so the checker explores one of them."""
    return tuple(p.fn(config) for p in PREDICATES.values() if not p.capability)


def lookup(name: str) -> Predicate:
    """The predicate called ``name``; a KeyError lists the known ones."""
    try:
        return PREDICATES[name]
    except KeyError:
        raise KeyError(f"unknown predicate {name!r}; known: {', '.join(PREDICATES)}") from None
