"""Declarative machine specs: states, transitions, named guards and named effects as data.

A spec is validated when it is built (like python-statemachine at import): unknown guard or
effect names, unreachable states, non-terminal trap states, terminal states with exits, states
that can never finish, and non-deterministic guard pairs are errors. The same spec compiles to
a pure lookup table (for the explorer and the runtime fast path) and to a ``transitions``
machine (see :mod:`lifecycle.decide.runtime`), so the two cannot drift.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.effects import EFFECTS
from lifecycle.decide.errors import SpecError
from lifecycle.decide.predicates import PREDICATES, vector

# What a state *means* to the rest of the job, declared on the state so that no module types out
# a set of state names by hand: the core, the checker and the shells read these groups.
TAGS: dict[str, str] = {
    "live": "an engine: its process is up and the slot holds its server (memory tags apply); a monitor: it "
    "exists and watches the live engines",
    "transient": "waits for an outcome the shells report (a launch, a load, a kill): the job is not settled",
    "gone": "out of play: not part of a weight-update snapshot, not counted as serving capacity",
    "busy": "a machine doing work that other machines must not cut into (generation, a training step)",
    "updating": "the rollout manager holds the engine lock while weights flow",
    "streaming": "the rollout manager's stream runs (--fully-async): the trainer takes completed groups from it",
    "leaving": "an elastic fleet's engine on its way out (withdrawn, not a member): never marked, never recovered",
}
MEMORY_TAGS = ("weights", "kv_cache")


@dataclass(frozen=True)
class StateSpec:
    """One state. ``terminal`` states have no exits; ``marked`` ones matter to invariants.

    ``tags`` name the groups the state belongs to (:data:`TAGS`); ``releases`` the memory an engine in
    this state has released (invariant 6 compares it with what the engine reports).
    """

    name: str
    terminal: bool = False
    marked: bool = False
    doc: str = ""
    tags: frozenset[str] = frozenset()
    releases: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Guard:
    """A reference to a named predicate, possibly negated (written ``!name``)."""

    predicate: str
    negated: bool = False

    @classmethod
    def parse(cls, text: str) -> Guard:
        text = text.strip()
        return cls(text[1:].strip(), True) if text.startswith("!") else cls(text)

    def __str__(self) -> str:
        return ("!" if self.negated else "") + self.predicate

    def value(self, values: Mapping[str, bool]) -> bool:
        return values[self.predicate] != self.negated


@dataclass(frozen=True)
class EffectRef:
    """An effect a transition performs, optionally only when a predicate holds.

    Written ``"start_monitor if monitors_rollout"``: one transition then serves every config,
    and the predicate name shows on the graph edge.
    """

    name: str
    when: Guard | None = None

    @classmethod
    def parse(cls, text: str) -> EffectRef:
        name, sep, cond = text.partition(" if ")
        return cls(name.strip(), Guard.parse(cond) if sep else None)

    def __str__(self) -> str:
        return self.name if self.when is None else f"{self.name} if {self.when}"


@dataclass(frozen=True)
class TransitionSpec:
    """``trigger``: ``source`` -> ``dest`` when every guard holds, performing ``effects`` in order."""

    trigger: str
    source: tuple[str, ...]
    dest: str
    guards: tuple[Guard, ...] = ()
    effects: tuple[EffectRef, ...] = ()
    doc: str = ""

    def label(self) -> str:
        guard = f" [{', '.join(map(str, self.guards))}]" if self.guards else ""
        return f"{self.trigger}{guard}"


def T(  # noqa: N802 - reads like a table row in the machine definitions
    trigger: str,
    source: str | Sequence[str],
    dest: str,
    *,
    when: str | Sequence[str] = (),
    effects: Sequence[str] = (),
    doc: str = "",
) -> TransitionSpec:
    """Shorthand for a transition row: ``T("recover", "Unhealthy", "Recovering", when="rollout_ft")``."""
    sources = (source,) if isinstance(source, str) else tuple(source)
    guards = (when,) if isinstance(when, str) else tuple(when)
    return TransitionSpec(
        trigger,
        sources,
        dest,
        tuple(Guard.parse(g) for g in guards),
        tuple(EffectRef.parse(e) for e in effects),
        doc,
    )


@dataclass(frozen=True)
class Step:
    """The outcome of an enabled event: where it goes and what it does under one config.

    ``guards`` pairs each guard's predicate name with the predicate's value.
    """

    dest: str
    effects: tuple[str, ...]
    guards: tuple[tuple[str, bool], ...]
    transition: TransitionSpec
    guard_map: Mapping[str, bool] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "guard_map", MappingProxyType(dict(self.guards)))


@dataclass(frozen=True)
class Blocked:
    """The outcome of an event whose transitions all have a false guard.

    ``blocked_by`` lists the failing guards as written (``rollout_ft``: it was false;
    ``!replay``: replay was true).
    """

    blocked_by: tuple[str, ...]
    guards: tuple[tuple[str, bool], ...]


Outcome = Step | Blocked


@dataclass(frozen=True)
class CompiledSpec:
    """A spec specialised to one predicate vector: a dict lookup per event.

    ``table[(state, trigger)]`` is a :class:`Step` or :class:`Blocked`; a missing key means the
    event is illegal in that state.
    """

    spec: MachineSpec
    values: Mapping[str, bool]
    table: Mapping[tuple[str, str], Outcome]
    enabled: Mapping[str, tuple[str, ...]]

    def step(self, state: str, trigger: str) -> Outcome | None:
        return self.table.get((state, trigger))

    def reachable(self) -> tuple[frozenset[str], frozenset[str]]:
        """States reachable from ``Init`` under this config, and every effect on the way.

        One machine alone; :mod:`lifecycle.check.explore` composes machines into a job.
        """
        seen = {self.spec.initial}
        effects: set[str] = set()
        queue = deque(seen)
        while queue:
            state = queue.popleft()
            for trigger in self.enabled[state]:
                out = self.table[(state, trigger)]
                assert isinstance(out, Step)
                effects.update(out.effects)
                if out.dest not in seen:
                    seen.add(out.dest)
                    queue.append(out.dest)
        return frozenset(seen), frozenset(effects)


@dataclass(frozen=True)
class MachineSpec:
    """A whole machine as data; constructing one validates it (raises :class:`SpecError`)."""

    name: str
    states: tuple[StateSpec, ...]
    transitions: tuple[TransitionSpec, ...]
    initial: str = "Init"
    doc: str = ""
    environment: frozenset[str] = frozenset()
    # environment triggers about one engine's process: news that names an older generation of the engine (its
    # epoch) never fires them -- a late death report or probe verdict of a process that was since replaced
    fenced: frozenset[str] = frozenset()
    _compiled: dict[object, CompiledSpec] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        problems = validate(self)
        if problems:
            raise SpecError(self.name, problems)

    # -- views ---------------------------------------------------------------------------
    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.states)

    def tagged(self, tag: str) -> frozenset[str]:
        """The names of the states carrying ``tag`` (a group of :data:`TAGS`)."""
        return frozenset(st.name for st in self.states if tag in st.tags)

    def state(self, name: str) -> StateSpec:
        for s in self.states:
            if s.name == name:
                return s
        raise KeyError(f"{self.name} has no state {name!r}")

    @property
    def terminal_states(self) -> frozenset[str]:
        return frozenset(s.name for s in self.states if s.terminal)

    @property
    def triggers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.trigger for t in self.transitions))

    def guard_names(self) -> frozenset[str]:
        names = {g.predicate for t in self.transitions for g in t.guards}
        names |= {e.when.predicate for t in self.transitions for e in t.effects if e.when}
        return frozenset(names)

    def allowed(self, state: str) -> list[str]:
        """Triggers with a transition out of ``state``, whatever the guards say."""
        return sorted({t.trigger for t in self.transitions if state in t.source})

    # -- compilation -----------------------------------------------------------------------
    def compile(self, config: LifecycleConfig | Mapping[str, bool]) -> CompiledSpec:
        """Specialise to a config (or a predicate-name -> bool mapping); cached per vector."""
        if isinstance(config, LifecycleConfig):
            vec = vector(config)
            key: object = vec
            values: Mapping[str, bool] = dict(zip(PREDICATES, vec, strict=True))
        else:
            values = {n: bool(config.get(n, False)) for n in PREDICATES}
            key = tuple(values.values())
        cached = self._compiled.get(key)
        if cached is None:
            cached = self._compiled[key] = _compile(self, values)
        return cached


def _compile(spec: MachineSpec, values: Mapping[str, bool]) -> CompiledSpec:
    table: dict[tuple[str, str], Outcome] = {}
    for t in spec.transitions:
        guard_values = tuple((g.predicate, values[g.predicate]) for g in t.guards)
        ok = all(g.value(values) for g in t.guards)
        for src in t.source:
            key = (src, t.trigger)
            prior = table.get(key)
            if isinstance(prior, Step):
                continue  # validation guarantees exclusivity, so at most one is enabled
            if ok:
                effects = tuple(e.name for e in t.effects if e.when is None or e.when.value(values))
                table[key] = Step(t.dest, effects, guard_values, t)
            else:
                blocked = tuple(str(g) for g in t.guards if not g.value(values))
                if isinstance(prior, Blocked):
                    blocked = prior.blocked_by + blocked
                    guard_values = prior.guards + guard_values
                table[key] = Blocked(blocked, guard_values)
    enabled: dict[str, tuple[str, ...]] = {s.name: () for s in spec.states}
    for (src, trig), out in table.items():
        if isinstance(out, Step):
            enabled[src] = (*enabled[src], trig)
    return CompiledSpec(spec, dict(values), table, enabled)


# -- validation ---------------------------------------------------------------------------------
def _reachable(start: Iterable[str], edges: Mapping[str, set[str]]) -> set[str]:
    seen = set(start)
    queue = deque(seen)
    while queue:
        for nxt in edges.get(queue.popleft(), ()):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _exclusive(a: TransitionSpec, b: TransitionSpec) -> bool:
    """True when some predicate is required by one and negated by the other."""
    pa = {(g.predicate, g.negated) for g in a.guards}
    return any((g.predicate, not g.negated) in pa for g in b.guards)


def validate(spec: MachineSpec) -> list[str]:
    """Every structural problem of ``spec``, as readable sentences (empty when valid)."""
    problems: list[str] = []
    names = [s.name for s in spec.states]
    known = set(names)
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"state {dup!r} is defined more than once")
    if spec.initial != "Init":
        problems.append(f"initial state is {spec.initial!r}; every machine starts in 'Init'")
    if spec.initial not in known:
        problems.append(f"initial state {spec.initial!r} is not a state")
    if not any(s.terminal for s in spec.states):
        problems.append("no terminal state: a machine must be able to finish")

    edges: dict[str, set[str]] = {n: set() for n in known}
    reverse: dict[str, set[str]] = {n: set() for n in known}
    for t in spec.transitions:
        where = f"transition {t.trigger!r} ({', '.join(t.source)} -> {t.dest})"
        for name in (*t.source, t.dest):
            if name not in known:
                problems.append(f"{where} names unknown state {name!r}")
        for g in t.guards:
            if g.predicate not in PREDICATES:
                problems.append(f"{where} has unknown guard {g.predicate!r} (not a registered predicate)")
        for e in t.effects:
            if e.name not in EFFECTS:
                problems.append(f"{where} has unknown effect {e.name!r} (not in lifecycle.decide.effects.EFFECTS)")
            if e.when is not None and e.when.predicate not in PREDICATES:
                problems.append(f"{where} gates effect {e.name!r} on unknown predicate {e.when.predicate!r}")
        for src in t.source:
            if src in known and t.dest in known:
                edges[src].add(t.dest)
                reverse[t.dest].add(src)

    terminal = {s.name for s in spec.states if s.terminal}
    for st in spec.states:
        for tag in sorted(st.tags - set(TAGS)):
            problems.append(f"state {st.name!r} has unknown tag {tag!r} (known: {', '.join(TAGS)})")
        for mem in sorted(st.releases - set(MEMORY_TAGS)):
            problems.append(f"state {st.name!r} releases unknown memory {mem!r} (known: {', '.join(MEMORY_TAGS)})")
        outgoing = [t.trigger for t in spec.transitions if st.name in t.source]
        if st.terminal and outgoing:
            problems.append(f"terminal state {st.name!r} has outgoing transitions: {', '.join(sorted(set(outgoing)))}")
        if not st.terminal and not outgoing:
            problems.append(f"state {st.name!r} is a trap: no transition leaves it and it is not terminal")

    if spec.initial in known:
        unreachable = known - _reachable([spec.initial], edges)
        for s in sorted(unreachable):
            problems.append(f"state {s!r} is unreachable from {spec.initial!r}")
    if terminal:
        stuck = known - _reachable(terminal, reverse)
        for s in sorted(stuck):
            problems.append(f"state {s!r} can never reach a terminal state")

    by_key: dict[tuple[str, str], list[TransitionSpec]] = {}
    for t in spec.transitions:
        for s in t.source:
            by_key.setdefault((s, t.trigger), []).append(t)
    for (s, trig), ts in sorted(by_key.items()):
        for i, a in enumerate(ts):
            for b in ts[i + 1 :]:
                if not _exclusive(a, b):
                    problems.append(
                        f"event {trig!r} in state {s!r} is ambiguous: transitions to {a.dest!r} and {b.dest!r} "
                        "need guards that exclude each other (p and !p)"
                    )
    for trig in spec.environment:
        if trig not in {t.trigger for t in spec.transitions}:
            problems.append(f"environment event {trig!r} has no transition")
    for trig in sorted(spec.fenced - spec.environment):
        problems.append(f"fenced event {trig!r} is not an environment event (only news is fenced by an epoch)")
    return problems
