"""The Prometheus exporter: what a real run's log makes it say, its naming, its HTTP endpoint, and a scrape
taken *during* a ``lifecycle run --metrics-port`` that kills and recovers an engine."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from lifecycle.decide.events import EventLog, read_jsonl
from lifecycle.decide.machines import ENGINE
from lifecycle.observe.monitor import JUDGED
from tests.helpers import EVENT_LOGS, free_port
from trainer.app.metrics import Metrics, serve_metrics

LOG = EVENT_LOGS / "rollout_ft_kill_events.jsonl"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape, keyed by (name, labels), through prometheus_client's own parser."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def matching(samples: Samples, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    want = set(labels.items())
    return {k: v for (n, k), v in samples.items() if n == name and want <= set(k)}


def fed(events: Iterable[dict[str, object]]) -> Samples:
    metrics = Metrics()
    for e in events:
        metrics(e)
    return parse(generate_latest(metrics.registry).decode())


def current_state(samples: Samples, machine: str, instance: str) -> list[str]:
    states = matching(samples, "rl_lifecycle_state", machine=machine, instance=instance)
    return sorted(dict(k)["state"] for k, v in states.items() if v == 1)


def test_a_real_fault_runs_log_gives_states_transitions_one_recovery_and_the_weight_versions() -> None:
    events = read_jsonl(LOG)
    s = fed(events)
    last = {e["instance"]: e["dst"] for e in events if e["event"] == "lifecycle.transition"}
    for instance in ("engine-0", "engine-1"):
        states = matching(s, "rl_lifecycle_state", machine="engine", instance=instance)
        assert {dict(k)["state"] for k in states} == set(ENGINE.state_names)  # the whole StateSet is exported
        assert current_state(s, "engine", instance) == [last[instance]]
    restart = {"machine": "engine", "from_state": "Recovering", "to_state": "Starting", "trigger": "restart"}
    assert value(s, "rl_lifecycle_transitions_total", **restart) == 1
    assert value(s, "rl_lifecycle_recoveries_total", instance="engine-1", outcome="restarted") == 1
    assert value(s, "rl_lifecycle_restarts_in_window", instance="engine-1") == 1
    assert value(s, "rl_lifecycle_restart_budget") == 3  # --engine-max-restarts, read from lifecycle.started
    committed = [e["weight_version"] for e in events if e["event"] == "weights.committed"][-1]
    assert value(s, "rl_lifecycle_committed_weight_version") == float(committed) == 5
    assert value(s, "rl_lifecycle_weight_version", instance="engine-0") == 5
    assert value(s, "rl_lifecycle_weight_version", instance="engine-1") == 5
    probes = [e for e in events if e["event"] == "engine.probe"]
    assert sum(matching(s, "rl_lifecycle_probes_total").values()) == len(probes) > 0
    assert value(s, "rl_lifecycle_probe_duration_seconds_count", by="monitor") == len(probes)
    moves = [e for e in events if e.get("machine") == "engine" and e.get("src", "") != e.get("dst", "")]
    assert sum(matching(s, "rl_lifecycle_time_in_state_seconds_count", machine="engine").values()) == len(moves)
    assert {dict(k)["invariant"] for k in matching(s, "rl_lifecycle_invariant_violations_total")} == set(JUDGED)
    assert sum(matching(s, "rl_lifecycle_invariant_violations_total").values()) == 0
    assert value(s, "rl_lifecycle_step") == 4


def test_guard_rejections_name_the_predicate_and_violations_are_counted() -> None:
    blocked = {
        "event": "lifecycle.blocked",
        "machine": "rollout",
        "instance": "rollout",
        "state": "Ready",
        "trigger": "offload",
        "blocked_by": ["offloads_rollout"],
    }
    violated = {"event": "lifecycle.invariant_violated", "invariant": "traffic_only_to_serving", "problem": "x"}
    s = fed([blocked, blocked, violated])
    rejected = {"machine": "rollout", "trigger": "offload", "guard": "offloads_rollout"}
    assert value(s, "rl_lifecycle_guard_rejections_total", **rejected) == 2
    assert value(s, "rl_lifecycle_invariant_violations_total", invariant="traffic_only_to_serving") == 1


def test_a_streams_groups_and_their_staleness_are_counted() -> None:
    """--fully-async: buffered, taken and dropped groups, and how stale each judged one was."""
    taken = {"event": "stream.group_taken", "group": "0/1", "oldest": "3", "version": "4", "bound": 1}
    dropped = {"event": "stream.group_dropped", "group": "0/2", "oldest": "1", "version": "4", "bound": 1}
    buffered = {"event": "stream.group_buffered", "group": "0/1", "oldest": "3", "versions": ["3"]}
    s = fed([buffered, buffered, taken, dropped])
    assert value(s, "rl_lifecycle_stream_groups_total", outcome="buffered") == 2
    assert value(s, "rl_lifecycle_stream_groups_total", outcome="taken") == 1
    assert value(s, "rl_lifecycle_stream_groups_total", outcome="dropped") == 1
    assert value(s, "rl_lifecycle_stream_staleness_versions_sum", outcome="taken") == 1
    assert value(s, "rl_lifecycle_stream_staleness_versions_sum", outcome="dropped") == 3


def test_the_names_follow_prometheus_conventions_and_no_label_is_unbounded() -> None:
    metrics = Metrics()
    for e in read_jsonl(LOG):
        metrics(e)
    families = list(metrics.registry.collect())
    assert len(families) >= 14
    for family in families:
        assert family.name.startswith("rl_lifecycle_"), family.name
        assert family.documentation, f"{family.name} has no help text"
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        if "seconds" in family.name or "time" in family.name:
            assert family.name.endswith(("_seconds", "_timestamp_seconds")), family.name
        for s in family.samples:
            assert not {"id", "request_id", "rid", "path", "url", "pid", "ts"} & set(s.labels), (family.name, s.labels)


def test_the_endpoint_serves_the_log_over_http_and_close_stops_it() -> None:
    log = EventLog()
    server = serve_metrics(log, 0)
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.port > 0
        move = {"machine": "engine", "instance": "engine-0", "src": "Init", "dst": "Starting", "trigger": "start"}
        log.emit("lifecycle.transition", **move)
        with urllib.request.urlopen(server.url, timeout=5) as response:
            assert response.status == 200 and "text/plain" in response.headers["Content-Type"]
            s = parse(response.read().decode())
        assert current_state(s, "engine", "engine-0") == ["Starting"]
    finally:
        server.close()
    assert not log.enabled  # the sink left the log with the server
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)


def test_two_exporters_keep_their_own_registries() -> None:
    a, b = Metrics(), Metrics(CollectorRegistry())
    a({"event": "weights.committed", "weight_version": "7"})
    assert "rl_lifecycle_committed_weight_version 7.0" in generate_latest(a.registry).decode()
    assert "rl_lifecycle_committed_weight_version 0.0" in generate_latest(b.registry).decode()


@pytest.mark.recovery
@pytest.mark.usefixtures("ray_cluster")
def test_a_scrape_during_a_run_shows_engine_1_leave_serving_the_transitions_one_recovery_and_the_versions(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    from lifecycle.cli import main

    port = free_port()
    argv = ["run", "--steps", "5", "--inject", "kill-engine:1@3", "--use-fault-tolerance", "--ft-components"]
    argv += ["rollout", "--quiet", "--run-dir", str(tmp_path / "run"), "--metrics-port", str(port)]
    result: list[int] = []
    run = threading.Thread(target=lambda: result.append(main(argv)), name="lifecycle-run")
    run.start()
    scrapes: list[Samples] = []
    while run.is_alive():
        try:
            # Prometheus's own default scrape timeout: the exporter's thread shares this process (and, in CI, two
            # busy cores) with the run, and one slow answer is a missed scrape, as it would be for Prometheus
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                scrapes.append(parse(response.read().decode()))
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet, already closed, or one scrape too slow
        time.sleep(0.02)
    run.join()
    assert result == [0]
    assert len(scrapes) > 10
    engine_1 = [current_state(s, "engine", "engine-1") for s in scrapes]
    served = engine_1.index(["Serving"])
    out = next(i for i in range(served, len(engine_1)) if engine_1[i] and engine_1[i][0] in ENGINE_MARKED_OR_RESTARTING)
    assert out > served  # a scrape during the run saw engine-1 Serving, then one saw it marked or restarting
    last = scrapes[-1]
    marked = {"machine": "engine", "from_state": "Quiesced", "to_state": "Unhealthy", "trigger": "mark_unhealthy"}
    assert value(last, "rl_lifecycle_transitions_total", **marked) == 1
    assert sum(matching(last, "rl_lifecycle_transitions_total", machine="engine").values()) > 40
    assert value(last, "rl_lifecycle_recoveries_total", instance="engine-1", outcome="restarted") == 1
    committed = value(last, "rl_lifecycle_committed_weight_version")
    assert committed is not None and committed >= 4
    assert value(last, "rl_lifecycle_weight_version", instance="engine-0") == committed
    assert value(last, "rl_lifecycle_weight_version", instance="engine-1") == committed
    assert sum(matching(last, "rl_lifecycle_invariant_violations_total").values()) == 0
    assert (tmp_path / "run" / "timeline.html").is_file()


ENGINE_MARKED_OR_RESTARTING = frozenset({"Unhealthy", "Recovering", "Starting", "PendingWeights", "LoadingWeights"})


@pytest.mark.bad_input
def test_a_bad_or_busy_metrics_port_is_one_error_naming_the_flag_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lifecycle.cli import main

    argv = ["run", "--steps", "1", "--run-dir", str(tmp_path / "run")]
    assert main([*argv, "--metrics-port", "70000"]) == 2
    assert "--metrics-port: out of range 0..65535 (a TCP port" in capsys.readouterr().err  # refused at parse time
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main([*argv, "--metrics-port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--metrics-port: cannot listen on 127.0.0.1:{port}" in err and "pick a free port, or 0" in err


def test_restarts_leave_the_budget_window_as_time_passes_not_only_at_the_next_restart() -> None:
    from lifecycle.decide.config import LifecycleConfig

    now = [100.0]
    config = LifecycleConfig.from_mapping({"rollout_num_gpus": 1, "engine_restart_window": 60.0})
    metrics = Metrics(config=config, monotonic=lambda: now[0])
    restart = {"machine": "engine", "instance": "engine-0", "src": "Recovering", "dst": "Starting"}
    metrics({"event": "lifecycle.transition", **restart, "trigger": "restart"})
    now[0] = 130.0
    metrics({"event": "lifecycle.transition", **restart, "trigger": "restart"})

    def scrape() -> float | None:
        samples = parse(generate_latest(metrics.registry).decode())
        return value(samples, "rl_lifecycle_restarts_in_window", instance="engine-0")

    assert scrape() == 2
    now[0] = 170.0  # the first restart is 70 s old: out of the 60 s window
    assert scrape() == 1
    now[0] = 200.0
    assert scrape() == 0


def test_an_elastic_fleet_s_counts_notices_and_drains() -> None:
    """The elastic log: 2 engines, scaled to 3 (a join), engine-1 retired, engine-2 given a notice and drained."""
    events = read_jsonl(EVENT_LOGS / "elastic_events.jsonl")

    def fleet_at(i: int) -> dict[str, float | None]:
        s = fed(events[: i + 1])
        return {k: value(s, "rl_lifecycle_fleet_engines", kind=k) for k in ("desired", "allocated", "routable")}

    reads = [i for i, e in enumerate(events) if e["event"] == "gateway.members" and e["workers"]]
    assert fleet_at(0) == {"desired": 2, "allocated": None, "routable": None}  # --rollout-num-gpus, before any move
    assert fleet_at(reads[0]) == {"desired": 2, "allocated": 2, "routable": 2}  # step 0's generate
    assert fleet_at(reads[1]) == {"desired": 3, "allocated": 3, "routable": 3}  # after the join
    notice = fleet_at(reads[3])  # step 2: engine-1 retired, engine-2 Draining, engine-0 alone routable
    assert notice["desired"] == 2 and notice["routable"] == 1
    if ENGINE.tagged("leaving"):  # the spec tags Draining/Retiring leaving and Retired gone: neither allocated
        assert notice["allocated"] == 1
    s = fed(events)
    assert value(s, "rl_lifecycle_engine_notices_total", instance="engine-2", by="injector") == 1
    assert value(s, "rl_lifecycle_drains_total", outcome="drained") == 1
    assert value(s, "rl_lifecycle_drain_duration_seconds_count", outcome="drained") == 1
    assert value(s, "rl_lifecycle_drain_duration_seconds_sum", outcome="drained") == pytest.approx(1.27)
    assert value(s, "rl_lifecycle_drain_duration_seconds_bucket", outcome="drained", le="1.0") == 0
    assert value(s, "rl_lifecycle_drain_duration_seconds_bucket", outcome="drained", le="2.5") == 1
    timed_out = {"event": "engine.drained", "instance": "engine-0", "timed_out": True, "seconds": 30.0}
    s = fed([*events, timed_out])
    assert value(s, "rl_lifecycle_drains_total", outcome="timed_out") == 1
    assert value(s, "rl_lifecycle_fleet_engines", kind="routable") == 0  # the run ended: every engine stopped
