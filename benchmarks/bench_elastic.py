"""Benchmark: what an elastic fleet's joins and leaves cost (issue 44), lock-step and streaming.

Each round runs two jobs on the same engines (CPU engines through the SMG gateway where it is installed;
``--backend vllm``: real vLLM servers on a tiny Llama), a fleet of ``--rollout-num-gpus 1`` between 1 and 3 engines
(``--rollout-min-num-gpus 1 --rollout-max-num-gpus 3``), driven through the ``Job`` API as a user's loop would:
one lock-step job (generate, train, update per step) and one streaming job (``--fully-async``, K=1). In each:

1. step 0 commits weight version 1 (so a joiner must load the trainer's weights, not its launch weights);
2. **a join**: ``job.add_engines(1)``; then the next step (lock-step: its ``generate`` routes the joiner; a stream
   routes it once loaded);
3. **a preemption with notice**: while the engine has requests in flight (its own report) -- during lock-step's
   ``generate``, during a stream's ``take`` and again during a stream's in-flight weight update (the engine paused
   with its requests kept: news comes at any time) -- the fault injector's ``preempt-engine`` on it (the notice as
   news, SIGTERM at the deadline ``--notice`` s later); the target is kept, so a replacement joins a vacant slot at
   the next boundary;
4. **a scale-down**: the same way, during a ``generate`` or a ``take``, ``job.retire_engines([it])``.

Measured, from the job's own event log (the core's moves, ``engine.routed``, ``engine.drained``) and from the
engines' own reports, polled every ``--poll`` s through the job's clients:

* **join**: from the ``add_engines`` call to (a) the joiner ``Quiesced`` on the committed weights, (b)
  ``engine.routed`` (the gateway answered its registration), (c) its first answered request (the engine's own
  counter: the CPU engine's ``/server_info`` ``num_generate_requests`` less those running and waiting, vLLM's
  ``vllm:request_success_total``, which counts its health probes too: its first rise after the routing); split into
  **launch** (the ``join`` move to ``ready``: process start and health), **catch-up load** (``PendingWeights`` ->
  ``Quiesced``, under the engine lock) and **registration** (the ``resume`` move to the gateway's answer). Against
  a **cold start measured in the same job**: the initial engine's launch (``start`` -> ``ready``) and load, through
  the same launcher. Lock-step (c) includes the wait for the next ``generate`` (the bench starts it at once); a
  stream's does not. A replacement (after a notice) is timed from the notice.
* **leaves**: the requests in flight at the engine when the leave was called (its own report); seconds to its
  withdrawal (its move out of ``Serving``: ``stop_routing``), its drain (``engine.drained``) against the bound
  (``--rollout-drain-timeout``, and for a notice its deadline less the controller's margin) and its confirmed stop
  (``Retired``); requests handed back (``engine.drained``, a stream's); tries through the gateway that failed (each
  sent again: by the router loop, or by the stream) and requests **failed** (lock-step: unanswered after the
  router loop's retries; a stream sends a request again until its group's bound, past which the run fails), counted
  by hooks on the routings' ``generate`` from the call to a second after the stop. Goal: zero failed, and no
  failed try either (a failed try is work lost and redone).

Ratios (join launch + load against the cold start) are against the same job's cold start.

Run: python benchmarks/bench_elastic.py [--rounds 2] [--quick] [--backend cpu|vllm] [--notice 10] [--poll 0.02]
(vLLM: LIFECYCLE_VLLM_PYTHON=..., and one vLLM run at a time on a shared machine: flock a lock around it.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

MODES = ("lock-step", "stream")
BASELINE = "cold start"  # the same job's initial launch + load: every join's ratio is against it
FLEET = {"rollout_num_gpus": 1, "rollout_min_num_gpus": 1, "rollout_max_num_gpus": 3}
DRAIN_TIMEOUT = 10.0  # --rollout-drain-timeout: a leave's bound (a notice's deadline may shorten it)
SETTLE_S = 60.0  # the most a leaver may take to be confirmed stopped, or a step to find requests in flight


# -- the measurements (pure: tests/test_bench_elastic.py runs them on hand-written logs) ------------------------------
def when(event: Mapping[str, Any], *, done: bool = False) -> float:
    """An event's time (epoch seconds); ``done``: when its I/O was done, where it says (a fact's ``done_at``)."""
    text = str(event.get("done_at") or event["ts"]) if done else str(event["ts"])
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def moves(events: Sequence[Mapping[str, Any]], instance: str, since: float = 0.0) -> list[Mapping[str, Any]]:
    """The engine's lifecycle moves from ``since`` on, in order."""
    return [
        e
        for e in events
        if e.get("event") == "lifecycle.transition" and e.get("instance") == instance and when(e) >= since
    ]


def _first(found: Sequence[Mapping[str, Any]], test: Callable[[Mapping[str, Any]], bool]) -> Mapping[str, Any] | None:
    return next((m for m in found if test(m)), None)


@dataclass(frozen=True)
class WayIn:
    """One engine process's way into the fleet, in seconds: ``launch`` (its start/join move to ``ready``), ``load``
    (``PendingWeights`` to ``Quiesced``: the catch-up load), ``registration`` (its ``resume`` move to the gateway's
    answer); and from the call (``t0``) to ``Quiesced``, ``engine.routed`` and its first answered request."""

    instance: str
    launch: float
    load: float
    registration: float | None
    quiesced: float
    routed: float | None
    answered: float | None

    @property
    def started(self) -> float:
        """Launch + catch-up load: what a cold start costs too."""
        return self.launch + self.load


def way_in(
    events: Sequence[Mapping[str, Any]], instance: str, t0: float, counts: Sequence[tuple[float, int]] = ()
) -> WayIn | None:
    """The first way in of ``instance`` that begins at or after ``t0`` (None: it did not get as far as Quiesced);
    ``counts``: that process's answered count as polled (time, count), for its first answer once routed."""
    found = moves(events, instance, t0)
    launch = _first(found, lambda m: m["dst"] in ("Starting", "Joining"))
    if launch is None:
        return None
    rest = found[found.index(launch) :]
    ready = _first(rest, lambda m: m["src"] in ("Starting", "Joining") and m["dst"] == "PendingWeights")
    loaded = _first(rest, lambda m: m["src"] == "LoadingWeights" and m["dst"] == "Quiesced")
    if ready is None or loaded is None:
        return None
    resume = _first(found[found.index(loaded) :], lambda m: m["dst"] == "Serving")
    routed = None
    if resume is not None:
        routed = _first(
            [e for e in events if e.get("event") == "engine.routed" and e.get("instance") == instance],
            lambda e: when(e) >= when(resume),
        )
    answered = first_answer(counts, None if routed is None else when(routed, done=True))
    return WayIn(
        instance=instance,
        launch=when(ready) - when(launch),
        load=when(loaded) - when(ready),
        registration=None if routed is None or resume is None else when(routed, done=True) - when(resume),
        quiesced=when(loaded) - t0,
        routed=None if routed is None else when(routed, done=True) - t0,
        answered=None if answered is None else answered - t0,
    )


def first_answer(counts: Sequence[tuple[float, int]], routed_at: float | None) -> float | None:
    """The first poll at or after ``routed_at`` whose answered count is above the last one polled before it: a
    routed request answered (vLLM counts its own health probes' 1-token generations among its requests; a probe
    answered between the routing and the first request would be taken for it -- the CPU engine counts none)."""
    if routed_at is None:
        return None
    base = 0
    for t, n in counts:
        if t < routed_at:
            base = n
        elif n > base:
            return t
    return None


def cold_starts(events: Sequence[Mapping[str, Any]]) -> list[WayIn]:
    """The initial engines' launch + load (their ``start`` moves, before the first ``generate``/``stream``)."""
    out = []
    for e in events:
        if e.get("event") == "lifecycle.transition" and e.get("trigger") == "start" and e.get("machine") == "engine":
            w = way_in(events, str(e["instance"]), when(e))
            if w is not None:
                out.append(w)
    return out


@dataclass(frozen=True)
class Leave:
    """One planned leave: the engine's state and its requests at the call, each stage's seconds from the call, and
    what became of the requests."""

    mode: str
    kind: str
    instance: str
    found: str  # the engine's state when the leave was called
    in_flight: int  # its requests then, running and waiting (its own report)
    withdrawn: float | None  # its move out of Serving (stop_routing); None: it was not routed at the call
    draining: float | None  # its move into Draining (None: stopped at once, nothing routed)
    drain: float | None  # engine.drained's seconds
    drained_running: int  # engine.drained's count left (0 unless timed out)
    bound: float
    timed_out: bool
    handed_back: int
    resent: int  # tries through the gateway that failed (sent again by the router loop or the stream)
    failed: int  # requests unanswered after the router's retries
    stopped: float | None  # Retired (death confirmed)


@dataclass
class Requests:
    """What the routing hooks saw, with their times: tries through a gateway that failed (each sent again: by the
    router loop, or by the stream, which tries once per call and sends again itself), and requests left unanswered
    after the router loop's retries (a stream's unanswered requests are sent again: a group it cannot complete
    fails the run, and the bench with it)."""

    resent: list[tuple[float, int]] = field(default_factory=list)
    failed: list[tuple[float, int]] = field(default_factory=list)
    errors: list[tuple[float, str]] = field(default_factory=list)  # the failed tries' errors, for --keep's record

    def between(self, start: float, end: float) -> tuple[int, int]:
        def count(xs: list[tuple[float, int]]) -> int:
            return sum(n for t, n in xs if start <= t <= end)

        return count(self.resent), count(self.failed)


def state_at(events: Sequence[Mapping[str, Any]], instance: str, t: float) -> str:
    """The engine's state at ``t``: its last move's destination before it."""
    before = [e for e in moves(events, instance) if when(e) < t]
    return str(before[-1]["dst"]) if before else "Init"


def leave_of(
    events: Sequence[Mapping[str, Any]],
    mode: str,
    kind: str,
    instance: str,
    t0: float,
    in_flight: int,
    bound: float,
    requests: Requests,
) -> Leave:
    """The leave of ``instance`` called at ``t0``, from the log (that process's moves up to its confirmed stop);
    requests counted from the call to a second after the stop (or to the log's end, never stopped)."""
    found = moves(events, instance, t0)
    retired = _first(found, lambda m: m["dst"] == "Retired")
    if retired is not None:
        found = found[: found.index(retired) + 1]
    out = _first(found, lambda m: m["src"] == "Serving")
    draining = _first(found, lambda m: m["dst"] == "Draining")
    drained = _first(
        [e for e in events if e.get("event") == "engine.drained" and e.get("instance") == instance],
        lambda e: when(e) >= t0,
    )
    end = when(retired) if retired is not None else when(events[-1])
    resent, failed = requests.between(t0, end + 1.0)
    return Leave(
        mode=mode,
        kind=kind,
        instance=instance,
        found=state_at(events, instance, t0),
        in_flight=in_flight,
        withdrawn=None if out is None else when(out) - t0,
        draining=None if draining is None else when(draining) - t0,
        drain=None if drained is None else float(drained["seconds"]),
        drained_running=int(drained.get("running", 0)) if drained else 0,
        bound=bound,
        timed_out=bool(drained and drained.get("timed_out")),
        handed_back=int(drained.get("handed_back", 0)) if drained else 0,
        resent=resent,
        failed=failed,
        stopped=None if retired is None else end - t0,
    )


@dataclass
class Round:
    """One job's results."""

    mode: str
    cold: list[WayIn]
    joins: list[tuple[str, WayIn]]  # (what: "scale-up" / "replacement (after which notice)", its way in)
    leaves: list[Leave]


def _s(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def table(rounds: Sequence[Round]) -> str:
    """The printed result: the joins (each against its job's cold start, measured in the same job) and the leaves."""
    lines = [
        "| mode | join | cold start: launch + load (s) | launch | catch-up load | registration | call → Quiesced "
        "| call → routed | call → first answer | launch + load vs cold |",
        "|" + "---|" * 10,
    ]
    for r in rounds:
        cold = statistics.mean(w.started for w in r.cold) if r.cold else None
        for what, w in r.joins:
            ratio = "—" if not cold else f"{w.started / cold:.2f}x"
            lines.append(
                f"| {r.mode} | {what} ({w.instance}) | {_s(cold)} | {w.launch:.2f} | {w.load:.2f} "
                f"| {_s(w.registration)} | {w.quiesced:.2f} | {_s(w.routed)} | {_s(w.answered)} | {ratio} |"
            )
    lines += [
        "",
        "| mode | leave | found in | in flight at the call | withdrawn after (s) | Draining after (s) "
        "| drain (s) / bound | handed back | failed tries, re-sent | failed | stopped after (s) |",
        "|" + "---|" * 11,
    ]
    for r in rounds:
        for x in r.leaves:
            drain = "—" if x.drain is None else f"{x.drain:.2f}{' (timed out)' if x.timed_out else ''}"
            withdrawn = _s(x.withdrawn, 3) if x.withdrawn is not None else "unrouted already"
            lines.append(
                f"| {x.mode} | {x.kind} ({x.instance}) | {x.found} | {x.in_flight} | {withdrawn} "
                f"| {_s(x.draining, 3)} | {drain} / {x.bound:g} | {x.handed_back} | {x.resent} | {x.failed} "
                f"| {_s(x.stopped)} |"
            )
    return "\n".join(lines)


def summary(rounds: Sequence[Round]) -> str:
    """One line per mode: median join figures and the leaves' totals."""
    out = []
    for mode in MODES:
        rs = [r for r in rounds if r.mode == mode]
        ups = [w for r in rs for what, w in r.joins if what == "scale-up"]
        colds = [w.started for r in rs for w in r.cold]
        leaves = [x for r in rs for x in r.leaves]
        if not ups or not colds:
            continue
        answered = [w.answered for w in ups if w.answered is not None]
        join, cold = statistics.median(w.started for w in ups), statistics.median(colds)
        out.append(
            f"{mode}: join launch + load {join:.2f} s vs cold start {cold:.2f} s ({join / cold:.2f}x)"
            f"; call → first answer {statistics.median(answered) if answered else float('nan'):.2f} s; leaves: "
            f"{sum(x.failed for x in leaves)} failed, {sum(x.handed_back for x in leaves)} handed back, "
            f"{sum(x.resent for x in leaves)} failed tries re-sent, of {sum(x.in_flight for x in leaves)} in flight "
            "at the calls"
        )
    return "\n".join(out)


# -- the engines' own reports -------------------------------------------------------------------------------------
async def engine_counts(client: Any) -> tuple[int, int]:
    """(requests at the engine now, requests it has answered so far) from its own report."""
    if hasattr(client, "server_info"):
        info = await client.server_info(timeout=5.0)
        s = info.internal_states[0] if info.internal_states else {}
        now = int(s.get("num_running_reqs", 0)) + int(s.get("num_waiting_reqs", 0))
        return now, int(s.get("num_generate_requests", 0)) - now
    from engines.vllm.client import parse_progress, read_metrics

    text = await read_metrics(client, timeout=5.0)
    progress = parse_progress(text)
    done = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.split("{", 1)[0].split(" ", 1)[0] == "vllm:request_success_total"
    )
    return round(progress.running + progress.waiting), int(done)


async def watch_answers(job: Any, counts: dict[tuple[str, int], list[tuple[float, int]]], poll: float) -> None:
    """Every ``poll`` s, each engine process's answered count (its own report), until it rose once the process was
    Serving: its first routed answer is in the series then (:func:`first_answer`)."""
    controller = job.manager.controller
    done: set[tuple[str, int]] = set()
    before: dict[tuple[str, int], int] = {}  # the count of its last poll before it was Serving

    async def one(engine: Any) -> None:
        key = (engine.id, engine.epoch)
        if engine.client is None or key in done:
            return
        t0 = time.time()
        with contextlib.suppress(Exception):  # an observation: it never fails the run
            n = (await engine_counts(engine.client))[1]
            counts.setdefault(key, []).append(((t0 + time.time()) / 2, n))
            if controller.state_of(engine) != "Serving":
                before[key] = n
            elif n > before.get(key, 0):
                done.add(key)

    while True:
        await asyncio.gather(*(one(e) for e in list(controller.engines)))
        await asyncio.sleep(poll)


async def busy(job: Any, index: int, task: asyncio.Future[Any], poll: float) -> int:
    """Wait until engine ``index`` has requests (its own report) or ``task`` ended; the count then."""
    engine = job.manager.controller.engines[index]
    deadline = time.monotonic() + SETTLE_S
    while not task.done() and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            now, _ = await engine_counts(engine.client)
            if now > 0:
                return now
        await asyncio.sleep(poll)
    return 0


# -- the routing hooks --------------------------------------------------------------------------------------------
def counted(requests: Requests, gateways: set[int], generate: Callable[..., Awaitable[dict[int, Any]]]) -> Any:
    """A routing's ``generate`` that records the requests left unanswered after its tries (and names its gateway
    client, so failed tries through it are counted)."""

    @functools.wraps(generate)
    async def run(self: Any, requests_: Sequence[Any], *args: Any, **kwargs: Any) -> dict[int, Any]:
        gateway = getattr(self, "gateway", None)
        if gateway is not None:
            gateways.add(id(gateway))
        done = await generate(self, requests_, *args, **kwargs)
        if len(done) < len(requests_) and kwargs.get("max_tries", 3) > 1:  # the router loop's retries are spent
            requests.failed.append((time.time(), len(requests_) - len(done)))
        return done

    return run


def tried(requests: Requests, gateways: set[int], generate: Callable[..., Awaitable[Any]]) -> Any:
    """The engine client's ``generate``: a failed try through a gateway client is counted (the router loop sends
    the request again)."""

    @functools.wraps(generate)
    async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await generate(self, *args, **kwargs)
        except Exception as exc:
            if id(self) in gateways:
                requests.resent.append((time.time(), 1))
                requests.errors.append((time.time(), repr(exc)[:500]))
            raise

    return run


@contextmanager
def hooked(requests: Requests) -> Iterator[None]:
    from engines.client import EngineClient
    from rollout import routing

    gateways: set[int] = set()
    saved: list[tuple[Any, str, Any]] = []
    for cls in (routing.LocalRouting, routing.RouterRouting):
        saved.append((cls, "generate", cls.generate))
        cls.generate = counted(requests, gateways, cls.generate)  # type: ignore[method-assign]
    saved.append((EngineClient, "generate", EngineClient.generate))
    EngineClient.generate = tried(requests, gateways, EngineClient.generate)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


# -- one job ------------------------------------------------------------------------------------------------------
def job_parts(args: argparse.Namespace, run_dir: Path, mode: str) -> tuple[Any, dict[str, Any]]:
    """The config and the Job's keyword arguments for ``mode`` on ``args.backend``."""
    from lifecycle.decide.config import LifecycleConfig
    from rollout.pattern import PatternTask
    from trainer.app.options import RunOptions

    values: dict[str, Any] = {**FLEET, "rollout_drain_timeout": DRAIN_TIMEOUT}
    if mode == "stream":
        values |= {"fully_async": True, "max_weight_staleness": 1}
    task = PatternTask(seed=args.seed)
    kwargs: dict[str, Any] = {"run_dir": run_dir}
    if args.backend == "vllm":
        from engines.backends import engine_backend
        from engines.models import build_tiny_llama
        from trainer.grpo import grpo_backend

        values["rollout_backend"] = "vllm"
        built = build_tiny_llama(run_dir.parent / "model", seed=args.seed, **engine_backend("vllm").tiny_llama)
        kwargs |= {
            "initial_checkpoint": built,
            "backend": grpo_backend(seed=args.seed, temperature=task.temperature, checkpoint=str(built)),
            "options": RunOptions(seed=args.seed, vllm_python=os.environ.get("LIFECYCLE_VLLM_PYTHON")),
        }
    return LifecycleConfig.from_mapping(values), {"task": task, **kwargs}


async def step(job: Any, n: int) -> None:
    """One step: lock-step generate -> train -> update; a stream's take -> update."""
    if job.streams:
        await job.take()
        await job.update_weights(n + 1, onload=False)
    else:
        await job.train(await job.generate(n))
        await job.update_weights(n + 1)


async def settle(job: Any, instance: str) -> None:
    """Until ``instance`` is no longer leaving (stopped and confirmed), bounded."""
    deadline = time.monotonic() + SETTLE_S
    while instance in job.fleet.draining and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


# the leaves of each mode's job: (step, what, during what). A stream's notice also lands during a weight update (the
# engine paused with its requests kept): news comes at any time; a retire is the user's call, between two of theirs.
LEAVES: dict[str, tuple[tuple[int, str, str], ...]] = {
    "lock-step": ((2, "preempt", "generate"), (4, "scale-down", "generate")),
    "stream": ((2, "preempt", "take"), (4, "preempt", "update"), (6, "scale-down", "take")),
}


async def one_job(args: argparse.Namespace, mode: str, run_dir: Path) -> Round:
    """One job of ``mode``: a join, then its leaves (:data:`LEAVES`), each in the middle of a step."""
    from lifecycle.decide.events import read_jsonl
    from trainer.app import Job
    from trainer.app.faults import Fault, FaultInjector

    config, kwargs = job_parts(args, run_dir, mode)
    task = kwargs.pop("task")
    injector = FaultInjector(notice=args.notice)
    counts: dict[tuple[str, int], list[tuple[float, int]]] = {}  # each process's answered count, polled
    requests = Requests()
    calls: list[tuple[str, str, float, int, float]] = []  # (what, instance, t0, in flight, bound)
    with hooked(requests):
        async with Job(config, task, **kwargs) as job, contextlib.AsyncExitStack() as stack:
            if job.streams:
                await stack.enter_async_context(job.streaming())
            watcher = asyncio.create_task(watch_answers(job, counts, args.poll), name="bench-answers")
            stack.push_async_callback(_cancel, watcher)
            stack.push_async_callback(injector.aclose)
            await step(job, 0)  # weight version 1 committed: a joiner loads it, not its launch weights
            joined_at = time.time()
            (joiner,) = await job.add_engines(1)
            await step(job, 1)
            controller = job.manager.controller
            for n, kind, during in LEAVES[mode]:
                victim = max(int(e.rsplit("-", 1)[1]) for e in job.fleet.serving or job.fleet.members)
                engine = controller.engines[victim]
                running: asyncio.Future[Any]
                if during == "update":  # the stream's in-flight update: the engine paused, its requests kept
                    await job.take()
                    running = asyncio.ensure_future(job.update_weights(n + 1, onload=False))
                    in_flight = await updating(job, victim, running, args.poll)
                else:  # lock-step's generate, or a stream's take (its update comes after: see LEAVES)
                    running = asyncio.ensure_future(job.take() if job.streams else job.generate(n))
                    in_flight = await busy(job, victim, running, args.poll)
                t0 = time.time()
                if kind == "preempt":
                    await injector.inject(Fault("preempt-engine", victim, n), controller, job.trainer)
                    bound = controller.drain_bound(args.notice)
                    moment = "a weight update" if during == "update" else during
                    what = f"preempt during {moment}, notice {args.notice:g} s"
                else:
                    await job.retire_engines([engine.id])
                    bound = controller.drain_bound()
                    what = f"scale-down during {during}"
                calls.append((what, engine.id, t0, in_flight, bound))
                done = await running
                if during == "generate":
                    await job.train(done)
                if during != "update":
                    await job.update_weights(n + 1, **({"onload": False} if job.streams else {}))
                await settle(job, engine.id)
                await step(job, n + 1)  # a preemption's replacement joins at this step's boundary at the latest
    events = read_jsonl(run_dir / "events.jsonl")
    joins: list[tuple[str, WayIn]] = []
    scale_up = way_in(events, joiner, joined_at, _counts(events, counts, joiner, joined_at))
    if scale_up is not None:
        joins.append(("scale-up", scale_up))
    for what, _, noticed, _, _ in calls:
        if not what.startswith("preempt"):
            continue
        for e in events:  # its replacement: the first join after the notice
            if e.get("event") == "lifecycle.transition" and e.get("trigger") == "join" and when(e) >= noticed:
                instance = str(e["instance"])
                replacement = way_in(events, instance, noticed, _counts(events, counts, instance, noticed))
                if replacement is not None:
                    joins.append((f"replacement ({what.split(',')[0]})", replacement))
                break
    leaves = [
        leave_of(events, mode, what, instance, t0, in_flight, bound, requests)
        for what, instance, t0, in_flight, bound in calls
    ]
    if args.keep is not None:
        (run_dir.parent / "gateway-errors.txt").write_text("".join(f"{t:.3f} {e}\n" for t, e in requests.errors))
    return Round(mode, cold_starts(events), joins, leaves)


async def updating(job: Any, index: int, task: asyncio.Future[Any], poll: float) -> int:
    """Wait until engine ``index`` is in its in-flight weight update (or ``task`` ended); its requests then."""
    controller = job.manager.controller
    engine = controller.engines[index]
    deadline = time.monotonic() + SETTLE_S
    while not task.done() and time.monotonic() < deadline:
        if controller.state_of(engine) == "UpdatingInFlight":
            with contextlib.suppress(Exception):
                return (await engine_counts(engine.client))[0]
            return 0
        await asyncio.sleep(poll / 4)
    return 0


def _counts(
    events: Sequence[Mapping[str, Any]],
    counts: Mapping[tuple[str, int], list[tuple[float, int]]],
    instance: str,
    since: float,
) -> list[tuple[float, int]]:
    """The polled answered counts of the process of ``instance`` that launched after ``since``."""
    launch = _first(moves(events, instance, since), lambda m: m["dst"] in ("Starting", "Joining"))
    if launch is None:
        return []
    later = [c for (i, _), c in counts.items() if i == instance and c and c[0][0] >= when(launch)]
    return min(later, key=lambda c: c[0][0]) if later else []


async def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each mode's job once per round (default 2)")
    parser.add_argument("--quick", action="store_true", help="1 round, lock-step only (a smoke run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=("cpu", "vllm"), default="cpu")
    parser.add_argument("--notice", type=float, default=10.0, help="a preemption's notice, seconds (default 10)")
    parser.add_argument("--poll", type=float, default=0.02, help="seconds between two polls of an engine's report")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--keep", type=Path, help="keep each job's run directory (its event log) under this one")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",")]
    if args.quick:
        args.rounds, modes = 1, ["lock-step"]
    if any(m not in MODES for m in modes):
        raise SystemExit(f"--modes: one of {', '.join(MODES)}, comma-separated")

    from engines.actor import init_local_cluster
    from engines.router import router_available

    init_local_cluster(num_cpus=2)
    rounds: list[Round] = []
    t0 = time.monotonic()
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else list(reversed(modes)):
            with tempfile.TemporaryDirectory(prefix="bench-elastic-") as tmp:
                where = Path(tmp) if args.keep is None else args.keep / f"round{r + 1}-{mode}"
                done = asyncio.run(one_job(args, mode, where / "run"))
            rounds.append(done)
            print(f"round {r + 1} {mode}: {len(done.joins)} joins, {len(done.leaves)} leaves", flush=True)
    load = os.getloadavg()
    print(
        f"\nElastic fleet: joins and leaves ({args.backend} engines, 1 -> 2 engines between 1 and 3, "
        f"{'through SMG' if router_available() else 'routed in-process (no SMG installed)'}; {args.rounds} round(s); "
        f"notice {args.notice:g} s, --rollout-drain-timeout {DRAIN_TIMEOUT:g} s; {datetime.now():%Y-%m-%d %H:%M}, "
        f"load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} on {os.cpu_count()} cores; "
        f"{time.monotonic() - t0:.0f}s in all)\n"
    )
    print(table(sorted(rounds, key=lambda r: MODES.index(r.mode))))
    print()
    print(summary(rounds))


if __name__ == "__main__":
    main()
