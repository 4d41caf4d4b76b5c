"""Prometheus metrics of every machine, fed by the event log: a sink, so the exporter sees exactly what was logged.

The metrics follow the patterns operators' dashboards already know: kube-state-metrics' StateSet
(``rl_lifecycle_state{state}`` is 1 for the current state and 0 for every other state of the machine's spec,
so ``sum by (state)`` is the fleet's composition), Ray Serve's health-check counters, and a
state-entered timestamp for "stuck in a state" alerts. Labels are bounded: machine, instance (one per
engine slot, not per process), state, trigger, guard, invariant; never a request id or a path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core.model import GROUP_PREFIX, ROLLOUT
from lifecycle.decide.events import (
    BLOCKED,
    COMMITTED,
    DRAINED,
    FLEET,
    GROUP_BUFFERED,
    GROUP_DROPPED,
    GROUP_TAKEN,
    PREEMPT_NOTICE,
    PROBE,
    STARTED,
    TRANSITION,
    VIOLATED,
    WEIGHTS,
    EventLog,
)
from lifecycle.decide.machines import MACHINES
from lifecycle.observe.monitor import JUDGED

PREFIX = "rl_lifecycle"
STATE_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
PROBE_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
STREAM_OUTCOMES = {GROUP_BUFFERED: "buffered", GROUP_TAKEN: "taken", GROUP_DROPPED: "dropped"}
RECOVERY_OUTCOMES = {"restart": "restarted", "give_up": "gave_up"}  # how an engine leaves Recovering
DRAIN_SECONDS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)  # --rollout-drain-timeout is 30 s
FLEET_KINDS = ("desired", "allocated", "routable")  # Dynamo's engine-group counts: wanted, holding a slot, routed
ENGINE = MACHINES["engine"]
# an engine slot holds no member in these (vacant: no process, or one on its way out of an elastic fleet)
NOT_ALLOCATED = ENGINE.tagged("gone") | ENGINE.tagged("leaving")
ROLLOUT_ENGINE = GROUP_PREFIX[ROLLOUT]  # the rollout fleet's instances (engine-0, ...), not the eval fleet's


class Metrics:
    """The exporter's metrics in their own registry, updated by :meth:`__call__` (an event-log sink)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        config: LifecycleConfig | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock  # timestamps (Unix time); durations and the restart window use ``monotonic``
        self._monotonic = monotonic
        r = self.registry
        self.state = Gauge(
            f"{PREFIX}_state",
            "1 for the machine instance's current state, 0 for its spec's other states (a StateSet).",
            ["machine", "instance", "state"],
            registry=r,
        )
        self.transitions = Counter(
            f"{PREFIX}_transitions", "Machine moves.", ["machine", "from_state", "to_state", "trigger"], registry=r
        )
        self.guard_rejections = Counter(
            f"{PREFIX}_guard_rejections",
            "Moves a guard refused, by the named predicate that refused it.",
            ["machine", "trigger", "guard"],
            registry=r,
        )
        self.entered = Gauge(
            f"{PREFIX}_state_entered_timestamp_seconds",
            "When the machine instance entered its current state (Unix time).",
            ["machine", "instance"],
            registry=r,
        )
        self.time_in_state = Histogram(
            f"{PREFIX}_time_in_state_seconds",
            "How long a machine stayed in a state, observed when it left.",
            ["machine", "state"],
            buckets=STATE_SECONDS,
            registry=r,
        )
        self.probes = Counter(
            f"{PREFIX}_probes", "Liveness probes by result.", ["instance", "by", "outcome"], registry=r
        )
        self.probe_seconds = Histogram(
            f"{PREFIX}_probe_duration_seconds", "Probe latency.", ["by"], buckets=PROBE_SECONDS, registry=r
        )
        self.recoveries = Counter(
            f"{PREFIX}_recoveries",
            "Recoveries of an engine by rollout FT, by how they left Recovering.",
            ["instance", "outcome"],
            registry=r,
        )
        self.restarts_in_window = Gauge(
            f"{PREFIX}_restarts_in_window",
            "Restarts of the engine slot within --engine-restart-window (its budget is rl_lifecycle_restart_budget).",
            ["instance"],
            registry=r,
        )
        self.restart_budget = Gauge(
            f"{PREFIX}_restart_budget", "Restarts an engine slot may have within the window (--engine-max-restarts).",
            registry=r,
        )  # fmt: skip
        self.weight_version = Gauge(
            f"{PREFIX}_weight_version",
            "The weight version the engine's server reported after its last verified transfer.",
            ["instance"],
            registry=r,
        )
        self.committed = Gauge(
            f"{PREFIX}_committed_weight_version", "The version every engine must serve (the trainer's last).",
            registry=r,
        )  # fmt: skip
        self.stream_groups = Counter(
            f"{PREFIX}_stream_groups",
            "--fully-async: groups the stream completed (buffered), the trainer trained on (taken), or dropped as "
            "more than --max-weight-staleness versions behind (dropped).",
            ["outcome"],
            registry=r,
        )
        self.staleness = Histogram(
            f"{PREFIX}_stream_staleness_versions",
            "--fully-async: how many versions behind the committed weights each group the trainer took or dropped was.",
            ["outcome"],
            buckets=(0, 1, 2, 3, 4, 6, 8, 16, 32, 64),
            registry=r,
        )
        self.fleet = Gauge(
            f"{PREFIX}_fleet_engines",
            "The rollout fleet in engines: desired (the target: --rollout-num-gpus, then each scale), allocated "
            "(slots holding a member that is not leaving), routable (Serving).",
            ["kind"],
            registry=r,
        )
        self.notices = Counter(
            f"{PREFIX}_engine_notices",
            "Preemption notices an engine was given (a spot reclaim, a draining node), by who gave it.",
            ["instance", "by"],
            registry=r,
        )
        self.drains = Counter(
            f"{PREFIX}_drains",
            "Drains of a leaving engine: its requests in flight finished (drained) or the drain bound passed first "
            "(timed_out: what was left was handed back or re-sent).",
            ["outcome"],
            registry=r,
        )
        self.drain_seconds = Histogram(
            f"{PREFIX}_drain_duration_seconds",
            "How long a leaving engine's drain took, from its withdrawal to its last request (or the bound).",
            ["outcome"],
            buckets=DRAIN_SECONDS,
            registry=r,
        )
        self.violations = Counter(
            f"{PREFIX}_invariant_violations", "Invariant violations the live monitor saw.", ["invariant"], registry=r
        )
        self.step = Gauge(f"{PREFIX}_step", "The RL step the last event belongs to.", registry=r)
        for name in JUDGED:  # the series exist at 0, so an alert on increase() works from the first scrape
            self.violations.labels(name)
        self._current: dict[str, tuple[str, str, float]] = {}  # instance -> (machine, state, since: monotonic)
        self._fleet = {"allocated": 0, "routable": 0}  # the rollout fleet's counts, kept by each move's difference
        self._children: dict[tuple[Any, ...], Any] = {}  # (metric, labels...) -> its child: labels() costs µs
        self._restarts: dict[str, list[float]] = {}
        self._budget: tuple[int, float] | None = None
        if config is not None:
            self._configure(config.engine_max_restarts, config.engine_restart_window)

    def _configure(self, max_restarts: int, window: float) -> None:
        self._budget = (max_restarts, window)
        self.restart_budget.set(max_restarts)

    # -- the sink ---------------------------------------------------------------------------------------------
    def __call__(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event")
        step = event.get("step")
        if isinstance(step, int):
            self.step.set(step)
        if kind == TRANSITION:
            self._transition(event)
        elif kind == BLOCKED:
            for guard in event.get("blocked_by") or ():
                self.guard_rejections.labels(event.get("machine"), event.get("trigger"), guard).inc()
        elif kind == PROBE:
            by = str(event.get("by"))
            self._child(self.probes, event.get("instance"), by, event.get("outcome")).inc()
            seconds = event.get("seconds")
            if isinstance(seconds, (int, float)):
                self._child(self.probe_seconds, by).observe(seconds)
        elif kind == WEIGHTS:
            version = _number(event.get("weight_version"))
            if event.get("outcome") == "loaded" and version is not None:
                self._child(self.weight_version, event.get("instance")).set(version)
        elif kind == COMMITTED:
            version = _number(event.get("weight_version"))
            if version is not None:
                self.committed.set(version)
        elif kind in STREAM_OUTCOMES:
            outcome = STREAM_OUTCOMES[kind]
            self._child(self.stream_groups, outcome).inc()
            version, oldest = _number(event.get("version")), _number(event.get("oldest"))
            if version is not None and oldest is not None:
                self._child(self.staleness, outcome).observe(version - oldest)
        elif kind == VIOLATED:
            self.violations.labels(event.get("invariant")).inc()
        elif kind == FLEET:
            target = event.get("target")
            if isinstance(target, int):
                self._child(self.fleet, "desired").set(target)
        elif kind == PREEMPT_NOTICE:
            self._child(self.notices, event.get("instance"), event.get("by")).inc()
        elif kind == DRAINED:
            outcome = "timed_out" if event.get("timed_out") else "drained"
            self._child(self.drains, outcome).inc()
            seconds = event.get("seconds")
            if isinstance(seconds, (int, float)):
                self._child(self.drain_seconds, outcome).observe(seconds)
        elif kind == STARTED:
            config = event.get("config") or {}
            if self._budget is None and "engine_max_restarts" in config and "engine_restart_window" in config:
                self._configure(int(config["engine_max_restarts"]), float(config["engine_restart_window"]))
            gpus, per = config.get("rollout_num_gpus"), config.get("rollout_num_gpus_per_engine") or 1
            if isinstance(gpus, int) and isinstance(per, int):  # the fleet a run starts with, until it is scaled
                self._child(self.fleet, "desired").set(gpus // per)

    def _child(self, metric: Any, *labels: Any) -> Any:
        """``metric.labels(*labels)``, looked up once: the sink runs on every event of the loop."""
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _transition(self, e: Mapping[str, Any]) -> None:
        machine, instance = str(e.get("machine")), str(e.get("instance"))
        src, dst, trigger = str(e.get("src")), str(e.get("dst")), str(e.get("trigger"))
        self._child(self.transitions, machine, src, dst, trigger).inc()
        now = self._monotonic()
        if instance not in self._current:
            self._first_seen(machine, instance, src, now)
        if src != dst:
            _, _, since = self._current[instance]
            self._child(self.time_in_state, machine, src).observe(now - since)
            self._child(self.state, machine, instance, src).set(0)
            self._child(self.state, machine, instance, dst).set(1)
            self._child(self.entered, machine, instance).set(self._clock())
            self._current[instance] = (machine, dst, now)
        if machine == "engine" and src != dst and instance.rpartition("-")[0] == ROLLOUT_ENGINE:
            self._count_fleet(src, dst)
        if machine == "engine" and src == "Recovering" and trigger in RECOVERY_OUTCOMES:
            self.recoveries.labels(instance, RECOVERY_OUTCOMES[trigger]).inc()
            if trigger == "restart":
                self._restarted(instance, now)

    def _count_fleet(self, src: str, dst: str) -> None:
        """Allocated and routable engines of the rollout fleet, from the engines' moves (the StateSet's view): one
        move changes each count by at most one, so a fleet of thousands costs no scan per move."""
        counts = self._fleet
        counts["allocated"] += (dst not in NOT_ALLOCATED) - (src not in NOT_ALLOCATED)
        counts["routable"] += (dst == "Serving") - (src == "Serving")
        for kind, n in counts.items():
            self._child(self.fleet, kind).set(n)

    def _first_seen(self, machine: str, instance: str, state: str, now: float) -> None:
        """Every state of the machine's spec gets its series (0), so a StateSet query sees the whole set."""
        spec = MACHINES.get(machine)
        for name in spec.state_names if spec is not None else (state,):
            self.state.labels(machine, instance, name).set(1 if name == state else 0)
        self.entered.labels(machine, instance).set(self._clock())
        self._current[instance] = (machine, state, now)

    def _restarted(self, instance: str, now: float) -> None:
        first = instance not in self._restarts
        self._restarts.setdefault(instance, []).append(now)
        if first:  # computed at each scrape, so a restart that has left the window no longer counts
            self.restarts_in_window.labels(instance).set_function(lambda: self.in_window(instance))

    def in_window(self, instance: str) -> int:
        """The slot's restarts within --engine-restart-window of now (what its restart budget is spent on)."""
        window = self._budget[1] if self._budget is not None else float("inf")
        now = self._monotonic()
        return sum(1 for t in self._restarts.get(instance, ()) if now - t < window)


def _number(value: Any) -> float | None:
    """Weight versions are strings ("3"); a non-numeric one has no gauge value."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass
class MetricsServer:
    """A running exporter: ``url`` serves the Prometheus text format; ``close`` stops it and detaches the sink."""

    metrics: Metrics
    host: str
    port: int
    _log: EventLog
    _server: Any

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._log.remove_sink(self.metrics)
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def serve_metrics(
    log: EventLog, port: int = 0, *, host: str = "127.0.0.1", config: LifecycleConfig | None = None
) -> MetricsServer:
    """Attach a :class:`Metrics` sink to ``log`` and serve it at ``http://host:port/metrics`` (port 0: any free
    one; ``.port`` says which). The one call an embedding loop needs; ``close()`` when the run ends."""
    metrics = Metrics(config=config)
    server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    log.add_sink(metrics)
    return MetricsServer(metrics, host, int(server.server_port), log, server)
