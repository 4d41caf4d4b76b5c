"""Runtime machines: a spec + a config -> ``transitions`` machines with a ledger and an event log.

Why not ``add_model`` per instance: it binds a method per trigger and state on every model
(~9 KB and ~0.25 ms each), which is too much for thousands of engines. Instead one
``transitions.Machine`` is built per (spec, predicate vector) and shared; each
:class:`LifecycleMachine` is a small slotted object that ``transitions`` moves through its
states. The compiled lookup table answers "illegal?" and "blocked by which predicate?" before
``transitions`` is asked to move, so errors are typed and cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transitions import Machine

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import IllegalTransition
from lifecycle.decide.events import BLOCKED, DEFAULT_LOG, TRANSITION, EventLog
from lifecycle.decide.ledger import EffectLedger
from lifecycle.decide.spec import Blocked, CompiledSpec, MachineSpec, Step


@dataclass(slots=True)
class FireResult:
    """What one event did: moved (``ok``) with ``effects``, or was blocked by ``blocked_by``."""

    machine: str
    instance: str
    trigger: str
    src: str
    dst: str
    ok: bool
    effects: tuple[str, ...] = ()
    guards: Mapping[str, bool] = field(default_factory=dict)
    blocked_by: tuple[str, ...] = ()
    queued: bool = False

    def __bool__(self) -> bool:
        return self.ok


class _Const:
    """A guard condition for ``transitions`` whose value is fixed by the compiled config.

    Named after its predicate so ``transitions``' own diagrams and markup show the name.
    """

    __slots__ = ("__name__", "value")

    def __init__(self, name: str, value: bool) -> None:
        self.__name__ = name
        self.value = value

    def __call__(self, *_: Any, **__: Any) -> bool:
        return self.value


def transitions_kwargs(compiled: CompiledSpec) -> dict[str, Any]:
    """States and transitions in ``transitions``' own format, guards as named constants."""
    spec = compiled.spec
    rows: list[dict[str, Any]] = []
    for t in spec.transitions:
        conditions = [_Const(g.predicate, compiled.values[g.predicate]) for g in t.guards if not g.negated]
        unless = [_Const(g.predicate, compiled.values[g.predicate]) for g in t.guards if g.negated]
        rows.append(
            {"trigger": t.trigger, "source": list(t.source), "dest": t.dest, "conditions": conditions, "unless": unless}
        )
    return {
        "states": list(spec.state_names),
        "transitions": rows,
        "initial": spec.initial,
        "auto_transitions": False,
        "ignore_invalid_triggers": False,
        "send_event": False,
        "name": spec.name,
    }


def build_transitions_machine(spec: MachineSpec, config: LifecycleConfig, model: Any = None) -> Machine:
    """A plain ``transitions`` machine for ``spec`` under ``config`` (the conformance test's reference)."""
    return Machine(model=model, queued=False, **transitions_kwargs(spec.compile(config)))


_SHARED: dict[int, tuple[CompiledSpec, Machine]] = {}


def _shared_machine(compiled: CompiledSpec) -> Machine:
    """One ``transitions.Machine`` per compiled spec, shared by every instance of it."""
    entry = _SHARED.get(id(compiled))
    if entry is None:
        entry = _SHARED[id(compiled)] = (compiled, Machine(model=None, queued=False, **transitions_kwargs(compiled)))
    return entry[1]


class _Base:
    __slots__ = ("_compiled", "instance", "ledger", "log", "record", "seq", "spec", "state")

    def __init__(
        self,
        spec: MachineSpec,
        config: LifecycleConfig,
        instance: str,
        *,
        ledger: EffectLedger | None = None,
        log: EventLog | None = None,
        record: bool = True,
    ) -> None:
        self.spec = spec
        self.record = record  # False: the owner records effects when their work has run (lifecycle.decide.runner)
        self._compiled = spec.compile(config)
        self.instance = instance
        self.state = spec.initial
        self.seq = 0
        self.ledger = ledger if ledger is not None else EffectLedger()
        self.log = log if log is not None else DEFAULT_LOG

    @property
    def name(self) -> str:
        return self.spec.name

    def enabled(self) -> tuple[str, ...]:
        """Events that would move this machine now."""
        return self._compiled.enabled.get(self.state, ())

    def can(self, trigger: str) -> bool:
        return isinstance(self._compiled.table.get((self.state, trigger)), Step)

    @property
    def terminal(self) -> bool:
        return self.state in self.spec.terminal_states

    def _blocked(self, trigger: str, out: Blocked) -> FireResult:
        if self.log.enabled:
            self.log.emit(
                BLOCKED,
                machine=self.spec.name,
                instance=self.instance,
                state=self.state,
                trigger=trigger,
                guards=dict(out.guards),
                blocked_by=list(out.blocked_by),
            )
        return FireResult(
            self.spec.name, self.instance, trigger, self.state, self.state, False, (), dict(out.guards), out.blocked_by
        )

    def _moved(self, trigger: str, src: str, step: Step) -> FireResult:
        self.seq += 1
        if step.effects and self.record:
            self.ledger.record(self.spec.name, self.instance, self.seq, trigger, src, step.dest, step.effects)
        if self.log.enabled:
            self.log.emit(
                TRANSITION,
                machine=self.spec.name,
                instance=self.instance,
                seq=self.seq,
                src=src,
                dst=step.dest,
                trigger=trigger,
                guards=dict(step.guards),
                effects=list(step.effects),
            )
        return FireResult(self.spec.name, self.instance, trigger, src, step.dest, True, step.effects, step.guard_map)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec.name}[{self.instance}] {self.state}>"


class LifecycleMachine(_Base):
    """A machine instance; ``fire(trigger)`` moves it and records what it did (the effects it names are run
    by their owner: :class:`lifecycle.decide.runner.Runner` hands them to the shells as the core's commands)."""

    __slots__ = ("_events",)

    def __init__(self, spec: MachineSpec, config: LifecycleConfig, instance: str, **kwargs: Any) -> None:
        super().__init__(spec, config, instance, **kwargs)
        self._events = _shared_machine(self._compiled).events

    def fire(self, trigger: str) -> FireResult:
        out = self._compiled.table.get((self.state, trigger))
        if type(out) is not Step:
            if out is None:
                raise IllegalTransition(
                    self.spec.name, self.instance, self.state, trigger, self.spec.allowed(self.state)
                )
            return self._blocked(trigger, out)  # type: ignore[arg-type]
        src = self.state
        self._events[trigger].trigger(self)
        return self._moved(trigger, src, out)
