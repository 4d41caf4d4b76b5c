"""The real SMG gateway in the rollout path, read on the wire.

Gateway membership is the publication boundary: after every step of the job whose commands have come
back, SMG's ``GET /workers`` shows exactly the Serving engines ``ready`` (routable) -- a Quiesced, Pending,
Updating or Unhealthy one ready, or a Serving one not, fails -- each labelled with the committed version; and
every engine's own count of ``/generate``
requests does not move while it is not Serving -- right after a recovery and during a weight update
included. Two tests re-introduce the field's bugs (registered before holding the weights, miles #1724;
never registered again after a recovery, miles #692) and show the check fails.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import EVAL, ROLLOUT, Event, Move, Refusal
from lifecycle.decide.events import EventLog, MemorySink
from lifecycle.decide.runner import RunFailed, Runner

pytest.importorskip("torch")
pytest.importorskip("smg")

from engines.engine import Timeouts
from engines.errors import EngineUnreachable
from engines.launcher import launcher_factory
from engines.models import TinyCausalLM
from rollout.executor import RolloutManager
from rollout.pattern import PatternTask
from rollout.routing import RouterRouting

from .conftest import bind_trainer_stand_in

pytestmark = pytest.mark.routing

ROLLOUT_FT = {
    "use_fault_tolerance": True,
    "ft_components": ["rollout"],
    "rollout_num_gpus": 2,
    "offload_rollout": True,
    "rollout_health_check_interval": 5.0,
    "rollout_health_check_timeout": 5.0,
    "engine_restart_backoff": 0.05,
    "engine_max_restarts": 20,
}
TASK = PatternTask(prompts_per_step=2, group_size=2, response_len=4)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _vllm_requests(url: str) -> int:
    """Requests a vLLM server has finished (``vllm:request_success_total``, every finish reason summed)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return int(
        sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total")
        )
    )


class Violation(AssertionError):
    pass


class CheckingRunner(Runner):
    """After every event whose commands have all come back, the router lists exactly the Serving engines."""

    rig: Rig | None = None
    checks = 0

    async def submit(self, event: Event) -> Refusal | None:
        refusal = await super().submit(event)
        if self.rig is not None and not self.state.failed and not self.state.awaiting:  # settled: effects done
            await self.rig.check_membership(f"after {event!r}"[:160])
            self.checks += 1
        return refusal


class Rig:
    def __init__(
        self, flags: dict[str, Any], tmp: Path, *, vllm_python: str | None = None, timeouts: Timeouts | None = None
    ) -> None:
        """``vllm_python``: real vLLM servers (``--rollout-backend vllm``) on tiny Llama checkpoints; ``timeouts``:
        the engines' bounds (default: the slot's own, or a 300 s start-up for vLLM)."""
        self.vllm = vllm_python is not None
        self.config = LifecycleConfig.from_mapping({**flags, **({"rollout_backend": "vllm"} if self.vllm else {})})
        self.tmp = tmp
        launchers = launcher_factory("local")
        if vllm_python is not None:
            from engines.vllm.launcher import vllm_launcher_factory

            launchers = vllm_launcher_factory("local", self.weights(0)[0], python=vllm_python)
        self.loop = asyncio.new_event_loop()
        self.events = MemorySink()
        self.runner = CheckingRunner(self.config, log=EventLog([self.events]))
        self.manager = RolloutManager(
            self.config,
            TASK,
            runner=self.runner,
            launcher_factory=launchers,
            timeouts=timeouts or (Timeouts(startup=300.0) if self.vllm else None),
            router=True,
            log_dir=str(tmp),
        )
        self.versions = 0
        self.counts: list[tuple[str, str, str, int]] = []  # (engine, src, dst, its /generate count at the move)
        self.runner.watch(self._count)
        bind_trainer_stand_in(self.runner, self.weights)
        self.run(self.runner.operate("trainer.start"))
        self.runner.rig = self

    @property
    def routing(self) -> RouterRouting:
        routing = self.manager.controller.routing()
        assert isinstance(routing, RouterRouting)
        return routing

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def weights(self, version: int | None = None) -> tuple[str, str]:
        if version is None:
            self.versions += 1
            version = self.versions
        path = self.tmp / f"step-{version}"
        if not path.exists() and self.vllm:
            from engines.models import build_tiny_llama
            from trainer.app.loop import VLLM_TINY_LLAMA

            build_tiny_llama(path, seed=100 + version, **VLLM_TINY_LLAMA)
            if version:  # new weights, the served tokenizer (the seed draws the tokenizer too), as a trainer writes
                for name in ("tokenizer.json", "tokenizer_config.json"):
                    shutil.copy(self.tmp / "step-0" / name, path / name)
        elif not path.exists():
            TinyCausalLM("tiny", seed=100 + version).save_pretrained(path)
        return str(path), str(version)

    def generate_count(self, index: int) -> int:
        engines = self.manager.controller.engines
        if index >= len(engines) or engines[index].url is None:
            return 0
        engine = engines[index]
        if engine.url is None:
            return 0
        try:
            if self.vllm:  # vLLM counts its requests in its Prometheus metrics (finished ones)
                return _vllm_requests(engine.url)
            info = _get(engine.url + "/server_info")
        except OSError:
            return -1  # the process is gone (a death the lifecycle is about to hear of)
        return int(info["internal_states"][0]["num_generate_requests"])

    def _count(self, move: Move) -> None:
        if move.machine == "engine" and move.instance.startswith("engine-"):
            i = int(move.instance.rsplit("-", 1)[1])
            self.counts.append((move.instance, move.src, move.dst, self.generate_count(i)))

    async def check_membership(self, when: str) -> None:
        for group in (ROLLOUT, EVAL):
            await self._check_group(group, when)

    async def _check_group(self, group: str, when: str) -> None:
        """One group's gateway (rollout, eval): SMG routes to exactly its Serving engines, each labelled with the
        committed version."""
        routing = self.manager.controller.routing(group)
        assert isinstance(routing, RouterRouting)
        router = routing.router
        if router.process is None or not router.alive:
            return  # not started yet, or dead (being restarted by the lifecycle): it routes nothing
        try:
            workers = await router.workers()
        except EngineUnreachable:
            if not router.alive:
                return
            raise
        listed = {url for url, w in workers.items() if w.routable}  # SMG's "ready": what it routes to
        engines = self.manager.controller.engines if group == ROLLOUT else self.manager.controller.evals
        states = [e.state for e in self.runner.state.group(group)]
        serving = {e.url.rstrip("/") for e, state in zip(engines, states, strict=False) if e.url and state == "Serving"}
        if listed != serving:
            seen = {url: w.status for url, w in workers.items()}
            raise Violation(
                f"{when}: SMG ({routing.name}) routes to {sorted(listed)}, Serving are {sorted(serving)} "
                f"({dict(zip([e.id for e in engines], states, strict=False))}; {seen})"
            )
        committed = self.runner.committed[1] if self.runner.committed else None
        labels = {url: workers[url].weight_version for url in listed}
        if any(v != committed for v in labels.values()):
            raise Violation(f"{when}: SMG's weight_version labels {labels}, the committed version is {committed}")

    def state(self, i: int = 0) -> str:
        return self.runner.state.engines[i].state

    def close(self) -> None:
        self.runner.rig = None
        self.run(self.manager.dispose())
        self.loop.close()


def requests_while_not_serving(counts: list[tuple[str, str, str, int]]) -> list[str]:
    """Per engine, the /generate requests it counted between leaving Serving and entering it again."""
    bad = []
    left: dict[str, tuple[str, int]] = {}
    for instance, src, dst, count in counts:
        if src == "Serving" and dst != "Serving":
            left[instance] = (dst, count)
        elif dst == "Serving" and instance in left:
            state, before = left.pop(instance)
            if count >= 0 and before >= 0 and count > before:
                bad.append(f"{instance}: {count - before} requests while {state}")
        elif src == "Starting" and dst == "PendingWeights":  # a new process: counted from zero
            left[instance] = (dst, count)
    return bad


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    r = Rig(ROLLOUT_FT, tmp_path_factory.mktemp("router"))
    r.run(r.manager.init(r.weights(0)))
    yield r
    r.close()


def test_router_lists_exactly_the_serving_engines_through_generate_updates_and_recovery(rig: Rig) -> None:
    checks = rig.runner.checks
    samples = rig.run(rig.manager.generate(1))
    assert len(samples) == TASK.prompts_per_step * TASK.group_size and {s["engine"] for s in samples} == {"router"}
    assert {s["weight_version"] for s in samples} == {"0"}
    rig.run(rig.runner.operate("update_weights"))
    rig.run(rig.manager.offload())
    rig.run(rig.manager.onload_weights())
    rig.run(rig.manager.onload_kv())
    rig.run(rig.manager.controller.kill_engine(0))
    samples = rig.run(rig.manager.generate(2))  # recover engine-0, catch up, register again
    assert {s["weight_version"] for s in samples} == {"1"}
    assert rig.state(0) == "Quiesced" and rig.runner.checks > checks + 8
    moves = [(e["instance"], e["trigger"]) for e in rig.events if e.get("event") == "lifecycle.transition"]
    assert ("engine-0", "recover") in moves
    assert requests_while_not_serving(rig.counts) == []


def test_smgs_view_read_back_agrees_and_a_planted_disagreement_is_caught(rig: Rig) -> None:
    """Every registration and removal logs what SMG then reports for that worker (``gateway.worker``); judged by
    the live monitor's ``gateway_agrees_with_lifecycle`` the whole log passes -- and it fails when SMG's view is
    planted to disagree: a Serving engine not routable, a withdrawn one still routable, another version label."""
    from lifecycle.observe.monitor import EventMonitor

    rig.run(rig.manager.generate(3))
    events = [dict(e) for e in rig.events]
    seen = [i for i, e in enumerate(events) if e.get("event") == "gateway.worker"]
    ready = [i for i in seen if events[i]["status"] == "ready"]
    gone = [i for i in seen if events[i]["status"] is None]
    assert ready and gone, [events[i] for i in seen]
    assert all(events[i]["weight_version"] is not None for i in ready)

    def judged(planted: list[dict[str, Any]]) -> list[str]:
        return [v.problem for v in EventMonitor().feed_all(planted) if v.invariant == "gateway_agrees_with_lifecycle"]

    assert judged(events) == []
    for index, change, says in (
        (ready[-1], {"status": "not_ready"}, "does not route to (not_ready)"),
        (gone[-1], {"status": "ready"}, "routes to"),
        (ready[-1], {"weight_version": "99"}, "labels engine"),
    ):
        planted = copy.deepcopy(events)
        planted[index].update(change)
        found = judged(planted)
        assert len(found) == 1 and says in found[0], (change, found)


def test_smgs_own_verdict_on_a_stalled_serving_engine_is_news_the_lifecycle_acts_on(tmp_path: Path) -> None:
    """With SMG's own health checks kept on (a second detector), a Serving engine stalled mid-generate (SIGSTOP)
    is marked not_ready by SMG first (1 s checks, against the lifecycle monitor's 5 s); SMG only tells: the
    lifecycle marks the engine Unhealthy with SMG's verdict as the reason, removes it from SMG, recovers it (rollout
    FT) and registers it again once it holds the committed weights -- and SMG routes to it again."""
    # the stalled engine's in-flight requests end at the request bound, then go on elsewhere: 10 s, not the default
    # 30 s, which the whole generate waited out -- still far beyond SMG's verdict (~3 s) and a healthy engine's answer
    rig = Rig({**ROLLOUT_FT, "gateway_health_check": True}, tmp_path, timeouts=Timeouts(request=10.0))
    rig.runner.rig = None  # SMG may disagree for the moment it takes to tell: the news, not the settled check
    try:
        rig.run(rig.manager.init(rig.weights(0)))
        rig.run(rig.manager.generate(1))
        stalled = rig.manager.controller.engines[1]

        pid = rig.run(stalled.launcher.server_pid())
        assert pid is not None
        stopped: list[int] = []

        def stall_once_routed(event: dict[str, Any]) -> None:
            """Registered and ready at SMG (``engine.routed``): then it stalls, before the rollout's requests. (A
            poll of the routing's members could miss the whole generate on a fast machine and wait for ever.)"""
            if not stopped and event.get("event") == "engine.routed" and event.get("instance") == "engine-1":
                os.killpg(pid, signal.SIGSTOP)
                stopped.append(pid)

        rig.runner.log.add_sink(stall_once_routed)
        try:
            samples = rig.run(rig.manager.generate(2))
        finally:
            rig.runner.log.remove_sink(stall_once_routed)
        assert stopped == [pid]
        assert len(samples) == TASK.prompts_per_step * TASK.group_size  # the stalled engine's prompts went on
        marks = [e for e in rig.events if e.get("trigger") == "mark_unhealthy" and e.get("instance") == "engine-1"]
        assert marks and "router-rollout (SMG) reports its worker not_ready" in str(marks[0].get("reason")), marks
        moves = [
            e["trigger"] for e in rig.events if e.get("event") == "lifecycle.transition" and e["instance"] == "engine-1"
        ]
        assert moves[-1] == "mark_unhealthy", moves  # SMG told; the lifecycle decided
        rig.run(rig.manager.generate(3))  # recovered: caught up, registered again, routed again
        moves = [
            e["trigger"] for e in rig.events if e.get("event") == "lifecycle.transition" and e["instance"] == "engine-1"
        ]
        assert "recover" in moves[moves.index("mark_unhealthy") :], moves
        ready = {url for url, w in rig.run(rig.routing.router.workers()).items() if w.routable}
        assert rig.state(1) == "Quiesced" and stalled.url is not None
        seen = [e for e in rig.events if e.get("event") == "gateway.worker" and e.get("instance") == "engine-1"]
        assert seen[-1]["status"] is None and any(e["status"] == "ready" for e in seen[-3:]), seen[-3:]
        assert ready == set()  # between generates nothing is Serving, so SMG routes to nothing
    finally:
        rig.close()


def test_the_eval_fleets_gateway_routes_to_exactly_its_serving_engines(tmp_path: Path) -> None:
    """The eval fleet has its own SMG (``router-eval``): checked after every settled step like the rollout's --
    through evals, a weight update, and an eval engine's death and restart."""
    rig = Rig({**ROLLOUT_FT, "rollout_num_gpus": 1, "offload_rollout": False, "eval_num_gpus": 2}, tmp_path)
    try:
        rig.run(rig.manager.init(rig.weights(0)))
        checks = rig.runner.checks
        first = rig.run(rig.manager.eval(0))
        assert first.on == "eval_fleet" and first.skipped is None, first
        rig.run(rig.runner.operate("update_weights"))
        rig.run(rig.manager.controller.evals[1].launcher.kill())
        second = rig.run(rig.manager.eval(1))  # the dead eval engine is started again and pinned
        assert second.on == "eval_fleet" and second.weight_version == "1", second
        assert rig.runner.checks > checks + 6
        seen = [e for e in rig.events if e.get("event") == "gateway.worker" and e["router"] == "router-eval"]
        assert {e["instance"] for e in seen if e["status"] == "ready"} == {"eval-0", "eval-1"}, seen
    finally:
        rig.close()


async def hammered_update(rig: Rig) -> list[int]:
    """A weight update while a client sends generate requests to the gateway as fast as it answers: its codes."""
    gateway = rig.routing.gateway
    assert gateway is not None
    stop, codes = asyncio.Event(), []

    async def hammer() -> None:
        while not stop.is_set():
            try:
                await gateway.generate("abcd:", sampling_params={"max_new_tokens": 1})
                codes.append(200)
            except Exception as exc:  # SMG answers an error: no worker to route to
                codes.append(getattr(exc, "status", 0))
            await asyncio.sleep(0)

    task = asyncio.create_task(hammer())
    await asyncio.sleep(0.05)
    await rig.runner.operate("update_weights")
    stop.set()
    await task
    return codes


@pytest.mark.slow
@pytest.mark.recorded  # CI's time bound: the same check on CPU engines runs in CI, and so do the vLLM fault cells
def test_smg_routes_to_exactly_the_serving_vllm_engines(tmp_path: Path, vllm_python: str) -> None:
    """The same wire check with real vLLM servers behind SMG (its /v1/completions forwarded): after every settled
    step SMG routes to exactly the Serving engines, labelled with the committed version, through generate, a
    weight update hammered with requests and a recovery; no engine finished a request while it was not Serving
    (vLLM's own count)."""
    flags = {**ROLLOUT_FT, "offload_rollout": False, "rollout_num_gpus": 1}
    rig = Rig(flags, tmp_path, vllm_python=vllm_python)
    try:
        rig.run(rig.manager.init(rig.weights(0)))
        checks = rig.runner.checks
        samples = rig.run(rig.manager.generate(1))
        assert {s["weight_version"] for s in samples} == {"0"}
        before = rig.generate_count(0)
        codes = rig.run(hammered_update(rig))  # requests hammer SMG while the update runs: none reaches vLLM
        assert codes and 200 not in codes and rig.generate_count(0) == before, (codes[:5], before)
        rig.run(rig.manager.controller.kill_engine(0))
        samples = rig.run(rig.manager.generate(2))  # recovered, caught up, registered again at SMG
        assert {s["weight_version"] for s in samples} == {"1"}
        assert rig.runner.checks >= checks + 5  # every settled step of the sequence was checked
        moves = [(e["instance"], e["trigger"]) for e in rig.events if e.get("event") == "lifecycle.transition"]
        assert ("engine-0", "recover") in moves
        assert requests_while_not_serving(rig.counts) == []
    finally:
        rig.close()


def test_no_request_reaches_an_engine_during_a_weight_update(rig: Rig) -> None:
    """Requests sent to the router while the update runs find no member (none is Serving), not an engine."""
    before = [rig.generate_count(i) for i in range(2)]
    router_url = rig.routing.url
    assert router_url is not None

    async def hammer(stop: asyncio.Event) -> list[int]:
        client = rig.routing.router.client
        assert client is not None
        codes = []
        while not stop.is_set():
            try:
                await client.generate("abcd:", sampling_params={"max_new_tokens": 1})
                codes.append(200)
            except Exception as exc:  # the router answers an error: no worker to route to
                codes.append(getattr(exc, "status", 0))
            await asyncio.sleep(0)
        return codes

    async def scenario() -> list[int]:
        stop = asyncio.Event()
        task = asyncio.create_task(hammer(stop))
        await asyncio.sleep(0.05)
        await rig.runner.operate("update_weights")
        stop.set()
        return await task

    codes = rig.run(scenario())
    assert codes and 200 not in codes
    assert [rig.generate_count(i) for i in range(2)] == before
    assert requests_while_not_serving(rig.counts) == []


def test_the_check_fails_when_engines_are_registered_before_they_hold_the_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """miles #1724 re-introduced: registration at launch (PendingWeights, no committed weights yet)."""
    original = RouterRouting.publish
    rig = Rig({**ROLLOUT_FT, "rollout_num_gpus": 1}, tmp_path)

    async def launch_and_register(cmd: Any) -> Any:
        outcome = await launch(cmd)
        await original(rig.routing, rig.manager.controller.slot(cmd))
        return outcome

    launch = rig.runner.handlers["engine.launch_engine"]
    rig.runner.provide({"engine.launch_engine": launch_and_register})
    try:
        with pytest.raises(Violation, match="Serving are \\[\\]"):
            rig.run(rig.manager.init(rig.weights(0)))
    finally:
        rig.close()


def test_the_check_fails_when_a_recovered_engine_is_not_registered_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """miles #692 re-introduced: an engine registered once is never registered again."""
    original = RouterRouting.publish
    seen: set[str] = set()

    async def once(self: RouterRouting, engine: Any) -> Any:
        if engine.id in seen:
            from lifecycle.decide.core import Outcome

            return Outcome("done")
        seen.add(engine.id)
        return await original(self, engine)

    monkeypatch.setattr(RouterRouting, "publish", once)
    rig = Rig({**ROLLOUT_FT, "rollout_num_gpus": 1}, tmp_path)
    try:
        rig.run(rig.manager.init(rig.weights(0)))
        rig.run(rig.manager.generate(1))
        rig.run(rig.manager.controller.kill_engine(0))
        with pytest.raises(Violation, match="SMG \\(router-rollout\\) routes to \\[\\]"):
            rig.run(rig.manager.generate(2))
    finally:
        rig.close()


@pytest.mark.recovery
def test_a_killed_router_is_restarted_and_the_serving_engines_registered_again(tmp_path: Path) -> None:
    rig = Rig(ROLLOUT_FT, tmp_path)
    try:
        rig.run(rig.manager.init(rig.weights(0)))

        async def kill_router_mid_rollout(rollout_id: int, controller: Any) -> Any:
            old = rig.routing.router.process
            assert old is not None
            await rig.routing.router.kill()  # SIGKILL while both engines are Serving
            for _ in range(500):
                if rig.routing.router.alive and rig.routing.router.process is not old:
                    break
                await asyncio.sleep(0.01)
            return await fn(rollout_id, controller)

        fn = rig.manager.executor.rollout_fn
        assert fn is not None
        rig.manager.executor.rollout_fn = kill_router_mid_rollout
        samples = rig.run(rig.manager.generate(1))
        assert len(samples) == TASK.prompts_per_step * TASK.group_size
        assert rig.routing.router.restarts == 1
        moves = [(e["instance"], e["trigger"]) for e in rig.events if e.get("event") == "lifecycle.transition"]
        assert moves.count(("engine-0", "republish")) == 1 and moves.count(("engine-1", "republish")) == 1
    finally:
        rig.close()


def test_without_rollout_ft_a_killed_router_stops_the_run_naming_it(tmp_path: Path) -> None:
    rig = Rig({"rollout_num_gpus": 1}, tmp_path)
    try:
        rig.run(rig.manager.init(rig.weights(0)))
        rig.run(rig.routing.router.kill())
        for _ in range(500):
            if rig.runner.state.failed:
                break
            rig.run(asyncio.sleep(0.01))
        with pytest.raises(Exception, match=r"router-rollout died.*--ft-components rollout"):
            rig.manager.controller.check()
        with pytest.raises((RunFailed, Exception)):
            rig.run(rig.manager.generate(1))
    finally:
        rig.close()


def test_a_router_whose_port_was_taken_starts_again_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """free_port's port is free when asked; another process can bind it first (seen in CI: a Ray gRPC server
    answered the router's health probe). The router that cannot bind exits, and a new one starts elsewhere."""
    import socket

    from engines import router as router_module

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    ports = [busy]
    real = router_module.free_port
    monkeypatch.setattr(router_module, "free_port", lambda: ports.pop(0) if ports else real())

    async def go() -> str:
        r = router_module.Router(startup_timeout=30.0)
        try:
            url = await r.start()
            assert await r.workers() == {}
            return url
        finally:
            await r.close()

    try:
        url = asyncio.run(go())
    finally:
        taken.close()
    assert not ports and not url.endswith(f":{busy}")  # the taken port was tried, and another one serves
