"""Runtime machines: a spec + a config -> ``transitions`` machines with a ledger and an event log.

Why not ``add_model`` per instance: it binds a method per trigger and state on every model
(~9 KB and ~0.25 ms each), which is too much for thousands of engines. Instead one
``transitions.Machine`` is built per (spec, predicate vector) and shared; each
:class:`LifecycleMachine` is a small slotted object that ``transitions`` moves through its
states. The compiled lookup table answers "illegal?" and "blocked by which predicate?" before
``transitions`` is asked to move, so errors are typed and cheap.

The move itself is ``transitions``' own, compiled once per (shared machine, state, trigger) (benchmark P3:
~24 µs a move inside the RL loop, ~13 frames): :func:`_compile_move` reads the destination from the
machine's ``Transition`` whose constant guards pass, and each later move of that pair sets it -- what
``Transition.execute`` does when no callback is registered anywhere on the way, which is checked when
compiling (a machine with callbacks is moved by ``Event.trigger`` every time). What a compiled move skips
besides the empty callback lists: ``transitions``' own debug/info lines on the ``transitions`` logger.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transitions import Machine
from transitions.core import Transition

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import IllegalTransition, LifecycleError
from lifecycle.decide.events import BLOCKED, DEFAULT_LOG, TRANSITION, EventLog, encode_json
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


# a compiled move: its step (the table's), the destination transitions sets, its log line's middle; None: a move
# transitions must make itself (a callback on the way)
_Move = tuple[Step, str, str] | None
_SHARED: dict[int, tuple[CompiledSpec, Machine, dict[tuple[str, str], _Move]]] = {}


def _shared_machine(compiled: CompiledSpec) -> tuple[Machine, dict[tuple[str, str], _Move]]:
    """One ``transitions.Machine`` per compiled spec, shared by every instance of it, and its compiled moves."""
    entry = _SHARED.get(id(compiled))
    if entry is None:
        machine = Machine(model=None, queued=False, **transitions_kwargs(compiled))
        entry = _SHARED[id(compiled)] = (compiled, machine, {})
    return entry[1], entry[2]


def _quiet(transition: Transition, machine: Machine, source: str) -> bool:
    """Nothing runs on this transition's way but the state change: no callback of the machine, the
    transition or the two states (``transitions_kwargs`` registers none; a reference test might)."""
    assert transition.dest is not None
    hooks = (
        machine.prepare_event,
        machine.before_state_change,
        machine.after_state_change,
        machine.finalize_event,
        machine.on_exception,
        machine.on_final,
        transition.prepare,
        transition.before,
        transition.after,
        machine.get_state(source).on_exit,
    )
    return not any(hooks) and not machine.get_state(transition.dest).on_enter


def _compile_move(machine: Machine, state: str, trigger: str, step: Step) -> _Move:
    """The state ``transitions`` moves a model in ``state`` to on ``trigger`` -- the first of the event's
    transitions from there whose guards (constants of the config) pass -- and the middle of the move's log
    line (what every instance logs alike); None when transitions must be asked each time: a guard that is
    not a constant, or a callback on the way."""
    for transition in machine.events[trigger].transitions.get(state, ()):
        guards = [(c.func, c.target) for c in transition.conditions]
        if not all(isinstance(func, _Const) for func, _ in guards):
            return None
        if all(func.value == target for func, target in guards):  # type: ignore[union-attr]
            if transition.dest is None or not _quiet(transition, machine, state):
                return None
            dst = str(machine.get_state(transition.dest).value)
            if dst != step.dest:
                raise LifecycleError(
                    f"{machine.name}: transitions moves {state} on {trigger} to {dst}, not {step.dest}"
                )
            fields = {"src": state, "dst": dst, "trigger": trigger, "guards": dict(step.guards)}
            fields |= {"effects": list(step.effects), "event": TRANSITION}
            return step, dst, "," + encode_json(fields)[1:-1]
        if transition.prepare:  # it runs before the guards even when they fail
            return None
    raise LifecycleError(f"{machine.name}: transitions does not move {state} on {trigger}, the compiled table does")


class _Base:
    __slots__ = ("_compiled", "_line", "instance", "ledger", "log", "record", "seq", "spec", "state")

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
        self._line = ""  # the start of this instance's move lines (the log's JSON), made at its first move
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

    def _moved(self, trigger: str, src: str, step: Step, middle: str | None = None) -> FireResult:
        self._logged(trigger, src, step, middle)
        return FireResult(self.spec.name, self.instance, trigger, src, step.dest, True, step.effects, step.guard_map)

    def _logged(self, trigger: str, src: str, step: Step, middle: str | None) -> None:
        """A move's seq, ledger entries and event (``middle``: its log line's middle, when compiled)."""
        self.seq += 1
        if step.effects and self.record:
            self.ledger.record(self.spec.name, self.instance, self.seq, trigger, src, step.dest, step.effects)
        log = self.log
        if log.enabled:
            head = None
            if middle is not None:  # the line's start, but for its seq, is known: machine, instance, move
                head = f"{self._line or self._start_line()}{self.seq}{middle}"
            log.send(
                {
                    "machine": self.spec.name,
                    "instance": self.instance,
                    "seq": self.seq,
                    "src": src,
                    "dst": step.dest,
                    "trigger": trigger,
                    "guards": dict(step.guards),
                    "effects": list(step.effects),
                    "event": TRANSITION,
                },
                head,
            )

    def _start_line(self) -> str:
        self._line = f'{{"machine":{encode_json(self.spec.name)},"instance":{encode_json(self.instance)},"seq":'
        return self._line

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec.name}[{self.instance}] {self.state}>"


class LifecycleMachine(_Base):
    """A machine instance; ``fire(trigger)`` moves it and records what it did (the effects it names are run
    by their owner: :class:`lifecycle.decide.runner.Runner` hands them to the shells as the core's commands)."""

    __slots__ = ("_events", "_machine", "_moves")

    compiled = True  # False: every move through ``Event.trigger`` (the reference path, benchmark P3's baseline)

    def __init__(self, spec: MachineSpec, config: LifecycleConfig, instance: str, **kwargs: Any) -> None:
        super().__init__(spec, config, instance, **kwargs)
        self._machine, self._moves = _shared_machine(self._compiled)
        self._events = self._machine.events

    def fire(self, trigger: str) -> FireResult:
        src = self.state
        if LifecycleMachine.compiled:
            move = self._moves.get((src, trigger))  # compiled: the table allowed it, transitions agreed
            if move is not None:
                self.state = move[1]
                return self._moved(trigger, src, move[0], move[2])
        out = self._compiled.table.get((src, trigger))
        if type(out) is not Step:
            if out is None:
                raise IllegalTransition(self.spec.name, self.instance, src, trigger, self.spec.allowed(src))
            return self._blocked(trigger, out)  # type: ignore[arg-type]
        if LifecycleMachine.compiled and (src, trigger) not in self._moves:
            move = self._moves[(src, trigger)] = _compile_move(self._machine, src, trigger, out)
            if move is not None:
                self.state = move[1]
                return self._moved(trigger, src, out, move[2])
        self._events[trigger].trigger(self)
        return self._moved(trigger, src, out)

    def replay(self, trigger: str) -> str:
        """:meth:`fire` for a move the core decided (the runner's): the state it moved to, no result built;
        a blocked or illegal one as :meth:`fire` (its state unchanged)."""
        src = self.state
        if LifecycleMachine.compiled:
            move = self._moves.get((src, trigger))
            if move is not None:
                self.state = move[1]
                self._logged(trigger, src, move[0], move[2])
                return move[1]
        return self.fire(trigger).dst
