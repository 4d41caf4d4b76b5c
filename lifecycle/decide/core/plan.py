"""The operations a training loop may call, and how machines move together: data, read by :mod:`.core`.

An operation is a *program*: a list of phases run in order, each as soon as the commands of the
previous ones have come back. A phase is a machine event (``rollout.generate``: the rollout
manager's move with the engine moves ``ENGINE_PLAN`` attaches to it) or a named step of the core
(``recover``, ``catch_up``, ...). An event a phase names that is not allowed in the state the job
is in by then is skipped, so one program serves every mode: ``init`` under replay goes to
``Replay`` and its server phases find nothing to do.

Operations run on a *lane*: the rollout side's and the trainer's operations may overlap (the async
loop generates while it trains), two operations of one lane may not. ``update_weights`` holds both.
"""

from __future__ import annotations

from typing import NamedTuple

# -- engine moves attached to rollout-manager moves --------------------------------------------------------
# trigger of the rollout manager -> (before|after its own move, engine trigger, engine states it applies to)
ENGINE_PLAN: dict[str, tuple[tuple[str, str, frozenset[str]], ...]] = {
    "generate": (("after", "resume", frozenset({"Quiesced"})),),
    "eval": (("after", "resume", frozenset({"Quiesced"})),),
    "generate_done": (("before", "drain", frozenset({"Serving"})),),
    "eval_done": (("before", "drain", frozenset({"Serving"})),),
    "offload": (("after", "offload", frozenset({"Quiesced"})),),
    "onload_weights": (("after", "onload_weights", frozenset({"Offloaded"})),),
    "onload_kv": (("before", "onload_kv", frozenset({"WeightsOnly"})),),
    # the weight update's snapshot: every engine still in play (recovered ones in PendingWeights get weights so); in
    # a stream the Serving ones are paused first, keeping their requests (the engine spec's pause: only streaming)
    "begin_update": (
        ("before", "pause", frozenset({"Serving"})),
        ("after", "begin_update", frozenset({"Quiesced", "PendingWeights", "WeightsOnly", "Paused"})),
    ),
    "catch_up": (("after", "begin_update", frozenset({"PendingWeights"})),),
    "stream": (("after", "resume", frozenset({"Quiesced"})),),
    "stream_stop": (("before", "drain", frozenset({"Serving"})),),
}
# The snapshot rule: a weight update may begin when every engine still in play is in one of these
# states for the rollout manager's state (the rest are `gone`); recovered engines are in the snapshot.
SNAPSHOT: dict[str, frozenset[str]] = {
    "Ready": frozenset({"Quiesced", "PendingWeights"}),
    "WeightsOnly": frozenset({"WeightsOnly", "PendingWeights", "Quiesced"}),
    # in a stream, as the update begins: the Serving engines paused (ENGINE_PLAN), the rest waiting for weights
    "Streaming": frozenset({"Paused", "PendingWeights", "Quiesced"}),
}


class Operation(NamedTuple):
    lane: str  # "rollout" | "trainer"
    program: tuple[str, ...]
    holds: tuple[str, ...] = ()  # other lanes it keeps busy
    optional: bool = False  # a no-op, not an error, when its machine event does not apply in this state
    when: str | None = None  # a predicate the whole operation needs (else it is refused as blocked)
    doc: str = ""


OPERATIONS: dict[str, Operation] = {
    # -- the rollout manager ---------------------------------------------------------------------------------
    "init": Operation(
        "rollout",
        ("rollout.init", "rollout.start_servers", "rollout.skip_servers", "load_initial", "rollout.servers_ready"),
        doc="construction gate, servers, the initial weights on every engine, monitor and eval fleet",
    ),
    "generate": Operation(
        "rollout",
        ("recover", "reconcile", "catch_up", "rollout.generate", "ci_inject", "require_routable", "read_gateway"),
        doc="rollout FT recovers dead engines and restarted ones catch up before any engine is routed",
    ),
    "generate_done": Operation("rollout", ("rollout.generate_done",)),
    "eval": Operation("rollout", ("recover", "reconcile", "catch_up", "rollout.eval")),
    "eval_done": Operation("rollout", ("rollout.eval_done",)),
    "pin": Operation(
        "rollout",
        ("fleet.pin", "fleet.probed", "fleet_restart", "fleet_alive", "fleet_loaded"),
        doc="the eval fleet on one snapshot of the committed weights, or a typed skip",
    ),
    "release": Operation("rollout", ("fleet_drain", "fleet.release"), optional=True),
    "offload": Operation("rollout", ("rollout.offload",), optional=True),
    "onload_weights": Operation("rollout", ("rollout.onload_weights",), optional=True),
    "onload_kv": Operation("rollout", ("rollout.onload_kv",), optional=True),
    "catch_up": Operation("rollout", ("catch_up",), optional=True),
    # --fully-async: the stream runs from stream to stream_stop; the trainer's take and update_weights go on meanwhile
    "stream": Operation(
        "rollout",
        ("recover", "reconcile", "catch_up", "rollout.stream", "require_routable", "read_gateway"),
        when="streaming",
        doc="every routable engine generates on; completed groups enter the buffer (news group_done)",
    ),
    "stream_stop": Operation("rollout", ("rollout.stream_stop",), when="streaming"),
    "stop_engine": Operation("rollout", ("engine.stop",)),
    # an elastic fleet: a new target (Op.target), reconciled at once; one engine out of the membership (its drain runs
    # beside the loop: the operation returns once it is out of routing)
    "scale_rollout": Operation(
        "rollout",
        ("rollout.scale", "catch_up", "read_gateway"),
        when="elastic",
        doc="the members brought to Op.target: leavers retired, joiners launched and caught up on committed weights",
    ),
    "retire_engine": Operation(
        "rollout",
        ("engine.retire", "read_gateway"),
        when="elastic",
        doc="one member withdrawn from routing, then drained and stopped beside the loop; the target one less",
    ),
    "start_engine": Operation("rollout", ("engine.start",)),
    "dispose": Operation(
        "rollout", ("rollout.dispose", "dispose_engines", "fleet_dispose", "monitor.dispose"), optional=True
    ),
    # -- the trainer group ---------------------------------------------------------------------------------------
    "trainer.start": Operation(
        "trainer",
        ("trainer.allocate", "trainer.initialize", "trainer_ready"),
        doc="workers, their model, then Ready: through the job checkpoint's restore when the job resumes",
    ),
    # --debug-rollout-only: no trainer exists, so its operations are refused as blocked by `trains`
    "train": Operation("trainer", ("trainer.train",), when="trains"),
    # in a stream the trainer trains only on what it takes: the buffered groups within --max-weight-staleness
    "take": Operation(
        "trainer",
        ("take_batch",),
        when="streaming",
        doc="drop every buffered group beyond the bound (prompts re-queued), train on the rest",
    ),
    "save": Operation("trainer", ("trainer.save",), when="trains"),
    # a job checkpoint is one consistent cut: nothing moves on the rollout side while it is written
    "checkpoint": Operation(
        "trainer",
        ("trainer.checkpoint",),
        holds=("rollout",),
        when="saves_job",
        doc="a job checkpoint, on the committed weights only (after the step's weight update)",
    ),
    "offload_train": Operation("trainer", ("trainer.offload",), optional=True, when="trains"),
    "onload_train": Operation("trainer", ("trainer.onload",), optional=True, when="trains"),
    # the trainer's update_weights: recover (rollout FT) and push to one snapshot, through its effects
    "update_weights": Operation(
        "trainer", ("trainer.update_weights", "trainer.update_done"), holds=("rollout",), when="trains"
    ),
    "trainer.dispose": Operation("trainer", ("sync_dispose", "trainer.dispose"), optional=True, when="trains"),
}

# Phases of an elastic fleet only: left out of every program where the config has no bounds, so such a job's states
# (its operations' programs among them) are exactly what they were without them.
ELASTIC_PHASES = frozenset({"reconcile", "read_gateway"})

# The phases an effect adds in front of the rest of its operation (the trainer's recover_engine and
# transfer_weights) are in the core's dispatch table, with everything else the core does with an effect.

# -- outcomes ------------------------------------------------------------------------------------------------------
# What a command's result may be (``Completed``), by effect; ``done`` is every command's plain success.
RESULTS: dict[str, frozenset[str]] = {
    "launch_engine": frozenset({"ready", "start_failed"}),
    "kill_engine": frozenset({"dead", "alive"}),
    # a kept engine: it holds the checkpoint's committed weights (adopted), something else (behind), or it cannot
    # be reached or is not the process the ledger names (lost: killed and launched anew)
    "adopt_engine": frozenset({"adopted", "behind", "lost"}),
    "transfer_weights": frozenset({"loaded", "refused", "request_failed", "done", "worker_crashed"}),
    "init_weight_group": frozenset({"done", "failed"}),
    "broadcast_weights": frozenset({"done", "failed", "worker_crashed"}),
    "destroy_weight_group": frozenset({"done"}),
    "continue_generation": frozenset({"done", "request_failed"}),
    # the stream holds the record of every request it sent: it re-sends them whatever the engine's health
    "hand_back_requests": frozenset({"done"}),
    # elastic: the shell started watching the drain (its end is the news drained); the gateway was read
    "drain_requests": frozenset({"done"}),
    "read_gateway": frozenset({"done"}),
    "requeue_prompts": frozenset({"done"}),
    "route_traffic": frozenset({"done", "request_failed"}),
    "stop_routing": frozenset({"done", "request_failed"}),
    "hold_routing": frozenset({"done", "request_failed"}),
    "pause_generation": frozenset({"done", "request_failed"}),
    "release_weights": frozenset({"done", "request_failed"}),
    "release_kv_cache": frozenset({"done", "request_failed"}),
    "resume_weights": frozenset({"done", "request_failed"}),
    "resume_kv_cache": frozenset({"done", "request_failed"}),
    "probe_engine": frozenset({"probe_ok", "probe_failed"}),
    "train_step": frozenset({"trained", "worker_crashed"}),
    "save_checkpoint": frozenset({"saved", "worker_crashed"}),
    "save_job_state": frozenset({"checkpointed", "worker_crashed"}),
    "restore_job_state": frozenset({"restored", "worker_crashed"}),
    "replace_worker": frozenset({"healed", "heal_failed"}),
    "allocate_workers": frozenset({"done", "worker_crashed"}),
    "init_model": frozenset({"done", "worker_crashed"}),
    "offload_train": frozenset({"done", "worker_crashed"}),
    "onload_train": frozenset({"done", "worker_crashed"}),
}
# News the shells report at any time (not the result of a command): deaths, probe verdicts, failed requests, and
# ``replaced``: another process answers at an external engine's address (its identity changed).
NEWS = frozenset(
    {
        "died",
        "request_failed",
        "probe",
        "probe_failed",
        "threshold_reached",
        "stale_result",
        "router_died",
        "replaced",
        "group_done",  # --fully-async: the stream completed a group (its oldest token's version in Outcome.version)
        "preempt_notice",  # elastic: the engine's process will be taken (a deadline, a fact the shell keeps)
        "drained",  # elastic: a Draining engine's requests finished, or its drain bound passed
    }
)
ERROR = "error"  # a handler raised: the operation is aborted (the lock released), the exception goes on
