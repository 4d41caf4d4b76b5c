"""The runtime's driver of the core: the shells give it handlers, the loop gives it operations.

A :class:`Runner` holds one job's state and does, for every operation a loop calls and every report a
shell makes, exactly this: ``Core.step`` decides; the runner replays the moves on ``transitions``
machines (one per machine instance: the event log, guards checked a second time), hands the commands
to their handlers *concurrently*, waits for all of them, and reports their results back to the core
*in the order the core gave them out* -- so a fixed seed gives the same event log however the
handlers' I/O interleaves -- until the operation has nothing more to do.

Handlers are bound by ``machine.effect`` name (XState's ``provide``): ``engine.launch_engine``,
``trainer.train_step``, ... A job whose config can issue a command nobody handles fails at its first
operation, naming it. The effect ledger records an effect when its work is done (or failed), not
when the transition fires; effects that need no work (the core's own couplings, labels like
``route_traffic``) are recorded with their move.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import (
    COMMITTED_WEIGHTS,
    PENDING_WEIGHTS,
    Command,
    Completed,
    Core,
    Event,
    Failure,
    JobState,
    Move,
    Op,
    Outcome,
    Refusal,
    Result,
    instance_name,
)
from lifecycle.decide.core.plan import ERROR
from lifecycle.decide.errors import IllegalTransition, LifecycleError
from lifecycle.decide.events import COMMITTED, DEFAULT_LOG, FENCED, STARTED, EventLog, bind_context, utc_now
from lifecycle.decide.ledger import EffectLedger, LedgerEntry
from lifecycle.decide.names import OperationName
from lifecycle.decide.runtime import LifecycleMachine
from lifecycle.decide.spec import MachineSpec

Handler = Callable[[Command], Awaitable[Outcome | None]]
FAILED_RESULTS = frozenset({"start_failed", "refused", "request_failed", "probe_failed", "worker_crashed", "alive"})


class UnboundEffect(LifecycleError):
    """The config can issue a command that no shell handles (a runtime built without one of its parts)."""


class RunFailed(LifecycleError):
    """The run has stopped (the core's failure); the parts' explainers give the detailed error first."""

    def __init__(self, failure: Failure) -> None:
        self.failure = failure
        super().__init__(f"{failure}. Fix: {failure.fix}" if failure.fix else str(failure))


class OperationRefused(LifecycleError):
    """An operation the core does not allow now (a loop bug: the wrong order, or a busy lane)."""

    def __init__(self, refusal: Refusal) -> None:
        self.refusal = refusal
        super().__init__(refusal.reason)


class Runner:
    """One job's core, its machine instances, and the shells' handlers."""

    def __init__(
        self,
        config: LifecycleConfig,
        *,
        engines: int | None = None,
        evals: int | None = None,
        log: EventLog | None = None,
        ledger: EffectLedger | None = None,
        machines: Mapping[str, MachineSpec] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.core = Core(config, engines=engines, evals=evals, machines=machines)
        self.state: JobState = self.core.initial()
        self.log = log if log is not None else DEFAULT_LOG
        self.ledger = ledger if ledger is not None else EffectLedger()
        self.clock = clock
        self.handlers: dict[str, Handler] = {}
        # instance -> the reason of the news or result that last moved it (for error messages); news that moved
        # nothing (fenced, or about an engine already marked) leaves it, so a failure quotes what marked it
        self.reasons: dict[str, str] = {}
        self.errors: list[BaseException] = []  # exceptions handlers raised (the core saw an "error" result)
        # Data the shells share, kept in step with the core's moves: the weights every current engine holds
        # (the initial ones, then each committed update) and the trainer's new ones while an update is out.
        self.committed: tuple[str, str] | None = None
        self.pending: tuple[str, str] | None = None
        self._machines: dict[str, LifecycleMachine] = {}
        self._issued: dict[Command, tuple[int, str, str, str]] = {}  # the move that issued a command
        self._watchers: list[Callable[[Move], None]] = []
        self._explainers: list[Callable[[Failure], None]] = []
        self._lock = asyncio.Lock()
        self._checked = False

    # -- binding ----------------
    def provide(self, handlers: Mapping[str, Handler]) -> None:
        """Bind effects to the code that carries them out: ``{"engine.launch_engine": launch, ...}``."""
        unknown = sorted(name for name in handlers if "." not in name)
        if unknown:
            raise UnboundEffect(f"handler names must be machine.effect, got {', '.join(unknown)}")
        self.handlers.update(handlers)

    def watch(self, fn: Callable[[Move], None]) -> None:
        """Call ``fn`` with every move as it is applied (shells keep their data in step: committed weights)."""
        self._watchers.append(fn)

    def explain(self, fn: Callable[[Failure], None]) -> None:
        """``fn(failure)`` raises the error that names a failure of its part (the engine, the flag, the fix) and
        returns when the failure is another part's (it reads the failure's fields); :meth:`check_failed` asks
        every part."""
        self._explainers.append(fn)

    def unbound(self) -> list[str]:
        """The commands this config can issue that have no handler."""
        return sorted(f"{m}.{e}" for m, e in self.core.commands() if f"{m}.{e}" not in self.handlers)

    def check(self) -> None:
        missing = self.unbound()
        if missing:
            raise UnboundEffect(
                f"no handler for {', '.join(missing)}: a shell of this job is missing (bind it with "
                "Runner.provide, or declare the effect ledger-only in lifecycle.decide.core.tables)"
            )
        first, self._checked = not self._checked, True
        if first and self.log.enabled:  # the log judges itself: `lifecycle trace check` reads the config here
            self.log.emit(STARTED, config=self.config.to_dict(), engines=self.core.engines, evals=self.core.evals)

    # -- driving ----------------
    async def operate(
        self,
        name: OperationName,
        engine: int | None = None,
        *,
        allow: frozenset[str] = frozenset(),
        target: int | None = None,
    ) -> Refusal | None:
        """Run one operation to its end (``target``: scale_rollout's new member count). A refusal whose kind is in
        ``allow`` (``blocked``, ``not_applicable``) is returned; any other raises :class:`OperationRefused`."""
        refusal = await self.submit(Op(name, engine, self.clock(), target))
        if refusal is not None and refusal.kind not in allow:
            if refusal.kind == "failed":
                self.check_failed()
            raise OperationRefused(refusal)
        return refusal

    async def report(self, outcome: Outcome) -> None:
        """News from a shell (a death, a probe verdict, a failed request)."""
        await self.submit(outcome._replace(now=self.clock()))

    async def submit(self, event: Event) -> Refusal | None:
        if not self._checked:
            self.check()
        async with self._lock:
            result, commands = self._step(event)
        if result.refused is not None:
            return result.refused
        while commands:
            try:
                outcomes = await asyncio.gather(*(self._carry_out(c) for c in commands))
            except asyncio.CancelledError:  # the caller gave up: what was out is undone, every lock released
                await asyncio.shield(self._cancelled(commands))
                raise
            async with self._lock:
                commands = self._completed(commands, outcomes)
        return None

    def _step(self, event: Event) -> tuple[Result, tuple[Command, ...]]:
        """One burst of the record for news or an operation: the core decides, its moves are applied, and the
        lines go out in one write -- before its commands do. One synchronous call, so the burst's code runs
        back to back (benchmark P3: each call into the layer between the loop's other work starts cold)."""
        with self.log.batch():
            result = self.core.step(self.state, event)
            why = {}
            if isinstance(event, Outcome) and event.reason and event.group is not None and event.engine is not None:
                why[instance_name(event.group, event.engine)] = event.reason
            return result, self._apply(result, why)

    def _completed(self, commands: tuple[Command, ...], outcomes: list[Outcome]) -> tuple[Command, ...]:
        """:meth:`_step` for the results of ``commands``: the core decides, their effects are ledgered under the
        moves that issued them, the new moves applied, one write; the commands that follow."""
        with self.log.batch():
            results = tuple(zip(commands, outcomes, strict=True))
            done = self.core.step(self.state, Completed(results, self.clock()))
            self._record(commands, outcomes)
            return self._apply(done, {c.instance: o.reason for c, o in results if o.reason})

    async def _cancelled(self, commands: tuple[Command, ...]) -> None:
        """Every command left out is reported as an error, so the core undoes what it was for."""
        async with self._lock:
            while commands:
                outcomes = [Outcome(ERROR, reason=f"{c.instance}: {c.effect} cancelled") for c in commands]
                commands = self._completed(commands, outcomes)

    async def _carry_out(self, cmd: Command) -> Outcome:
        handler = self.handlers.get(cmd.handler)
        if handler is None:  # checked at the first operation; a mutated spec can still get here
            return Outcome(ERROR, reason=f"no handler for {cmd.handler}")
        try:
            if cmd.delay > 0:
                await asyncio.sleep(cmd.delay)
            outcome = await handler(cmd)
        except Exception as exc:  # the core decides what an error means; the exception is kept for the caller
            self.errors.append(exc)
            return Outcome(ERROR, reason=f"{cmd.instance}: {cmd.effect} raised {type(exc).__name__}: {exc}")
        outcome = outcome or Outcome("done")
        if outcome.facts:
            done = utc_now()
            outcome = outcome._replace(facts=tuple(f.done_at(done) for f in outcome.facts))
        return outcome

    # -- the record: machines, event log, ledger ----------------
    def machine(self, machine: str, instance: str) -> LifecycleMachine:
        m = self._machines.get(instance)
        if m is None:
            spec = self.core.specs[machine]
            m = LifecycleMachine(spec, self.config, instance, ledger=self.ledger, log=self.log, record=False)
            self._machines[instance] = m
        return m

    def _apply(self, result: Result, why: Mapping[str, str] | None = None) -> tuple[Command, ...]:
        """Take the core's step: its state, its commit, its moves (replayed, logged, ledgered), its commands.

        ``why`` (instance -> reason) is the news that caused the step; it travels with that instance's moves
        in the event log, so a ``mark_unhealthy`` says what the probe, the request or the death was."""
        self.state = result.state
        log = self.log
        if result.commits and log.enabled:  # before the moves: the engines they route must hold it
            served = self.pending or self.committed
            log.emit(COMMITTED, weight_version=served[1] if served else None)
        if result.commits and self.pending is not None:  # the core committed the update: these are served now
            self.committed, self.pending = self.pending, None
        commands, moves, blocked, fenced = result.commands, result.moves, result.blocked, result.fenced
        pending = {(c.machine, c.instance, c.effect): c for c in commands} if commands else {}
        machines, issued, watchers = self._machines, self._issued, self._watchers
        labels: list[LedgerEntry] = []
        try:
            for k, move in enumerate((*moves, None)):
                if fenced or blocked:
                    self._interleave(result, k)
                if move is None:
                    break
                m = machines.get(move.instance) or self.machine(move.machine, move.instance)
                if m.state != move.src:
                    raise IllegalTransition(move.machine, move.instance, m.state, move.trigger, m.spec.allowed(m.state))
                reason = why.get(move.instance) if why else None
                if reason:
                    self.reasons[move.instance] = reason  # only news that moved it: a fenced report names nothing
                    with bind_context(reason=reason):
                        dst = m.replay(move.trigger)
                else:
                    dst = m.replay(move.trigger)
                if dst != move.dst:  # the transitions machine and the core disagree: a bug, never silent
                    raise LifecycleError(f"{move.instance}: {move.trigger} went to {dst}, the core said {move.dst}")
                for effect in move.effects:
                    cmd = pending.pop((move.machine, move.instance, effect), None)
                    if cmd is None:  # a label or a coupling: no work to wait for, recorded with its move
                        labels.append(
                            LedgerEntry(move.machine, move.instance, m.seq, move.trigger, move.src, move.dst, effect)
                        )
                    else:
                        issued[cmd] = (m.seq, move.trigger, move.src, move.dst)
                for fn in watchers:
                    fn(move)
        finally:  # what was moved is ledgered, even when a later move fails
            if labels:
                self.ledger.extend(labels)
        return commands

    def _interleave(self, result: Result, k: int) -> None:
        """The fenced news and the guards' refusals the core placed before move ``k`` (logged in order)."""
        for f in result.fenced:
            if f.after == k and self.log.enabled:
                fields = {"machine": f.machine, "instance": f.instance, "state": f.state, "trigger": f.trigger}
                self.log.emit(FENCED, **fields, news=f.news, epoch=f.epoch, current_epoch=f.current)
        for b in result.blocked:  # a guard's refusal, logged by the machine itself (lifecycle.blocked), in order
            if b.after == k and self.machine(b.machine, b.instance).state == b.state:
                self.machine(b.machine, b.instance).fire(b.trigger)

    def _record(self, commands: tuple[Command, ...], outcomes: list[Outcome]) -> None:
        """Each command's effect, now that its work has run (or failed), under the move that issued it."""
        entries = []
        issued, log = self._issued, self.log
        for cmd, outcome in zip(commands, outcomes, strict=True):
            move = issued.pop(cmd, None)
            if move is None:  # not issued by a move (a mutated spec): under the instance's last one
                m = self.machine(cmd.machine, cmd.instance)
                move = (m.seq, "", m.state, m.state)
            status = "failed" if outcome.name == ERROR or outcome.name in FAILED_RESULTS else "done"
            entries.append(LedgerEntry(cmd.machine, cmd.instance, *move, cmd.effect, status))
            if outcome.facts and log.enabled:  # what the I/O did, in the core's order (deterministic logs)
                for fact in outcome.facts:
                    fields = dict(fact.fields)  # the event dict itself (emit's order: its fields, then ``event``)
                    fields["event"] = fact.event
                    log.send(fields)
        self.ledger.extend(entries)

    def weights(self, cmd: Command) -> tuple[str, str] | None:
        """The weights an engine's ``transfer_weights`` loads, as the core's command names them (committed, or
        the trainer's pending ones): (checkpoint path, weight version), or None when there are none yet."""
        if cmd.weights == PENDING_WEIGHTS:
            return self.pending
        if cmd.weights == COMMITTED_WEIGHTS:
            return self.committed
        raise LifecycleError(f"{cmd.instance}: {cmd.effect} names no weights to load ({cmd.weights!r})")

    # -- a job checkpoint's part (--save, --load) ----------------
    def restart_ages(self) -> list[list[float]]:
        """How long ago each rollout engine's counted restarts were (a clock-free form a checkpoint keeps)."""
        now = self.clock()
        return [[round(now - t, 3) for t in e.restarts] for e in self.state.engines]

    def keep(self, epochs: tuple[int | None, ...], floor: int = 0) -> None:
        """A resumed job's rollout slots whose processes a previous driver left running (its engine ledger's
        generations; None: none): the core adopts those instead of launching them (before the first operation).
        ``floor``: the highest generation the run directory ever used; every new process's lies above it."""
        self.state = self.core.with_kept(self.state, epochs, floor)

    def restore_stream(self, version: int, oldest: tuple[int, ...] = ()) -> None:
        """A resumed stream's checkpoint: its committed version (and groups), before the first operation."""
        self.state = self.core.with_checkpoint(self.state, version, oldest)

    def restore_restart_ages(self, ages: list[list[float]]) -> None:
        """A resumed job's engines keep the restart budget they had spent (before its first operation)."""
        now = self.clock()
        self.state = self.core.with_restarts(self.state, tuple(tuple(now - a for a in row) for row in ages))

    def restore_target(self, target: int) -> None:
        """A resumed elastic job's target (its job checkpoint's), before its first operation: the first boundary
        joins or retires members to reach it."""
        self.state = self.core.with_target(self.state, target)

    def target(self) -> int | None:
        """An elastic fleet's target now (what a job checkpoint records); None where the fleet has a fixed size."""
        return self.state.target if self.core.elastic else None

    # -- views ----------------
    def epoch(self, group: str, index: int) -> int:
        """The generation of the engine's process now (the core's count of its launches): a shell stamps news
        about that process with it, so the core can tell a late report about a replaced one."""
        return self.state.group(group)[index].epoch

    def states(self, group: str = "rollout") -> dict[str, str]:
        return {instance_name(group, i): e.state for i, e in enumerate(self.state.group(group))}

    def raise_failure(self) -> None:
        """Raise the exception a handler raised, when that is why the run stopped."""
        if self.state.failed and self.errors:
            raise self.errors[-1]

    def check_failed(self) -> None:
        """When the run has stopped, raise why: a handler's exception, else the error of the part that failed
        (its explainer names the engine or worker, the state and the flag), else :class:`RunFailed`."""
        failed = self.state.failed
        if failed is None:
            return
        self.raise_failure()
        for explain in self._explainers:
            explain(failed)
        raise RunFailed(failed)
