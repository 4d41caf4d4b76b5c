"""What the core does with each effect of a move, and with each result of a command: two tables.

``EFFECT_TABLE``: every effect of every spec, classified once -- the core carries it out itself (it moves another
machine or changes a fact), it is a label of the move, or it is a command a shell carries out.
``RESULT_TABLE``: what each ``(machine, effect, outcome)`` a shell reports back does -- the row to find for
"what happens when a launch fails". The rules the rows name are functions of a step in progress
(:class:`~lifecycle.decide.core.step.StepDraft`), in the modules of their concern.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, NamedTuple

from lifecycle.decide.core import engines, trainer, weights
from lifecycle.decide.core.model import ROLLOUT, Command, Outcome
from lifecycle.decide.core.parts import Origin
from lifecycle.decide.core.plan import ERROR

if TYPE_CHECKING:
    from lifecycle.decide.core.step import StepDraft


class Handling(NamedTuple):
    """What the core does with one machine's effect: exactly one of three kinds.

    ``coupled``: the core carries it out itself (``do``: it moves another machine or changes a fact) -- never
    a command; ``ledger``: a label of the move, with nothing more to do (XState: an action bound to no code);
    ``command``: work a shell carries out, bound by ``machine.effect`` name (:meth:`Runner.provide`).
    ``phases`` are added in front of the rest of the effect's operation (couplings that span operations).
    """

    kind: Literal["coupled", "ledger", "command"]
    doc: str
    do: Callable[[StepDraft, Origin], object] | None = None
    phases: tuple[str, ...] = ()


def coupled(
    doc: str, do: Callable[[StepDraft, Origin], object] | None = None, phases: tuple[str, ...] = ()
) -> Handling:
    return Handling("coupled", doc, do, phases)


def ledger(doc: str) -> Handling:
    return Handling("ledger", doc)


def command(doc: str, phases: tuple[str, ...] = ()) -> Handling:
    return Handling("command", doc, None, phases)


EffectRow = tuple[str, str, Handling]  # (machine, effect, what the core does with it)

# Every effect of every spec, classified once: the core's dispatch table (a test holds it to the specs).
EFFECT_TABLE: tuple[EffectRow, ...] = (
    # -- the rollout manager ---------------------------------------------------------------------------------
    ("rollout", "construct_rollout_fn", command("the executor builds the rollout function")),
    ("rollout", "construct_eval_fn", command("the executor builds the eval function")),
    ("rollout", "load_replay_data", command("the executor reads the saved samples")),
    ("rollout", "save_rollout_data", command("the executor writes the samples")),
    (
        "rollout",
        "generate_rollouts",
        ledger("the executor calls the rollout function between this move and generate_done"),
    ),
    ("rollout", "run_eval", ledger("the executor calls the eval function between this move and eval_done")),
    ("rollout", "start_stream", ledger("the stream keeps every routable engine busy until stream_stop")),
    ("rollout", "stop_stream", ledger("the stream stops feeding engines; the engines' drain follows (ENGINE_PLAN)")),
    ("rollout", "requeue_prompts", command("the stream drops one stale buffered group and re-queues its prompts")),
    (
        "rollout",
        "start_servers",
        coupled("every engine's start", lambda step, origin: engines.start_engines(step, ROLLOUT)),
    ),
    ("rollout", "stop_servers", coupled("every engine's stop and disposal (the dispose program)")),
    ("rollout", "start_monitor", coupled("the monitor's create", lambda step, origin: step.fire("monitor", "create"))),
    (
        "rollout",
        "resume_monitor",
        coupled("the monitor's resume", lambda step, origin: engines.monitor_to(step, "Paused", "resume")),
    ),
    (
        "rollout",
        "pause_monitor",
        coupled(
            "the monitor's pause (a no-op when it is paused)",
            lambda step, origin: engines.monitor_to(step, "Running", "pause"),
        ),
    ),
    ("rollout", "stop_monitor", coupled("the monitor's stop", lambda step, origin: engines.stop_monitor(step))),
    (
        "rollout",
        "arm_ci_fault_injection",
        coupled(
            "the fact ci_pending: the first generate kills one engine", lambda step, origin: engines.arm_ci_fault(step)
        ),
    ),
    ("rollout", "inject_ci_fault", coupled("a command on the engine the ci_inject phase picks")),
    (
        "rollout",
        "start_eval_fleet",
        coupled("the eval fleet's create and its engines' starts", lambda step, origin: engines.start_eval_fleet(step)),
    ),
    ("rollout", "acquire_engine_lock", coupled("the fact lock", lambda step, origin: weights.lock_engines(step))),
    ("rollout", "release_engine_lock", coupled("the fact lock", lambda step, origin: weights.unlock_engines(step))),
    (
        "rollout",
        "reconcile_fleet",
        coupled("elastic: leavers retire, members brought to the target (the reconcile phase)", phases=("reconcile",)),
    ),
    ("rollout", "read_gateway", command("elastic: read every router's worker list, report it (gateway.members)")),
    ("rollout", "release_weights", coupled("the engines' offload (ENGINE_PLAN)")),
    ("rollout", "release_kv_cache", coupled("the engines' offload (ENGINE_PLAN)")),
    ("rollout", "resume_weights", coupled("the engines' onload_weights (ENGINE_PLAN)")),
    ("rollout", "resume_kv_cache", coupled("the engines' onload_kv (ENGINE_PLAN)")),
    (
        "rollout",
        "report_failure",
        coupled("the run stops (failed)", lambda step, origin: engines.report_failure(step, origin)),
    ),
    # -- the trainer group -----------------------------------------------------------------------------------
    ("trainer", "allocate_workers", command("the group creates its worker actors")),
    ("trainer", "init_model", command("the workers build their policy and optimizer")),
    ("trainer", "keep_heal_state", command("train FT: a group without a peer keeps its last good state")),
    ("trainer", "restore_job_state", command("the workers load the job checkpoint")),
    ("trainer", "train_step", command("one optimisation step")),
    ("trainer", "save_checkpoint", command("a checkpoint")),
    ("trainer", "save_job_state", command("a job checkpoint")),
    ("trainer", "offload_train", command("the workers release their memory")),
    ("trainer", "onload_train", command("the workers take their memory back")),
    ("trainer", "replace_worker", command("a new worker for the crashed one")),
    ("trainer", "restore_from_peer", ledger("replace_worker restored the state")),
    (
        "trainer",
        "restore_weight_version",
        coupled("the fact version: the job checkpoint's", lambda step, origin: trainer.restore_version(step)),
    ),
    (
        "trainer",
        "restore_stream_buffer",
        coupled("the fact buffer: the checkpoint's groups", lambda step, origin: trainer.restore_buffer(step)),
    ),
    ("trainer", "recover_engine", coupled("rollout FT: dead engines are recovered first", phases=("recover",))),
    (
        "trainer",
        "reconcile_fleet",
        coupled("elastic: the fleet is reconciled before the snapshot is taken", phases=("reconcile",)),
    ),
    # the trainer writes its new weights; the engines then take them: one snapshot under the engine lock
    ("trainer", "transfer_weights", command("the trainer writes its new weights (pending)", phases=("begin_update",))),
    (
        "trainer",
        "report_failure",
        coupled("the run stops (failed)", lambda step, origin: engines.report_failure(step, origin)),
    ),
    # -- an engine ---------------------------------------------------------------------------------------------
    ("engine", "launch_engine", command("start its process (after the restart's backoff)")),
    ("engine", "kill_engine", command("kill its process and confirm the death")),
    ("engine", "adopt_engine", command("reach the process a previous driver left, check it is the ledger's, read it")),
    ("engine", "transfer_weights", command("load the weights the command names (from disk, or by broadcast)")),
    ("engine", "route_traffic", command("publish it to its group's routing")),
    ("engine", "stop_routing", command("withdraw it from its group's routing")),
    ("engine", "hold_routing", command("withdraw it from its group's routing, keeping its requests in flight")),
    ("engine", "pause_generation", command("pause in-flight generation")),
    ("engine", "continue_generation", command("continue generation")),
    ("engine", "hand_back_requests", command("the stream takes back the requests it kept, to re-send them")),
    (
        "engine",
        "drain_requests",
        command(
            "withdrawn already: watch its running requests until they reach 0, bounded by min(--rollout-drain-timeout, "
            "a notice's deadline), then report the news drained"
        ),
    ),
    ("engine", "release_weights", command("release its weight memory")),
    ("engine", "release_kv_cache", command("release its KV-cache memory")),
    ("engine", "resume_weights", command("restore its weight memory")),
    ("engine", "resume_kv_cache", command("restore its KV-cache memory")),
    ("engine", "probe_engine", command("one health probe (the eval fleet's own, when no monitor probes)")),
    ("engine", "inject_ci_fault", command("--ci-test: SIGKILL its server")),
    ("engine", "recover_engine", ledger("the recovery is the kill and the relaunch that follow")),
    (
        "engine",
        "report_failure",
        coupled("the run stops (failed)", lambda step, origin: engines.report_failure(step, origin)),
    ),
    # -- the health monitor ------------------------------------------------------------------------------------
    ("monitor", "start_monitor", command("create the monitor (paused)")),
    ("monitor", "resume_monitor", command("start probing")),
    ("monitor", "pause_monitor", command("stop probing")),
    ("monitor", "stop_monitor", command("stop for good")),
    ("monitor", "probe_engine", ledger("the round the monitor just ran")),
    ("monitor", "count_probe_failure", ledger("the monitor counts toward its threshold")),
    ("monitor", "discard_probe_result", ledger("nothing is done with the result")),
    (
        "monitor",
        "mark_engine_unhealthy",
        coupled("the engine's mark_unhealthy", lambda step, origin: engines.mark_subject(step)),
    ),
    # -- the eval fleet ----------------------------------------------------------------------------------------
    (
        "eval_fleet",
        "probe_engine",
        coupled("a probe command on each live eval engine", lambda step, origin: engines.probe_evals(step)),
    ),
    ("eval_fleet", "restart_eval_engines", coupled("the fleet_restart phase (stop, confirm, start)")),
    (
        "eval_fleet",
        "load_snapshot",
        coupled("the eval engines' begin_update", lambda step, origin: engines.load_snapshot(step)),
    ),
    # -- the weight-update group ------------------------------------------------------------------------------
    ("weight_sync", "init_weight_group", command("rank 0 and every member join (bounded)")),
    ("weight_sync", "broadcast_weights", command("rank 0 sends every bucket (bounded)")),
    ("weight_sync", "destroy_weight_group", command("everyone still alive leaves")),
)


def dispatch(rows: tuple[EffectRow, ...]) -> dict[tuple[str, str], Handling]:
    """The table by (machine, effect); an effect classified twice is an error, not a silent override."""
    table: dict[tuple[str, str], Handling] = {}
    for machine, effect, handling in rows:
        if (machine, effect) in table:
            raise ValueError(f"{machine}.{effect} is classified twice ({table[machine, effect].kind}, {handling.kind})")
        table[machine, effect] = handling
    return table


DISPATCH = dispatch(EFFECT_TABLE)
# Views of the table by kind (the README names them).
COUPLED = {key: h.doc for key, h in DISPATCH.items() if h.kind == "coupled"}
LEDGER_ONLY = {key: h.doc for key, h in DISPATCH.items() if h.kind == "ledger"}


# -- what a command's result does ------------------------------------------------------------------------------------
ANY = "*"


class ResultRow(NamedTuple):
    """What one result of one command does.

    ``effect`` ``*``: any effect of the machine; ``outcome`` ``*``: any other outcome (never ``error``: a
    command that raised has rows of its own). A row with ``when`` applies only where it holds; where it does
    not, the next row that matches applies. The rows of one command are tried most specific first:
    ``(machine, effect, outcome)``, ``(machine, effect, *)``, ``(machine, *, outcome)``, ``(*, *, outcome)``.
    """

    machine: str
    effect: str
    outcome: str
    doc: str
    do: Callable[[StepDraft, Command, Outcome], object]
    when: Callable[[StepDraft, Command], bool] | None = None


def engine_in(*states: str) -> Callable[[StepDraft, Command], bool]:
    """The command's engine is in one of ``states``."""
    wanted = frozenset(states)
    return lambda step, cmd: step.job.engine(cmd.group, cmd.engine).state in wanted  # type: ignore[arg-type]


def engine_updating(step: StepDraft, cmd: Command) -> bool:
    """The command's engine is taking weights (a transient live state: its spec says which)."""
    return step.job.engine(cmd.group, cmd.engine).state in step.core.updating_engine  # type: ignore[arg-type]


def engine_markable(step: StepDraft, cmd: Command) -> bool:
    """The command's engine may be marked unhealthy now (or, leaving an elastic fleet, stopped: lost)."""
    return engines.faultable(step, cmd.group, cmd.engine)  # type: ignore[arg-type]


def engine_fault(step: StepDraft, cmd: Command, outcome: Outcome) -> None:
    """The command's engine failed it: marked unhealthy, or -- leaving an elastic fleet -- stopped (lost)."""
    engines.fault(step, cmd.group, cmd.engine)  # type: ignore[arg-type]


def rollout_updating(step: StepDraft, cmd: Command) -> bool:
    """A rollout engine's load in the rollout side's weight update."""
    return cmd.group == ROLLOUT and step.job.rollout in step.core.rollout_updating


def sync_in(state: str) -> Callable[[StepDraft, Command], bool]:
    """The weight-update group is in ``state``."""
    return lambda step, cmd: step.job.sync == state


def fire_engine(trigger: str, only_in: str | None = None) -> Callable[[StepDraft, Command, Outcome], object]:
    """Fire ``trigger`` on the command's engine (where it is in ``only_in``, if given: else nothing)."""

    def do(step: StepDraft, cmd: Command, outcome: Outcome) -> None:
        assert cmd.group is not None and cmd.engine is not None
        if only_in is None or step.job.engine(cmd.group, cmd.engine).state == only_in:
            step.fire("engine", trigger, cmd.group, cmd.engine)

    return do


def fire(part: str, trigger: str) -> Callable[[StepDraft, Command, Outcome], object]:
    return lambda step, cmd, outcome: step.fire(part, trigger)


def reason(cmd: Command, outcome: Outcome) -> str:
    """Why a command that raised failed: the shell's reason, or which command it was."""
    return outcome.reason or f"{cmd.instance}: {cmd.effect} failed"


def group_call_raised(step: StepDraft, cmd: Command, outcome: Outcome) -> None:
    """A weight-update group call that raised (not one that failed): it failed, and the run cannot go on."""
    failure = step.failure_of(cmd, reason(cmd, outcome))
    apply_result(step, cmd, Outcome("failed", reason=reason(cmd, outcome)))
    step.fail_run(failure)


RESULT_TABLE: tuple[ResultRow, ...] = (
    # -- an engine ---------------------------------------------------------------------------------------------------
    ResultRow(
        "engine",
        "launch_engine",
        "ready",
        "Starting or Joining: it is up (ready; a joiner waits for the committed weights)",
        lambda step, cmd, outcome: engines.launched(step, cmd),
    ),
    ResultRow(
        "engine",
        "launch_engine",
        ANY,
        "Starting: its start failed (start_failed: its spec recovers it, or the run fails); Joining: the slot retires",
        fire_engine("start_failed"),
    ),
    ResultRow(
        "engine",
        "launch_engine",
        ERROR,
        "the launch raised: as a failed start",
        fire_engine("start_failed"),
        engine_in("Starting", "Joining"),
    ),
    ResultRow(
        "engine",
        "kill_engine",
        "alive",
        "the process outlived SIGKILL: the run stops (no second process is ever started beside it)",
        lambda step, cmd, outcome: engines.still_alive(
            step, cmd, f"process still alive after SIGKILL ({outcome.reason})"
        ),
    ),
    ResultRow(
        "engine",
        "kill_engine",
        ANY,
        "its death is confirmed: a stop ends (a let-go slot starts anew), a recovery relaunches within the budget",
        lambda step, cmd, outcome: engines.killed(step, cmd),
    ),
    ResultRow(
        "engine",
        "kill_engine",
        ERROR,
        "its death could not be confirmed: the run stops",
        lambda step, cmd, outcome: engines.still_alive(
            step, cmd, f"its death could not be confirmed ({reason(cmd, outcome)})"
        ),
    ),
    ResultRow(
        "engine",
        "adopt_engine",
        ANY,
        "Adopting: what the kept process holds decides how it rejoins (adopted, behind, lost)",
        lambda step, cmd, outcome: engines.adopted(step, cmd, outcome.name),
        engine_in("Adopting"),
    ),
    ResultRow(
        "engine",
        "adopt_engine",
        ERROR,
        "Adopting: it could not be read (lost)",
        lambda step, cmd, outcome: engines.adopted(step, cmd, "lost"),
        engine_in("Adopting"),
    ),
    ResultRow(
        "engine",
        "transfer_weights",
        "loaded",
        "it took the weights (finish_update): it holds them once they are committed",
        lambda step, cmd, outcome: weights.loaded(step, cmd),
        engine_updating,
    ),
    ResultRow(
        "engine",
        "transfer_weights",
        ANY,
        "refused or unanswered: it must not serve with the weights it holds (mark_unhealthy; a leaver: lost)",
        engine_fault,
        engine_updating,
    ),
    ResultRow(
        "engine",
        "transfer_weights",
        ERROR,
        "a rollout engine's load raised: the weight update fails as a whole",
        lambda step, cmd, outcome: weights.abort_update(step),
        rollout_updating,
    ),
    ResultRow(
        "engine",
        ANY,
        "request_failed",
        "a request failed: mark_unhealthy (a leaver: lost)",
        engine_fault,
        engine_markable,
    ),
    ResultRow(
        "engine",
        ANY,
        "probe_failed",
        "its probe failed: mark_unhealthy (a leaver: lost)",
        engine_fault,
        engine_markable,
    ),
    ResultRow("engine", ANY, ERROR, "a request raised: mark_unhealthy (a leaver: lost)", engine_fault, engine_markable),
    ResultRow(
        "rollout",
        "read_gateway",
        ERROR,
        "a router's worker list could not be read: the report is missing (the monitor says so), the run goes on",
        lambda step, cmd, outcome: None,
    ),
    # -- the weight-update group ---------------------------------------------------------------------------------------
    ResultRow(
        "weight_sync", "init_weight_group", "done", "it connected", fire("sync", "connected"), sync_in("Connecting")
    ),
    ResultRow(
        "weight_sync",
        "init_weight_group",
        ANY,
        "it did not connect: nothing was sent, the trainer's update ends (the next one connects again)",
        lambda step, cmd, outcome: weights.group_failed(step),
        sync_in("Connecting"),
    ),
    ResultRow(
        "weight_sync",
        "broadcast_weights",
        "done",
        "every bucket was sent",
        fire("sync", "broadcast_done"),
        sync_in("Broadcasting"),
    ),
    ResultRow(
        "weight_sync",
        "broadcast_weights",
        "worker_crashed",
        "rank 0's worker crashed mid-broadcast: the broadcast failed, and the trainer heals or fails",
        lambda step, cmd, outcome: weights.broadcast_crashed(step, outcome.reason),
        sync_in("Broadcasting"),
    ),
    ResultRow(
        "weight_sync",
        "broadcast_weights",
        ANY,
        "failed or timed out: no engine of the snapshot holds the committed weights; the update ends uncommitted",
        lambda step, cmd, outcome: weights.broadcast_failed(step),
        sync_in("Broadcasting"),
    ),
    ResultRow("weight_sync", ANY, ERROR, "a group call raised: it failed, and the run stops", group_call_raised),
    # -- the trainer group -----------------------------------------------------------------------------------------
    ResultRow(
        "trainer",
        ANY,
        "trained",
        "train_done; its weights are ahead of the served ones until an update commits them",
        lambda step, cmd, outcome: trainer.trained(step),
    ),
    ResultRow("trainer", ANY, "saved", "save_done", fire("trainer", "save_done")),
    ResultRow("trainer", ANY, "checkpointed", "checkpoint_done", fire("trainer", "checkpoint_done")),
    ResultRow("trainer", ANY, "restored", "restored", fire("trainer", "restored")),
    ResultRow(
        "trainer",
        ANY,
        "healed",
        "a new worker holds the state: the operation runs again, once",
        lambda step, cmd, outcome: trainer.healed(step),
    ),
    ResultRow(
        "trainer",
        ANY,
        "heal_failed",
        "the run stops",
        lambda step, cmd, outcome: trainer.heal_failed(step, outcome.reason),
    ),
    ResultRow(
        "trainer",
        ANY,
        "worker_crashed",
        "heal from a peer under train FT, else the run stops",
        lambda step, cmd, outcome: trainer.crashed(step, outcome.reason),
    ),
    ResultRow(
        "trainer",
        ANY,
        ERROR,
        "a call raised: as a crashed worker",
        lambda step, cmd, outcome: trainer.crashed(step, reason(cmd, outcome)),
    ),
    # -- anything else ---------------------------------------------------------------------------------------------
    ResultRow(
        ANY,
        ANY,
        ERROR,
        "building the rollout function, the monitor, ...: the run cannot go on",
        lambda step, cmd, outcome: step.fail_run(step.failure_of(cmd, reason(cmd, outcome))),
    ),
)


def rows_by_key(rows: tuple[ResultRow, ...]) -> dict[tuple[str, str, str], tuple[ResultRow, ...]]:
    """The rows by (machine, effect, outcome), in table order."""
    table: dict[tuple[str, str, str], tuple[ResultRow, ...]] = {}
    for row in rows:
        key = (row.machine, row.effect, row.outcome)
        table[key] = (*table.get(key, ()), row)
    return table


RESULTS_BY_KEY = rows_by_key(RESULT_TABLE)
_CANDIDATES: dict[tuple[str, str, str], tuple[ResultRow, ...]] = {}


def candidates(machine: str, effect: str, outcome: str) -> tuple[ResultRow, ...]:
    """The rows that may apply to one result, most specific first (cached: the table is fixed)."""
    key = (machine, effect, outcome)
    found = _CANDIDATES.get(key)
    if found is None:
        keys = [key, (machine, effect, ANY), (machine, ANY, outcome), (ANY, ANY, outcome)]
        if outcome == ERROR:
            keys.remove((machine, effect, ANY))
        found = _CANDIDATES[key] = tuple(row for k in dict.fromkeys(keys) for row in RESULTS_BY_KEY.get(k, ()))
    return found


def apply_result(step: StepDraft, cmd: Command, outcome: Outcome) -> None:
    """Do what the first row that applies to this result says (none: nothing)."""
    machine, name = cmd.machine, outcome.name
    if machine == "engine":
        if cmd.group is None or cmd.engine is None:
            machine = ANY  # an engine command without its engine: only what any command's result does
        elif name != ERROR:
            step.subject = (cmd.group, cmd.engine)
    rows = _CANDIDATES.get((machine, cmd.effect, name))
    if rows is None:
        rows = candidates(machine, cmd.effect, name)
    for row in rows:
        if row.when is None or row.when(step, cmd):
            row.do(step, cmd, outcome)
            return
