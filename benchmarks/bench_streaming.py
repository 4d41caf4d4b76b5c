"""Benchmark P11: streaming RL (``--fully-async``) against lock-step and ``--async`` on the same job (issue 43).

Every mode runs ``lifecycle run``'s own loop (``run_loop``) in this process on the same model, task, seed and engines
(two CPU engines on the embedded CPU defaults; ``--backend vllm``: two real vLLM servers, tiny Llama): lock-step,
miles' one-step overlap ``--async``, and the stream with ``--max-weight-staleness`` 1 and 4. The modes alternate
within each round, so a slow stretch of the shared machine falls on all of them. Eval is off (``--eval-interval``
stops the stream for a greedy pass: another cost, measured apart if wanted). Per mode:

* **trained samples/s**: the samples the trainer trained on (``metrics.jsonl``'s ``samples``) / the wall time of the
  steps (from the first step's start to the last step's end: the stream's start, every generation, training and
  weight update included; the engines' and trainer's start-up excluded);
* **generated samples/s**: every answer the engines returned during the same steps (the routing's ``generate``,
  counted as it returns; an answer the stream later drops as too stale counts, an aborted one does not);
* **the engines' idle fraction**: time-weighted over the steps, the share of samples of the engine's *own* load
  report in which it had no request (CPU engine: ``/server_info``'s ``num_running_reqs + num_waiting_reqs``; vLLM:
  ``/metrics``' ``vllm:num_requests_running + vllm:num_requests_waiting``), polled every ``--poll`` seconds through
  the job's own clients. The engine's report, not the driver's view: through the SMG gateway (the default where
  it is installed) the driver does not know which engine holds a request, and a request the driver has sent may
  still be queued at the engine. ``held`` is the share in which it had requests but was paused for a weight
  update (the stream's in-flight update keeps them): not idle, not generating either. Cross-check from the
  driver's side: the share of the steps in which no routing ``generate`` call was out at all (every engine idle
  from the driver's view; an engine's own idle share can only be larger);
* **reward**: the first-5 and last-5 mean, as ``lifecycle run`` prints it;
* **the version lag** of the groups trained on (``metrics.jsonl``'s ``staleness``, one entry per group of
  ``group_size`` samples: how many versions its oldest token is behind the trainer's) and the groups dropped as
  too stale (their prompts sent again).

Ratios are against lock-step, measured in the same run.

Run: python benchmarks/bench_streaming.py [--steps 30] [--rounds 1] [--quick] [--backend cpu|vllm] [--poll 0.1]
(vLLM: LIFECYCLE_VLLM_PYTHON=... and one vLLM run at a time on a shared machine.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import io
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES: dict[str, tuple[list[str], bool]] = {  # name -> (lifecycle flags, --async)
    "lock-step": ([], False),
    "--async": ([], True),
    "stream K=1": (["--fully-async", "--max-weight-staleness", "1"], False),
    "stream K=4": (["--fully-async", "--max-weight-staleness", "4"], False),
}
BASELINE = "lock-step"
# the loop's step functions (trainer/app/loop.py): their call is the window the benchmark measures
STEP_FUNCTIONS = ("_sync_steps", "_async_steps", "_stream_steps")


# -- the measurements (pure: tests/test_bench_streaming.py runs them on made-up data) ---------------------------------
@dataclass(frozen=True)
class Load:
    """One poll of one engine's own load report."""

    t: float  # time.monotonic() halfway through the poll
    engine: str
    requests: int  # running + waiting at the engine
    paused: bool


@dataclass
class Occupancy:
    """Time-weighted shares of one window: no request at the engine (idle), requests held while paused (held),
    requests and not paused (generating)."""

    idle: float = 0.0
    held: float = 0.0
    generating: float = 0.0

    @property
    def seconds(self) -> float:
        return self.idle + self.held + self.generating

    def share(self, what: str) -> float:
        return getattr(self, what) / self.seconds if self.seconds else float("nan")

    def add(self, other: Occupancy) -> None:
        self.idle += other.idle
        self.held += other.held
        self.generating += other.generating


def occupancy(loads: Sequence[Load], start: float, end: float) -> dict[str, Occupancy]:
    """Per engine, seconds of ``[start, end]`` idle / held / generating: each poll's answer holds until the next
    poll of the same engine (sample and hold); before an engine's first poll in the window nothing is counted."""
    out: dict[str, Occupancy] = {}
    by_engine: dict[str, list[Load]] = {}
    for load in sorted(loads, key=lambda x: x.t):
        by_engine.setdefault(load.engine, []).append(load)
    for engine, polls in by_engine.items():
        occ = out.setdefault(engine, Occupancy())
        for n, load in enumerate(polls):
            until = polls[n + 1].t if n + 1 < len(polls) else end
            a, b = max(load.t, start), min(until, end)
            if b <= a:
                continue
            what = "idle" if load.requests == 0 else "held" if load.paused else "generating"
            setattr(occ, what, getattr(occ, what) + (b - a))
    return out


def uncovered(intervals: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` that no interval covers (the driver's view: no generate call out at all)."""
    covered, reach = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return (end - start) - covered


def lag_distribution(rows: Sequence[Mapping[str, Any]]) -> Counter[int]:
    """Groups trained on, by version lag (``metrics.jsonl``'s ``staleness``: one entry per group trained)."""
    lags: Counter[int] = Counter()
    for row in rows:
        lags.update(int(x) for x in row.get("staleness", ()))
    return lags


def lockstep_lags(rows: Sequence[Mapping[str, Any]], group_size: int, async_mode: bool) -> Counter[int]:
    """The lag of lock-step's groups, by construction: 0 (generated under the weights they train); ``--async``
    trains step k on what was generated during step k-1, under the weights one update behind (step 0's excepted)."""
    lags: Counter[int] = Counter()
    for n, row in enumerate(rows):
        lags[1 if async_mode and n > 0 else 0] += int(row["samples"]) // group_size
    return lags


@dataclass
class Run:
    """One mode's run: the steps' window and what was counted in it."""

    mode: str
    seconds: float
    trained: int
    generated: int
    engines: dict[str, Occupancy]
    unsent: float  # seconds of the window in which the driver had no generate call out
    rewards: list[float]
    lags: Counter[int]
    dropped: int
    group_size: int


@dataclass
class Summary:
    """One mode over every round."""

    mode: str
    runs: list[Run] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.runs)

    def trained_rate(self) -> float:
        return sum(r.trained for r in self.runs) / self.seconds

    def spread(self) -> str:
        """The trained rate's range over the rounds (empty for one round): how far one run's ratio can be trusted."""
        if len(self.runs) < 2:
            return ""
        rates = [r.trained / r.seconds for r in self.runs]
        return f"; rounds {min(rates):.0f}-{max(rates):.0f}"

    def generated_rate(self) -> float:
        return sum(r.generated for r in self.runs) / self.seconds

    def unsent(self) -> float:
        return sum(r.unsent for r in self.runs) / self.seconds

    def occupancy(self) -> Occupancy:
        total = Occupancy()
        for r in self.runs:
            for occ in r.engines.values():
                total.add(occ)
        return total

    def reward(self) -> tuple[float, float]:
        """The mean over rounds of the first-5 and last-5 mean reward."""
        first = statistics.mean(statistics.mean(r.rewards[:5]) for r in self.runs)
        last = statistics.mean(statistics.mean(r.rewards[-5:]) for r in self.runs)
        return first, last

    def lags(self) -> Counter[int]:
        total: Counter[int] = Counter()
        for r in self.runs:
            total.update(r.lags)
        return total

    def dropped(self) -> int:
        return sum(r.dropped for r in self.runs)


def table(summaries: Sequence[Summary], baseline: str = BASELINE) -> str:
    """The printed result: one row per mode, ratios against ``baseline`` (measured in the same run)."""
    base = next(s for s in summaries if s.mode == baseline)
    head = (
        "| mode | steps' wall | trained samples/s | generated samples/s | engines idle | held (paused with requests) "
        "| no request out (driver) "
        "| reward first-5 → last-5 | version lag of trained groups | dropped groups |"
    )
    lines = [head, "|" + "---|" * 10]
    for s in summaries:
        occ, first_last = s.occupancy(), s.reward()
        lags = s.lags()
        lag = ", ".join(f"{k}: {lags[k]}" for k in sorted(lags))
        streaming = s.mode.startswith("stream")
        idle, base_idle = occ.share("idle"), base.occupancy().share("idle")
        lines.append(
            f"| {s.mode} "
            f"| {s.seconds:.1f} s "
            f"| {s.trained_rate():.1f} ({s.trained_rate() / base.trained_rate():.2f}x{s.spread()}) "
            f"| {s.generated_rate():.1f} ({s.generated_rate() / base.generated_rate():.2f}x) "
            f"| {idle:.1%} ({idle / base_idle:.2f}x) "
            f"| {occ.share('held'):.1%} "
            f"| {s.unsent():.1%} "
            f"| {first_last[0]:.3f} → {first_last[1]:.3f} "
            f"| {lag}{'' if streaming else ' (by construction)'} "
            f"| {s.dropped() if streaming else '—'} |"
        )
    return "\n".join(lines)


# -- the hooks on the real loop ---------------------------------------------------------------------------------------
@dataclass
class Recorder:
    """What the hooks collect during one run."""

    poll: float
    start: float | None = None
    end: float | None = None
    loads: list[Load] = field(default_factory=list)
    generated: int = 0
    calls: list[tuple[float, float]] = field(default_factory=list)  # the routings' generate calls in the window
    group_size: int = 0

    @property
    def open(self) -> bool:
        return self.start is not None and self.end is None


async def engine_load(client: Any) -> tuple[int, bool]:
    """(requests at the engine, paused) from the engine's own report: the CPU engine's (SGLang's API)
    ``/server_info``, or vLLM's ``/metrics`` gauges and ``/is_paused``."""
    if hasattr(client, "server_info"):
        info = await client.server_info(timeout=5.0)
        state = info.internal_states[0] if info.internal_states else {}
        requests = int(state.get("num_running_reqs", 0)) + int(state.get("num_waiting_reqs", 0))
        return requests, bool(state.get("paused", False))
    from engines.vllm.client import read_progress

    progress, paused = await asyncio.gather(read_progress(client, timeout=5.0), client.is_paused(timeout=5.0))
    return round(progress.running + progress.waiting), bool(paused)


async def poll_engines(job: Any, rec: Recorder) -> None:
    """Every ``rec.poll`` seconds, every rollout engine's load (an engine without a server, or one that does not
    answer, is skipped for that poll)."""

    async def one(engine: Any) -> None:
        client = engine.client
        if client is None:
            return
        t0 = time.monotonic()
        with contextlib.suppress(Exception):  # a poll is an observation: it must never fail the run
            requests, paused = await engine_load(client)
            rec.loads.append(Load((t0 + time.monotonic()) / 2, engine.id, requests, paused))

    while True:
        await asyncio.gather(*(one(e) for e in job.manager.controller.engines))
        await asyncio.sleep(rec.poll)


def windowed(rec: Recorder, steps: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """A loop step function that opens the window when it starts, polls the engines while it runs, and closes
    the window when it ends."""

    @functools.wraps(steps)
    async def run(*args: Any, **kwargs: Any) -> None:
        job = next(a for a in args if hasattr(a, "manager") and hasattr(a, "task"))  # the loop's Job
        rec.group_size = job.task.group_size
        poller = asyncio.create_task(poll_engines(job, rec), name="bench-poll")
        rec.start = time.monotonic()
        try:
            await steps(*args, **kwargs)
        finally:
            rec.end = time.monotonic()
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)

    return run


def counted(rec: Recorder, generate: Callable[..., Awaitable[dict[int, Any]]]) -> Callable[..., Any]:
    """A routing's ``generate`` that counts the answers it returns inside the window (an aborted one is not an
    answer: the stream sends it again) and records when it was out."""

    @functools.wraps(generate)
    async def run(*args: Any, **kwargs: Any) -> dict[int, Any]:
        t0 = time.monotonic()
        done = await generate(*args, **kwargs)
        if rec.open:
            rec.generated += sum(1 for a in done.values() if not _aborted(a))
            rec.calls.append((t0, time.monotonic()))
        return done

    return run


def _aborted(answer: Any) -> bool:
    finish = answer.response.meta_info.finish_reason
    return finish is not None and finish.type == "abort"


@contextmanager
def hooked(rec: Recorder) -> Iterator[None]:
    """The hooks installed on the loop's step functions and the routings' ``generate`` for one run."""
    from rollout import routing
    from trainer.app import loop

    saved: list[tuple[Any, str, Any]] = []
    for name in STEP_FUNCTIONS:
        saved.append((loop, name, getattr(loop, name)))
        setattr(loop, name, windowed(rec, getattr(loop, name)))
    for cls in (routing.LocalRouting, routing.RouterRouting):
        saved.append((cls, "generate", cls.generate))
        cls.generate = counted(rec, cls.generate)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def one_run(mode: str, args: argparse.Namespace) -> Run:
    """One ``lifecycle run`` in ``mode``: its loop, hooked."""
    from lifecycle.cli.args import add_config_arguments, config_from_args
    from trainer.app.loop import RunOptions, run_loop

    flags, async_mode = MODES[mode]
    flags = [*flags, *(["--rollout-backend", "vllm"] if args.backend == "vllm" else [])]
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    config = config_from_args(parser.parse_args(flags))
    config = dataclasses.replace(config, eval_interval=None)
    rec = Recorder(poll=args.poll)
    extra: dict[str, Any] = {}
    if args.backend == "vllm":
        extra = {"model": "tiny-llama", "vllm_python": os.environ.get("LIFECYCLE_VLLM_PYTHON")}
    if args.no_router:
        extra["router"] = False
    with tempfile.TemporaryDirectory(prefix="bench-streaming-") as tmp, hooked(rec):
        opts = RunOptions(
            steps=args.steps,
            seed=args.seed,
            run_dir=Path(tmp) / "run",
            quiet=True,
            async_mode=async_mode,
            timeline=False,
            **extra,
        )
        result = asyncio.run(run_loop(config, opts, io.StringIO()))
    assert rec.start is not None and rec.end is not None, "the loop's steps never ran"
    rows = result.metrics
    return Run(
        mode=mode,
        seconds=rec.end - rec.start,
        trained=sum(int(r["samples"]) for r in rows),
        generated=rec.generated,
        unsent=uncovered(rec.calls, rec.start, rec.end),
        engines=occupancy(rec.loads, rec.start, rec.end),
        rewards=[float(r["reward"]) for r in rows],
        lags=lag_distribution(rows) if config.fully_async else lockstep_lags(rows, rec.group_size, async_mode),
        dropped=sum(int(r.get("dropped", 0)) for r in rows),
        group_size=rec.group_size,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="steps per run (default 30, lifecycle run's)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, every mode once per round (default 1)")
    parser.add_argument("--quick", action="store_true", help="10 steps, 1 round (a smoke run; rewards barely move)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=("cpu", "vllm"), default="cpu")
    parser.add_argument("--poll", type=float, default=0.1, help="seconds between two polls of an engine's load")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--no-router", action="store_true", help="route in-process instead of through SMG")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds = 10, 1
    modes = [m.strip() for m in args.modes.split(",")]
    unknown = [m for m in modes if m not in MODES]
    if unknown or BASELINE not in modes:
        raise SystemExit(f"--modes: unknown {unknown}, or no {BASELINE!r} (the baseline)")

    from engines.actor import init_local_cluster

    init_local_cluster(num_cpus=2)
    summaries = {m: Summary(m) for m in modes}
    t0 = time.monotonic()
    for r in range(args.rounds):
        order = modes if r % 2 == 0 else list(reversed(modes))  # alternate: no mode always runs first
        for mode in order:
            run = one_run(mode, args)
            summaries[mode].runs.append(run)
            occ = Occupancy()
            for o in run.engines.values():
                occ.add(o)
            print(
                f"round {r + 1} {mode:11s}: {run.seconds:5.1f}s of steps, {run.trained} trained, {run.generated} "
                f"generated, idle {occ.share('idle'):.1%}, held {occ.share('held'):.1%}, reward "
                f"{statistics.mean(run.rewards[:5]):.3f} -> {statistics.mean(run.rewards[-5:]):.3f}",
                flush=True,
            )
    group = next(iter(summaries.values())).runs[0].group_size
    print(
        f"\nP11 streaming vs lock-step and --async ({args.backend} engines x2, {args.steps} steps x {args.rounds} "
        f"round(s), seed {args.seed}, eval off; engine load polled every {args.poll}s; lag in groups of "
        f"{group} samples; {time.monotonic() - t0:.0f}s in all)\n"
    )
    print(table([summaries[m] for m in modes]))


if __name__ == "__main__":
    main()
