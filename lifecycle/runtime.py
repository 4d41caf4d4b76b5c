"""Runtime machines: a spec + a config -> ``transitions`` machines with a ledger and an event log.

Why not ``add_model`` per instance: it binds a method per trigger and state on every model
(~9 KB and ~0.25 ms each), which is too much for thousands of engines. Instead one
``transitions.Machine`` is built per (spec, predicate vector) and shared; each
:class:`LifecycleMachine` is a small slotted object that ``transitions`` moves through its
states. The compiled lookup table answers "illegal?" and "blocked by which predicate?" before
``transitions`` is asked to move, so errors are typed and cheap.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from transitions import Machine
from transitions.core import MachineError
from transitions.extensions.asyncio import AsyncMachine

from lifecycle.config import LifecycleConfig
from lifecycle.errors import IllegalTransition
from lifecycle.events import BLOCKED, DEFAULT_LOG, TRANSITION, EventLog
from lifecycle.ledger import EffectLedger
from lifecycle.spec import Blocked, CompiledSpec, MachineSpec, Step

Handler = Callable[..., Any]


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


class LeanAsyncMachine(AsyncMachine):
    """``AsyncMachine`` whose callback lists of zero or one entry are awaited directly.

    ``transitions`` runs every callback list (conditions, before, after, enter, exit, the
    machine-wide hooks: ~10 per event) through ``asyncio.gather``. An empty list costs a future
    and a coroutine; a list of one wraps it in a task and suspends the caller. Our machines have
    one condition list and one ``after`` callback per transition and nothing else, so gathering
    made an async ``fire`` ~3x the cost of a sync one and let other coroutines run in the middle
    of a transition. Lists of two or more still go through ``gather``.

    Awaiting the one callback directly differs from a task in two ways, neither used here: it
    runs in the caller's context (a handler's un-reset ``bind_contextvars`` would stay bound after
    ``fire``; use ``with bind_context(...)``), and a handler that swallows ``CancelledError`` lets
    the transition finish instead of aborting it.
    """

    async def callbacks(self, funcs: Any, event_data: Any) -> None:  # type: ignore[override]  # stubs: sync
        if funcs:  # most lists are empty: skip building partials and coroutines for them
            await self.await_all([partial(event_data.machine.callback, func, event_data) for func in funcs])

    @staticmethod
    async def await_all(callables: list[Callable[[], Any]]) -> list[Any]:
        if not callables:
            return []
        if len(callables) == 1:
            return [await callables[0]()]
        return list(await asyncio.gather(*[func() for func in callables]))


def build_transitions_machine(spec: MachineSpec, config: LifecycleConfig, model: Any = None) -> Machine:
    """A plain ``transitions`` machine for ``spec`` under ``config`` (async specs: ``AsyncMachine``, queued)."""
    kwargs = transitions_kwargs(spec.compile(config))
    if spec.is_async:
        return LeanAsyncMachine(model=model, queued=True, **kwargs)
    return Machine(model=model, queued=False, **kwargs)


_SHARED: dict[int, tuple[CompiledSpec, Machine]] = {}


def _shared_machine(compiled: CompiledSpec) -> Machine:
    """One ``transitions.Machine`` per compiled spec, shared by every instance of it."""
    entry = _SHARED.get(id(compiled))
    if entry is None:
        entry = _SHARED[id(compiled)] = (compiled, Machine(model=None, queued=False, **transitions_kwargs(compiled)))
    return entry[1]


class _Base:
    __slots__ = ("_compiled", "_handlers", "instance", "ledger", "log", "record", "seq", "spec", "state")

    def __init__(
        self,
        spec: MachineSpec,
        config: LifecycleConfig,
        instance: str,
        *,
        ledger: EffectLedger | None = None,
        log: EventLog | None = None,
        handlers: Mapping[str, Handler] | None = None,
        record: bool = True,
    ) -> None:
        self.spec = spec
        self.record = record  # False: the owner records effects when their work has run (lifecycle.runner)
        self._compiled = spec.compile(config)
        self.instance = instance
        self.state = spec.initial
        self.seq = 0
        self.ledger = ledger if ledger is not None else EffectLedger()
        self.log = log if log is not None else DEFAULT_LOG
        self._handlers = dict(handlers) if handlers else None

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

    def _outcome(self, trigger: str) -> Step | Blocked:
        out = self._compiled.table.get((self.state, trigger))
        if out is None:
            raise IllegalTransition(self.spec.name, self.instance, self.state, trigger, self.spec.allowed(self.state))
        return out

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
    """A synchronous machine instance; ``fire(trigger)`` moves it and records what it did.

    Effects run through ``handlers`` (effect name -> callable taking the :class:`FireResult`)
    after the state has changed, in declaration order: the spec names actions, the owner
    implements them (XState's style).
    """

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
        result = self._moved(trigger, src, out)
        if self._handlers:
            for effect in result.effects:
                handler = self._handlers.get(effect)
                if handler is not None:
                    handler(result)
        return result


class AsyncLifecycleMachine(_Base):
    """An asyncio machine instance backed by a queued ``AsyncMachine``.

    ``queued=True`` matters: without it a second event fired from inside an effect handler
    would cancel the first one's callbacks; with it the second waits its turn. A nested
    ``fire`` therefore returns at once with ``queued=True``; its legality is checked when it runs.
    """

    __slots__ = ("_busy", "_machine", "_results")

    def __init__(self, spec: MachineSpec, config: LifecycleConfig, instance: str, **kwargs: Any) -> None:
        super().__init__(spec, config, instance, **kwargs)
        self._results: list[FireResult] = []
        self._busy = False
        opts = transitions_kwargs(self._compiled)
        opts["send_event"] = True
        for row in opts["transitions"]:
            row["after"] = [self._after]
        self._machine = LeanAsyncMachine(model=None, queued=True, **opts)

    async def _after(self, event: Any) -> None:
        trigger = event.event.name
        src = event.transition.source
        step = self._compiled.table[(src, trigger)]
        result = self._moved(trigger, src, step)  # type: ignore[arg-type]
        self._results.append(result)
        if self._handlers:
            for effect in result.effects:
                handler = self._handlers.get(effect)
                if handler is not None:
                    value = handler(result)
                    if inspect.isawaitable(value):
                        await value

    async def fire(self, trigger: str) -> FireResult:
        if self._busy:  # called from an effect handler: queue it behind the running transition
            if trigger not in self._machine.events:
                raise IllegalTransition(self.spec.name, self.instance, self.state, trigger, [])
            await self._machine.events[trigger].trigger(self)
            return FireResult(self.spec.name, self.instance, trigger, self.state, self.state, True, queued=True)
        out = self._outcome(trigger)
        if type(out) is Blocked:
            return self._blocked(trigger, out)
        self._busy = True
        first = len(self._results)
        try:
            await self._machine.events[trigger].trigger(self)
        except MachineError as exc:  # a queued nested event turned out to be illegal when it ran
            raise IllegalTransition(
                self.spec.name, self.instance, self.state, str(exc), self.spec.allowed(self.state)
            ) from exc
        finally:
            self._busy = False
        return self._results[first]
