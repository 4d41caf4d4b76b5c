"""Operations: whether the loop's call may start (its lane, its predicate, its machine, the other machines),
and running its program, one phase after the other, as the commands they wait for come back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lifecycle.decide.core import weights
from lifecycle.decide.core.draft import has_command_out
from lifecycle.decide.core.model import ROLLOUT, BlockedMove, Op, Refusal, instance_name
from lifecycle.decide.core.parts import INSTANCE, LANES, PARTS
from lifecycle.decide.core.phases import PHASES
from lifecycle.decide.core.plan import OPERATIONS, SNAPSHOT
from lifecycle.decide.spec import Blocked, Step

if TYPE_CHECKING:
    from lifecycle.decide.core.step import StepDraft


def start(step: StepDraft, op: Op) -> None:
    """The operation starts on its lane (its program runs next), or the step is refused, saying why."""
    job, core = step.job, step.core
    spec = OPERATIONS.get(op.name)
    if spec is None:
        step.refused = Refusal("illegal", f"unknown operation {op.name!r}; known: {', '.join(OPERATIONS)}")
        return
    if job.failed and not op.name.endswith("dispose"):
        step.refused = Refusal("failed", str(job.failed))
        return
    for lane in (spec.lane, *spec.holds):
        if job.lane_op(lane):
            step.refused = Refusal("busy", f"{op.name}: the {lane} side is busy with {job.lane_op(lane)}")
            return
    if spec.when is not None and not core.predicates[spec.when]:
        step.refused = Refusal("blocked", f"{op.name}: blocked by {spec.when}", (spec.when,))
        return
    main = next((p for p in spec.program if "." in p), None)
    if main is not None:
        part, trigger = main.split(".", 1)
        if part == "engine" and (op.engine is None or not 0 <= op.engine < core.engines):
            step.refused = Refusal("illegal", f"{op.name}: no rollout engine {op.engine}")
            return
        group, i = (ROLLOUT, op.engine) if part == "engine" else (None, None)
        src = job.state_of(part, group, i)
        out = core.compiled[part].table.get((src, trigger))
        if isinstance(out, Blocked):
            instance = instance_name(ROLLOUT, op.engine) if op.engine is not None else INSTANCE[part]
            step.blocked.append(
                BlockedMove(PARTS[part], instance, trigger, src, out.blocked_by, out.guards, len(step.moves))
            )
            step.refused = Refusal("blocked", f"{op.name}: blocked by {', '.join(out.blocked_by)}", out.blocked_by)
            return
        if out is None:
            kind = "not_applicable" if spec.optional else "illegal"
            step.refused = Refusal(kind, f"{op.name}: {PARTS[part]} {trigger!r} is not allowed in state {src!r}")
            return
    # the operation's own machine allows it (or it has none): now the other machines' say
    problem = precondition(step, op)
    if problem is not None:
        step.refused = Refusal("illegal", f"{op.name}: {problem}")
        return
    program = core.programs[op.name]
    if op.engine is not None:
        program = tuple(f"{p}@{op.engine}" for p in program)
    if op.name == "scale_rollout" and op.target is not None:
        job.target = op.target
    elif op.name == "retire_engine":
        job.target -= 1
    for lane in spec.holds:
        job.set_lane(lane, op=op.name)
    job.set_lane(spec.lane, op=op.name, program=program)


def precondition(step: StepDraft, op: Op) -> str | None:
    """Which job states allow an operation beyond its own machine's spec (the cross-machine couplings)."""
    job, core = step.job, step.core
    if op.name in ("generate", "eval", "stream") and job.dirty:
        return "the last weight update failed and was not redone: engines may hold different weights"
    if (
        op.name in ("generate", "eval", "stream")
        and core.engines
        and not (core.elastic and job.target)  # an elastic fleet's boundary joins its target first
        and all(e.state in core.gone for e in job.engines)
    ):
        return "no rollout engine is in play (all stopped or never started): start one first (start_engine)"
    if op.name == "eval_done" and job.fleet not in ("Init", "Idle"):
        return f"the eval fleet is {job.fleet}: release it first"
    if op.name == "pin" and job.rollout != "Evaluating":
        return f"the rollout manager is {job.rollout}: the fleet is pinned for an eval"
    if op.name == "offload" and job.trainer in core.trainer_busy:
        return f"the trainer is {job.trainer}"
    if op.name == "update_weights" and job.rollout not in SNAPSHOT:
        return f"the rollout manager is {job.rollout}: a weight update starts only from Ready or WeightsOnly"
    if op.name == "train" and core.streaming:
        return "in a stream the trainer trains only on the groups it takes within the staleness bound (take)"
    if op.name == "take" and not (job.buffer or job.taken):
        return "the buffer holds no completed group"
    if op.name == "take" and not isinstance(core.compiled["trainer"].table.get((job.trainer, "train")), Step):
        return f"the trainer is {job.trainer}: it takes groups when it can train on them"
    if op.name == "take" and job.rollout not in core.rollout_streams:
        return f"the rollout manager is {job.rollout}: groups are taken while the stream runs"
    if op.name == "train" and job.rollout in ("Init", "Constructed", "StartingServers"):
        return f"the rollout manager is {job.rollout}: nothing has been generated yet"
    if op.name == "offload_train" and job.rollout in core.rollout_busy:
        return f"the rollout manager is {job.rollout}"
    if op.name == "checkpoint" and (job.ahead or job.dirty):
        why = "the last weight update failed" if job.dirty else "the trainer trained since the last weight update"
        return f"{why}: a job checkpoint holds the committed weights only (update weights first)"
    if op.name in ("stop_engine", "start_engine") and (job.rollout != "Ready" or job.lock):
        return "single engines are stopped and started between steps (rollout Ready, engine lock free)"
    if op.name in ("scale_rollout", "retire_engine"):
        return fleet_precondition(step, op)
    return None


def fleet_precondition(step: StepDraft, op: Op) -> str | None:
    """An elastic fleet's scale and retire: while no update holds the engines, within the bounds."""
    job, core = step.job, step.core
    if job.lock:
        return "the engine lock is held (a weight update or a catch-up): scale between its phases"
    lo, hi = core.min_engines, core.engines
    if op.name == "scale_rollout":
        if op.target is None or not lo <= op.target <= hi:
            return (
                f"the target {op.target} is outside the fleet's bounds {lo}..{hi} engines "
                "(--rollout-min-num-gpus, --rollout-max-num-gpus): scale within them, or change the bounds"
            )
        return None
    if not isinstance(core.compiled["rollout"].table.get((job.rollout, "scale")), Step):
        return f"the rollout manager is {job.rollout}: engines retire between steps, during a generate or a stream"
    assert op.engine is not None
    e = job.engines[op.engine]
    if core.leaving(e) or e.state in core.gone:
        return f"{instance_name(ROLLOUT, op.engine)} is not a member ({e.state}): nothing to retire"
    if job.target - 1 < lo:
        return (
            f"retiring {instance_name(ROLLOUT, op.engine)} would leave a target of {job.target - 1}, below "
            f"--rollout-min-num-gpus ({lo} engines): lower the bound, or scale up first"
        )
    return None


def run_programs(step: StepDraft) -> None:
    """Each lane runs its operation's phases until one waits for commands out, or the program ends."""
    job = step.job
    for lane in LANES:
        step.lane = lane
        rollout = lane == "rollout"  # the lane's fields read directly: this loop runs at every step
        while job.rollout_op if rollout else job.trainer_op:
            if job.failed:
                job.set_lane(lane, program=())
            if has_command_out(job.commands_out.get(), lane):
                break
            program = job.rollout_program if rollout else job.trainer_program
            if not program:
                finish(step, lane)
                break
            if rollout:
                job.rollout_program = program[1:]
            else:
                job.trainer_program = program[1:]
            run_phase(step, program[0])


def finish(step: StepDraft, lane: str) -> None:
    """The lane's operation has run all its phases and every command came back."""
    job = step.job
    op = job.lane_op(lane)
    job.set_lane(lane, op="", program=())
    for held in OPERATIONS[op.rstrip("!")].holds if op else ():
        job.set_lane(held, op="")


def run_phase(step: StepDraft, phase: str) -> None:
    """One phase: a machine event (``rollout.generate``, ``engine.stop@1``) or one of the core's own (PHASES)."""
    name, _, arg = phase.partition("@")
    if "." not in name:
        PHASES[name](step)
        return
    part, trigger = name.split(".", 1)
    if part == "rollout":
        out = step.composite(trigger, log=True)
        if isinstance(out, Step) and trigger in ("servers_ready", "update_done"):
            weights.commit(step, update=trigger == "update_done")
    elif part == "engine":
        step.fire("engine", trigger, ROLLOUT, int(arg), log=True)
    else:
        step.fire(part, trigger, log=True)
