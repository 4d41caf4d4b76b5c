"""The RL training loop that embeds the lifecycle (``lifecycle run``): the miles order per step.

Per step: generate -> offload rollout -> train -> onload rollout weights -> update weights ->
onload KV. Every decision about what to construct, start, monitor, offload or recover is taken by
the machines (each call below is a machine move that its predicates may block). Writes, into the
run directory: ``events.jsonl`` (the event log of every machine), ``metrics.jsonl`` (one line per
step) and ``reward.png`` when matplotlib is installed.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from lifecycle.config import LifecycleConfig
from lifecycle.errors import ConfigError
from lifecycle.events import EventLog, JsonlSink, bind_context
from lifecycle.ledger import EffectLedger
from rollout.executor import RolloutManager
from rollout.task import PatternTask

FAULTS = ("kill-engine", "crash-trainer")
_FAULT_RE = re.compile(r"^(?P<kind>[a-z-]+):(?P<index>\d+)@(?P<step>\d+)$")
SHORT = {
    "Serving": "S",
    "Quiesced": "Q",
    "PendingWeights": "P",
    "Unhealthy": "U",
    "Recovering": "R",
    "Failed": "F",
    "Offloaded": "O",
    "WeightsOnly": "W",
    "Disposed": "D",
    "Stopped": "X",
}


@dataclass(frozen=True)
class Fault:
    kind: str  # kill-engine | crash-trainer
    index: int
    step: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}@{self.step}"


def parse_fault(spec: str) -> Fault:
    m = _FAULT_RE.match(spec.strip())
    if not m or m["kind"] not in FAULTS:
        raise ConfigError(
            "--inject",
            spec,
            "not a fault spec",
            f"use FAULT:INDEX@STEP with FAULT one of {', '.join(FAULTS)}, e.g. kill-engine:1@3",
        )
    return Fault(m["kind"], int(m["index"]), int(m["step"]))


@dataclass
class RunOptions:
    steps: int = 30
    seed: int = 0
    run_dir: Path = field(default_factory=lambda: Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    ray_address: str | None = None
    faults: tuple[Fault, ...] = ()
    launcher: str = "ray"  # ray | local
    workers: int = 1
    lr: float = 1e-2
    model_size: str = "tiny"
    rollout_fn: str | None = None
    task: PatternTask | None = None
    quiet: bool = False


@dataclass
class RunResult:
    run_dir: Path
    rewards: list[float]
    seconds: float
    metrics: list[dict[str, Any]]

    @property
    def first5(self) -> float:
        head = self.rewards[:5]
        return sum(head) / max(len(head), 1)

    @property
    def last5(self) -> float:
        tail = self.rewards[-5:]
        return sum(tail) / max(len(tail), 1)


def _launcher_factory(kind: str, seed: int) -> Callable[[str], Any]:
    from engines.process import torch_engine_command

    def command() -> list[str]:
        return torch_engine_command(seed=seed)

    if kind == "local":
        from engines.launcher import LocalLauncher

        return lambda engine_id: LocalLauncher(engine_id, command)
    from engines.actor import RayLauncher

    return lambda engine_id: RayLauncher(engine_id, command)


def _states(manager: RolloutManager) -> str:
    states = manager.controller.states()
    if not states:
        return manager.state
    return " ".join(SHORT.get(s, s) for s in states.values())


def _plot(path: Path, rewards: list[float]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(len(rewards)), rewards, marker="o", ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(0, 1)
    ax.set_title("lifecycle run: reward")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


async def run_loop(config: LifecycleConfig, opts: RunOptions, out: TextIO = sys.stdout) -> RunResult:
    """The sync loop. Starts Ray (or connects to ``ray_address``) only for the parts that need it."""
    from engines.actor import init_local_cluster
    from trainer.group import TrainerGroup

    def say(line: str) -> None:
        if not opts.quiet:
            print(line, file=out, flush=True)

    run_dir = opts.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    task = opts.task or PatternTask(seed=opts.seed)
    sink = JsonlSink(run_dir / "events.jsonl")
    log = EventLog([sink])
    ledger = EffectLedger()
    metrics_path = run_dir / "metrics.jsonl"
    metrics_path.write_text("")
    t0 = time.monotonic()
    init_local_cluster(num_cpus=2, address=opts.ray_address)
    trainer = TrainerGroup(
        config,
        run_dir,
        workers=opts.workers,
        model_size=opts.model_size,
        seed=opts.seed,
        lr=opts.lr,
        temperature=task.temperature,
        log=log,
        ledger=ledger,
    )
    manager = RolloutManager(
        config,
        task,
        launcher_factory=_launcher_factory(opts.launcher, opts.seed),
        log=log,
        ledger=ledger,
        seed=opts.seed,
        rollout_fn_path=opts.rollout_fn,
    )
    rewards: list[float] = []
    metrics: list[dict[str, Any]] = []
    say(f"lifecycle run: {opts.steps} steps, mode {config.mode}, run dir {run_dir}")
    try:
        weights = await trainer.start()
        await manager.init(weights)
        say(f"  ready in {time.monotonic() - t0:.1f}s: rollout {manager.state}, engines [{_states(manager)}]")
        for step in range(opts.steps):
            ts = time.monotonic()
            with bind_context(step=step, rollout_id=step):
                for fault in opts.faults:
                    if fault.step == step:
                        await _inject(fault, manager, trainer)
                samples = await manager.generate(step)
                await manager.offload()
                stats = await trainer.train(samples)
                await manager.onload_weights()
                await trainer.update_weights(manager.controller if manager.controller.engines else None, step + 1)
                await manager.onload_kv()
            reward = sum(float(s["reward"]) for s in samples) / len(samples)
            rewards.append(reward)
            row = {
                "step": step,
                "reward": round(reward, 6),
                "samples": len(samples),
                **{k: round(v, 6) for k, v in stats.items()},
                "engines": manager.controller.states(),
                "seconds": round(time.monotonic() - ts, 3),
            }
            metrics.append(row)
            with metrics_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            example = samples[0]["response"] if samples else ""
            say(
                f"  step {step + 1:>3}/{opts.steps}  reward {reward:.3f}  loss {stats.get('loss', 0.0):+.3f}  "
                f"engines [{_states(manager)}]  {row['seconds']:.1f}s  e.g. {example!r}"
            )
    finally:
        try:
            await manager.dispose()
        finally:
            await trainer.dispose()
            log.remove_sink(sink)
    seconds = time.monotonic() - t0
    result = RunResult(run_dir, rewards, seconds, metrics)
    png = run_dir / "reward.png"
    plotted = _plot(png, rewards)
    say(
        f"done in {seconds:.1f}s: reward first-5 mean {result.first5:.3f} -> last-5 mean {result.last5:.3f}"
        f" ({result.last5 / max(result.first5, 1e-9):.1f}x)"
    )
    say(f"  events:  {run_dir / 'events.jsonl'}")
    say(f"  metrics: {metrics_path}")
    say(f"  plot:    {png}" if plotted else "  plot:    (pip install matplotlib for reward.png)")
    return result


async def _inject(fault: Fault, manager: RolloutManager, trainer: Any) -> None:
    if fault.kind == "kill-engine":
        engines = manager.controller.engines
        if not 0 <= fault.index < len(engines):
            raise ConfigError("--inject", str(fault), f"there are {len(engines)} engines", "use a valid engine index")
        await manager.controller.kill_engine(fault.index)
    elif fault.kind == "crash-trainer":
        if not 0 <= fault.index < trainer.size:
            raise ConfigError("--inject", str(fault), f"there are {trainer.size} workers", "use a valid worker rank")
        await trainer.crash_worker(fault.index)
        await asyncio.sleep(0.5)


def run(config: LifecycleConfig, opts: RunOptions, out: TextIO = sys.stdout) -> RunResult:
    return asyncio.run(run_loop(config, opts, out))
