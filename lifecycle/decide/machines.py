"""The six machines of an RL job, as data: engine, health monitor, rollout manager, eval fleet, trainer,
weight-update group.

Read each table top to bottom: ``T(trigger, source(s), dest, when=guards, effects=...)``.
Guards and effect gates are predicate *names* from :mod:`lifecycle.decide.predicates`; effects are
names from :mod:`lifecycle.decide.effects`. The runtime, the checker and the graphs all use these.
"""

from __future__ import annotations

from lifecycle.decide.spec import MachineSpec, StateSpec, T

S = StateSpec
LIVE, TRANSIENT, GONE = frozenset({"live"}), frozenset({"transient"}), frozenset({"gone"})
BUSY, UPDATING = frozenset({"busy"}), frozenset({"updating"})
STREAM = frozenset({"streaming"})
LEAVING = frozenset({"leaving"})
KV = frozenset({"kv_cache"})

# -- engine ------------------------------------------------------------------------------------
# One per engine slot. PendingWeights: alive but not routable until it holds the current
# weights (miles #1724). Residency: Offloaded (nothing resident) -> WeightsOnly (partial onload)
# -> Quiesced (both resident). Weight updates happen from Quiesced (KV resident) or WeightsOnly, and in a stream
# from Paused: its requests kept, not drained. A failed in-flight update leads only to PendingWeights, which has no
# resume: an engine whose refit failed serves again only after a successful load of the committed weights.
_LIVE_UNROUTED = (
    "PendingWeights",
    "LoadingWeights",
    "Quiesced",
    "UpdatingWeights",
    "Offloaded",
    "WeightsOnly",
    "UpdatingWeightsKVReleased",
    "Paused",
    "UpdatingInFlight",
)

ENGINE = MachineSpec(
    name="engine",
    doc="One inference engine slot (an SGLang-API server process owned by a Ray actor).",
    states=(
        S("Init", doc="slot allocated, no process", tags=GONE),
        S("Starting", doc="process launched, waiting for /health_generate", tags=TRANSIENT),
        S(
            "Adopting",
            doc="a previous driver's engine, still running (--detach-engines): reached, identified, read back",
            tags=TRANSIENT,
        ),
        S("PendingWeights", doc="alive, but does not hold the current weight version: never routed", tags=LIVE),
        S("Serving", doc="routable: holds current weights and KV cache", tags=LIVE),
        S("Quiesced", doc="out of routing, generation paused, memory resident", tags=LIVE),
        S(
            "LoadingWeights",
            doc="a (re)started engine receiving the current weights; still not routable",
            tags=LIVE | TRANSIENT,
        ),
        S("UpdatingWeights", doc="receiving weights, KV cache resident", tags=LIVE | TRANSIENT),
        S("Offloaded", doc="weights and KV cache released", tags=LIVE, releases=frozenset({"weights", "kv_cache"})),
        S("WeightsOnly", doc="weights resumed, KV cache still released (partial onload)", tags=LIVE, releases=KV),
        S(
            "UpdatingWeightsKVReleased",
            doc="receiving weights while the KV cache is released",
            tags=LIVE | TRANSIENT,
            releases=KV,
        ),
        S(
            "Paused",
            doc="streaming: out of routing, generation paused with its requests kept (--pause-generation-mode)",
            tags=LIVE,
        ),
        S("UpdatingInFlight", doc="streaming: receiving weights while its paused requests wait", tags=LIVE | TRANSIENT),
        S("Unhealthy", marked=True, doc="dead or failing its probes"),
        S("Recovering", marked=True, doc="being restarted by rollout fault tolerance", tags=TRANSIENT),
        S("Stopping", doc="kill requested, death not yet confirmed", tags=TRANSIENT),
        S("Stopped", doc="death confirmed; may be started again", tags=GONE),
        # an elastic fleet (--rollout-min/max-num-gpus): members join and leave mid-run; a leave is never a failure
        S(
            "Joining",
            doc="elastic: a new member's process launched (a scale-up or a replacement), waiting for its health",
            tags=TRANSIENT,
        ),
        S(
            "Draining",
            doc="elastic: out of routing, its requests in flight finishing (or handed back) within the drain bound",
            tags=LIVE | LEAVING,
        ),
        S("Retiring", doc="elastic: leaving; kill requested, death not yet confirmed", tags=TRANSIENT | LEAVING),
        S("Retired", doc="elastic: the slot is vacant, its process confirmed dead; it may be joined again", tags=GONE),
        S("Failed", terminal=True, marked=True, doc="restart budget spent, or no rollout FT", tags=GONE),
        S("Disposed", terminal=True, doc="slot released", tags=GONE),
    ),
    transitions=(
        T("start", ("Init", "Stopped"), "Starting", effects=["launch_engine"]),
        T("ready", "Starting", "PendingWeights"),
        # a resumed job's slot whose engine outlived the old driver (the run directory's ledger names it): adopted,
        # never launched -- kept without a reload only when it holds the checkpoint's committed weights
        T("adopt", "Init", "Adopting", when="keeps_engines", effects=["adopt_engine"]),
        T("adopted", "Adopting", "Quiesced"),
        T("adopted_behind", "Adopting", "PendingWeights"),  # a later (voided), torn or unknown version: reloaded
        T("disown", "Adopting", "Stopping", effects=["kill_engine"]),  # unreachable, or not the ledger's: relaunched
        T("begin_update", "PendingWeights", "LoadingWeights", effects=["transfer_weights"]),
        T("finish_update", "LoadingWeights", "Quiesced"),
        T("begin_update", "Quiesced", "UpdatingWeights", effects=["transfer_weights"]),
        T("finish_update", "UpdatingWeights", "Quiesced"),
        T("resume", "Quiesced", "Serving", effects=["continue_generation", "route_traffic"]),
        T("drain", "Serving", "Quiesced", effects=["stop_routing", "pause_generation"]),
        T("offload", "Quiesced", "Offloaded", effects=["release_weights", "release_kv_cache"]),
        T("onload_weights", "Offloaded", "WeightsOnly", effects=["resume_weights"]),
        T("begin_update", "WeightsOnly", "UpdatingWeightsKVReleased", effects=["transfer_weights"]),
        T("finish_update", "UpdatingWeightsKVReleased", "WeightsOnly"),
        # a failed weight update aborts: the engine keeps the old weights and is not routable-fresh
        T("abort_update", "LoadingWeights", "PendingWeights"),
        T("abort_update", "UpdatingWeights", "Quiesced"),
        T("abort_update", "UpdatingWeightsKVReleased", "WeightsOnly"),
        T("onload_kv", "WeightsOnly", "Quiesced", effects=["resume_kv_cache"]),
        # streaming: an in-flight update pauses a Serving engine keeping its requests, loads, and resumes them; a
        # failed load -- or a whole update that failed after it loaded -- hands the requests back to the stream and
        # leaves the engine waiting for the committed weights (no edge back to Serving)
        T("pause", "Serving", "Paused", when="streaming", effects=["hold_routing", "pause_generation"]),
        T("begin_update", "Paused", "UpdatingInFlight", effects=["transfer_weights"]),
        T("finish_update", "UpdatingInFlight", "Paused"),
        T("resume", "Paused", "Serving", effects=["continue_generation", "route_traffic"]),
        T("abort_update", "UpdatingInFlight", "PendingWeights", effects=["hand_back_requests"]),
        T("revert", "Paused", "PendingWeights", effects=["hand_back_requests"]),
        # faults: death is detected by Ray/the monitor, start-up failure by the launcher
        T("start_failed", "Starting", "Unhealthy"),
        # the router lost its membership (it died and was restarted empty): a Serving engine is registered
        # again, under rollout FT; without it the run stops (the core marks the engine)
        T("republish", "Serving", "Serving", when="rollout_ft", effects=["route_traffic"]),
        T("mark_unhealthy", "Serving", "Unhealthy", effects=["stop_routing"]),
        T("mark_unhealthy", _LIVE_UNROUTED, "Unhealthy"),
        T(
            "recover",
            "Unhealthy",
            "Recovering",
            when=("rollout_ft", "!external_engines"),
            effects=["recover_engine", "kill_engine"],
        ),
        T("fail", "Unhealthy", "Failed", when="!rollout_ft", effects=["report_failure"]),
        # an engine the job did not start is never restarted: under rollout FT it is let go (the run goes on
        # with the others) and may be attached again by a start once its owner has restarted it
        T("detach", "Unhealthy", "Stopping", when=("rollout_ft", "external_engines"), effects=["kill_engine"]),
        T("restart", "Recovering", "Starting", effects=["launch_engine"]),
        # a spent restart budget: an elastic fleet retires the slot and goes on while its minimum serves
        T("give_up", "Recovering", "Failed", when="!elastic", effects=["report_failure"]),
        T("give_up", "Recovering", "Retired", when="elastic"),
        T("stop", "Serving", "Stopping", effects=["stop_routing", "kill_engine"]),
        T("stop", ("Unhealthy", *_LIVE_UNROUTED), "Stopping", effects=["kill_engine"]),
        T("confirm_dead", "Stopping", "Stopped"),
        # an elastic fleet: a joiner is routed only after its catch-up (PendingWeights has no resume); a leaver is
        # withdrawn first (every way out of Serving carries stop_routing or hold_routing), and news about it -- a
        # death, a probe verdict, a failed request -- stops it (lost), never marks it Unhealthy
        T("join", ("Init", "Retired"), "Joining", when="elastic", effects=["launch_engine"]),
        T("ready", "Joining", "PendingWeights"),
        T("start_failed", "Joining", "Retiring", effects=["kill_engine"]),
        T("retire", "Serving", "Draining", when="elastic", effects=["stop_routing", "drain_requests"]),
        # streaming: the requests it kept continue, unrouted, until they finish or are handed back
        T("retire", "Paused", "Draining", when="elastic", effects=["continue_generation", "drain_requests"]),
        T("drained", "Draining", "Retiring", effects=["hand_back_requests if streaming", "kill_engine"]),
        T(
            "retire",
            ("PendingWeights", "Quiesced", "Offloaded", "WeightsOnly", "Unhealthy"),
            "Retiring",
            when="elastic",
            effects=["kill_engine"],
        ),
        T("lost", (*_LIVE_UNROUTED, "Draining"), "Retiring", when="elastic", effects=["kill_engine"]),
        T("retired", "Retiring", "Retired"),
        T("retired", "Recovering", "Retired", when="elastic"),  # a leaver's recovery kill: the slot retires
        T("dispose", ("Init", "Stopped", "Retired"), "Disposed"),
    ),
    environment=frozenset({"mark_unhealthy", "start_failed", "republish", "drained", "lost"}),
    # a failed request's report names the process it was sent to: one sent to a replaced process is not news
    fenced=frozenset({"mark_unhealthy", "drained", "lost"}),
)

# -- health monitor -----------------------------------------------------------------------------
# One per rollout server group, and only when monitors_rollout. Paused at creation; the rollout
# manager resumes it only at generate/eval. A probe failure that returns while paused is
# discarded; an engine *death* reported by Ray is acted on even while paused.
MONITOR = MachineSpec(
    name="monitor",
    doc="Rollout health monitor of one server group (probes /health_generate concurrently).",
    states=(
        S("Init", doc="not created"),
        S("Paused", doc="created or paused: probes are not sent, late results are dropped", tags=LIVE),
        S("Running", doc="probing every interval (with jitter)", tags=LIVE),
        S("Stopped", terminal=True, doc="stopped for good"),
    ),
    transitions=(
        T("create", "Init", "Paused", when="monitors_rollout", effects=["start_monitor"]),
        T("resume", "Paused", "Running", effects=["resume_monitor"]),
        T("pause", "Running", "Paused", effects=["pause_monitor"]),
        T("probe", "Running", "Running", effects=["probe_engine"]),
        T("probe_failed", "Running", "Running", effects=["count_probe_failure"]),
        T("threshold_reached", "Running", "Running", effects=["mark_engine_unhealthy"]),
        T("probe_failed", "Paused", "Paused", effects=["discard_probe_result"]),
        T("threshold_reached", "Paused", "Paused", effects=["discard_probe_result"]),
        # a result of a probe sent before the last pause (an older resume): never acted on
        T("stale_result", "Running", "Running", effects=["discard_probe_result"]),
        T("stale_result", "Paused", "Paused", effects=["discard_probe_result"]),
        T("engine_died", "Running", "Running", effects=["mark_engine_unhealthy"]),
        T("engine_died", "Paused", "Paused", effects=["mark_engine_unhealthy"]),
        T("stop", ("Paused", "Running"), "Stopped", effects=["stop_monitor"]),
        T("dispose", "Init", "Stopped"),  # never created (monitors_rollout false): nothing to stop
    ),
    environment=frozenset({"engine_died", "probe_failed", "threshold_reached", "stale_result"}),
    # a death report or probe verdict of an engine's earlier process (before its restart, or the previous
    # driver's) says nothing about the process it has now (miles #2172)
    fenced=frozenset({"engine_died", "probe_failed", "threshold_reached"}),
)

# -- rollout manager (InferenceController + RolloutExecutor) -----------------------------------
# Replay is an absorbing branch: it constructs nothing, and generate reads the saved file.
_MONITOR_OFF = "pause_monitor if monitors_rollout"
ROLLOUT = MachineSpec(
    name="rollout",
    doc="The rollout manager: InferenceController (servers, monitors, lock, offload) + RolloutExecutor (data).",
    states=(
        S("Init"),
        S("Replay", marked=True, doc="replaying saved rollouts: no rollout fn, servers, monitors or fleet"),
        S("Constructed", doc="rollout and eval functions built"),
        S("StartingServers", doc="rollout server groups launching"),
        S("Ready", doc="idle between steps; monitors paused"),
        S("Generating", doc="rollout function running; monitors resumed", tags=BUSY),
        S("Evaluating", doc="eval function running; monitors resumed", tags=BUSY),
        S("UpdatingWeights", doc="engine lock held, monitors paused, weights flowing", tags=UPDATING),
        S(
            "CatchingUp",
            doc="engine lock held: restarted engines receive the committed weights (PendingWeights)",
            tags=UPDATING,
        ),
        S("Offloaded", doc="engine memory released for training"),
        S("WeightsOnly", doc="weights resumed, KV cache still released"),
        S("UpdatingWeightsKVReleased", doc="engine lock held while the KV cache is released", tags=UPDATING),
        S(
            "Streaming",
            doc="--fully-async: every routable engine generates, completed groups enter the buffer; monitors resumed",
            tags=BUSY | STREAM,
        ),
        S(
            "PausedForUpdate",
            doc="engine lock held, an in-flight update: the snapshot's engines paused with their requests kept",
            tags=UPDATING,
        ),
        S(
            "StreamCatchingUp",
            doc="engine lock held: restarted engines load the committed weights while the others generate on",
            tags=BUSY | UPDATING | STREAM,
        ),
        S("Failed", terminal=True, marked=True, doc="servers could not start"),
        S("Disposed", terminal=True),
    ),
    transitions=(
        T("init", "Init", "Replay", when="replay"),
        T("init", "Init", "Constructed", when="!replay", effects=["construct_rollout_fn", "construct_eval_fn"]),
        T("generate", "Replay", "Replay", effects=["load_replay_data"]),
        T("start_servers", "Constructed", "StartingServers", when="starts_servers", effects=["start_servers"]),
        T("skip_servers", "Constructed", "Ready", when="!starts_servers"),
        T(
            "servers_ready",
            "StartingServers",
            "Ready",
            effects=[
                "start_monitor if monitors_rollout",
                "arm_ci_fault_injection if ci_injects_rollout_faults",
                "start_eval_fleet if eval_fleet_enabled",
            ],
        ),
        T("servers_failed", "StartingServers", "Failed", effects=["report_failure"]),
        T(
            "generate",
            "Ready",
            "Generating",
            effects=["resume_monitor if monitors_rollout", "generate_rollouts"],
        ),
        # --ci-test under rollout FT: once, at the first generate, one engine is killed so CI exercises recovery
        T("inject_ci_fault", "Generating", "Generating", when="ci_injects_rollout_faults", effects=["inject_ci_fault"]),
        T("generate_done", "Generating", "Ready", effects=[_MONITOR_OFF, "save_rollout_data if saves_rollout_data"]),
        T("eval", "Ready", "Evaluating", effects=["resume_monitor if monitors_rollout", "run_eval"]),
        T("eval_done", "Evaluating", "Ready", effects=[_MONITOR_OFF]),
        T(
            "begin_update",
            "Ready",
            "UpdatingWeights",
            when="updates_rollout_weights",
            effects=[_MONITOR_OFF, "acquire_engine_lock"],
        ),
        T("update_done", "UpdatingWeights", "Ready", effects=["release_engine_lock"]),
        T("update_failed", "UpdatingWeights", "Ready", effects=["release_engine_lock"]),
        T("catch_up", "Ready", "CatchingUp", effects=[_MONITOR_OFF, "acquire_engine_lock"]),
        T("update_done", "CatchingUp", "Ready", effects=["release_engine_lock"]),
        T("update_failed", "CatchingUp", "Ready", effects=["release_engine_lock"]),
        T(
            "offload",
            "Ready",
            "Offloaded",
            when="offloads_rollout",
            effects=[_MONITOR_OFF, "release_weights", "release_kv_cache"],
        ),
        T("onload_weights", "Offloaded", "WeightsOnly", effects=["resume_weights"]),
        T("begin_update", "WeightsOnly", "UpdatingWeightsKVReleased", effects=["acquire_engine_lock"]),
        T("update_done", "UpdatingWeightsKVReleased", "WeightsOnly", effects=["release_engine_lock"]),
        T("update_failed", "UpdatingWeightsKVReleased", "WeightsOnly", effects=["release_engine_lock"]),
        T("onload_kv", "WeightsOnly", "Ready", effects=["resume_kv_cache"]),
        # --fully-async: the stream runs from one stream to its stream_stop; the trainer's updates pause it in flight
        T(
            "stream",
            "Ready",
            "Streaming",
            when="streaming",
            effects=["resume_monitor if monitors_rollout", "start_stream"],
        ),
        # a buffered group more than --max-weight-staleness versions behind is never trained: its prompts re-queued
        T("drop_stale", "Streaming", "Streaming", effects=["requeue_prompts"]),
        T("drop_stale", "StreamCatchingUp", "StreamCatchingUp", effects=["requeue_prompts"]),
        T("begin_update", "Streaming", "PausedForUpdate", effects=[_MONITOR_OFF, "acquire_engine_lock"]),
        T(
            "update_done",
            "PausedForUpdate",
            "Streaming",
            effects=["release_engine_lock", "resume_monitor if monitors_rollout"],
        ),
        T(
            "update_failed",
            "PausedForUpdate",
            "Streaming",
            effects=["release_engine_lock", "resume_monitor if monitors_rollout"],
        ),
        T("catch_up", "Streaming", "StreamCatchingUp", effects=["acquire_engine_lock"]),
        T("update_done", "StreamCatchingUp", "Streaming", effects=["release_engine_lock"]),
        T("update_failed", "StreamCatchingUp", "Streaming", effects=["release_engine_lock"]),
        T("stream_stop", "Streaming", "Ready", effects=[_MONITOR_OFF, "stop_stream"]),
        # an elastic fleet: a new target size, reconciled at once (joins, retirements) where the manager stands
        *(T("scale", s, s, when="elastic", effects=["reconcile_fleet"]) for s in ("Ready", "Generating", "Streaming")),
        T(
            "dispose",
            ("Replay", "Ready"),
            "Disposed",
            effects=["stop_monitor if monitors_rollout", "stop_servers if starts_servers"],
        ),
    ),
    environment=frozenset({"servers_failed", "update_failed"}),
)

# -- eval fleet -----------------------------------------------------------------------------------
# pin = probe (only when nobody else does) -> restart dead engines -> wait alive -> load one
# snapshot on every engine (all-or-nothing) -> ready; any step may end in a typed skip.
EVAL_FLEET = MachineSpec(
    name="eval_fleet",
    doc="Dedicated eval engines (--eval-num-gpus): pinned to one weight snapshot per eval.",
    states=(
        S("Init"),
        S("Idle", doc="fleet exists, not pinned"),
        S("Probing", doc="probing its own engines (no rollout monitor does it)"),
        S("Restarting", doc="restarting dead eval engines (the fleet's own, not rollout FT)"),
        S("WaitingAlive", doc="waiting (bounded) until every eval engine answers"),
        S("LoadingSnapshot", doc="loading one weight version on every eval engine"),
        S("Pinned", doc="every eval engine holds the snapshot: eval may run"),
        S("SkippedUnhealthy", marked=True, doc="skip reason: unhealthy"),
        S("SkippedPinViolation", marked=True, doc="skip reason: pin_violation (versions disagree)"),
        S("Disposed", terminal=True),
    ),
    transitions=(
        T("create", "Init", "Idle", when="eval_fleet_enabled"),
        T("pin", "Idle", "Probing", when="eval_fleet_self_probes", effects=["probe_engine"]),
        T("pin", "Idle", "Restarting", when="!eval_fleet_self_probes"),
        T("probed", "Probing", "Restarting"),
        T("restarted", "Restarting", "WaitingAlive", effects=["restart_eval_engines"]),
        T("alive", "WaitingAlive", "LoadingSnapshot", effects=["load_snapshot"]),
        T("loaded", "LoadingSnapshot", "Pinned"),
        T("unhealthy", ("Probing", "Restarting", "WaitingAlive"), "SkippedUnhealthy"),
        T("version_mismatch", "LoadingSnapshot", "SkippedPinViolation"),
        T("release", ("Pinned", "SkippedUnhealthy", "SkippedPinViolation"), "Idle"),
        T("dispose", ("Init", "Idle"), "Disposed"),
    ),
    environment=frozenset({"unhealthy", "version_mismatch"}),
)

# -- weight-update process group ---------------------------------------------------------------------
# Exists only with broadcast_weights. Its members are one snapshot's engine processes: a member that dies
# or restarts (a new process) makes it Stale, and a stale group is destroyed and connected again before
# the next broadcast. A failed broadcast destroys it: the next update connects afresh.
WEIGHT_SYNC = MachineSpec(
    name="weight_sync",
    doc="The trainer's weight-update process group with the engines (SGLang's /init_weights_update_group).",
    states=(
        S("Init", doc="never connected"),
        S("Connecting", doc="trainer and every member joining (bounded)", tags=BUSY),
        S("Connected", doc="every member of the last snapshot joined; broadcasts may go"),
        S("Stale", marked=True, doc="a member died or restarted: must be destroyed and connected again"),
        S("Broadcasting", doc="the trainer's weights flowing to every member (each bucket bounded)", tags=BUSY),
        S("Disconnected", doc="destroyed (after a failure or a stale membership): connect before a broadcast"),
        S("Disposed", terminal=True),
    ),
    transitions=(
        T("connect", ("Init", "Disconnected"), "Connecting", when="broadcasts_weights", effects=["init_weight_group"]),
        T("connected", "Connecting", "Connected"),
        T("connect_failed", "Connecting", "Disconnected", effects=["destroy_weight_group"]),
        T("membership_changed", "Connected", "Stale"),
        T("member_left", "Connected", "Stale", when="elastic"),  # a planned departure (a retirement)
        T("destroy", "Stale", "Disconnected", effects=["destroy_weight_group"]),
        T("broadcast", "Connected", "Broadcasting", effects=["broadcast_weights"]),
        T("broadcast_done", "Broadcasting", "Connected"),
        T("broadcast_failed", "Broadcasting", "Disconnected", effects=["destroy_weight_group"]),
        T("dispose", "Disconnected", "Disposed"),
        T("dispose", ("Connected", "Stale"), "Disposed", effects=["destroy_weight_group"]),
    ),
    environment=frozenset({"membership_changed", "connect_failed", "broadcast_failed"}),
)

# -- trainer group ----------------------------------------------------------------------------------
TRAINER = MachineSpec(
    name="trainer",
    doc="The trainer worker group (Ray actors with a torch policy).",
    states=(
        S("Init"),
        S("Allocated", doc="worker actors placed"),
        S("Initialized", doc="policy and optimizer built"),
        S("Ready", doc="between steps"),
        S("Training", doc="one optimisation step", tags=BUSY),
        S("UpdatingWeights", doc="pushing weights to rollout engines under the engine lock", tags=BUSY),
        S("Offloaded", doc="trainer memory released"),
        S("Saving", doc="writing a checkpoint", tags=BUSY),
        S("Checkpointing", doc="writing a job checkpoint: only on the committed weights (--save)", tags=BUSY),
        S("Restoring", doc="a resumed job's workers loading its latest checkpoint (--load)", tags=BUSY),
        S("Errored", marked=True, doc="a worker crashed", tags=BUSY),
        S("Healing", marked=True, doc="replacement worker restoring state from a peer (train FT)", tags=BUSY),
        S("Failed", terminal=True, marked=True, doc="a worker crashed without train FT"),
        S("Disposed", terminal=True),
    ),
    transitions=(
        # --debug-rollout-only generates without training: no worker is ever allocated
        T("allocate", "Init", "Allocated", when="trains", effects=["allocate_workers"]),
        T("initialize", "Allocated", "Initialized", effects=["init_model"]),
        T("ready", "Initialized", "Ready", when="!resumes", effects=["keep_heal_state if heals_trainer"]),
        # a resumed job (its driver died): the workers continue from the checkpoint, not from the initial weights
        T("restore", "Initialized", "Restoring", when="resumes", effects=["restore_job_state"]),
        # a resumed stream: the committed version first, then the buffered groups judged against it (AReaL #1388:
        # the staleness accounting travels with the version; miles #2244: the version never starts again from 0)
        T(
            "restored",
            "Restoring",
            "Ready",
            effects=[
                "keep_heal_state if heals_trainer",
                "restore_weight_version if streaming",
                "restore_stream_buffer if streaming",
            ],
        ),
        T("train", "Ready", "Training", effects=["train_step"]),
        T("train_done", "Training", "Ready", effects=["keep_heal_state if heals_trainer"]),
        T(
            "update_weights",
            "Ready",
            "UpdatingWeights",
            when="updates_rollout_weights",
            effects=[
                "recover_engine if trainer_recovers_rollout",
                "reconcile_fleet if elastic",  # a stream's only per-step boundary: leavers retire, gaps are filled
                "transfer_weights",
            ],
        ),
        T("update_done", "UpdatingWeights", "Ready"),
        T("offload", "Ready", "Offloaded", when="offloads_train", effects=["offload_train"]),
        T("onload", "Offloaded", "Ready", effects=["onload_train"]),
        T("save", "Ready", "Saving", effects=["save_checkpoint"]),
        T("save_done", "Saving", "Ready"),
        T("checkpoint", "Ready", "Checkpointing", when="saves_job", effects=["save_job_state"]),
        T("checkpoint_done", "Checkpointing", "Ready"),
        T("worker_crashed", ("Training", "UpdatingWeights", "Saving", "Checkpointing"), "Errored"),
        # a worker lost while the job's state is restored has no peer with that state to heal from: the resumed
        # run stops; the checkpoint is untouched, so --resume again
        T("worker_crashed", "Restoring", "Failed", effects=["report_failure"]),
        T("heal", "Errored", "Healing", when="heals_trainer", effects=["replace_worker"]),
        T("healed", "Healing", "Ready", effects=["restore_from_peer"]),
        T("fail", "Errored", "Failed", when="!heals_trainer", effects=["report_failure"]),
        T("dispose", ("Init", "Ready"), "Disposed"),
    ),
    environment=frozenset({"worker_crashed"}),
)

MACHINES: dict[str, MachineSpec] = {m.name: m for m in (ENGINE, MONITOR, ROLLOUT, EVAL_FLEET, TRAINER, WEIGHT_SYNC)}
