"""Fault injection: ``lifecycle run --inject FAULT:INDEX@STEP`` and the reliability matrix.

Seven faults, each a *real* failure of a real part (no mocked errors):

========================  ==========================================================================
``kill-engine``           the engine's Ray actor process dies (SIGKILL of server and actor); Ray
                          reports the actor's death to the slot's watcher
``hang-engine``           the server process is SIGSTOPped: health and generate stall, nothing dies;
                          only a bounded wait (request timeout, probe timeout) can notice it
``kill-http``             only the HTTP server process dies; the actor lives (its pid is unchanged)
``crash-during-update``   the server is SIGKILLed the moment its engine machine enters a weight
                          update (a ``live`` and ``transient`` state), before the HTTP call
``crash-during-offload``  the same when its weights are released (needs ``--offload-rollout``)
``crash-during-broadcast`` the server is SIGKILLed between two buckets of a broadcast update (needs
                          ``--update-weight-transfer-mode broadcast`` and more than one bucket)
``lose-node``             the Ray worker node hosting the engine is removed (``--ray-nodes 3``)
``crash-trainer``         a trainer worker actor's process dies
``crash-trainer-in-broadcast`` trainer worker 0 (the broadcast's rank 0) is SIGKILLed between two buckets
``kill-router``           the rollout group's sglang-router process is SIGKILLed (INDEX is 0); its
                          watcher reports it, and it comes back empty
``kill-driver``           the driver process itself is SIGKILLed (INDEX is 0; needs ``--save``): every
                          engine and worker dies with it; ``lifecycle run --resume RUN_DIR`` continues
========================  ==========================================================================

The armed faults (update, offload) act from an event-log sink, synchronously inside the machine
transition, so the crash lands at an exact lifecycle point rather than "some time later".
:func:`expected` is the contract of the matrix: for every fault and FT configuration, whether the
run recovers or stops, and why. ``tests/reliability/test_matrix.py`` proves each cell and writes
``docs/reliability.md`` from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engines.launcher import Launcher
from lifecycle.config import MAX_COUNT, LifecycleConfig, arg_type, parse_number
from lifecycle.errors import ConfigError, LifecycleError
from lifecycle.events import EventLog
from lifecycle.predicates import broadcasts_weights, heals_trainer, offloads_rollout, rollout_ft
from lifecycle.presets import FT_PRESETS
from lifecycle.runner import Runner

FAULTS = (
    "kill-engine",
    "hang-engine",
    "kill-http",
    "crash-during-update",
    "crash-during-offload",
    "crash-during-broadcast",
    "lose-node",
    "crash-trainer",
    "crash-trainer-in-broadcast",
    "kill-router",
    "kill-driver",
)
ENGINE_FAULTS = FAULTS[:7]
TRAINER_FAULTS = ("crash-trainer", "crash-trainer-in-broadcast")
BROADCAST_FAULTS = ("crash-during-broadcast", "crash-trainer-in-broadcast")  # they need broadcast mode
FAULT_DOCS = {
    "kill-engine": "engine actor process SIGKILL (Ray reports the actor dead)",
    "hang-engine": "engine server SIGSTOP: health and generate stall, nothing dies",
    "kill-http": "HTTP server process SIGKILL, the Ray actor stays alive",
    "crash-during-update": "server SIGKILL on entering a weight update, before the HTTP call",
    "crash-during-offload": "server SIGKILL on entering Offloaded (--offload-rollout)",
    "crash-during-broadcast": "server SIGKILL between two buckets of a broadcast weight update",
    "lose-node": "the Ray worker node hosting the engine is removed (--ray-nodes 3)",
    "crash-trainer": "trainer worker actor process dies",
    "crash-trainer-in-broadcast": "trainer worker 0 (the broadcast's rank 0) SIGKILL between two buckets",
    "kill-router": "the rollout sglang-router process SIGKILL (it restarts empty)",
    "kill-driver": "the driver (lifecycle run itself) SIGKILLs itself; lifecycle run --resume RUN_DIR continues",
}
# The four FT configurations of the matrix, by their column names (the flags are the presets').
FT_CONFIGS: dict[str, dict[str, object]] = {
    "none": FT_PRESETS["no-ft"],
    "train": FT_PRESETS["ft-train"],
    "rollout": FT_PRESETS["ft-rollout"],
    "both": FT_PRESETS["ft-both"],
}
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
        if f.kind == "lose-node" and launcher != "ray":
            raise ConfigError("--inject", str(f), "needs engines in Ray actors", "drop --launcher local")
        if f.kind == "lose-node" and ray_nodes < 2:
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


# The run modes the matrix covers, as flags: the normal loop, generation without a trainer, and the loop
# with broadcast weight updates (small buckets, so that a fault can land between two of them).
MODES: dict[str, dict[str, object]] = {
    "normal": {},
    "rollout-only": {"debug_rollout_only": True},
    "broadcast": {"update_weight_transfer_mode": "broadcast", "update_weight_buffer_size": 64 * 1024},
}


def ft_config(name: str, engines: int = 2, mode: str = "normal") -> LifecycleConfig:
    """The FT configuration ``name`` with ``engines`` rollout engines (the matrix uses 2), in ``mode``."""
    return LifecycleConfig.from_mapping({**FT_CONFIGS[name], **MODES[mode], "rollout_num_gpus": engines})


def expected(kind: str, ft: str, mode: str = "normal") -> Expected:
    """What the lifecycle promises for ``kind`` under FT configuration ``ft`` (derived from the predicates)."""
    config = ft_config(ft, mode=mode)
    if kind == "kill-driver":  # whatever the FT configuration: the job's state is on disk, not in the driver
        return Expected(
            "recovers",
            "the driver dies with its engines and workers; lifecycle run --resume restores the last checkpoint, "
            "relaunches the engines, loads its weights before any is routed, runs the later steps again; "
            "every step trained once",
        )
    if kind == "crash-trainer-in-broadcast":
        if heals_trainer(config):
            return Expected(
                "recovers",
                "the broadcast fails, every engine of the snapshot is taken out; the worker is replaced and restored, "
                "the update runs again over a new group; run completes",
            )
        return Expected("stops", "TrainerFailed names the worker and the state (UpdatingWeights); train FT off")
    if kind == "crash-trainer":
        if heals_trainer(config):
            return Expected("recovers", "worker replaced and restored from saved state, step retried, run completes")
        return Expected("stops", "TrainerFailed names the worker, the trainer state and the crash; train FT off")
    if kind == "crash-during-broadcast":
        if rollout_ft(config):
            return Expected(
                "recovers",
                "the broadcast fails within --update-weight-timeout and the group is destroyed; the engine is "
                "relaunched, the survivor reloads the committed checkpoint before it is routed, the next update "
                "reconnects; run completes",
            )
        return Expected("stops", "EngineFailed names the engine, the state it was in and the reason; rollout FT off")
    if kind == "kill-router":
        if rollout_ft(config):
            return Expected(
                "recovers",
                "router restarted empty; every engine is registered again as it enters Serving; run completes",
            )
        return Expected("stops", "the run stops at once naming the router and the fix; rollout FT off")
    if rollout_ft(config) and mode == "rollout-only":  # no trainer, so no update_weights to recover it
        return Expected(
            "recovers",
            "engine marked Unhealthy, relaunched at the next generate (no trainer), loads the committed weights "
            "before it is routed; run completes",
        )
    if rollout_ft(config):
        where = " on a surviving node" if kind == "lose-node" else ""
        return Expected(
            "recovers",
            f"engine marked Unhealthy, relaunched{where}, loads the current weights before it is routed; run completes",
        )
    return Expected("stops", "EngineFailed names the engine, the state it was in and the reason; rollout FT off")


# -- the injector -----------------------------------------------------------------------------------------
class EngineSlot(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def launcher(self) -> Launcher: ...


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


@dataclass
class Injection:
    """What was done, to which part, when (seconds since the injector started) -- for reports and tests."""

    fault: Fault
    target: str
    detail: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0
    fired_at: float | None = None  # armed faults: when the crash actually happened


class FaultInjector:
    """Applies faults at step starts; armed faults fire from the event log at an exact transition."""

    def __init__(self, faults: Sequence[Fault] = (), *, detect_timeout: float = 20.0) -> None:
        self.faults = tuple(faults)
        self.detect_timeout = detect_timeout
        self.injections: list[Injection] = []
        self._t0 = time.monotonic()

    async def inject(self, fault: Fault, controller: Controller | None, trainer: Workers) -> Injection:
        """Apply ``fault`` now; a ``fault.injected`` event (target, details) goes to the controller's log."""
        log = controller.log if controller is not None else None
        if fault.kind == "kill-driver":  # on the record first: nothing of this process runs after the signal
            if log is not None:
                log.emit("fault.injected", fault=str(fault), target="driver", pid=os.getpid())
            os.kill(os.getpid(), signal.SIGKILL)
        record = await self._inject(fault, controller, trainer)
        if log is not None:
            log.emit("fault.injected", fault=str(fault), target=record.target, **record.detail)
        return record

    async def _inject(self, fault: Fault, controller: Controller | None, trainer: Workers) -> Injection:
        now = time.monotonic() - self._t0
        if fault.kind == "crash-trainer-in-broadcast":
            if controller is None or controller.log is None:
                raise FaultError(f"{fault}: there is no event log to arm the fault on")
            worker = await trainer.worker_pid(fault.index)
            record = Injection(fault, f"trainer worker {fault.index}", at=now, detail={"pid": worker})
            self.injections.append(record)
            self._arm_bucket(controller.log, worker, record)
            return record
        if fault.kind == "crash-trainer":
            if not 0 <= fault.index < trainer.size:
                raise ConfigError(
                    "--inject", str(fault), f"there are {trainer.size} workers", "use a valid worker rank"
                )
            record = Injection(fault, f"trainer worker {fault.index}", at=now)
            await trainer.crash_worker(fault.index)
            await asyncio.sleep(0.5)  # the process is gone before the next call
            self.injections.append(record)
            return record
        if fault.kind == "kill-router":
            if controller is None:
                raise FaultError(f"{fault}: there is no rollout manager")
            routing = controller.routing()
            kill = getattr(routing, "kill", None)
            if kill is None:
                raise FaultError(f"{fault}: requests are routed in-process (--no-router): there is no router to kill")
            record = Injection(fault, routing.name, at=now, detail={"deaths_before": routing.deaths})
            self.injections.append(record)
            await kill()
            deadline = time.monotonic() + self.detect_timeout
            while routing.deaths == record.detail["deaths_before"]:  # its watcher reported the death
                if time.monotonic() > deadline:
                    raise FaultError(f"{routing.name}: death not reported within {self.detect_timeout:g}s")
                await asyncio.sleep(0.02)
            return record
        engines = list(controller.engines) if controller is not None else []
        if not 0 <= fault.index < len(engines):
            raise ConfigError("--inject", str(fault), f"there are {len(engines)} engines", "use a valid engine index")
        assert controller is not None
        engine = engines[fault.index]
        record = Injection(fault, engine.id, at=now, detail={"state_before": controller.state_of(engine)})
        self.injections.append(record)
        launcher = engine.launcher
        if fault.kind == "kill-engine":
            record.detail["actor"] = await _info(launcher)
            launcher.crash()
            await self._detected(controller, engine)
        elif fault.kind == "kill-http":
            record.detail["actor"] = await _info(launcher)
            await launcher.kill()  # the server process only: a Ray actor stays alive
            await self._detected(controller, engine)
            record.detail["actor_after"] = await _info(launcher)
        elif fault.kind == "hang-engine":
            record.detail["server_pid"] = await launcher.pause_server()
        elif fault.kind in ("crash-during-update", "crash-during-offload"):
            if fault.kind == "crash-during-offload" and not offloads_rollout(controller.config):
                raise ConfigError(
                    "--inject", str(fault), "rollout engines are never offloaded", "add --offload-rollout"
                )
            core = controller.runner.core  # the engine states the fault lands in, read off the spec's tags
            offloaded = frozenset(state for state, released in core.releases.items() if "weights" in released)
            targets = core.updating_engine if fault.kind == "crash-during-update" else offloaded
            pid = await launcher.server_pid()
            if pid is None:
                raise FaultError(f"{fault}: {engine.id} has no server process to crash")
            if controller.log is None:
                raise FaultError(f"{fault}: the controller has no event log to arm the fault on")
            record.detail["server_pid"] = pid
            self._arm(controller.log, engine.id, targets, pid, record)
        elif fault.kind == "crash-during-broadcast":
            if not broadcasts_weights(controller.config):
                raise ConfigError(
                    "--inject",
                    str(fault),
                    "the weights are never broadcast",
                    "add --update-weight-transfer-mode broadcast",
                )
            server = await launcher.server_pid()
            if server is None or controller.log is None:
                raise FaultError(f"{fault}: {engine.id} has no server process, or there is no event log")
            record.detail["server_pid"] = server
            self._arm_bucket(controller.log, server, record, group=True)
        elif fault.kind == "lose-node":
            from engines.actor import remove_node

            node = str((await launcher.info()).get("node_id") or "")
            if not node:
                raise FaultError(f"{fault}: {engine.id} does not run in a Ray actor on a node of this cluster")
            record.detail["node"] = node
            await asyncio.to_thread(remove_node, node)
            await self._detected(controller, engine)
        return record

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
                log.emit("fault.fired", fault=str(record.fault), target=instance, state=event.get("dst"), pid=pid)

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
                log.emit("fault.fired", fault=str(record.fault), target=record.target, state="Broadcasting", pid=pid)

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


async def _info(launcher: Launcher) -> dict[str, Any]:
    try:
        return dict(await launcher.info())
    except Exception as exc:  # the actor is already gone: say so instead of failing the injection
        return {"error": f"{type(exc).__name__}: {exc}"}
