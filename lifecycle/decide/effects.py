"""The vocabulary of effects a transition may perform.

Transitions *declare* their effects by these names and the ledger records them, so "replay
never constructs the rollout function" becomes a query over data. A spec naming an effect that
is not listed here fails validation (a typo would otherwise make an invariant vacuous).
"""

from __future__ import annotations

EFFECTS: dict[str, str] = {
    # rollout manager: construction and infrastructure
    "construct_rollout_fn": "build the rollout (generate) function and its state",
    "construct_eval_fn": "build the eval function",
    "start_servers": "launch the rollout server groups (engines)",
    "stop_servers": "shut the rollout server groups down",
    "start_monitor": "create a rollout health monitor (paused)",
    "stop_monitor": "stop a rollout health monitor",
    "pause_monitor": "pause rollout health monitors",
    "resume_monitor": "resume rollout health monitors",
    "arm_ci_fault_injection": "arm CI fault injection on rollout engines",
    "inject_ci_fault": "kill one rollout engine (once, armed by --ci-test) so that CI exercises recovery",
    "start_eval_fleet": "create the dedicated eval fleet",
    "reconcile_fleet": "elastic: leavers retire, the members are brought to the target (retire the surplus, join "
    "vacant slots)",
    "read_gateway": "elastic: read every router's worker list and report it (gateway.members)",
    "acquire_engine_lock": "take the engine lock for a weight update",
    "release_engine_lock": "release the engine lock",
    # rollout executor: data
    "generate_rollouts": "run the rollout function for one rollout id",
    "load_replay_data": "read saved rollout samples instead of generating",
    "save_rollout_data": "write the rollout's samples for later replay",
    "run_eval": "run the eval function",
    "start_stream": "--fully-async: start the rollout stream (every routable engine kept busy, groups buffered)",
    "stop_stream": "--fully-async: stop the stream; requests in flight finish into the buffer or are handed back",
    "requeue_prompts": "drop a group beyond --max-weight-staleness (logged with its versions); re-queue its prompts",
    # engines
    "launch_engine": "start an engine process (actor + server)",
    "kill_engine": "kill an engine process",
    "adopt_engine": "reach a previous driver's engine: identity, epoch, what it serves; paused, resident, unrouted",
    "route_traffic": "make an engine routable for generate requests",
    "stop_routing": "take an engine out of routing",
    "hold_routing": "--fully-async: take an engine out of routing, its requests in flight kept (a pause, not a drain)",
    "pause_generation": "pause in-flight generation on an engine",
    "continue_generation": "continue generation on an engine",
    "drain_requests": "elastic: watch a withdrawn engine until its requests in flight finish or the drain bound "
    "passes, then report it drained",
    "hand_back_requests": "the requests a paused engine kept go back to the stream, to be re-sent to another engine",
    "transfer_weights": "push the trainer's current weights to engines",
    "release_weights": "release an engine's weight memory",
    "release_kv_cache": "release an engine's KV-cache memory",
    "resume_weights": "restore an engine's weight memory",
    "resume_kv_cache": "restore an engine's KV-cache memory",
    "recover_engine": "restart a dead rollout engine (rollout fault tolerance)",
    "report_failure": "fail the run with an error naming the engine/worker and state",
    # health probing
    "probe_engine": "send a health probe (a real 1-token generation) to engines",
    "count_probe_failure": "count one failed probe toward the threshold",
    "mark_engine_unhealthy": "mark an engine Unhealthy",
    "discard_probe_result": "drop a probe result that returned after a pause",
    # eval fleet
    "restart_eval_engines": "restart dead engines of the eval fleet",
    "load_snapshot": "load one weight snapshot on every eval engine",
    # the weight-update process group (--update-weight-transfer-mode broadcast)
    "init_weight_group": "join the trainer and every engine of the snapshot in one process group (bounded)",
    "broadcast_weights": "broadcast the trainer's weights, bucket by bucket, to every member (bounded)",
    "destroy_weight_group": "leave the process group on the trainer and every member still alive",
    # trainer group
    "allocate_workers": "create the trainer worker actors",
    "init_model": "initialise the policy and optimizer",
    "train_step": "run one optimisation step",
    "save_checkpoint": "write a checkpoint",
    "save_job_state": "write a job checkpoint (trainer state, RNG, rollout id, committed version) atomically (--save)",
    "restore_job_state": "load the latest job checkpoint into every worker (--load): the job continues from it",
    "offload_train": "release trainer memory",
    "onload_train": "restore trainer memory",
    "replace_worker": "start a replacement for a crashed trainer worker",
    "keep_heal_state": "keep a copy of the model and optimizer to heal a worker without a peer from (train FT)",
    "restore_from_peer": "copy model and optimizer state from a healthy peer",
    "restore_weight_version": "a resumed stream's committed version is the job checkpoint's (never a counter from 0)",
    "restore_stream_buffer": "a resumed stream's buffered groups, judged by their recorded oldest versions",
}
